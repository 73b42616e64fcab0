"""The ``script``, ``submit`` and ``jobs`` subcommands of ``pmc``.

Owns argument parsing for the batch side and turning errors into one message on
stderr and an exit code (never a traceback). ``add_commands`` plugs them into the
main ``pmc`` parser; ``python -m pmc.adapters.cli`` runs them on their own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pmc.site import Site, SiteError, load_site

from . import scheduler_for
from .base import AdapterError, Scheduler, default_script_path, render_script, write_script

EXIT_OK = 0
EXIT_FAILED = 1  # a scheduler command failed
EXIT_USAGE = 2  # bad profile, DAG or arguments

DEFAULT_MAX_JOBS = 10


def _fail(message: str, code: int) -> int:
    print(f"pmc: error: {message}", file=sys.stderr)
    return code


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except SiteError as e:
            return _fail(str(e), EXIT_USAGE)
        except AdapterError as e:
            return _fail(str(e), EXIT_FAILED)
        except OSError as e:
            return _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), EXIT_FAILED)

    return run


def _max_jobs(args: argparse.Namespace) -> int:
    if args.max_jobs is not None and not args.until_done:
        raise SiteError("--max-jobs only applies with --until-done")
    if not args.until_done:
        return 1
    n: int = args.max_jobs if args.max_jobs is not None else DEFAULT_MAX_JOBS
    if n < 1:
        raise SiteError(f"--max-jobs: bad value {n}: must be at least 1")
    return n


def _check_dag(dag: str) -> None:
    from pmc.dag import DagError, parse_dag

    if not Path(dag).is_file():
        raise SiteError(f"{dag}: no such DAG file")
    try:
        parse_dag(dag)
    except DagError as e:
        raise SiteError(str(e)) from e


def _script_text(
    args: argparse.Namespace, absolute: bool = False
) -> tuple[Site, Scheduler, str, str]:
    site = load_site(args.site)
    sched = scheduler_for(site.scheduler)
    dag: str = args.dag
    path = args.script_path or default_script_path(dag, site.scheduler)
    if absolute:
        # A submitted job (and every follow-up of a chain) must find the DAG and the
        # script wherever its setup lines or its batch system leave it.
        dag, path = os.path.abspath(dag), os.path.abspath(path)
    text = render_script(sched, site, dag, script_path=path, max_jobs=_max_jobs(args))
    return site, sched, path, text


@_guarded
def cmd_script(args: argparse.Namespace) -> int:
    _, _, _, text = _script_text(args)
    sys.stdout.write(text)
    return EXIT_OK


@_guarded
def cmd_submit(args: argparse.Namespace) -> int:
    _check_dag(args.dag)
    site, sched, path, text = _script_text(args, absolute=True)
    write_script(path, text)
    job_id = sched.submit(path, site)
    print(job_id)
    print(f"pmc: submitted {path} to {sched.name} as job {job_id}", file=sys.stderr)
    return EXIT_OK


def _scheduler_of(args: argparse.Namespace) -> Scheduler:
    if args.site is not None:
        return scheduler_for(load_site(args.site).scheduler)
    if args.scheduler is not None:
        return scheduler_for(args.scheduler)
    found = [
        name
        for name, tool in (("slurm", "sbatch"), ("pbs", "qsub"), ("loadleveler", "llsubmit"))
        if shutil.which(tool)
    ]
    if len(found) != 1:
        seen = ", ".join(found) if found else "none"
        raise SiteError(
            f"cannot tell which scheduler to ask (found on PATH: {seen}); "
            "give --scheduler or --site"
        )
    return scheduler_for(found[0])


@_guarded
def cmd_status(args: argparse.Namespace) -> int:
    sched = _scheduler_of(args)
    for job_id in args.job_ids:
        print(sched.status(job_id))
    return EXIT_OK


@_guarded
def cmd_cancel(args: argparse.Namespace) -> int:
    sched = _scheduler_of(args)
    for job_id in args.job_ids:
        sched.cancel(job_id)
        print(f"pmc: cancelled {sched.name} job {job_id}", file=sys.stderr)
    return EXIT_OK


def _script_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--site", required=True, metavar="SITE.yaml", help="site profile (YAML)")
    p.add_argument(
        "--script-path",
        metavar="PATH",
        help="where the batch script is written (default: WORKFLOW.dag.SCHEDULER.sh)",
    )
    p.add_argument(
        "--until-done",
        action="store_true",
        help="chain follow-up jobs that resume from the rescue log until the workflow "
        "succeeds, a task fails permanently or --max-jobs jobs have run",
    )
    p.add_argument(
        "--max-jobs",
        type=int,
        metavar="N",
        help=f"most jobs in an --until-done chain (default {DEFAULT_MAX_JOBS})",
    )
    p.add_argument("dag", metavar="workflow.dag")


def _job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--site", metavar="SITE.yaml", help="take the scheduler from this profile")
    p.add_argument("--scheduler", choices=["slurm", "pbs", "loadleveler", "local"])
    p.add_argument("job_ids", nargs="+", metavar="ID")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``script``, ``submit`` and ``jobs`` to the main parser's subcommands."""
    p = sub.add_parser(
        "script",
        help="print the batch script for a workflow at a site",
        description="Print the batch script that runs WORKFLOW.dag at the site.",
    )
    _script_options(p)
    p.set_defaults(func=cmd_script)

    p = sub.add_parser(
        "submit",
        help="write the batch script and submit it; prints the job id",
        description="Write the batch script and submit it to the site's scheduler.",
    )
    _script_options(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("jobs", help="status or cancel of submitted jobs")
    jobs = p.add_subparsers(dest="jobs_command", metavar="{status,cancel}", required=True)
    s = jobs.add_parser("status", help="print each job's state")
    _job_options(s)
    s.set_defaults(func=cmd_status)
    c = jobs.add_parser("cancel", help="cancel jobs")
    _job_options(c)
    c.set_defaults(func=cmd_cancel)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pmc", description="pmc batch commands")
    sub = parser.add_subparsers(dest="command", metavar="{script,submit,jobs}", required=True)
    add_commands(sub)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
