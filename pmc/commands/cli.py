"""Command-line parsing only: each subcommand calls one function elsewhere.

``pegasus-mpi-cluster [options] workflow.dag`` takes the reference's options with the
same meaning; ``pmc run`` takes the same options plus this project's own.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pmc import __version__
from pmc.commands import mpirank
from pmc.errors import ExitCode

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    import argparse

    from pmc.options import RunOptions

# Under MPI only the master reads the command line (pmc.commands.mpirank): what a worker
# rank imports before it knows its part is this module alone, hence the option table,
# the site profile and the converters are imported where they are used.


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The DAG and the run options of ``pmc.options.OPTIONS``: the reference's (same
    letters, same meaning) and this project's own."""
    from pmc import options

    options.add_arguments(p)


def options_from_args(p: argparse.ArgumentParser, args: argparse.Namespace,
                      dropin: bool = False) -> RunOptions:
    """``dropin``: the pegasus-mpi-cluster command, whose console output is the
    reference's (no progress unless asked for with --progress-interval)."""
    import resource

    from pmc import options
    from pmc.commands.siteprofile import apply_site_profile

    options.apply_environment(p, args)
    apply_site_profile(p, args, dropin)
    if args.open_tcp is not None:
        args.open_run = True  # only an open run has a channel
    if args.open_run and args.schedule not in (None, "priority"):
        p.error("--open cannot be combined with --schedule (an open run orders by priority)")
    if args.set_affinity and args.host_cpus:
        # The reference's words: its binding needs the host's real cpus and sockets.
        p.error("--host-cpus is not compatible with --set-affinity")
    if args.maxfds is not None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and args.maxfds > soft:
            p.error(f"argument --maxfds: must not exceed RLIMIT_NOFILE ({soft}), "
                    f"got {args.maxfds}")
    return options.run_options(args, dropin)


def cmd_run(p: argparse.ArgumentParser, args: argparse.Namespace, dropin: bool = False) -> int:
    opts = options_from_args(p, args, dropin)
    from pmc.logsetup import setup_logging

    output = setup_logging(opts)
    from pmc.commands.run import run

    return run(opts, output)


def cmd_status(args: argparse.Namespace) -> int:
    from pmc.commands.status import main as status_main

    return status_main(args.dag, args.rescue, watch=args.watch, as_json=args.json)


def cmd_report(args: argparse.Namespace) -> int:
    from pmc.commands.report import main as report_main

    return report_main(args.eventlog, plot=args.plot, bin_width=args.bin, top=args.top,
                       run=args.run)


def cmd_add(args: argparse.Namespace) -> int:
    from pmc.commands import openrun

    return openrun.add(args.dag, args.more)


def cmd_close(args: argparse.Namespace) -> int:
    from pmc.commands import openrun

    return openrun.close(args.dag)


# The subcommands defined here; any other (or none, or --help) needs the batch wing's.
_OWN_COMMANDS = frozenset({"run", "status", "report", "add", "close"})


