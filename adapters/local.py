"""Local "scheduler": no batch system; the script runs detached on this machine.

A job id is ``PID-STARTTIME``: the script's process id and its start time in clock
ticks since boot (field 22 of ``/proc/PID/stat``), so a process that later gets the
same PID is never taken for the job (status and cancel compare both). The script leads
its own session, so cancel signals the whole group. It records its exit status in the
local job directory (``$PMC_LOCAL_JOBS``, default ``~/.cache/pmc/jobs``) so status
works after it ended; cancel leaves a mark there, so a cancelled job that then exits
non-zero reads CANCELLED rather than FAILED.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

from .base import AdapterError, JobState, JobStatus, Scheduler
from .site import Site

# Exit statuses of the script (pmc run's codes, or 128+signal) → JobState. A chain link
# that handed over to its follow-up exits 0.
STATES: dict[str, JobState] = {
    "0": JobState.COMPLETED,
    "1": JobState.FAILED,
    "2": JobState.FAILED,
    "3": JobState.FAILED,  # incomplete: the workflow did not finish
    "130": JobState.CANCELLED,
    "137": JobState.CANCELLED,
    "143": JobState.CANCELLED,
}

_JOB_ID = re.compile(r"^(\d+)-(\d+)$")

# The script's own id, computed the same way in bash: the fields after the command
# name (in parentheses, which may hold spaces) start at field 3, so starttime is the
# 20th of them.
JOB_ID_SHELL = [
    'pmc_stat="$(cat /proc/$$/stat)"',
    "read -r -a pmc_stat <<<\"${pmc_stat##*) }\"",
    'PMC_LOCAL_JOB_ID="$$-${pmc_stat[19]}"',
]


def jobs_dir() -> Path:
    default = Path.home() / ".cache" / "pmc" / "jobs"
    return Path(os.environ.get("PMC_LOCAL_JOBS") or default)


def proc_stat(pid: int) -> tuple[str, str] | None:
    """(state letter, start time) from /proc/PID/stat; None when there is no process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], fields[19]


def job_id_of(pid: int) -> str:
    stat = proc_stat(pid)
    if stat is None:
        raise AdapterError(f"local job {pid}: the process ended before it could be identified")
    return f"{pid}-{stat[1]}"


def parse_job_id(job_id: str) -> tuple[int, str]:
    m = _JOB_ID.match(job_id)
    if m is None:
        raise AdapterError(
            f"local job id {job_id!r}: expected PID-STARTTIME as printed by pmc submit "
            "(a PID alone could belong to another process by now)"
        )
    return int(m.group(1)), m.group(2)


class Local(Scheduler):
    name = "local"
    prefix = "#"
    job_id_var = "PMC_LOCAL_JOB_ID"
    STATES = STATES
    unsupported = (
        "account",
        "queue",
        "qos",
        "reservation",
        "constraint",
        "node_usage",
        "directives",
    )

    def directives(self, site: Site, job_name: str) -> list[str]:
        return []

    def prologue(self, site: Site) -> list[str]:
        return list(JOB_ID_SHELL)

    def epilogue(self, site: Site) -> list[str]:
        return [
            'pmc_jobs="${PMC_LOCAL_JOBS:-$HOME/.cache/pmc/jobs}"',
            'mkdir -p "$pmc_jobs" && printf \'%s\\n\' "$rc" > "$pmc_jobs/$PMC_LOCAL_JOB_ID.rc"',
        ]

    def log_path(self, site: Site, script: str) -> str:
        return site.output or f"{script}.out"

    def submit_argv(self, script: str) -> list[str]:
        return ["bash", script]

    def parse_job_id(self, stdout: str) -> str:
        return stdout.strip()

    def submit(self, script: str, site: Site, cwd: str | Path | None = None) -> str:
        log = Path(cwd or ".") / self.log_path(site, script)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                self.submit_argv(script),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # The start time does not change at exec: read now, it is the script's.
        return job_id_of(proc.pid)

    def chain_lines(self, site: Site) -> list[str]:
        target = shlex.quote(site.output) if site.output is not None else '"$pmc_self.out"'
        return [
            f'setsid bash "$pmc_self" >>{target} 2>&1 </dev/null &',
            'pmc_next="$(cat /proc/$!/stat 2>/dev/null)" || pmc_next=""',
            'if [ -n "$pmc_next" ]; then',
            '    read -r -a pmc_stat <<<"${pmc_next##*) }"',
            '    pmc_next="$!-${pmc_stat[19]}"',
            "fi",
        ]

    def status(self, job_id: str) -> JobStatus:
        pid, start = parse_job_id(job_id)
        stat = proc_stat(pid)
        if stat is not None and stat[1] == start and stat[0] not in ("Z", "X"):
            return JobStatus(job_id, JobState.RUNNING, f"process state {stat[0]}")
        rc_file = jobs_dir() / f"{job_id}.rc"
        try:
            code = rc_file.read_text().strip()
        except OSError:
            return JobStatus(job_id, JobState.UNKNOWN, "no such process and no exit record")
        if code != "0" and (jobs_dir() / f"{job_id}.cancelled").exists():
            return JobStatus(job_id, JobState.CANCELLED, f"cancelled, exited {code}", code)
        return JobStatus(job_id, STATES.get(code, JobState.FAILED), f"exited {code}", code)

    def cancel(self, job_id: str) -> JobStatus:
        before = self.status(job_id)
        if before.state is not JobState.RUNNING:
            what = "has already ended" if before.state.finished else "is not running"
            raise AdapterError(
                f"local job {job_id}: not cancelled: it {what} "
                f"({before.state.value}, {before.details()})"
            )
        pid, _ = parse_job_id(job_id)
        # Written first: the script drains pmc run on SIGTERM and records pmc's own exit
        # code (3, incomplete), which alone would read as a failure.
        marker = jobs_dir() / f"{job_id}.cancelled"
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError as e:
            raise AdapterError(f"local job {job_id}: not cancelled: cannot write {marker}: "
                               f"{e.strerror}") from e
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError as e:
            marker.unlink(missing_ok=True)
            raise AdapterError(f"local job {job_id}: not cancelled: no such process") from e
        return before

    def cancel_argv(self, job_id: str) -> list[str]:
        pid, _ = parse_job_id(job_id)
        return ["kill", "-TERM", "--", f"-{pid}"]
