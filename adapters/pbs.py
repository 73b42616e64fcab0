"""PBS Professional and Torque: ``#PBS`` directives (PBS Pro ``select``/``place``,
Torque ``nodes=N:ppn=R``), ``qsub``, status from ``qstat -f`` (PBS Pro ``qstat -x -f``
for finished jobs; the ``comment`` attribute says why a job waits), ``qdel``. Chained
jobs use ``-W depend=afterany``.

Ranks start with the site's own MPI (``mpiexec`` of a TM-aware build, bind model) or
``aprun``: a launcher that reaches the other nodes through PBS's TM interface, so PBS
tracks and accounts every rank. The pip MPI's ``mpiexec`` has no TM launcher and would
start remote ranks over ssh, outside the job.
"""

from __future__ import annotations

import re
import shlex

from pmc.errors import ExitCode

from .base import AdapterError, JobState, JobStatus, Scheduler, run_command
from .site import Site
from .units import hms

# job_state letters of qstat -f. F (PBS Pro) and C (Torque) are decided by Exit_status.
STATES: dict[str, JobState] = {
    "Q": JobState.PENDING,
    "H": JobState.PENDING,
    "W": JobState.PENDING,
    "T": JobState.PENDING,
    "M": JobState.PENDING,
    "B": JobState.RUNNING,
    "R": JobState.RUNNING,
    "E": JobState.RUNNING,
    "X": JobState.COMPLETED,
    "S": JobState.SUSPENDED,
    "U": JobState.SUSPENDED,
    "F": JobState.COMPLETED,
    "C": JobState.COMPLETED,
}

# Exit_status values that mean the batch system ended the job, not the script.
WALLTIME_EXITS = {"-29", "-11"}  # PBS Pro JOB_EXEC_KILL_WALLTIME, Torque's
CANCEL_EXITS = {"271", "-10"}  # 256+SIGTERM from qdel; Torque's JOB_EXEC_CMDFAIL on delete

_ATTR = re.compile(r"^\s{0,8}([A-Za-z_][\w.]*)\s*=\s*(.*)$")


def parse_qstat_f(stdout: str) -> dict[str, str]:
    """Attributes of the first job in ``qstat -f`` output (continuation lines joined)."""
    attrs: dict[str, str] = {}
    last: str | None = None
    for line in stdout.splitlines():
        if line.startswith("Job Id:"):
            if attrs:
                break
            attrs["Job Id"] = line.split(":", 1)[1].strip()
            continue
        m = _ATTR.match(line)
        if m and line.startswith("    ") and not line.startswith("\t"):
            last = m.group(1)
            attrs[last] = m.group(2).strip()
        elif last is not None and line.strip():
            # Long values wrap onto tab-indented continuation lines.
            attrs[last] += line.strip()
    return attrs


def reason_from_attrs(attrs: dict[str, str]) -> str | None:
    """Why a job waits, from the server's or the scheduler's ``comment`` attribute
    (``Not Running: Insufficient amount of resource: ncpus``); None when absent."""
    text = attrs.get("comment", "").strip()
    return text or None


def state_from_attrs(attrs: dict[str, str]) -> tuple[JobState, str, str | None]:
    native = attrs.get("job_state", "")
    code = attrs.get("Exit_status") or attrs.get("exit_status")
    state = STATES.get(native, JobState.UNKNOWN)
    if native in ("F", "C") and code is not None:
        if code == "0":
            state = JobState.COMPLETED
        elif code in WALLTIME_EXITS:
            state = JobState.TIMEOUT
        elif code in CANCEL_EXITS:
            state = JobState.CANCELLED
        else:
            state = JobState.FAILED
    return state, native, code