def build_parser(batch_commands: bool = True) -> argparse.ArgumentParser:
    """The ``pmc`` parser. ``batch_commands=False`` leaves out the batch wing's
    subcommands (``script``, ``submit``, ``jobs``), whose modules (site profiles, schema
    validation) take ~0.1 s of cpu to import: ``main`` does so when the command line
    names one of the subcommands above, which parse the same either way."""
    import argparse

    from pmc.optiontypes import positive_int, seconds

    p = argparse.ArgumentParser(prog="pmc",
                                description="Run DAGs of many short tasks inside one MPI job.")
    p.add_argument("-V", "--version", action="version", version=f"pmc {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run_p = sub.add_parser("run", help="run a workflow (same options as pegasus-mpi-cluster)",
                           description="Run a PMC DAG, under MPI or embedded.")
    add_run_options(run_p)
    run_p.set_defaults(func=lambda a: cmd_run(run_p, a))
    status_p = sub.add_parser(
        "status", help="progress of a running or finished workflow",
        description="Done / running / failed / remaining tasks of a workflow, from its "
        "status snapshot (DAG.status.json), rescue log and jobstate.log. Exit code: 0 "
        "finished ok, 1 finished failed, 3 incomplete.")
    status_p.add_argument("dag", metavar="workflow.dag", help="the DAG file")
    status_p.add_argument("-r", "--rescue", metavar="PATH",
                          help="rescue log (default DAG.rescue)")
    status_p.add_argument("--watch", metavar="SECONDS", type=seconds, nargs="?",
                          const=2.0, help="show it again every SECONDS (default 2) until "
                          "the run is no longer running")
    status_p.add_argument("--json", action="store_true",
                          help="one JSON object (a line each time with --watch)")
    status_p.set_defaults(func=cmd_status)
    report_p = sub.add_parser(
        "report", help="TTX, utilisation, throughput and concurrency from a JSON event log",
        description="Summarise a run from its --log-format json event log.")
    report_p.add_argument("eventlog", metavar="EVENTLOG", help="the JSON event log")
    report_p.add_argument("--plot", metavar="PNG",
                          help="also plot concurrency and throughput over time (matplotlib)")
    report_p.add_argument("--bin", metavar="SECONDS", type=seconds,
                          help="width of the time bins (default: about 20 bins)")
    report_p.add_argument("--top", metavar="N", type=positive_int, default=10,
                          help="how many slowest tasks to list (default 10)")
    report_p.add_argument("--run", metavar="K", type=int,
                          help="which run in a log of several (1 = first, default: last)")
    report_p.set_defaults(func=cmd_report)
    add_p = sub.add_parser(
        "add", help="pmc extension: add tasks to an open run (pmc run --open)",
        description="pmc extension: add the TASK and EDGE lines of MORE to the open run "
        "of the DAG, all of them or none (a bad line is refused with its line number). "
        "An EDGE's child must be a task of the same batch; its parent may be any task, "
        "done or not. Exit code: 0 added, 2 refused, 1 no open run reached.")
    add_p.add_argument("dag", metavar="workflow.dag", help="the DAG of the open run")
    add_p.add_argument("more", metavar="MORE", help="a file of TASK/EDGE lines, or - (stdin)")
    add_p.set_defaults(func=cmd_add)
    close_p = sub.add_parser(
        "close", help="pmc extension: let an open run end once its tasks are done",
        description="pmc extension: close the open run of the DAG: it takes no more "
        "tasks and ends once those it has are done.")
    close_p.add_argument("dag", metavar="workflow.dag", help="the DAG of the open run")
    close_p.set_defaults(func=cmd_close)
    if not batch_commands:
        return p
    # pmc.adapters lives in adapters/ (mapped by pyproject), which type checkers do not
    # follow as part of pmc: import it by name.
    import importlib

    adapters_cli = importlib.import_module("pmc.adapters.cli")
    adapters_cli.add_commands(sub)
    return p


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: its first word not an option (the
    top-level options, -h and -V, take no value)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    command = _command(words)
    if command == "run":
        return mpirank.entry(words, lambda: _main(argv, command))
    return _main(argv, command)


def _main(argv: Sequence[str] | None, command: str | None) -> int:
    # The batch wing is imported only if asked for.
    p = build_parser(batch_commands=command not in _OWN_COMMANDS)
    args = p.parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    return code


def pegasus_parser() -> argparse.ArgumentParser:
    """The reference's command line: the run options, no subcommands."""
    import argparse

    p = argparse.ArgumentParser(prog="pegasus-mpi-cluster",
                                description="Run a PMC DAG (pegasus-mpi-cluster compatible).")
    p.add_argument("-V", "--version", action="version",
                   version=f"pegasus-mpi-cluster (pmc) {__version__}")
    add_run_options(p)
    return p


def pegasus_main(argv: Sequence[str] | None = None) -> int:
    """``pegasus-mpi-cluster [options] workflow.dag``: the reference's command line."""
    return mpirank.entry(sys.argv[1:] if argv is None else argv, lambda: _pegasus(argv))


def _pegasus(argv: Sequence[str] | None) -> int:
    p = pegasus_parser()
    args = p.parse_args(argv)
    try:
        return cmd_run(p, args, dropin=True)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
