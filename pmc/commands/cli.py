"""Command-line parsing only: each subcommand calls one function elsewhere.

``pegasus-mpi-cluster [options] workflow.dag`` takes the reference's options with the
same meaning; ``pmc run`` takes the same options plus this project's own.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import resource
import sys
from collections.abc import Callable, Sequence

from pmc import __version__, log
from pmc.errors import ExitCode
from pmc.options import RunOptions


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 2 with one line of usage and one of error."""


# ASCII digits only: int() and float() also take "1_000" and other scripts' digits,
# which the reference's sscanf() reads otherwise ("1_000" as 1).
_WHOLE = re.compile(r"[+-]?[0-9]+")
# The reference's whole-number options read with sscanf("%d"), which stops at a decimal
# point: "-m 99.1" is 99 there, so it is here. Any other trailing text ("1e3", "12abc",
# which sscanf also reads as a number) stays an error.
_WHOLE_WITH_FRACTION = re.compile(r"([+-]?[0-9]+)(?:\.[0-9]*)?")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _whole(text: str, minimum: int, pattern: re.Pattern[str] = _WHOLE) -> int:
    m = pattern.fullmatch(text.strip(" \t\n"))
    if not m:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    value = int(m.group(1) if m.groups() else m.group(0))
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _whole(text, 1)


def _nonneg_int(text: str) -> int:
    return _whole(text, 0)


def _ref_positive_int(text: str) -> int:
    """A whole number >= 1 of the reference's options (a fraction is cut off, as there)."""
    return _whole(text, 1, _WHOLE_WITH_FRACTION)


def _ref_nonneg_int(text: str) -> int:
    """A whole number >= 0 of the reference's options (a fraction is cut off, as there)."""
    return _whole(text, 0, _WHOLE_WITH_FRACTION)


