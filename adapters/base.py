"""The batch pipeline every scheduler shares.

Owns: validated ``Site`` → batch script text (``render_script``, a pure function: one
directive per line, stable order, every user value through ``shlex.quote``) → write →
submit → job id; status (with the scheduler's reason) and cancel (an unknown or ended
job is an error); the normalised ``JobState``; the continuation chain
(``--until-done``) rendered into the script, which resubmits the batch system's copy
of itself (``$0``) and records each link in the chain file beside the DAG (read back
by ``chain.py``); and the one subprocess helper (``run_command``: an argv list, never
a shell). Scheduler modules fill the hooks of ``Scheduler`` only; launchers live in
``launchers.py``.
"""

from __future__ import annotations

import enum
import shlex
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pmc import options
from pmc.errors import ExitCode
from pmc.files import atomic_write

from .chainscript import CHAIN_MARK, chain_end, chain_start
from .launchers import launch_argv
from .site import Site
from .units import hms

# The codes ``pmc status`` answers from a workflow's record, which the job script takes
# over the launcher's own when a rank was lost.
_RECORDED = "|".join(str(int(c)) for c in (ExitCode.OK, ExitCode.FAILED, ExitCode.INCOMPLETE))


class AdapterError(Exception):
    """Something the user must fix or know; ``str()`` is the one message to print."""


