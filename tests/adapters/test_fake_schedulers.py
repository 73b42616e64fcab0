"""Submit → run → status → cancel through fake scheduler commands for every scheduler
and launcher: the generated script really runs in bash with the scheduler's
environment, and the DAG really runs on several MPI ranks."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from conftest import Fakes, base_profile, python_pmc, rescue_done

pytestmark = pytest.mark.mpi

CASES = [
    ("slurm", {}, "sbatch", "srun"),
    ("slurm", {"launcher": "mpiexec"}, "sbatch", "mpiexec"),
    ("slurm", {"launcher": "aprun", "ranks_per_node": 3}, "sbatch", "aprun"),
    ("pbs", {"flavor": "pro"}, "qsub", "mpiexec"),
    ("pbs", {"flavor": "torque", "launcher": "aprun"}, "qsub", "aprun"),
    ("loadleveler", {}, "llsubmit", "poe"),
]


@pytest.mark.parametrize(("scheduler", "extra", "submit_tool", "launcher"), CASES)
def test_submit_runs_the_dag_through_the_fakes(
    fakes: Fakes, scheduler: str, extra: dict[str, str], submit_tool: str, launcher: str
) -> None:
    site = fakes.profile("site.yaml", base_profile(scheduler, **extra))
    proc = fakes.pmc("submit", "--site", str(site), "diamond.dag", check=True)
    job_id = proc.stdout.strip()
    assert job_id, proc.stderr

    script = fakes.work / f"diamond.dag.{scheduler}.sh"
    assert script.exists()
    submits = fakes.calls(submit_tool)
    assert [c["argv"][-1] for c in submits] == [str(script)]
    launches = fakes.calls(launcher)
    assert len(launches) == 1
    # The launcher ran inside the job, with the scheduler's environment.
    env = launches[0]["env"]
    if scheduler == "slurm":
        assert env["SLURM_JOB_ID"] == job_id
    elif scheduler == "pbs":
        assert env["PBS_JOBID"] == job_id and Path(env["PBS_NODEFILE"]).exists()
        # The script moved from $HOME to the submit directory before running.
        assert launches[0]["cwd"] == str(fakes.work)
    else:
        assert env["LOADL_STEP_ID"] == job_id and env["LOADL_TOTAL_TASKS"] == "3"
    assert rescue_done(fakes.work / "diamond.dag.rescue") == ["A", "B", "C", "D"]
    out = fakes.job_output()
    assert "I am A" in out and "I am D" in out
    assert "pmc: run exited with status 0" in out

    status = fakes.pmc("jobs", "status", "--site", str(site), job_id, check=True)
    if scheduler == "loadleveler":
        # llq forgets finished jobs.
        assert "UNKNOWN" in status.stdout
    else:
        assert f"{job_id} COMPLETED" in status.stdout


def test_pbs_status_and_cancel_use_qstat_and_qdel(fakes: Fakes) -> None:
    site = fakes.profile("site.yaml", base_profile("pbs"))
    job_id = fakes.pmc("submit", "--site", str(site), "diamond.dag", check=True).stdout.strip()
    fakes.pmc("jobs", "cancel", "--scheduler", "pbs", job_id, check=True)
    assert fakes.calls("qdel")[0]["argv"] == [job_id]
    status = fakes.pmc("jobs", "status", "--scheduler", "pbs", job_id, check=True)
    assert f"{job_id} CANCELLED" in status.stdout
    # Live qstat first, then the PBS Pro history.
    assert [c["argv"] for c in fakes.calls("qstat")] == [["-f", job_id], ["-x", "-f", job_id]]


def test_slurm_cancel_and_status_of_unknown_job(fakes: Fakes) -> None:
    proc = fakes.pmc("jobs", "status", "--scheduler", "slurm", "999")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "999" in proc.stderr and "sacct" in proc.stderr
    proc = fakes.pmc("jobs", "cancel", "--scheduler", "slurm", "999")
    assert proc.returncode == 1
    assert "scancel 999" in proc.stderr and "no such job" in proc.stderr


def test_failed_task_reports_failed_job(fakes: Fakes) -> None:
    (fakes.work / "fail.dag").write_text("TASK A /bin/false\nTASK B /bin/echo b\nEDGE A B\n")
    site = fakes.profile("site.yaml", base_profile("slurm"))
    job_id = fakes.pmc("submit", "--site", str(site), "fail.dag", check=True).stdout.strip()
    status = fakes.pmc("jobs", "status", "--site", str(site), job_id, check=True)
    assert f"{job_id} FAILED" in status.stdout
    assert "pmc: run exited with status 1" in fakes.job_output()


def test_container_line_runs_pmc_inside_the_image(fakes: Fakes) -> None:
    image = fakes.work / "pmc.sif"
    image.write_bytes(b"fake image")
    data = base_profile(
        "slurm", container={"image": str(image), "binds": ["/scratch", "/data:/data:ro"]}
    )
    site = fakes.profile("site.yaml", data)
    fakes.pmc("submit", "--site", str(site), "diamond.dag", check=True)
    calls = fakes.calls("apptainer")
    assert len(calls) == 3  # one per rank
    argv = calls[0]["argv"]
    assert argv[:6] == ["exec", "--bind", "/scratch", "--bind", "/data:/data:ro", str(image)]
    assert argv[6:9] == [*python_pmc()[:1], "-m", "pmc"]
    assert "run" in argv and argv[-1] == str(fakes.work / "diamond.dag")
    assert rescue_done(fakes.work / "diamond.dag.rescue") == ["A", "B", "C", "D"]


def test_local_scheduler_runs_detached_and_reports_status(fakes: Fakes) -> None:
    data = base_profile("local")
    del data["walltime"]
    site = fakes.profile("site.yaml", data)
    job_id = fakes.pmc("submit", "--site", str(site), "diamond.dag", check=True).stdout.strip()
    assert job_id.isdigit()

    for _ in range(600):  # the job runs detached: wait for its exit record
        if (fakes.state / "local-jobs" / f"{job_id}.rc").exists():
            break
        time.sleep(0.1)
    status = fakes.pmc("jobs", "status", "--scheduler", "local", job_id, check=True)
    assert f"{job_id} COMPLETED" in status.stdout
    assert rescue_done(fakes.work / "diamond.dag.rescue") == ["A", "B", "C", "D"]
    assert "I am D" in (fakes.work / "diamond.dag.local.sh.out").read_text()


def _parallel_dag(n: int, seconds: int) -> str:
    lines = [
        f"TASK t{i} --expected-runtime {seconds} /bin/sh -c 'sleep {seconds}; echo t{i} >> ran.txt'"
        for i in range(n)
    ]
    return "\n".join(lines) + "\n"


def test_until_done_chain_resumes_until_the_workflow_succeeds(fakes: Fakes) -> None:
    # 8 tasks of 2 s on 2 workers = 16 s of work; each job may run 5 s (walltime 0:15
    # less a 10 s margin), so the chain needs several jobs.
    (fakes.work / "par.dag").write_text(_parallel_dag(8, 2))
    data = base_profile("pbs", walltime="0:15", walltime_margin="0:10")
    site = fakes.profile("site.yaml", data)
    proc = fakes.pmc("submit", "--site", str(site), "--until-done", "--max-jobs", "8", "par.dag")
    assert proc.returncode == 0, proc.stderr
    submits = fakes.calls("qsub")
    assert len(submits) >= 2
    # Follow-ups depend on the job before them and carry the chain index.
    for prev, nxt in itertools.pairwise(submits):
        assert "-W" in nxt["argv"] and any(a.startswith("depend=afterany:") for a in nxt["argv"])
        assert (
            int(nxt["env"]["PMC_CHAIN_INDEX"]) == int(prev["env"].get("PMC_CHAIN_INDEX", "1")) + 1
        )
    assert rescue_done(fakes.work / "par.dag.rescue") == sorted(f"t{i}" for i in range(8))
    ran = (fakes.work / "ran.txt").read_text().split()
    assert sorted(ran) == sorted(f"t{i}" for i in range(8)), "a finished task ran again"
    assert "pmc: run exited with status 0" in fakes.job_output()


def test_until_done_chain_stops_at_max_jobs(fakes: Fakes) -> None:
    # A job runs at most 2 rounds of 2 tasks here: 12 tasks cannot finish in 2 jobs.
    (fakes.work / "par.dag").write_text(_parallel_dag(12, 2))
    data = base_profile("slurm", walltime="0:15", walltime_margin="0:10")
    site = fakes.profile("site.yaml", data)
    fakes.pmc(
        "submit", "--site", str(site), "--until-done", "--max-jobs", "2", "par.dag", check=True
    )
    assert len(fakes.calls("sbatch")) == 2
    out = fakes.job_output()
    assert "workflow incomplete after 2 jobs; chain ends" in out
    assert "--dependency=afterany:100" in fakes.calls("sbatch")[1]["argv"]
    done = rescue_done(fakes.work / "par.dag.rescue")
    assert 0 < len(done) < 12