def _positive(text: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {unit}, got {text!r}") from None
    if not 0 < value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a positive number of {unit}, got {text}")
    return value


def _minutes(text: str) -> float:
    """--max-wall-time: 0 is no limit, as in the reference (which also takes a negative
    number, nan or inf without a word; refused here as the mistakes they must be)."""
    if not _DECIMAL.fullmatch(text.strip(" \t\n")):
        raise argparse.ArgumentTypeError(f"expected minutes, got {text!r}")
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a number of minutes >= 0 (0: no limit), got {text}")
    return value


def _seconds(text: str) -> float:
    return _positive(text, "seconds")


def _nonneg_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def _port(text: str) -> int:
    value = _nonneg_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The reference's options (same letters, same meaning) and this project's own."""
    p.add_argument("dag", metavar="workflow.dag", help="the DAG file to run")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="more logging (repeatable): DEBUG, TRACE")
    p.add_argument("-q", "--quiet", action="count", default=0,
                   help="less logging (repeatable): WARN, ERROR, FATAL")
    p.add_argument("-s", "--skip-rescue", action="store_true",
                   help="ignore an existing rescue log (a new one is still written)")
    p.add_argument("-o", "--stdout", metavar="PATH", help="file for task stdout")
    p.add_argument("-e", "--stderr", metavar="PATH", help="file for task stderr")
    p.add_argument("-m", "--max-failures", metavar="M", type=_ref_nonneg_int, default=0,
                   help="stop starting new tasks after M tasks failed (0: unlimited)")
    p.add_argument("-t", "--tries", metavar="T", type=_ref_positive_int, default=1,
                   help="tries per task before it counts as failed (default 1)")
    p.add_argument("-n", "--nolock", action="store_true", help="do not lock the DAG file")
    p.add_argument("-r", "--rescue", metavar="PATH", help="rescue log (default DAG.rescue)")
    p.add_argument("--host-script", metavar="PATH",
                   default=os.environ.get("PMC_HOST_SCRIPT") or None,
                   help="run once on every host before any task (env PMC_HOST_SCRIPT)")
    p.add_argument("--host-script-timeout", metavar="SECONDS", type=_seconds, default=60.0,
                   help="how long the host script may take before SIGALRM (default 60)")
    # As in the reference: --host-memory must be >= 1, PMC_HOST_MEMORY may be 0, and
    # --host-cpus or PMC_HOST_CPUS 0 is the default, detection.
    p.add_argument("--host-memory", metavar="MB", type=_ref_positive_int,
                   help="memory per host in MB (env PMC_HOST_MEMORY, where 0 is the "
                   "default; default: detected)")
    p.add_argument("--host-cpus", metavar="N", type=_ref_nonneg_int,
                   help="cpus per host (env PMC_HOST_CPUS; 0 or default: detected); not "
                   "with --set-affinity")
    p.add_argument("--strict-limits", action="store_true",
                   help="limit each task to its -m request: its memory, through a cgroup "
                   "where the worker can create one (pmc extension), else its address "
                   "space (RLIMIT_AS, as PMC)")
    p.add_argument("--max-wall-time", metavar="MINUTES", type=_minutes,
                   help="abort the workflow after this many minutes (env PMC_MAX_WALL_TIME; "
                   "0 or default: no limit)")
    p.add_argument("--per-task-stdio", action="store_true",
                   help="TASK.out.NNN / TASK.err.NNN per task try")
    p.add_argument("--jobstate-log", action="store_true",
                   help="write jobstate.log next to the DAG")
    p.add_argument("--monitord-hack", action="store_true",
                   help="write DAG.dagman.out for monitord (implies --per-task-stdio)")
    p.add_argument("--no-resource-log", action="store_true", help="no DAG.resource file")
    p.add_argument("--no-sleep-on-recv", action="store_true",
                   help="blocking MPI receives instead of polling with sleep")
    p.add_argument("--maxfds", metavar="N", type=_ref_positive_int,
                   help="most files the master keeps open for I/O forwarding")
    p.add_argument("--keep-affinity", action="store_true",
                   help="keep the inherited cpu affinity for tasks")
    p.add_argument("--set-affinity", action="store_true",
                   help="bind multi-core tasks to a compact set of cpus (PMC_AFFINITY)")
    ours = p.add_argument_group("pmc options")
    mode = ours.add_mutually_exclusive_group()
    mode.add_argument("--local", dest="mode", action="store_const", const="local",
                      help="embedded mode even under an MPI launcher")
    mode.add_argument("--mpi", dest="mode", action="store_const", const="mpi",
                      help="MPI mode even when no launcher is detected")
    ours.add_argument("--workers", metavar="N", type=_positive_int,
                      help="embedded mode: worker processes (default: one per cpu)")
    ours.add_argument("--worker-slots", metavar="K", type=_positive_int, default=1,
                      help="task slots per worker rank (default 1, as in PMC)")
    ours.add_argument("--no-prefetch", action="store_true",
                      help="send a worker a task only when it has a free slot (PMC's way); "
                      "by default each busy slot also holds the next task, started the "
                      "moment the running one ends")
    ours.add_argument("--no-host-sockets", action="store_true",
                      help="MPI mode: workers on the master's host talk to it through MPI "
                      "too, not a Unix socket")
    ours.add_argument("--log-format", choices=("text", "json"), default="text",
                      help="log lines as text (default) or one JSON object per line")
    ours.add_argument("--log-file", metavar="PATH", help="write the log here, not stderr")
    ours.add_argument("--metrics-port", metavar="PORT", type=_port,
                      help="serve Prometheus metrics on this port (0: any free port)")
    ours.add_argument("--metrics-bind", metavar="ADDR", default="127.0.0.1",
                      help="address for --metrics-port (default 127.0.0.1)")
    ours.add_argument("--metrics-textfile", metavar="PATH",
                      help="write metrics for node_exporter's textfile collector here")
    ours.add_argument("--metrics-pushgateway", metavar="URL",
                      help="push metrics to this Pushgateway, and once more at exit")
    ours.add_argument("--progress-interval", metavar="SECONDS", type=_nonneg_seconds,
                      help="pmc extension: when stderr is not a terminal, log '[info] "
                      "Progress: done/total, running, failed, rate, ETA' every SECONDS "
                      "(pmc run: default 60, and a live progress line on a terminal; "
                      "pegasus-mpi-cluster: default 0; 0: off)")
    # The site profile's name, for the metrics' "site" label and the JSON log: set by the
    # batch scripts pmc writes (PMC_SITE_NAME), hence hidden.
    ours.add_argument("--site", metavar="NAME", default="", help=argparse.SUPPRESS)


def _env_default(p: argparse.ArgumentParser, args: argparse.Namespace, attr: str, var: str,
                 conv: Callable[[str], object]) -> None:
    if getattr(args, attr) is not None:
        return
    text = os.environ.get(var)
    if text is None:
        return  # set but empty is an invalid value, as in the reference
    try:
        setattr(args, attr, conv(text))
    except argparse.ArgumentTypeError as e:
        p.error(f"environment variable {var}: {e}")


def options_from_args(p: argparse.ArgumentParser, args: argparse.Namespace,
                      dropin: bool = False) -> RunOptions:
    """``dropin``: the pegasus-mpi-cluster command, whose console output is the
    reference's (no progress unless asked for with --progress-interval)."""
    _env_default(p, args, "host_memory", "PMC_HOST_MEMORY", _ref_nonneg_int)
    _env_default(p, args, "host_cpus", "PMC_HOST_CPUS", _ref_nonneg_int)
    _env_default(p, args, "max_wall_time", "PMC_MAX_WALL_TIME", _minutes)
    if args.set_affinity and args.host_cpus:
        # The reference's words: its binding needs the host's real cpus and sockets.
        p.error("--host-cpus is not compatible with --set-affinity")
    if args.maxfds is not None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and args.maxfds > soft:
            p.error(f"argument --maxfds: must not exceed RLIMIT_NOFILE ({soft}), "
                    f"got {args.maxfds}")
    return RunOptions(
        dag=args.dag,
        stdout=args.stdout,
        stderr=args.stderr,
        max_failures=args.max_failures,
        tries=args.tries,
        skip_rescue=args.skip_rescue,
        nolock=args.nolock,
        rescue=args.rescue,
        host_script=args.host_script,
        host_script_timeout=args.host_script_timeout,
        host_memory=args.host_memory or None,  # 0: detected
        host_cpus=args.host_cpus or None,  # 0: detected
        strict_limits=args.strict_limits,
        max_wall_time=args.max_wall_time or None,  # 0: no limit
        per_task_stdio=args.per_task_stdio or args.monitord_hack,
        jobstate_log=args.jobstate_log,
        monitord_hack=args.monitord_hack,
        no_resource_log=args.no_resource_log,
        no_sleep_on_recv=args.no_sleep_on_recv,
        maxfds=args.maxfds,
        keep_affinity=args.keep_affinity,
        set_affinity=args.set_affinity,
        log_level=log.INFO + args.verbose - args.quiet,
        mode=args.mode or "auto",
        workers=args.workers,
        worker_slots=args.worker_slots,
        prefetch=not args.no_prefetch,
        host_sockets=not args.no_host_sockets,
        log_format=args.log_format,
        log_file=args.log_file,
        metrics_port=args.metrics_port,
        metrics_bind=args.metrics_bind,
        metrics_textfile=args.metrics_textfile,
        metrics_pushgateway=args.metrics_pushgateway,
        site=args.site or os.environ.get("PMC_SITE_NAME", ""),
        progress_interval=args.progress_interval if args.progress_interval is not None
        else (0.0 if dropin else 60.0),
        live_progress=not dropin,
    )


def cmd_run(p: argparse.ArgumentParser, args: argparse.Namespace, dropin: bool = False) -> int:
    opts = options_from_args(p, args, dropin)
    from pmc.outputs.observe import setup_logging

    setup_logging(opts)
    from pmc.commands.run import run

    return run(opts)


def cmd_status(args: argparse.Namespace) -> int:
    from pmc.outputs.status import main as status_main

    return status_main(args.dag, args.rescue, watch=args.watch, as_json=args.json)


def cmd_report(args: argparse.Namespace) -> int:
    from pmc.commands.report import main as report_main

    return report_main(args.eventlog, plot=args.plot, bin_width=args.bin, top=args.top,
                       run=args.run)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pmc", description="Run DAGs of many short tasks inside one MPI job.")
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
    status_p.add_argument("--watch", metavar="SECONDS", type=_seconds, nargs="?",
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
    report_p.add_argument("--bin", metavar="SECONDS", type=_seconds,
                          help="width of the time bins (default: about 20 bins)")
    report_p.add_argument("--top", metavar="N", type=_positive_int, default=10,
                          help="how many slowest tasks to list (default 10)")
    report_p.add_argument("--run", metavar="K", type=int,
                          help="which run in a log of several (1 = first, default: last)")
    report_p.set_defaults(func=cmd_report)
    # pmc.adapters lives in adapters/ (mapped by pyproject), which type checkers do not
    # follow as part of pmc: import it by name.
    adapters_cli = importlib.import_module("pmc.adapters.cli")
    adapters_cli.add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    return code


def pegasus_main(argv: Sequence[str] | None = None) -> int:
    """``pegasus-mpi-cluster [options] workflow.dag``: the reference's command line."""
    p = _Parser(prog="pegasus-mpi-cluster",
                description="Run a PMC DAG (pegasus-mpi-cluster compatible).")
    p.add_argument("-V", "--version", action="version",
                   version=f"pegasus-mpi-cluster (pmc) {__version__}")
    add_run_options(p)
    args = p.parse_args(argv)
    try:
        return cmd_run(p, args, dropin=True)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def _entry() -> None:
    sys.exit(main())
