"""IBM LoadLeveler: ``# @ keyword = value`` lines closed by ``# @ queue``, ``llsubmit``,
status from ``llq -l`` (a waiting job's status word and hold date are its reason),
``llcancel``; ranks start with ``poe``.

LoadLeveler keywords have no quoting: a value runs to the end of its line and is
never given to a shell (the lines are shell comments), so values are checked to be
one line and written as they are. LoadLeveler has no dependency on a separate job:
a chained follow-up is submitted as this job ends.
"""

from __future__ import annotations

import re

from .base import AdapterError, JobState, JobStatus, Scheduler, one_line, run_command
from .site import Site
from .units import hms

# llq -l "Status:" words (and the short codes of plain llq) → JobState.
STATES: dict[str, JobState] = {
    "IDLE": JobState.PENDING,
    "I": JobState.PENDING,
    "PENDING": JobState.PENDING,
    "P": JobState.PENDING,
    "STARTING": JobState.PENDING,
    "ST": JobState.PENDING,
    "DEFERRED": JobState.PENDING,
    "D": JobState.PENDING,
    "NOT QUEUED": JobState.PENDING,
    "NQ": JobState.PENDING,
    "USER HOLD": JobState.PENDING,
    "SYSTEM HOLD": JobState.PENDING,
    "USER & SYSTEM HOLD": JobState.PENDING,
    "H": JobState.PENDING,
    "S": JobState.PENDING,
    "HS": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "R": JobState.RUNNING,
    "COMPLETE PENDING": JobState.RUNNING,
    "CP": JobState.RUNNING,
    "PREEMPTED": JobState.SUSPENDED,
    "E": JobState.SUSPENDED,
    "COMPLETED": JobState.COMPLETED,
    "C": JobState.COMPLETED,
    "REMOVED": JobState.CANCELLED,
    "RM": JobState.CANCELLED,
    "REMOVE PENDING": JobState.CANCELLED,
    "RP": JobState.CANCELLED,
    "VACATED": JobState.FAILED,
    "V": JobState.FAILED,
    "REJECTED": JobState.FAILED,
    "X": JobState.FAILED,
    "TERMINATED": JobState.FAILED,
    "TX": JobState.FAILED,
}

_SUBMITTED = re.compile(r'The job "([^"]+)" has been submitted')
_STATUS = re.compile(r"^\s*Status:\s*(.+?)\s*$", re.MULTILINE)
_HOLD_UNTIL = re.compile(r"^\s*Hold Job Until:[ \t]*(\S.*?)\s*$", re.MULTILINE)


def parse_llq(stdout: str) -> str | None:
    """The Status word of ``llq -l ID``; None when llq has no job to report."""
    m = _STATUS.search(stdout)
    return m.group(1) if m else None


def parse_llq_reason(stdout: str) -> str | None:
    """Why a LoadLeveler job waits: its status (Idle, Deferred, User Hold, Not
    Queued...) and, for a deferred job, the date it is held until."""
    status = parse_llq(stdout)
    if status is None:
        return None
    hold = _HOLD_UNTIL.search(stdout)
    return f"{status} until {hold.group(1)}" if hold else status


class LoadLeveler(Scheduler):
    name = "loadleveler"
    prefix = "# @"
    job_id_var = "LOADL_STEP_ID"
    STATES = STATES
    unsupported = ("qos",)

    def directives(self, site: Site, job_name: str) -> list[str]:
        def kw(key: str, value: str) -> str:
            return f"{key} = {one_line(f'{site.source}: {key}', value)}"

        if site.host_gpus:
            # LoadLeveler has no GPU request of its own: a site that schedules GPUs
            # defines a consumable resource under a name of its choosing.
            raise AdapterError(
                f"{site.source}: host.gpus: LoadLeveler has no GPU request; ask for the "
                "GPUs with your site's consumable resource in directives (e.g. "
                "'resources = ...'), and declare them to pmc with environment "
                f"PMC_HOST_GPUS: {site.host_gpus}"
            )
        out = [kw("job_name", job_name), "job_type = parallel"]
        if site.queue is not None:
            out.append(kw("class", site.queue))
        if site.account is not None:
            out.append(kw("account_no", site.account))
        if site.walltime is not None:
            out.append(f"wall_clock_limit = {hms(site.walltime)}")
        out += [f"node = {site.nodes}", f"tasks_per_node = {site.ranks_per_node}"]
        if site.cpus_per_rank > 1:
            out.append(f"parallel_threads = {site.cpus_per_rank}")
        if site.host_memory is not None:
            per_task = max(1, site.host_memory // site.ranks_per_node)
            out.append(f"resources = ConsumableMemory({per_task}mb)")
        if site.constraint is not None:
            out.append(kw("requirements", site.constraint))
        if site.node_usage is not None:
            usage = "not_shared" if site.node_usage == "exclusive" else "shared"
            out.append(f"node_usage = {usage}")
        if site.reservation is not None:
            out.append(kw("ll_res_id", site.reservation))
        if site.output is not None:
            out.append(kw("output", site.output))
        if site.error is not None:
            out.append(kw("error", site.error))
        # The job sees the submitter's environment (PATH to pmc, PMC_CHAIN_INDEX).
        out.append("environment = COPY_ALL")
        return out

    def raw_directives(self, site: Site) -> list[str]:
        for i, d in enumerate(site.directives):
            if d.strip().lower() == "queue":
                raise AdapterError(
                    f"{site.source}: directives[{i}]: 'queue' is written last by pmc itself"
                )
        return super().raw_directives(site)

    def trailer(self) -> list[str]:
        return ["# @ queue"]

    def submit_argv(self, script: str) -> list[str]:
        return ["llsubmit", script]

    def parse_job_id(self, stdout: str) -> str:
        m = _SUBMITTED.search(stdout)
        if m is None:
            raise AdapterError(f"llsubmit printed no job id: {stdout.strip()!r}")
        # One job step per file: the step id is the job id with ".0".
        return m.group(1) + ".0"

    def chain_lines(self, site: Site) -> list[str]:
        # llsubmit: The job "host.domain.123" has been submitted.  → step host.domain.123.0
        return [
            'pmc_next="$(llsubmit "$pmc_self")" || pmc_next=""',
            "pmc_next=\"$(printf '%s\\n' \"$pmc_next\""
            " | sed -n 's/.*The job \"\\(.*\\)\" has been submitted.*/\\1.0/p')\"",
        ]

    def status(self, job_id: str) -> JobStatus:
        proc = run_command(["llq", "-l", job_id], check=False)
        native = parse_llq(proc.stdout)
        if native is None:
            if proc.returncode == 0 and "no job status to report" in proc.stdout:
                # llq forgets a job once it has left the queue.
                return JobStatus(job_id, JobState.UNKNOWN, "not in queue (finished or unknown)")
            detail = (proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}"
            raise AdapterError(f"loadleveler job {job_id}: llq does not know it: {detail}")
        state = self.state_of(native)
        reason = parse_llq_reason(proc.stdout) if state is JobState.PENDING else None
        return JobStatus(job_id, state, native, reason=reason)

    def cancel_argv(self, job_id: str) -> list[str]:
        return ["llcancel", job_id]
