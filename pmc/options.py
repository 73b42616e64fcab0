"""The run options: one table (``OPTIONS``) and what is made from it, and ``RunOptions``.

Each ``Option`` of the table says everything about one option of ``pmc run`` /
``pegasus-mpi-cluster``: its flags, converter, default, help, environment alias, site
profile key, whether it is a pmc extension and whether workers need it. From the table
come the argparse options of both commands (``add_arguments``), the ``RunOptions`` they
fill (``run_options``; an option not given takes its environment alias's value, then a
site profile's, ``apply_environment`` and ``apply_profile``, then its default), the site
profile schema of the profile keys (``profile_schema``) and the ``pmc run`` argv a batch
script runs (``argv_for``). No other module spells a run option's flag. What a row holds
(``Option``) and the converters are in ``pmc.optiontypes``: a profile value is checked
with the same function as the command line's text.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from pmc import log
from pmc.optiontypes import (
    Listen,
    Option,
    Ports,
    launcher_template,
    listen_address,
    minutes,
    nonneg_int,
    nonneg_seconds,
    path_or_none,
    port_or_range,
    positive_int,
    ref_nonneg_int,
    ref_positive_int,
    seconds,
)

# -- the table ---------------------------------------------------------------------------

def _none_if_zero(value: Any) -> Any:
    return value or None


def _not(value: Any) -> bool:
    return not value


OPTIONS: tuple[Option, ...] = (
    # The site profile's name, for the metrics' "site" label and the JSON log: passed by
    # the batch scripts pmc writes (which also export PMC_SITE_NAME), hence hidden; else
    # the name of the profile read (--site). First, so that a script's pmc run line
    # names its site first.
    Option(("--site-name",), "site", argparse.SUPPRESS, metavar="NAME", env="PMC_SITE_NAME",
           extension=True, to_field=lambda v: v or ""),
    # Read by pmc.commands.siteprofile, which fills the options not given from it.
    Option(("--site",), "site_profile",
           "take run options from this site profile's pmc:, logging: and metrics: sections "
           "(the command line and environment aliases win); pmc run's default: $PMC_SITE, "
           "else ~/.config/pmc/site.yaml when it exists", metavar="PROFILE", extension=True,
           to_field=lambda v: v or ""),
    Option(("--no-site",), "no_site",
           "read no site profile, neither $PMC_SITE nor ~/.config/pmc/site.yaml (the batch "
           "scripts pmc writes pass the profile's options themselves)", kind="flag",
           extension=True, field=""),
    Option(("-v", "--verbose"), "verbose", "more logging (repeatable): DEBUG, TRACE",
           kind="count", default=0, profile="logging.verbose", field=""),
    Option(("-q", "--quiet"), "quiet", "less logging (repeatable): WARN, ERROR, FATAL",
           kind="count", default=0, profile="logging.quiet", field=""),
    Option(("-s", "--skip-rescue"), "skip_rescue",
           "ignore an existing rescue log (a new one is still written)",
           kind="flag", profile="pmc.skip_rescue"),
    Option(("-o", "--stdout"), "stdout", "file for task stdout", metavar="PATH",
           profile="pmc.stdout"),
    Option(("-e", "--stderr"), "stderr", "file for task stderr", metavar="PATH",
           profile="pmc.stderr"),
    Option(("-m", "--max-failures"), "max_failures",
           "stop starting new tasks after M tasks failed (0: unlimited)", metavar="M",
           type=ref_nonneg_int, default=0, profile="pmc.max_failures"),
    Option(("-t", "--tries"), "tries", "tries per task before it counts as failed (default 1)",
           metavar="T", type=ref_positive_int, default=1, profile="pmc.tries"),
    Option(("-n", "--nolock"), "nolock", "do not lock the DAG file", kind="flag",
           profile="pmc.nolock"),
    Option(("-r", "--rescue"), "rescue", "rescue log (default DAG.rescue)", metavar="PATH",
           profile="pmc.rescue"),
    Option(("--host-script",), "host_script",
           "run once on every host before any task (env PMC_HOST_SCRIPT)", metavar="PATH",
           env="PMC_HOST_SCRIPT", env_type=path_or_none, profile="pmc.host_script",
           worker=True),
    Option(("--host-script-timeout",), "host_script_timeout",
           "how long the host script may take before SIGALRM (default 60)",
           metavar="SECONDS", type=seconds, default=60.0, profile="pmc.host_script_timeout",
           worker=True),
    # As in the reference: --host-memory must be >= 1, PMC_HOST_MEMORY may be 0, and
    # --host-cpus or PMC_HOST_CPUS 0 is the default, detection. A profile sets both in
    # its host section (with units for memory), also used for the allocation.
    Option(("--host-memory",), "host_memory",
           "memory per host in MB (env PMC_HOST_MEMORY, where 0 is the default; default: "
           "detected: MemTotal, or the worker's cgroup memory limit where lower, a pmc "
           "extension)", metavar="MB", type=ref_positive_int, env="PMC_HOST_MEMORY",
           env_type=ref_nonneg_int, worker=True, to_field=_none_if_zero),
    Option(("--host-cpus",), "host_cpus",
           "cpus per host (env PMC_HOST_CPUS; 0 or default: detected: the cpus the worker "
           "may run on, which a cpuset narrows); not with --set-affinity", metavar="N",
           type=ref_nonneg_int, env="PMC_HOST_CPUS", worker=True, to_field=_none_if_zero),
    Option(("--strict-limits",), "strict_limits",
           "limit each task to its -m request: its address space (RLIMIT_AS, as PMC: its "
           "allocations past -m fail), or its memory (--limit-memory-by cgroup)",
           kind="flag", profile="pmc.strict_limits", worker=True),
    # A profile's walltime less its margin becomes --max-wall-time.
    Option(("--max-wall-time",), "max_wall_time",
           "abort the workflow after this many minutes (env PMC_MAX_WALL_TIME; 0 or "
           "default: no limit)", metavar="MINUTES", type=minutes, env="PMC_MAX_WALL_TIME",
           to_field=_none_if_zero),
    Option(("--per-task-stdio",), "per_task_stdio", "TASK.out.NNN / TASK.err.NNN per task try",
           kind="flag", profile="pmc.per_task_stdio", worker=True),
    Option(("--jobstate-log",), "jobstate_log", "write jobstate.log next to the DAG",
           kind="flag", profile="pmc.jobstate_log"),
    Option(("--monitord-hack",), "monitord_hack",
           "write DAG.dagman.out for monitord (implies --per-task-stdio)", kind="flag",
           profile="pmc.monitord_hack"),
    Option(("--no-resource-log",), "no_resource_log", "no DAG.resource file", kind="flag",
           profile="pmc.no_resource_log"),
    Option(("--no-sleep-on-recv",), "no_sleep_on_recv",
           "blocking MPI receives instead of polling with sleep (MPI mode only)", kind="flag",
           profile="pmc.no_sleep_on_recv", only_in="mpi"),
    Option(("--maxfds",), "maxfds", "most files the master keeps open for I/O forwarding",
           metavar="N", type=ref_positive_int, profile="pmc.maxfds"),
    Option(("--keep-affinity",), "keep_affinity", "keep the inherited cpu affinity for tasks",
           kind="flag", profile="pmc.keep_affinity", worker=True),
    Option(("--set-affinity",), "set_affinity",
           "bind multi-core tasks to a compact set of cpus (PMC_AFFINITY)", kind="flag",
           profile="pmc.set_affinity", worker=True),
    # pmc extensions. --local / --mpi have no profile key: a batch job starts its ranks
    # through a launcher, which is MPI mode.
    Option(("--local",), "mode", "embedded mode even under an MPI launcher", kind="const",
           const="local", extension=True, to_field=lambda v: v or "auto"),
    Option(("--mpi",), "mode", "MPI mode even when no launcher is detected", kind="const",
           const="mpi", extension=True, to_field=lambda v: v or "auto"),
    Option(("--workers",), "workers", "embedded mode: worker processes (default: one per cpu)",
           metavar="N", type=positive_int, extension=True, profile="pmc.workers",
           profile_help="embedded mode only: worker processes (default: one per cpu); "
           "no effect on a batch job's ranks started by an MPI launcher, whose number is "
           "nodes x ranks_per_node",
           only_in="local"),
    Option(("--worker-slots",), "worker_slots", "task slots per worker rank (default 1, as in PMC)",
           metavar="K", type=positive_int, default=1, extension=True,
           profile="pmc.worker_slots", worker=True),
    Option(("--no-prefetch",), "no_prefetch",
           "send a worker a task only when it has a free slot (PMC's way); by default each "
           "busy slot also holds the next task, started the moment the running one ends",
           kind="flag", extension=True, profile="pmc.no_prefetch", field="prefetch",
           to_field=_not),
    Option(("--no-host-sockets",), "no_host_sockets",
           "MPI mode: workers on the master's host talk to it through MPI too, not a Unix "
           "socket", kind="flag", extension=True, profile="pmc.no_host_sockets",
           field="host_sockets", to_field=_not, only_in="mpi"),
    Option(("--worker-timeout",), "worker_timeout",
           "a worker silent this long is lost: its tasks run again elsewhere (default 60)",
           metavar="SECONDS", type=seconds, default=60.0, extension=True,
           profile="pmc.worker_timeout", worker=True),
    Option(("--max-worker-losses",), "max_worker_losses",
           "a task that was running on this many lost workers fails (default 2; one more "
           "if it was only queued on them, starting as they were lost)",
           metavar="N", type=positive_int, default=2, extension=True,
           profile="pmc.max_worker_losses"),
    Option(("--host-gpus",), "host_gpus", "GPUs per host (env PMC_HOST_GPUS; default: probed)",
           metavar="N", type=nonneg_int, env="PMC_HOST_GPUS", extension=True, worker=True),
    Option(("--task-launcher",), "task_launcher", "how --ranks tasks start (default: srun in "
           "Slurm, else mpiexec)", metavar="TEMPLATE", type=launcher_template, extension=True,
           profile="pmc.task_launcher", worker=True),
    Option(("--task-accounting",), "task_accounting",
           "how each task's peak memory and cpu are measured: cgroup (its whole process "
           "tree, in a cgroup per task slot where the worker may create one; ~0.1 ms more "
           "per task), rusage (wait4: the cpu of the processes it waited for, the peak "
           "only where it passes the worker's own), auto (default: cgroup with strict "
           "limits or a JSON log, whose task events carry the figures; else rusage)",
           choices=("auto", "cgroup", "rusage"), default="auto", extension=True,
           profile="pmc.task_accounting", worker=True),
    Option(("--schedule",), "schedule",
           "which ready task goes first: priority (default: higher -p first, then DAG "
           "order, as the reference), critical-path (the longest path of runtimes left "
           "below it first, then priority), priority-path (priority first, then the "
           "longest path); runtimes from --expected-runtime, else learned per executable "
           "or Pegasus transformation as tasks end",
           choices=("priority", "critical-path", "priority-path"), default="priority",
           extension=True, profile="pmc.schedule"),
    Option(("--limit-memory-by",), "limit_memory_by", "how strict limits hold a task to "
           "its -m: rlimit (default, as PMC: its address space; an allocation past it "
           "fails), cgroup (its memory, where the worker has cgroups: the kernel kills it "
           "past -m; JVMs and Go run)", choices=("rlimit", "cgroup"), default="rlimit",
           extension=True, profile="pmc.limit_memory_by", worker=True),
    Option(("--on-warning",), "on_warning", "what a batch system's warning that time is "
           "short (SIGUSR1, SIGUSR2, SIGXCPU) does: drain (default: no task starts any "
           "more, running ones end, then exit 3 with everything written), stop (as "
           "SIGTERM), ignore", choices=("drain", "stop", "ignore"), default="drain",
           extension=True, profile="pmc.on_warning"),
    Option(("--reuse",), "reuse",
           "do not run a task whose declared --outputs all exist and are no older than its "
           "--inputs and its parents' outputs, nor (as Pegasus) one whose outputs only such "
           "tasks need; it is recorded as reused. Tasks downstream of a changed file run",
           kind="flag", extension=True, profile="pmc.reuse"),
    Option(("--open",), "open_run",
           "an open run: run the DAG's tasks and keep waiting for more, added with 'pmc "
           "add DAG MORE' or pmc.client, until 'pmc close DAG'; added tasks are kept in "
           "DAG.added and read again by a later run of the DAG",
           kind="flag", extension=True, profile="pmc.open"),
    Option(("--open-tcp",), "open_tcp",
           "an open run also listens on TCP, for clients elsewhere (found in DAG.tcp): "
           "HOST an address, host name, interface or * (all, the default), PORT a port or "
           "FIRST-LAST (0, the default: any free); implies --open", metavar="[HOST][:PORT]",
           type=listen_address, extension=True, profile="pmc.open_tcp"),
    Option(("--log-format",), "log_format",
           "log lines as text (default) or one JSON object per line",
           choices=("text", "json"), default="text", extension=True,
           profile="logging.format", worker=True),
    Option(("--log-file",), "log_file", "write the log here, not stderr", metavar="PATH",
           extension=True, profile="logging.file"),
    Option(("--metrics-port",), "metrics_port",
           "serve Prometheus metrics on this port, or the first free one of FIRST-LAST; "
           "0, or all taken: any free port (logged)", metavar="PORT",
           type=port_or_range, extension=True, profile="metrics.port"),
    Option(("--metrics-bind",), "metrics_bind", "address for --metrics-port (default 127.0.0.1)",
           metavar="ADDR", default="127.0.0.1", extension=True, profile="metrics.bind"),
    Option(("--metrics-textfile",), "metrics_textfile",
           "write metrics for node_exporter's textfile collector here", metavar="PATH",
           extension=True, profile="metrics.textfile"),
    Option(("--metrics-pushgateway",), "metrics_pushgateway",
           "push metrics to this Pushgateway, and once more at exit", metavar="URL",
           extension=True, profile="metrics.pushgateway"),
    Option(("--metrics-file-sd",), "metrics_file_sd", "a Prometheus file_sd target file "
           "for the endpoint (a free port if no --metrics-port) in DIR while the run runs",
           metavar="DIR", extension=True, profile="metrics.file_sd"),
    Option(("--progress-interval",), "progress_interval",
           "pmc extension: when stderr is not a terminal, log '[info] Progress: "
           "done/total, running, failed, rate, ETA' every SECONDS (pmc run: default 60, and "
           "a live progress line on a terminal; pegasus-mpi-cluster: default 0; 0: off)",
           metavar="SECONDS", type=nonneg_seconds, extension=True,
           profile="pmc.progress_interval", field=""),
)

BY_DEST: dict[str, Option] = {}
for _o in OPTIONS:
    BY_DEST.setdefault(_o.dest, _o)


def field_default(o: Option) -> Any:
    """The value an option's ``RunOptions`` field takes when the option is not given."""
    value = False if o.kind == "flag" else o.default
    return o.to_field(value) if o.to_field else value


