"""The batch pipeline every scheduler shares.

Owns: validated ``Site`` → batch script text (``render_script``, a pure function: one
directive per line, stable order, every user value through ``shlex.quote``) → write →
submit → job id; status and cancel; the normalised ``JobState``; the continuation
chain (``--until-done``) rendered into the script; and the one subprocess helper
(``run_command``: an argv list, never a shell). Scheduler modules fill the hooks of
``Scheduler`` only; launchers live in ``launchers.py``.
"""

from __future__ import annotations

import enum
import os
import shlex
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pmc.site import Site

from .launchers import launch_argv

# pmc run's exit code for "stopped before finishing, nothing failed permanently".
EXIT_INCOMPLETE = 3


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

    def __str__(self) -> str:
        text = f"{self.job_id} {self.state.value} (native: {self.native}"
        if self.exit_code is not None:
            text += f", exit {self.exit_code}"
        return text + ")"


def one_line(what: str, value: str) -> str:
    """A directive is one line: reject values that would end it early."""
    if any(c in value for c in "\n\r\0"):
        raise AdapterError(
            f"{what}: bad value {value!r}: must be one line "
            "(a newline, carriage return or NUL would end the directive)"
        )
    return value


def hms(seconds: int) -> str:
    """HH:MM:SS with hours unbounded (Slurm, PBS and LoadLeveler all accept it)."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


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
    def chain_lines(self, script_q: str, site: Site) -> list[str]:
        """Shell lines that submit the next job of a chain (``PMC_CHAIN_INDEX`` is
        exported already); ``script_q`` is the script path, shell-quoted."""

    @abstractmethod
    def status(self, job_id: str) -> JobStatus: ...

    @abstractmethod
    def cancel_argv(self, job_id: str) -> list[str]: ...

    def submit(self, script: str, site: Site, cwd: str | Path | None = None) -> str:
        proc = run_command(self.submit_argv(script), cwd=cwd)
        return self.parse_job_id(proc.stdout)

    def cancel(self, job_id: str) -> None:
        run_command(self.cancel_argv(job_id))

    def state_of(self, native: str) -> JobState:
        return self.STATES.get(native.strip().upper(), JobState.UNKNOWN)


def pmc_run_argv(site: Site, dag: str) -> list[str]:
    """``pmc run`` with the profile's PMC, logging and metrics options, then the DAG."""
    p = site.pmc
    argv = [*p.get("command", ["pmc"]), "run"]
    flags = [
        ("skip_rescue", "-s"),
        ("nolock", "-n"),
        ("strict_limits", "--strict-limits"),
        ("per_task_stdio", "--per-task-stdio"),
        ("jobstate_log", "--jobstate-log"),
        ("monitord_hack", "--monitord-hack"),
        ("no_resource_log", "--no-resource-log"),
        ("no_sleep_on_recv", "--no-sleep-on-recv"),
        ("keep_affinity", "--keep-affinity"),
        ("set_affinity", "--set-affinity"),
    ]
    valued = [
        ("stdout", "-o"),
        ("stderr", "-e"),
        ("max_failures", "-m"),
        ("tries", "-t"),
        ("rescue", "-r"),
        ("host_script", "--host-script"),
        ("maxfds", "--maxfds"),
        ("worker_slots", "--worker-slots"),
    ]
    for key, opt in valued:
        if key in p:
            argv += [opt, str(p[key])]
    for key, opt in flags:
        if p.get(key):
            argv.append(opt)
    if site.host_cpus is not None:
        argv += ["--host-cpus", str(site.host_cpus)]
    if site.host_memory is not None:
        argv += ["--host-memory", str(site.host_memory)]
    mwt = site.max_wall_time_minutes
    if mwt is not None:
        argv += ["--max-wall-time", minutes_text(mwt)]
    log = site.logging
    argv += ["-v"] * int(log.get("verbose", 0)) + ["-q"] * int(log.get("quiet", 0))
    if "format" in log:
        argv += ["--log-format", str(log["format"])]
    if "file" in log:
        argv += ["--log-file", str(log["file"])]
    for key in ("port", "bind", "textfile", "pushgateway"):
        if key in site.metrics:
            argv += [f"--metrics-{key}", str(site.metrics[key])]
    argv += [str(a) for a in p.get("args", [])]
    argv.append(dag)
    return argv


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