class Pbs(Scheduler):
    name = "pbs"
    prefix = "#PBS"
    job_id_var = "PBS_JOBID"
    STATES = STATES
    queue_ahead = True  # chain_lines: afterany on the running job
    unsupported = ("qos",)

    def directives(self, site: Site, job_name: str) -> list[str]:
        q = shlex.quote
        torque = site.flavor == "torque"
        out = [f"-N {q(job_name)}"]
        if site.account is not None:
            out.append(f"-A {q(site.account)}")
        queue = site.queue
        if site.reservation is not None and not torque:
            # PBS Pro runs a reservation's jobs in a queue named after it.
            if queue is not None and queue != site.reservation:
                raise AdapterError(
                    f"{site.source}: reservation: PBS Professional submits to the "
                    f"reservation's own queue; drop queue {queue!r} or the reservation"
                )
            queue = site.reservation
        if queue is not None:
            out.append(f"-q {q(queue)}")
        if site.walltime is not None:
            out.append(f"-l walltime={hms(site.walltime)}")
        cpus = site.ranks_per_node * site.cpus_per_rank
        feature = f":{site.constraint}" if site.constraint is not None else ""
        # GPUs per node: Torque's nodes=N:ppn=P:gpus=G, PBS Pro's ngpus in the chunk.
        gpus = site.host_gpus or 0
        if torque:
            ppn = f"ppn={cpus}" + (f":gpus={gpus}" if gpus else "")
            out.append(f"-l {q(f'nodes={site.nodes}:{ppn}{feature}')}")
            if site.host_memory is not None:
                out.append(f"-l mem={site.host_memory * site.nodes}mb")
            if site.node_usage == "exclusive":
                out.append("-l naccesspolicy=singlejob")
            elif site.node_usage == "shared":
                out.append("-l naccesspolicy=shared")
            if site.reservation is not None:
                out.append(f"-W {q(f'x=FLAGS:ADVRES:{site.reservation}')}")
        else:
            mem = f":mem={site.host_memory}mb" if site.host_memory is not None else ""
            select = f"select={site.nodes}:ncpus={cpus}:mpiprocs={site.ranks_per_node}"
            select += f":ngpus={gpus}" if gpus else ""
            out.append(f"-l {q(select + mem + feature)}")
            usage = {"exclusive": ":excl", "shared": ":shared", None: ""}[site.node_usage]
            out.append(f"-l place=scatter{usage}")
        if site.output is not None:
            out.append(f"-o {q(site.output)}")
        if site.error is not None:
            out.append(f"-e {q(site.error)}")
        return out

    def prologue(self, site: Site) -> list[str]:
        # PBS starts the script in $HOME; relative paths are meant from the submit dir.
        return [f'cd "${{PBS_O_WORKDIR:-.}}" || exit {int(ExitCode.FAILED)}']

    def submit_argv(self, script: str) -> list[str]:
        return ["qsub", script]

    def parse_job_id(self, stdout: str) -> str:
        for line in stdout.splitlines():
            word = line.strip()
            if word and " " not in word:
                return word
        raise AdapterError(f"qsub printed no job id: {stdout.strip()!r}")

    def chain_lines(self, site: Site) -> list[str]:
        # -v passes the chain's variables from this shell (qsub exports no environment
        # without -V); qsub prints the new job's id.
        return [
            'pmc_next="$(qsub -W "depend=afterany:$PBS_JOBID" -v PMC_CHAIN_ID,PMC_CHAIN_INDEX'
            ' "$pmc_self")" || pmc_next=""',
        ]

    def status(self, job_id: str) -> JobStatus:
        proc = run_command(["qstat", "-f", job_id], check=False)
        if proc.returncode != 0 or "job_state" not in proc.stdout:
            # PBS Pro keeps finished jobs in the history shown by -x.
            history = run_command(["qstat", "-x", "-f", job_id], check=False)
            if history.returncode == 0 and "job_state" in history.stdout:
                proc = history
        if "job_state" not in proc.stdout:
            detail = (proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}"
            raise AdapterError(f"pbs job {job_id}: qstat does not know it: {detail}")
        attrs = parse_qstat_f(proc.stdout)
        state, native, code = state_from_attrs(attrs)
        reason = reason_from_attrs(attrs) if not state.finished else None
        return JobStatus(job_id, state, native, code, reason)

    def cancel_argv(self, job_id: str) -> list[str]:
        return ["qdel", job_id]
