"""Slurm: ``#SBATCH`` directives, ``sbatch --parsable``, status (with the pending
``Reason``) from squeue, then ``scontrol show job`` (works without accounting until
MinJobAge), then sacct; ``scancel`` (checked: it exits 0 for unknown jobs). Chained
jobs use ``--dependency=afterany``.
"""

from __future__ import annotations

import re
import shlex

from .base import (
    AdapterError,
    CommandError,
    JobState,
    JobStatus,
    Scheduler,
    run_command,
)
from .site import Site
from .units import hms

STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RESIZING": JobState.RUNNING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SUSPENDED": JobState.SUSPENDED,
    "STOPPED": JobState.SUSPENDED,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "PREEMPTED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "CANCELLED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,
}

_JOB_ID = re.compile(r"^\s*(\d+(?:_\d+)?)(?:;\S+)?\s*$")
_FIELD = re.compile(r"(?:^|\s)(JobState|ExitCode)=(\S+)")
# Reason= runs to the next " Key=" (a reason may hold spaces: "Reason=Resources" or
# "Reason=launch failed requeued held").
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?=\s+[A-Za-z_/:]+=|\s*$)", re.MULTILINE)
SQUEUE_FORMAT = "%T|%r"


def _reason(text: str | None) -> str | None:
    text = (text or "").strip()
    return None if text in ("", "None", "(null)") else text


def parse_squeue(stdout: str) -> str | None:
    """The state word from ``squeue -h -j ID -o %T|%r``; None when the job is not listed."""
    parsed = parse_squeue_reason(stdout)
    return parsed[0] if parsed else None


def parse_squeue_reason(stdout: str) -> tuple[str, str | None] | None:
    """(state, reason) from ``squeue -h -j ID -o '%T|%r'``; the reason is None when
    Slurm gives none. None when the job is not listed."""
    for line in stdout.splitlines():
        if line.strip():
            state, _, reason = line.strip().partition("|")
            return state.strip(), _reason(reason)
    return None


def parse_scontrol(stdout: str) -> tuple[str, str | None] | None:
    """(JobState, ExitCode) from ``scontrol show job ID``; None when not found."""
    fields = dict(_FIELD.findall(stdout))
    if "JobState" not in fields:
        return None
    return fields["JobState"], fields.get("ExitCode")


def parse_scontrol_reason(stdout: str) -> str | None:
    m = _REASON.search(stdout)
    return _reason(m.group(1)) if m else None


def parse_sacct(stdout: str) -> tuple[str, str | None] | None:
    """(State, ExitCode) from ``sacct -n -X -P -j ID -o State,ExitCode``
    ("CANCELLED by 0" counts as CANCELLED); None when sacct lists nothing."""
    for line in stdout.splitlines():
        if line.strip():
            fields = line.split("|")
            state = fields[0].split()[0].rstrip("+")
            return state, (fields[1].strip() if len(fields) > 1 else None)
    return None


class Slurm(Scheduler):
    name = "slurm"
    prefix = "#SBATCH"
    job_id_var = "SLURM_JOB_ID"
    STATES = STATES
    queue_ahead = True  # chain_lines: afterany on the running job

    def directives(self, site: Site, job_name: str) -> list[str]:
        q = shlex.quote
        out = [f"--job-name={q(job_name)}"]
        for opt, value in (
            ("account", site.account),
            ("partition", site.queue),
            ("qos", site.qos),
            ("reservation", site.reservation),
        ):
            if value is not None:
                out.append(f"--{opt}={q(value)}")
        if site.walltime is not None:
            out.append(f"--time={hms(site.walltime)}")
        out += [
            f"--nodes={site.nodes}",
            f"--ntasks-per-node={site.ranks_per_node}",
            f"--cpus-per-task={site.cpus_per_rank}",
            # A node that fails does not end the allocation (nor requeue the job): pmc
            # goes on with the ranks on the other nodes.
            "--no-kill",
        ]
        if site.host_memory is not None:
            out.append(f"--mem={site.host_memory}M")
        if site.host_gpus:
            out.append(f"--gpus-per-node={site.host_gpus}")
        if site.constraint is not None:
            out.append(f"--constraint={q(site.constraint)}")
        if site.node_usage == "exclusive":
            out.append("--exclusive")
        elif site.node_usage == "shared":
            out.append("--oversubscribe")
        if site.output is not None:
            out.append(f"--output={q(site.output)}")
        if site.error is not None:
            out.append(f"--error={q(site.error)}")
        return out

    def submit_argv(self, script: str) -> list[str]:
        return ["sbatch", "--parsable", script]

    def parse_job_id(self, stdout: str) -> str:
        for line in stdout.splitlines():
            m = _JOB_ID.match(line)
            if m:
                return m.group(1)
        raise AdapterError(f"sbatch printed no job id: {stdout.strip()!r}")

    def chain_lines(self, site: Site) -> list[str]:
        # afterany: the follow-up starts once this job has ended, whatever its state,
        # so the nodes and the DAG lock are free again. --parsable prints ID[;CLUSTER].
        return [
            'pmc_next="$(sbatch --parsable --dependency="afterany:$SLURM_JOB_ID"'
            ' "$pmc_self")" || pmc_next=""',
            'pmc_next="${pmc_next%%;*}"',
        ]

    def status(self, job_id: str) -> JobStatus:
        squeue = run_command(["squeue", "-h", "-j", job_id, "-o", SQUEUE_FORMAT], check=False)
        if squeue.returncode == 0:
            listed = parse_squeue_reason(squeue.stdout)
            if listed is not None:
                native, reason = listed
                return JobStatus(job_id, self.state_of(native), native, reason=reason)
        # Finished (or unknown to squeue): scontrol still knows it until MinJobAge.
        show = run_command(["scontrol", "show", "job", job_id], check=False)
        if show.returncode == 0:
            parsed = parse_scontrol(show.stdout)
            if parsed is not None:
                native, code = parsed
                state = self.state_of(native)
                reason = parse_scontrol_reason(show.stdout) if not state.finished else None
                return JobStatus(job_id, state, native, code, reason)
        try:
            acct = run_command(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"])
        except CommandError as e:
            raise AdapterError(
                f"slurm job {job_id}: not known to squeue or scontrol, and sacct failed: {e}"
            ) from e
        parsed_acct = parse_sacct(acct.stdout)
        if parsed_acct is None:
            raise AdapterError(f"slurm job {job_id}: not known to squeue, scontrol or sacct")
        native, code = parsed_acct
        return JobStatus(job_id, self.state_of(native), native, code)

    def cancel_argv(self, job_id: str) -> list[str]:
        return ["scancel", job_id]
