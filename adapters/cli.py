"""The ``script``, ``submit`` and ``jobs`` subcommands of ``pmc``.

Owns argument parsing for the batch side (the site profile, with ``$PMC_SITE`` or
``~/.config/pmc/site.yaml`` as default, and per-submit overrides such as ``--walltime``
and ``--set KEY=VALUE``), what ``submit`` tells the user (job id, resolved walltime,
the chain it starts), ``jobs status`` showing whole chains, and turning errors into one
message on stderr and an exit code (never a traceback). ``add_commands`` plugs them
into the main ``pmc`` parser; ``python -m pmc.adapters.cli`` runs them on their own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pmc.errors import ExitCode

from . import chain as chains
from . import scheduler_for, schedulers
from .base import (
    AdapterError,
    JobStatus,
    Scheduler,
    chain_file_of,
    default_script_path,
    minutes_text,
    render_script,
    write_script,
)
from .chainscript import FOLLOW_UPS
from .site import (
    Override,
    Site,
    SiteError,
    default_site_path,
    hms,
    load_site,
    override,
    parse_set,
)

DEFAULT_MAX_JOBS = 10

# Dedicated override options: (option, profile key, metavar).
OVERRIDES = [
    ("--walltime", "walltime", "TIME"),
    ("--queue", "queue", "NAME"),
    ("--nodes", "nodes", "N"),
    ("--ranks-per-node", "ranks_per_node", "N"),
    ("--account", "account", "NAME"),
    ("--reservation", "reservation", "NAME"),
    ("--job-name", "job_name", "NAME"),
]


def _fail(message: str, code: int) -> int:
    print(f"pmc: error: {message}", file=sys.stderr)
    return code


def _note(message: str) -> None:
    print(f"pmc: {message}", file=sys.stderr)


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except SiteError as e:
            return _fail(str(e), ExitCode.USAGE)
        except AdapterError as e:
            return _fail(str(e), ExitCode.FAILED)
        except OSError as e:
            return _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), ExitCode.FAILED)

    return run


def _max_jobs(args: argparse.Namespace) -> int:
    for given, option in ((args.max_jobs, "--max-jobs"), (args.follow_up, "--follow-up")):
        if given is not None and not args.until_done:
            raise SiteError(f"{option} only applies with --until-done")
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


def _overrides(args: argparse.Namespace) -> list[Override]:
    # --set first, then the dedicated options: a dedicated option wins over --set.
    out = [parse_set(text) for text in args.set or ()]
    for option, key, _ in OVERRIDES:
        value = getattr(args, key)
        if value is not None:
            out.append(override(option, key, value))
    return out


def _site_path(args: argparse.Namespace) -> tuple[str, str | None]:
    """The profile to load and, when it was not given with --site, where it came from."""
    if args.site is not None:
        return args.site, None
    found = default_site_path()
    if found is None:
        raise SiteError(
            "no site profile: give --site FILE, set $PMC_SITE, or write one to "
            "$XDG_CONFIG_HOME/pmc/site.yaml (default ~/.config/pmc/site.yaml)"
        )
    return found


def _load(args: argparse.Namespace) -> Site:
    path, origin = _site_path(args)
    site = load_site(path, _overrides(args))
    if origin is not None:
        _note(f"site profile {path} (from {origin})")
    return site


def walltime_words(site: Site) -> str:
    if site.walltime is None or site.margin is None:
        return (
            "no walltime in the profile: the scheduler's default limit applies and "
            "pmc run has no --max-wall-time"
        )
    mwt = site.max_wall_time_minutes
    assert mwt is not None
    return (
        f"walltime {hms(site.walltime)}; pmc run --max-wall-time {minutes_text(mwt)} "
        f"(stops {hms(site.margin)} before the limit)"
    )


def _script_text(
    args: argparse.Namespace, absolute: bool = False
) -> tuple[Site, Scheduler, str, str]:
    site = _load(args)
    sched = scheduler_for(site.scheduler)
    dag: str = args.dag
    path = args.script_path or default_script_path(dag, site.scheduler)
    if absolute:
        # A submitted job (and every follow-up of a chain) must find the DAG and the
        # script wherever its setup lines or its batch system leave it.
        dag, path = os.path.abspath(dag), os.path.abspath(path)
    # Printed scripts fall back on --script-path only when given: the default path
    # may hold another script, or none (the script normally resubmits $0).
    fallback = path if absolute or args.script_path else None
    text = render_script(sched, site, dag, script_path=fallback, max_jobs=_max_jobs(args),
                         follow_up=args.follow_up or "ahead")
    return site, sched, path, text


@_guarded
def cmd_script(args: argparse.Namespace) -> int:
    _, _, path, text = _script_text(args)
    if args.script_path is None:
        sys.stdout.write(text)
        return ExitCode.OK
    write_script(path, text)
    _note(f"wrote {path}")
    return ExitCode.OK


@_guarded
def cmd_submit(args: argparse.Namespace) -> int:
    _check_dag(args.dag)
    site, sched, path, text = _script_text(args, absolute=True)
    write_script(path, text)
    job_id = sched.submit(path, site)
    print(job_id)
    _note(f"submitted {path} to {sched.name} as job {job_id}")
    _note(walltime_words(site))
    max_jobs = _max_jobs(args)
    if max_jobs > 1:
        chain_file = Path(chain_file_of(os.path.abspath(args.dag)))
        chains.record(chain_file, job_id, 1, job_id, "submitted")
        _note(
            f"chain {job_id}: up to {max_jobs} jobs, recorded in {chain_file}; "
            f"`pmc jobs status {job_id}` shows every link"
        )
        if not sched.queue_ahead and args.follow_up != "at-end":
            _note(f"{sched.name} cannot hold a job until another has ended: each link "
                  "submits the next as it ends")
    return ExitCode.OK


def _scheduler_of(args: argparse.Namespace) -> Scheduler:
    if args.site is not None:
        return scheduler_for(load_site(args.site).scheduler)
    if args.scheduler is not None:
        return scheduler_for(args.scheduler)
    default = default_site_path()
    if default is not None:
        return scheduler_for(load_site(default[0]).scheduler)
    found = [
        name
        for name, tool in ((e.name, e.submit_tool) for e in schedulers.ENTRIES)
        if tool is not None and shutil.which(tool)
    ]
    if len(found) != 1:
        seen = ", ".join(found) if found else "none"
        raise SiteError(
            f"cannot tell which scheduler to ask (found on PATH: {seen}); "
            "give --scheduler or --site"
        )
    return scheduler_for(found[0])


def _is_dag_argument(arg: str) -> bool:
    return arg.endswith((".dag", ".chain")) or Path(arg).is_file()


def _chain_report(chain: chains.Chain, args: argparse.Namespace) -> str:
    name = chain.scheduler
    sched = scheduler_for(name) if name else _scheduler_of(args)
    statuses: dict[str, JobStatus | str] = {}
    for link in chain.ordered():
        try:
            statuses[link.job_id] = sched.status(link.job_id)
        except AdapterError as e:
            statuses[link.job_id] = str(e)
    return chains.render(chain, statuses)


@_guarded
def cmd_status(args: argparse.Namespace) -> int:
    shown: set[tuple[str, str]] = set()
    for arg in args.job_ids:
        chain = chains.chain_of_dag(arg) if _is_dag_argument(arg) else chains.chain_of_job(arg)
        if chain is None:
            print(_scheduler_of(args).status(arg))
            continue
        key = (str(chain.path), chain.chain_id)
        if key not in shown:
            shown.add(key)
            print(_chain_report(chain, args))
    return ExitCode.OK


@_guarded
def cmd_cancel(args: argparse.Namespace) -> int:
    sched = _scheduler_of(args)
    code: int = ExitCode.OK
    for job_id in args.job_ids:
        try:
            before = sched.cancel(job_id)
        except AdapterError as e:
            code = _fail(str(e), ExitCode.FAILED)
            continue
        _note(f"cancelled {sched.name} job {job_id} (was {before.state.value})")
    return code


def _script_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--site",
        metavar="SITE.yaml",
        help="site profile (YAML); default: $PMC_SITE, else "
        "$XDG_CONFIG_HOME/pmc/site.yaml (~/.config/pmc/site.yaml)",
    )
    p.add_argument(
        "--script-path",
        metavar="PATH",
        help="write the batch script here (script: instead of printing it; submit: "
        "default WORKFLOW.dag.SCHEDULER.sh)",
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
    p.add_argument(
        "--follow-up",
        choices=FOLLOW_UPS,
        help="when a chain's link submits the next: ahead (default: as it starts, queued "
        "behind itself, so that the next waits in the queue while it runs; cancelled "
        "should the workflow end first; Slurm and PBS), at-end (as it ends incomplete)",
    )
    g = p.add_argument_group(
        "overrides", "change the profile for this script only; validated like the file"
    )
    for option, key, metavar in OVERRIDES:
        g.add_argument(option, dest=key, metavar=metavar, help=f"profile key {key}")
    g.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="any profile key, dotted for nested ones (pmc.tries=3, host.memory=16G, "
        "environment.OMP_NUM_THREADS=4); repeatable",
    )
    p.add_argument("dag", metavar="workflow.dag")


def _job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--site", metavar="SITE.yaml", help="take the scheduler from this profile")
    p.add_argument("--scheduler", choices=list(schedulers.NAMES))


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
    s = jobs.add_parser(
        "status",
        help="print each job's state; a chain's link or DAG shows the whole chain",
    )
    _job_options(s)
    s.add_argument(
        "job_ids", nargs="+", metavar="ID|DAG", help="job id, or a DAG whose chain to show"
    )
    s.set_defaults(func=cmd_status)
    c = jobs.add_parser("cancel", help="cancel queued or running jobs")
    _job_options(c)
    c.add_argument("job_ids", nargs="+", metavar="ID")
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