BY_ATTR: dict[str, Option] = {}
for _o in OPTIONS:
    if _o.attr:
        BY_ATTR.setdefault(_o.attr, _o)


def default(attr: str) -> Any:
    """The default of the ``RunOptions`` field ``attr``, from its row of the table."""
    return field_default(BY_ATTR[attr])


# NamedTuples, not dataclasses: the master rank imports this module as it starts, and
# ``dataclasses`` (with ``inspect``) would add ~9 ms of cpu to it. The fields are
# written out for the type checker; the default of each option's field is its row's
# (``default``), the others' (the DAG, what -v/-q and --progress-interval make) here.
class RunOptions(NamedTuple):
    dag: str
    stdout: str | None = default("stdout")
    stderr: str | None = default("stderr")
    max_failures: int = default("max_failures")
    tries: int = default("tries")
    skip_rescue: bool = default("skip_rescue")
    nolock: bool = default("nolock")
    rescue: str | None = default("rescue")
    host_script: str | None = default("host_script")
    host_script_timeout: float = default("host_script_timeout")  # seconds
    host_memory: int | None = default("host_memory")  # MB
    host_cpus: int | None = default("host_cpus")
    strict_limits: bool = default("strict_limits")
    max_wall_time: float | None = default("max_wall_time")  # minutes
    per_task_stdio: bool = default("per_task_stdio")
    jobstate_log: bool = default("jobstate_log")
    monitord_hack: bool = default("monitord_hack")
    no_resource_log: bool = default("no_resource_log")
    no_sleep_on_recv: bool = default("no_sleep_on_recv")
    maxfds: int | None = default("maxfds")
    keep_affinity: bool = default("keep_affinity")
    set_affinity: bool = default("set_affinity")
    log_level: int = log.INFO
    mode: str = default("mode")  # "auto", "local" or "mpi"
    workers: int | None = default("workers")  # embedded mode; None: one per cpu
    worker_slots: int = default("worker_slots")
    prefetch: bool = default("prefetch")  # queue the next task behind each running one
    # MPI: workers on the master's host use a Unix socket
    host_sockets: bool = default("host_sockets")
    # seconds of silence after which a worker is lost
    worker_timeout: float = default("worker_timeout")
    # lost workers a task may take down before it fails
    max_worker_losses: int = default("max_worker_losses")
    host_gpus: int | None = default("host_gpus")  # declared GPUs per host; None: probed
    # multi-rank tasks' launcher template; None: default
    task_launcher: str | None = default("task_launcher")
    # "auto", "cgroup" or "rusage" (pmc.runtime.accounting)
    task_accounting: str = default("task_accounting")
    schedule: str = default("schedule")  # or by path (pmc.core.pathorder): see --schedule
    # --strict-limits: "rlimit" (as PMC) or "cgroup"
    limit_memory_by: str = default("limit_memory_by")
    on_warning: str = default("on_warning")  # a warning signal: "drain", "stop" or "ignore"
    # skip tasks whose declared outputs are up to date (pmc.core.reuse)
    reuse: bool = default("reuse")
    open_run: bool = default("open_run")  # take tasks added while running (pmc.runtime.openrun)
    open_tcp: Listen | None = default("open_tcp")  # an open run's TCP channel too
    # Observability
    log_format: str = default("log_format")  # "text" or "json"
    log_file: str | None = default("log_file")
    # a port (0: any free one), or a range
    metrics_port: int | Ports | None = default("metrics_port")
    metrics_bind: str = default("metrics_bind")
    metrics_textfile: str | None = default("metrics_textfile")
    metrics_pushgateway: str | None = default("metrics_pushgateway")
    # a directory: Prometheus file_sd target files
    metrics_file_sd: str | None = default("metrics_file_sd")
    site: str = default("site")
    site_profile: str = default("site_profile")  # the site profile the options not given came from
    # Progress while running (pmc.outputs.progress): a line every so many seconds when stderr is
    # not a terminal (None or 0: none), and the live line on a terminal.
    progress_interval: float | None = None
    live_progress: bool = False

    @property
    def prefetching(self) -> bool:
        """Whether tasks queue behind running ones: not with --max-failures, where a
        queued task could start before the failure that should stop it is counted."""
        return self.prefetch and not self.max_failures

    @property
    def rescue_path(self) -> str:
        return self.rescue or f"{self.dag}.rescue"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The DAG argument and every option of the table: the reference's (same letters,
    same meaning) first, this project's own in the "pmc options" group. An option not
    given is None after parsing, so that its environment alias and a site profile can
    fill it in before its default (``run_options``)."""
    p.add_argument("dag", metavar="workflow.dag", help="the DAG file to run")
    ours = p.add_argument_group("pmc options")
    exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for o in OPTIONS:
        target: Any = ours if o.extension else p
        if o.kind == "const":
            if o.dest not in exclusive:
                exclusive[o.dest] = target.add_mutually_exclusive_group()
            exclusive[o.dest].add_argument(*o.flags, dest=o.dest, action="store_const",
                                           const=o.const, help=o.help)
        elif o.kind == "flag":
            target.add_argument(*o.flags, dest=o.dest, action="store_true", default=None,
                                help=o.help)
        elif o.kind == "count":
            target.add_argument(*o.flags, dest=o.dest, action="count", default=None,
                                help=o.help)
        else:
            target.add_argument(*o.flags, dest=o.dest, metavar=o.metavar,
                                type=None if o.type is str else o.type, default=None,
                                choices=o.choices, help=o.help)


def apply_environment(p: argparse.ArgumentParser, args: argparse.Namespace,
                      environ: Mapping[str, str] | None = None) -> None:
    """Options not given take their environment alias's value; a bad one is a usage error."""
    env = os.environ if environ is None else environ
    for o in OPTIONS:
        if o.env is None or getattr(args, o.dest) is not None:
            continue
        text = env.get(o.env)
        if text is None:
            continue  # set but empty is an invalid value, as in the reference
        try:
            setattr(args, o.dest, (o.env_type or o.type)(text))
        except argparse.ArgumentTypeError as e:
            p.error(f"environment variable {o.env}: {e}")