class CommandError(AdapterError):
    """A scheduler command that failed: carries argv, exit code, stdout and stderr."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        detail = (stderr.strip() or stdout.strip() or "no output").splitlines()
        super().__init__(
            f"`{shlex.join(self.argv)}` failed with exit code {returncode}: "
            + " / ".join(detail[-3:])
        )


def run_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 120,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (no shell), capture text output; raise ``CommandError`` on failure."""
    try:
        proc = subprocess.run(
            list(argv),
            env=None if env is None else dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as e:
        raise CommandError(argv, 127, "", f"command not found: {argv[0]}") from e
    except subprocess.TimeoutExpired as e:
        raise CommandError(argv, -1, "", f"no answer within {timeout:g} s") from e
    if check and proc.returncode != 0:
        raise CommandError(argv, proc.returncode, proc.stdout, proc.stderr)
    return proc


class JobState(enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"  # hit the allocation's time limit: kept apart from FAILED
    UNKNOWN = "UNKNOWN"

    @property
    def finished(self) -> bool:
        return self in (
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMEOUT,
        )


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    state: JobState
    native: str  # the scheduler's own word, for people
    exit_code: str | None = None
    reason: str | None = None  # why it waits (Slurm Reason=, PBS comment, LoadLeveler)

    def __str__(self) -> str:
        return f"{self.job_id} {self.state.value} ({self.details()})"

    def details(self) -> str:
        text = f"native: {self.native}"
        if self.reason:
            text += f", reason: {self.reason}"
        if self.exit_code is not None:
            text += f", exit {self.exit_code}"
        return text


def one_line(what: str, value: str) -> str:
    """A directive is one line: reject values that would end it early."""
    if any(c in value for c in "\n\r\0"):
        raise AdapterError(
            f"{what}: bad value {value!r}: must be one line "
            "(a newline, carriage return or NUL would end the directive)"
        )
    return value


def minutes_text(minutes: float) -> str:
    return f"{minutes:.3f}".rstrip("0").rstrip(".")


class Scheduler(ABC):
    """Hooks one batch system fills. ``STATES`` maps native states to ``JobState``."""

    name: str
    prefix: str  # directive prefix, e.g. "#SBATCH"
    job_id_var: str  # shell variable holding the running job's id
    STATES: Mapping[str, JobState] = {}
    # Profile fields this scheduler cannot express; setting one is an error, not ignored.
    unsupported: tuple[str, ...] = ()
    # Whether a chain's link can queue the next one behind itself as it starts (its
    # chain_lines hold the job until this one has ended; see chainscript.py).
    queue_ahead = False

    def check(self, site: Site) -> None:
        for name in self.unsupported:
            if getattr(site, name) not in (None, (), {}):
                raise AdapterError(f"{site.source}: {name}: not supported by scheduler {self.name}")

    @abstractmethod
    def directives(self, site: Site, job_name: str) -> list[str]:
        """Directive bodies (after the prefix), one per line, stable order."""

    def directive_lines(self, site: Site, job_name: str) -> list[str]:
        bodies = [*self.directives(site, job_name), *self.raw_directives(site)]
        return [f"{self.prefix} {one_line('directive', b)}" for b in bodies]

    def raw_directives(self, site: Site) -> list[str]:
        return [
            one_line(f"{site.source}: directives[{i}]", d) for i, d in enumerate(site.directives)
        ]

    def trailer(self) -> list[str]:
        """Lines that must close the directive block (LoadLeveler's ``# @ queue``)."""
        return []

    def prologue(self, site: Site) -> list[str]:
        """Shell lines run first in the job (e.g. PBS: cd to the submit directory)."""
        return []

    def epilogue(self, site: Site) -> list[str]:
        """Shell lines run last, with the run's exit code in ``$rc``."""
        return []

    @abstractmethod
    def submit_argv(self, script: str) -> list[str]: ...

    @abstractmethod
    def parse_job_id(self, stdout: str) -> str: ...

    @abstractmethod
    def chain_lines(self, site: Site) -> list[str]:
        """Shell lines that submit ``"$pmc_self"`` (this script's text) as the next job
        of a chain and set ``pmc_next`` to its job id, left empty when the submission
        failed. ``PMC_CHAIN_ID`` and ``PMC_CHAIN_INDEX`` (the follow-up's) are exported."""

    @abstractmethod
    def status(self, job_id: str) -> JobStatus: ...

    @abstractmethod
    def cancel_argv(self, job_id: str) -> list[str]: ...

    def submit(self, script: str, site: Site, cwd: str | Path | None = None) -> str:
        proc = run_command(self.submit_argv(script), cwd=cwd)
        return self.parse_job_id(proc.stdout)

    def cancel(self, job_id: str) -> JobStatus:
        """Cancel a queued or running job; return its status before. An unknown job or
        one that has already ended is an error (scancel says nothing and exits 0 for
        both, so the state is asked first)."""
        try:
            before = self.status(job_id)
        except AdapterError as e:
            raise AdapterError(f"{self.name} job {job_id}: not cancelled: {e}") from e
        if before.state is JobState.UNKNOWN:
            raise AdapterError(
                f"{self.name} job {job_id}: not cancelled: the scheduler does not know it "
                f"as a queued or running job ({before.details()})"
            )
        if before.state.finished:
            raise AdapterError(
                f"{self.name} job {job_id}: not cancelled: it has already ended "
                f"({before.state.value}, {before.details()})"
            )
        run_command(self.cancel_argv(job_id))
        return before

    def state_of(self, native: str) -> JobState:
        return self.STATES.get(native.strip().upper(), JobState.UNKNOWN)


def pmc_run_argv(site: Site, dag: str) -> list[str]:
    """``pmc run`` with the profile's run options (its ``pmc``, ``logging`` and
    ``metrics`` keys, as ``pmc.options`` maps them to flags), the host's cpus, memory and GPUs,
    ``--max-wall-time`` from the walltime, the site's name, then ``pmc.args`` and the DAG.
    No other profile is read (``--no-site``): the line holds the whole profile, with the
    command line's overrides, and a default profile of the user's must not add to it."""
    values: dict[str, object] = options.profile_values(
        {"pmc": site.pmc, "logging": site.logging, "metrics": site.metrics})
    values["no_site"] = True
    values["host_cpus"] = site.host_cpus
    values["host_memory"] = site.host_memory
    values["host_gpus"] = site.host_gpus
    mwt = site.max_wall_time_minutes
    if mwt is not None:
        values["max_wall_time"] = minutes_text(mwt)
    values["site"] = site.name
    p = site.pmc
    return [*p.get("command", ["pmc"]), "run", *options.argv_for(values),
            *(str(a) for a in p.get("args", [])), dag]


def status_argv(site: Site, dag: str) -> list[str]:
    """``pmc status`` of the run's DAG (and its rescue log, if the profile names one),
    inside the container if any: the workflow's own record of how it ended."""
    rescue = site.pmc.get("rescue")
    argv = [*site.pmc.get("command", ["pmc"]), "status", dag,
            *(["--rescue", str(rescue)] if rescue else [])]
    c = site.container
    if c is None:
        return argv
    return [c.runtime, "exec", *(a for b in c.binds for a in ("--bind", b)), *c.args,
            c.image, *argv]


def command_argv(site: Site, dag: str) -> list[str]:
    """What the launcher starts on every rank: pmc run, inside the container if any."""
    run = pmc_run_argv(site, dag)
    c = site.container
    if c is None:
        return run
    argv = [c.runtime, "exec"]
    for b in c.binds:
        argv += ["--bind", b]
    return [*argv, *c.args, c.image, *run]


def default_job_name(dag: str) -> str:
    stem = Path(dag).name
    return "pmc-" + (stem[:-4] if stem.endswith(".dag") else stem)


def _walltime_comment(site: Site) -> str:
    if site.walltime is None:
        return "# No walltime: the scheduler's default limit applies; pmc run has no limit."
    mwt = site.max_wall_time_minutes
    assert mwt is not None and site.margin is not None
    return (
        f"# walltime {hms(site.walltime)}; pmc run stops by --max-wall-time "
        f"{minutes_text(mwt)} min, {hms(site.margin)} before the limit."
    )


def render_script(
    sched: Scheduler,
    site: Site,
    dag: str,
    *,
    script_path: str | None = None,
    max_jobs: int = 1,
    follow_up: str = "ahead",
) -> str:
    """The batch script for running ``dag`` at ``site``. Pure: same inputs, same text.

    With ``max_jobs`` > 1 the script is one link of a chain (``chainscript.py``). It
    records each link in ``DAG.chain`` and, while pmc run exits incomplete (3), hands
    over to its own text submitted again (the batch system's copy, ``$0``; else
    ``script_path`` when it holds this script) until the chain has ``max_jobs`` jobs:
    queued behind this job as it starts (``follow_up`` "ahead", where the scheduler
    can), else submitted as it ends. A link that handed over to a follow-up exits 0;
    the last link exits with pmc run's status, the workflow's.
    """
    sched.check(site)
    chained = max_jobs > 1
    if chained and site.pmc.get("skip_rescue"):
        raise AdapterError(
            f"{site.source}: pmc.skip_rescue: a chain resumes from the rescue log; "
            "it cannot be combined with skip_rescue"
        )
    lines = _header(sched, site, dag, chained)
    lines += _setup(sched, site)
    lines += _identity(sched, site)
    ahead = chained and follow_up == "ahead" and sched.queue_ahead
    if chained:
        lines += chain_start(chain_file_of(dag), sched.name, max_jobs, sched.chain_lines(site),
                             script_path, ahead)
    lines += _run(site, dag, chained)
    if chained:
        lines += chain_end(max_jobs, sched.cancel_argv('"$pmc_next"') if ahead else None)
    lines += sched.epilogue(site)
    lines.append('exit "$rc"')
    return "\n".join(lines) + "\n"


def _header(sched: Scheduler, site: Site, dag: str, chained: bool) -> list[str]:
    """The shebang, the scheduler's directives and what the script is."""
    job_name = one_line("job name", site.job_name or default_job_name(dag))
    lines = ["#!/bin/bash"]
    lines += sched.directive_lines(site, job_name)
    lines += sched.trailer()
    lines += [
        f"# pmc batch script for site {shlex.quote(one_line('site', site.name))}"
        f" ({sched.name}, launcher {site.launcher}).",
        "# Every value from the profile is quoted; only the setup lines are raw shell.",
        _walltime_comment(site),
    ]
    if chained:
        lines.append(CHAIN_MARK)
    return lines


def _setup(sched: Scheduler, site: Site) -> list[str]:
    """The scheduler's prologue, the profile's modules, environment and setup lines."""
    q = shlex.quote
    lines = sched.prologue(site)
    lines += [f"module load {q(m)}" for m in site.modules]
    lines += [f"export {k}={q(v)}" for k, v in site.environment]
    if site.setup:
        lines.append("# setup: raw shell lines from the profile")
        lines += list(site.setup)
    return lines


def _identity(sched: Scheduler, site: Site) -> list[str]:
    return [
        "# Who this run is, for pmc run's logs and metrics.",
        f'PMC_JOB_ID="${{{sched.job_id_var}:-}}"',
        'PMC_CHAIN_INDEX="${PMC_CHAIN_INDEX:-1}"',
        f"PMC_SITE_NAME={shlex.quote(site.name)}",
        "export PMC_JOB_ID PMC_CHAIN_INDEX PMC_SITE_NAME",
    ]


def _hydra_in_slurm(site: Site) -> list[str]:
    """Hydra's mpiexec starts its proxies with srun inside a Slurm allocation: with
    --no-kill, that a node that fails does not end the proxies on the other nodes."""
    if site.scheduler != "slurm" or site.launcher != "mpiexec" or site.mpi == "openmpi":
        return []
    return ["# Hydra starts its proxies with srun: a node that fails must not end the rest.",
            'export HYDRA_LAUNCHER_EXTRA_ARGS="${HYDRA_LAUNCHER_EXTRA_ARGS:---no-kill}"']


def _run(site: Site, dag: str, chained: bool) -> list[str]:
    """The signals' traps, the launch of pmc run, and its status in ``$rc``: the
    workflow's record's where the launcher's is not the workflow's."""
    launch = launch_argv(
        site.launcher,
        ranks=site.ranks,
        ranks_per_node=site.ranks_per_node,
        cpus_per_rank=site.cpus_per_rank,
        extra=site.launcher_args,
        command=command_argv(site, dag),
        mpi=site.mpi,
        exported=["PATH", *(k for k, _ in site.environment), "PMC_JOB_ID",
                  "PMC_CHAIN_INDEX", "PMC_SITE_NAME", *(["PMC_CHAIN_ID"] if chained else [])],
    )
    return [
        "# A TERM at the time limit must not end this script before pmc has saved its",
        "# state; pmc gets the signal itself.",
        "pmc_term=0",
        "trap 'pmc_term=1; echo \"pmc: batch script got SIGTERM\" >&2' TERM",
        "# A warning that time is short is pmc run's to act on, sent to its ranks (Slurm's",
        "# --signal=USR1@60, without B:); sent to this shell alone it must not end the job.",
        "trap 'echo \"pmc: batch script got a warning signal; pmc run acts on those sent to"
        " its ranks\" >&2' USR1 USR2 XCPU",
        *_hydra_in_slurm(site),
        shlex.join(launch),
        "rc=$?",
        'echo "pmc: run exited with status $rc (job ${PMC_JOB_ID:-?}, chain link'
        ' $PMC_CHAIN_INDEX)" >&2',
        "# The launcher's status is not the workflow's when a rank was lost (it reports",
        f"# the lost rank's death): take pmc's own record ({int(ExitCode.OK)} ok,"
        f" {int(ExitCode.FAILED)} failed, {int(ExitCode.INCOMPLETE)} incomplete).",
        f'if [ "$rc" -ne {int(ExitCode.OK)} ] && [ "$rc" -ne {int(ExitCode.USAGE)} ]; then',
        f"    {shlex.join(status_argv(site, dag))} >/dev/null 2>&1",
        "    pmc_recorded=$?",
        '    case $pmc_recorded in',
        f'        {_RECORDED}) [ "$pmc_recorded" -ne "$rc" ] && echo "pmc: the workflow\'s record'
        ' says status $pmc_recorded; the script exits with it" >&2; rc=$pmc_recorded ;;',
        "    esac",
        "fi",
    ]


def chain_file_of(dag: str) -> str:
    """Where a chain's links are recorded: beside the DAG."""
    return f"{dag}.chain"


def write_script(path: str | Path, text: str) -> None:
    """Write the script atomically and make it executable."""
    atomic_write(path, text, mode=0o755)


def default_script_path(dag: str, scheduler: str) -> str:
    return f"{dag}.{scheduler}.sh"