def render_script(
    sched: Scheduler,
    site: Site,
    dag: str,
    *,
    script_path: str | None = None,
    max_jobs: int = 1,
) -> str:
    """The batch script for running ``dag`` at ``site``. Pure: same inputs, same text.

    With ``max_jobs`` > 1 the script submits its own follow-up (from ``script_path``)
    when pmc run exits incomplete, until the chain has ``max_jobs`` jobs.
    """
    sched.check(site)
    if max_jobs > 1:
        if script_path is None:
            raise AdapterError("a chain of jobs needs the path the script is submitted from")
        if site.pmc.get("skip_rescue"):
            raise AdapterError(
                f"{site.source}: pmc.skip_rescue: a chain resumes from the rescue log; "
                "it cannot be combined with skip_rescue"
            )
    q = shlex.quote
    job_name = one_line("job name", site.job_name or default_job_name(dag))
    lines = ["#!/bin/bash"]
    lines += sched.directive_lines(site, job_name)
    lines += sched.trailer()
    lines += [
        f"# pmc batch script for site {q(one_line('site', site.name))}"
        f" ({sched.name}, launcher {site.launcher}).",
        "# Every value from the profile is quoted; only the setup lines are raw shell.",
    ]
    lines += sched.prologue(site)
    lines += [f"module load {q(m)}" for m in site.modules]
    lines += [f"export {k}={q(v)}" for k, v in site.environment]
    if site.setup:
        lines.append("# setup: raw shell lines from the profile")
        lines += list(site.setup)
    launch = launch_argv(
        site.launcher,
        ranks=site.ranks,
        ranks_per_node=site.ranks_per_node,
        cpus_per_rank=site.cpus_per_rank,
        extra=site.launcher_args,
        command=command_argv(site, dag),
    )
    lines += [
        'PMC_CHAIN_INDEX="${PMC_CHAIN_INDEX:-1}"',
        "export PMC_CHAIN_INDEX",
        "# A TERM at the time limit must not end this script before pmc has saved its",
        "# state; pmc gets the signal itself.",
        "trap 'echo \"pmc: batch script got SIGTERM\" >&2' TERM",
        shlex.join(launch),
        "rc=$?",
        'echo "pmc: run exited with status $rc (job ${'
        + sched.job_id_var
        + ':-?}, chain link $PMC_CHAIN_INDEX)" >&2',
    ]
    if max_jobs > 1:
        assert script_path is not None
        lines += [
            f'if [ "$rc" -eq {EXIT_INCOMPLETE} ] && [ "$PMC_CHAIN_INDEX" -lt {max_jobs} ]; then',
            "    PMC_CHAIN_INDEX=$((PMC_CHAIN_INDEX + 1))",
            "    export PMC_CHAIN_INDEX",
            '    echo "pmc: workflow incomplete; submitting job $PMC_CHAIN_INDEX'
            f' of {max_jobs}" >&2',
            *("    " + line for line in sched.chain_lines(q(script_path), site)),
            f'elif [ "$rc" -eq {EXIT_INCOMPLETE} ]; then',
            f'    echo "pmc: workflow incomplete after {max_jobs} jobs; chain ends" >&2',
            "fi",
        ]
    lines += sched.epilogue(site)
    lines.append('exit "$rc"')
    return "\n".join(lines) + "\n"


def write_script(path: str | Path, text: str) -> None:
    """Write the script atomically and make it executable."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(0o755)
    tmp.replace(target)


def default_script_path(dag: str, scheduler: str) -> str:
    return f"{dag}.{scheduler}.sh"