def run_options(args: argparse.Namespace, dropin: bool = False) -> RunOptions:
    """The ``RunOptions`` of parsed arguments (environment and profile already applied),
    each option not given taking its default.
    ``dropin``: pegasus-mpi-cluster, whose console output is the reference's (no
    progress unless asked for with --progress-interval)."""
    _apply_defaults(args)
    values: dict[str, Any] = {}
    for o in OPTIONS:
        if o.attr and o.attr not in values:
            value = getattr(args, o.dest)
            values[o.attr] = o.to_field(value) if o.to_field else value
    values["per_task_stdio"] = args.per_task_stdio or args.monitord_hack
    values["log_level"] = log.INFO + args.verbose - args.quiet
    values["progress_interval"] = (args.progress_interval if args.progress_interval is not None
                                   else (0.0 if dropin else 60.0))
    values["live_progress"] = not dropin
    return RunOptions(dag=args.dag, **values)


def _apply_defaults(args: argparse.Namespace) -> None:
    for o in OPTIONS:
        if getattr(args, o.dest) is None and o.kind != "const":
            setattr(args, o.dest, False if o.kind == "flag" else o.default)


def without_effect(opts: RunOptions, mode: str) -> list[str]:
    """The options given (not at their default) that have no effect in ``mode``."""
    words = {"mpi": "MPI mode", "local": "embedded mode"}
    out = []
    for o in OPTIONS:
        if o.only_in not in (None, mode) and getattr(opts, o.attr) != field_default(o):
            out.append(f"{o.long} has no effect in {words[mode]} ({words[o.only_in]} only)")
    return out


