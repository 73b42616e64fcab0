"""Local "scheduler": no batch system; the script runs detached on this machine.

The job id is the script's process id (it leads its own session, so cancel signals the
whole group). The script records its exit status in the local job directory
(``$PMC_LOCAL_JOBS``, default ``~/.cache/pmc/jobs``) so status works after it ended.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import Path

from pmc.site import Site

from .base import AdapterError, JobState, JobStatus, Scheduler

# Exit statuses of the script (pmc run's codes, or 128+signal) → JobState.
STATES: dict[str, JobState] = {
    "0": JobState.COMPLETED,
    "1": JobState.FAILED,
    "2": JobState.FAILED,
    "3": JobState.FAILED,  # incomplete: the workflow did not finish
    "130": JobState.CANCELLED,
    "137": JobState.CANCELLED,
    "143": JobState.CANCELLED,
}


def jobs_dir() -> Path:
    default = Path.home() / ".cache" / "pmc" / "jobs"
    return Path(os.environ.get("PMC_LOCAL_JOBS") or default)


def _proc_state(pid: int) -> str | None:
    """The state letter from /proc/PID/stat, None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


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
        return ["PMC_LOCAL_JOB_ID=$$"]

    def epilogue(self, site: Site) -> list[str]:
        return [
            'pmc_jobs="${PMC_LOCAL_JOBS:-$HOME/.cache/pmc/jobs}"',
            'mkdir -p "$pmc_jobs" && printf \'%s\\n\' "$rc" > "$pmc_jobs/$$.rc"',
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
        return str(proc.pid)

    def chain_lines(self, script_q: str, site: Site) -> list[str]:
        target = shlex.quote(site.output) if site.output is not None else f"{script_q}.out"
        return [f"setsid bash {script_q} >>{target} 2>&1 </dev/null &"]

    def status(self, job_id: str) -> JobStatus:
        pid = self._pid(job_id)
        state = _proc_state(pid)
        if state is not None and state not in ("Z", "X"):
            return JobStatus(job_id, JobState.RUNNING, f"process state {state}")
        rc_file = jobs_dir() / f"{pid}.rc"
        try:
            code = rc_file.read_text().strip()
        except OSError:
            return JobStatus(job_id, JobState.UNKNOWN, "no such process and no exit record")
        return JobStatus(job_id, STATES.get(code, JobState.FAILED), f"exited {code}", code)

    def cancel(self, job_id: str) -> None:
        pid = self._pid(job_id)
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError as e:
            raise AdapterError(f"local job {job_id}: no such process") from e

    def cancel_argv(self, job_id: str) -> list[str]:
        return ["kill", "-TERM", "--", f"-{self._pid(job_id)}"]

    @staticmethod
    def _pid(job_id: str) -> int:
        if not job_id.isdigit():
            raise AdapterError(f"local job id {job_id!r}: expected a process id")
        return int(job_id)
