"""Job-id and status parsers fed with scheduler output samples from tests/data/."""

from __future__ import annotations

from pathlib import Path

import pytest
from pmc.adapters.base import JobState
from pmc.adapters.loadleveler import LoadLeveler, parse_llq
from pmc.adapters.pbs import Pbs, parse_qstat_f, state_from_attrs
from pmc.adapters.slurm import Slurm, parse_sacct, parse_scontrol, parse_squeue

DATA = Path(__file__).resolve().parents[1] / "data"


def sample(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    ("name", "state", "native", "code"),
    [
        ("slurm-scontrol-running.txt", JobState.RUNNING, "RUNNING", "0:0"),
        ("slurm-scontrol-completed.txt", JobState.COMPLETED, "COMPLETED", "0:0"),
        ("slurm-scontrol-cancelled.txt", JobState.CANCELLED, "CANCELLED", "0:15"),
    ],
)
def test_slurm_scontrol(name: str, state: JobState, native: str, code: str) -> None:
    parsed = parse_scontrol(sample(name))
    assert parsed is not None
    assert parsed[0] == native
    assert Slurm().state_of(parsed[0]) is state
    assert parsed[1] == code


def test_slurm_squeue_sacct_and_job_id() -> None:
    assert parse_squeue(sample("slurm-squeue-running.txt")) == "RUNNING"
    assert parse_squeue("") is None  # finished jobs: no line, exit 0
    assert parse_scontrol("slurm_load_jobs error: Invalid job id specified") is None
    assert parse_sacct(sample("slurm-sacct.txt")) == ("TIMEOUT", "0:0")
    native, code = parse_sacct(sample("slurm-sacct-cancelled.txt")) or ("", None)
    assert Slurm().state_of(native) is JobState.CANCELLED and code == "0:15"
    assert Slurm().state_of("TIMEOUT") is JobState.TIMEOUT
    assert Slurm().state_of("OUT_OF_MEMORY") is JobState.FAILED
    assert Slurm().parse_job_id(sample("slurm-sbatch-parsable-cluster.txt")) == "4242"
    assert Slurm().parse_job_id("17\n") == "17"


@pytest.mark.parametrize(
    ("name", "state", "code"),
    [
        ("pbspro-qstat-f-running.txt", JobState.RUNNING, None),
        ("pbspro-qstat-xf-finished.txt", JobState.COMPLETED, "0"),
        ("pbspro-qstat-xf-walltime.txt", JobState.TIMEOUT, "-29"),
        ("torque-qstat-f-completed.txt", JobState.FAILED, "1"),
        ("torque-qstat-f-queued.txt", JobState.PENDING, None),
    ],
)
def test_pbs_qstat_f(name: str, state: JobState, code: str | None) -> None:
    attrs = parse_qstat_f(sample(name))
    got_state, native, got_code = state_from_attrs(attrs)
    assert (got_state, got_code) == (state, code)
    assert native == attrs["job_state"]


def test_pbs_wrapped_values_are_joined_and_job_id_parsed() -> None:
    attrs = parse_qstat_f(sample("pbspro-qstat-f-running.txt"))
    assert attrs["Job Id"] == "1234.pbs01"
    assert "PBS_O_WORKDIR=/home/alice/run" in attrs["Variable_List"]
    assert attrs["Variable_List"].endswith("PBS_O_HOST=login01")
    assert Pbs().parse_job_id(sample("qsub-pbspro.txt")) == "1234.pbs01"


def test_loadleveler_llq_and_llsubmit() -> None:
    native = parse_llq(sample("llq-l-running.txt"))
    assert native == "Running"
    assert LoadLeveler().state_of(native) is JobState.RUNNING
    assert parse_llq(sample("llq-l-none.txt")) is None
    assert LoadLeveler().state_of("Removed") is JobState.CANCELLED
    assert LoadLeveler().state_of("Idle") is JobState.PENDING
    job = LoadLeveler().parse_job_id(sample("llsubmit.txt"))
    assert job == "bp-login1.example.org.321.0"


def test_pending_reasons() -> None:
    from pmc.adapters.loadleveler import parse_llq_reason
    from pmc.adapters.pbs import reason_from_attrs
    from pmc.adapters.slurm import parse_scontrol_reason, parse_squeue_reason

    # Captured from the real one-node Slurm: a job waiting behind one that holds
    # every cpu, and one waiting on a dependency.
    assert parse_squeue_reason(sample("slurm-squeue-pending.txt")) == ("PENDING", "Priority")
    assert parse_squeue_reason(sample("slurm-squeue-dependency.txt")) == (
        "PENDING",
        "Dependency",
    )
    assert parse_scontrol_reason(sample("slurm-scontrol-pending.txt")) == "Priority"
    assert parse_scontrol_reason(sample("slurm-scontrol-running.txt")) is None  # Reason=None
    assert parse_squeue_reason("RUNNING|None\n") == ("RUNNING", None)
    assert parse_scontrol_reason("   JobState=PENDING Reason=launch failed requeued held "
                                 "Dependency=(null)\n") == "launch failed requeued held"
    attrs = parse_qstat_f(sample("pbspro-qstat-f-queued.txt"))
    assert reason_from_attrs(attrs) == (
        "Not Running: Insufficient amount of resource: ncpus (R: 64 A: 32 T: 64)"
    )
    assert reason_from_attrs(parse_qstat_f(sample("torque-qstat-f-queued.txt"))) is None
    assert parse_llq_reason(sample("llq-l-deferred.txt")) == (
        "Deferred until Mon 23 Nov 2026 06:00:00 AM UTC"
    )
    assert LoadLeveler().state_of("Deferred") is JobState.PENDING