def profile_options() -> list[Option]:
    return [o for o in OPTIONS if o.profile is not None]


def profile_schema() -> dict[str, dict[str, Any]]:
    """{profile section: {key: schema}} of every option with a profile key."""
    out: dict[str, dict[str, Any]] = {}
    for o in profile_options():
        assert o.profile is not None
        section, _, key = o.profile.partition(".")
        out.setdefault(section, {})[key] = o.schema()
    return out


def profile_values(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """{dest: value} of the run options a profile's sections ({"pmc": {...},
    "logging": {...}, "metrics": {...}}) set, the values as the profile gives them."""
    out: dict[str, Any] = {}
    for o in profile_options():
        assert o.profile is not None
        section, _, key = o.profile.partition(".")
        given = sections.get(section, {})
        if key in given:
            out[o.dest] = given[key]
    return out


def apply_profile(args: argparse.Namespace, values: Mapping[str, Any]) -> None:
    """Options neither given nor set by their environment alias take the value a
    (validated) site profile gives them, converted as the command line's text is."""
    for o in OPTIONS:
        if o.dest not in values or getattr(args, o.dest) is not None:
            continue
        value = values[o.dest]
        if o.kind == "value" and o.choices is None:
            value = o.type(value_text(value))
        setattr(args, o.dest, value)


def value_text(value: Any) -> str:
    """A value as command-line text that its converter reads back to the same value."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def check_profile_value(o: Option, value: Any) -> None:
    """Raise ``argparse.ArgumentTypeError`` when ``pmc run`` would refuse the value of
    ``o`` a profile gives (after its schema has been checked)."""
    if o.kind == "value" and o.choices is None:
        o.type(value_text(value))


def worker_values(opts: RunOptions) -> dict[str, Any]:
    """The options workers need, by ``RunOptions`` field: the run's part of a
    ``WorkerConfig`` (which holds exactly these and what the master derives)."""
    return {o.attr: getattr(opts, o.attr) for o in OPTIONS if o.worker}


def argv_for(values: Mapping[str, Any]) -> list[str]:
    """``pmc run`` arguments setting each option (by ``dest``) to its value, in table
    order: a flag when true, a count as that many flags, else the flag and the value's
    text (``--flag=TEXT`` when the text starts with "-", so that it is not an option)."""
    argv: list[str] = []
    for o in OPTIONS:
        if o.dest not in values or values[o.dest] is None:
            continue
        value = values[o.dest]
        if o.kind == "flag":
            argv += [o.flags[0]] if value else []
        elif o.kind == "count":
            argv += [o.flags[0]] * int(value)
        elif o.kind == "const":
            continue  # not in a profile: the launcher decides the mode
        else:
            text = value if isinstance(value, str) else value_text(value)
            argv += [f"{o.long}={text}"] if text.startswith("-") else [o.flags[0], text]
    return argv
