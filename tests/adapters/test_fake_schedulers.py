"""Submit → run → status → cancel through fake scheduler commands for every scheduler
and launcher: the generated script really runs in bash with the scheduler's
environment, and the DAG really runs on several MPI ranks. Chains run both ways:
``pmc submit --until-done`` and ``pmc script --until-done`` saved and submitted by
hand."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from adapterkit import Fakes, base_profile, python_pmc
from pmctest import rescue_done

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


def test_pbs_status_shows_the_comment_and_cancel_uses_qdel(fakes: Fakes) -> None:
    site = fakes.profile("site.yaml", base_profile("pbs"))
    fakes.env["FAKE_HOLD"] = "Not Running: Insufficient amount of resource: ncpus"
    job_id = fakes.pmc("submit", "--site", str(site), "diamond.dag", check=True).stdout.strip()
    status = fakes.pmc("jobs", "status", "--scheduler", "pbs", job_id, check=True)
    assert status.stdout.strip() == (
        f"{job_id} PENDING (native: Q, reason: Not Running: Insufficient amount of "
        "resource: ncpus)"
    )
    proc = fakes.pmc("jobs", "cancel", "--scheduler", "pbs", job_id, check=True)
    assert f"cancelled pbs job {job_id} (was PENDING)" in proc.stderr
    assert fakes.calls("qdel")[0]["argv"] == [job_id]
    status = fakes.pmc("jobs", "status", "--scheduler", "pbs", job_id, check=True)
    assert f"{job_id} CANCELLED" in status.stdout
    # Cancelling it again is an error: it has ended.
    proc = fakes.pmc("jobs", "cancel", "--scheduler", "pbs", job_id)
    assert proc.returncode == 1
    assert f"pbs job {job_id}: not cancelled: it has already ended (CANCELLED" in proc.stderr
    assert len(fakes.calls("qdel")) == 1


def test_slurm_pending_reason_and_cancel(fakes: Fakes) -> None:
    site = fakes.profile("site.yaml", base_profile("slurm"))
    fakes.env["FAKE_HOLD"] = "Resources"
    job_id = fakes.pmc("submit", "--site", str(site), "diamond.dag", check=True).stdout.strip()
    status = fakes.pmc("jobs", "status", "--site", str(site), job_id, check=True)
    assert status.stdout.strip() == f"{job_id} PENDING (native: PENDING, reason: Resources)"
    fakes.pmc("jobs", "cancel", "--site", str(site), job_id, check=True)
    assert fakes.calls("scancel")[0]["argv"] == [job_id]


def test_loadleveler_pending_status_is_the_reason(fakes: Fakes) -> None:
    site = fakes.profile("site.yaml", base_profile("loadleveler"))
    fakes.env["FAKE_HOLD"] = "Deferred"
    job_id = fakes.pmc("submit", "--site", str(site), "diamond.dag", check=True).stdout.strip()
    status = fakes.pmc("jobs", "status", "--site", str(site), job_id, check=True)
    assert status.stdout.strip() == f"{job_id} PENDING (native: Deferred, reason: Deferred)"


def test_slurm_cancel_and_status_of_unknown_job(fakes: Fakes) -> None:
    proc = fakes.pmc("jobs", "status", "--scheduler", "slurm", "999")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "999" in proc.stderr and "sacct" in proc.stderr
    # scancel itself exits 0 for an unknown id: pmc asks first and refuses.
    proc = fakes.pmc("jobs", "cancel", "--scheduler", "slurm", "999")
    assert proc.returncode == 1
    assert proc.stderr.startswith("pmc: error: slurm job 999: not cancelled: ")
    assert "cancelled slurm job" not in proc.stderr
    assert fakes.calls("scancel") == []


def test_cancel_of_a_finished_job_is_an_error(fakes: Fakes) -> None:
    site = fakes.profile("site.yaml", base_profile("slurm"))
    job_id = fakes.pmc("submit", "--site", str(site), "diamond.dag", check=True).stdout.strip()
    proc = fakes.pmc("jobs", "cancel", "--site", str(site), job_id, "999")
    assert proc.returncode == 1
    assert f"slurm job {job_id}: not cancelled: it has already ended (COMPLETED" in proc.stderr
    assert "slurm job 999: not cancelled" in proc.stderr  # every id is answered


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


def _wait_local(fakes: Fakes, job_id: str) -> None:
    for _ in range(600):  # the job runs detached: wait for its exit record
        if (fakes.state / "local-jobs" / f"{job_id}.rc").exists():
            return
        time.sleep(0.1)
    raise AssertionError(f"local job {job_id} left no exit record")


def test_local_scheduler_runs_detached_and_reports_status(fakes: Fakes) -> None:
    data = base_profile("local")
    del data["walltime"]
    site = fakes.profile("site.yaml", data)
    job_id = fakes.pmc("submit", "--site", str(site), "diamond.dag", check=True).stdout.strip()
    pid, start = job_id.split("-")
    assert pid.isdigit() and start.isdigit()
    _wait_local(fakes, job_id)
    status = fakes.pmc("jobs", "status", "--scheduler", "local", job_id, check=True)
    assert f"{job_id} COMPLETED" in status.stdout
    assert rescue_done(fakes.work / "diamond.dag.rescue") == ["A", "B", "C", "D"]
    assert "I am D" in (fakes.work / "diamond.dag.local.sh.out").read_text()
    proc = fakes.pmc("jobs", "cancel", "--scheduler", "local", job_id)
    assert proc.returncode == 1 and "it has already ended (COMPLETED" in proc.stderr


def _gated_local_job(fakes: Fakes) -> str:
    """A local job whose one task, A, has started and waits until ``release`` exists."""
    data = base_profile("local")
    del data["walltime"]
    site = fakes.profile("site.yaml", data)
    (fakes.work / "gate.dag").write_text(
        "TASK A /bin/sh -c 'touch started; while [ ! -e release ]; do sleep 0.1; done'\n")
    job_id = fakes.pmc("submit", "--site", str(site), "gate.dag", check=True).stdout.strip()
    deadline = time.monotonic() + 60
    while not (fakes.work / "started").exists():
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.1)
    return job_id


def test_a_warning_to_the_batch_shell_alone_does_not_end_the_job(fakes: Fakes) -> None:
    """Slurm's --signal=B:USR1@60 reaches the batch shell only: the script traps it (pmc
    run acts on the warnings its ranks get) and the job runs to its end."""
    import os
    import signal

    job_id = _gated_local_job(fakes)
    os.kill(int(job_id.split("-")[0]), signal.SIGUSR1)
    time.sleep(0.5)
    (fakes.work / "release").touch()
    _wait_local(fakes, job_id)
    status = fakes.pmc("jobs", "status", "--scheduler", "local", job_id, check=True)
    assert f"{job_id} COMPLETED" in status.stdout
    out = (fakes.work / "gate.dag.local.sh.out").read_text()
    assert "pmc: batch script got a warning signal; pmc run acts on those sent to its " \
           "ranks" in out
    assert rescue_done(fakes.work / "gate.dag.rescue") == ["A"]


def test_a_cancelled_local_job_reads_cancelled(fakes: Fakes) -> None:
    """The script drains pmc run on SIGTERM and records its exit code (3, incomplete);
    status still says the job was cancelled, not that it failed."""
    job_id = _gated_local_job(fakes)
    fakes.pmc("jobs", "cancel", "--scheduler", "local", job_id, check=True)
    _wait_local(fakes, job_id)
    status = fakes.pmc("jobs", "status", "--scheduler", "local", job_id, check=True)
    assert status.stdout.startswith(f"{job_id} CANCELLED (native: cancelled, exited "), \
        status.stdout
    assert rescue_done(fakes.work / "gate.dag.rescue") == []
    proc = fakes.pmc("jobs", "cancel", "--scheduler", "local", job_id)
    assert proc.returncode == 1 and "it has already ended (CANCELLED" in proc.stderr


def test_local_job_is_not_confused_with_a_process_that_reuses_its_pid(fakes: Fakes) -> None:
    # A live process with the job's PID but another start time (what PID reuse looks
    # like): the job is not running, and cancel must not signal that process.
    import os
    import subprocess

    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        stat = Path(f"/proc/{other.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert stat[19].isdigit()
        reused = f"{other.pid}-{int(stat[19]) + 1}"
        status = fakes.pmc("jobs", "status", "--scheduler", "local", reused, check=True)
        assert status.stdout.strip().startswith(f"{reused} UNKNOWN")
        proc = fakes.pmc("jobs", "cancel", "--scheduler", "local", reused)
        assert proc.returncode == 1 and "not cancelled" in proc.stderr
        assert other.poll() is None, "cancel signalled a process that is not the job"
        # The bare PID is refused, with what to give instead.
        proc = fakes.pmc("jobs", "status", "--scheduler", "local", str(other.pid))
        assert proc.returncode == 1 and "expected PID-STARTTIME" in proc.stderr
        mine = f"{other.pid}-{stat[19]}"
        status = fakes.pmc("jobs", "status", "--scheduler", "local", mine, check=True)
        assert status.stdout.strip().startswith(f"{mine} RUNNING")
    finally:
        os.killpg(other.pid, 15)
        other.wait()


def _parallel_dag(n: int, seconds: int) -> str:
    lines = [
        f"TASK t{i} --expected-runtime {seconds} /bin/sh -c 'sleep {seconds}; echo t{i} >> ran.txt'"
        for i in range(n)
    ]
    return "\n".join(lines) + "\n"


def _chain_lines(fakes: Fakes, dag: str) -> list[dict[str, str]]:
    text = (fakes.work / f"{dag}.chain").read_text()
    return [dict(w.split("=", 1) for w in line.split()[1:]) for line in text.splitlines()]


def _check_chain(fakes: Fakes, dag: str, submit_tool: str, n_tasks: int,
                 ahead: bool = True) -> list[str]:
    """Every link but the last ended as a success and named its follow-up; the last
    link's exit status is the workflow's; no finished task ran twice. Queued ahead
    (``ahead``), each link queued the next as it started, and the last one's, not
    needed, was cancelled: no job is left waiting. The job ids of the links, in order."""
    submits = fakes.calls(submit_tool)
    events = _chain_lines(fakes, dag)
    ended = {int(e["link"]): e for e in events if e["event"] == "ended"}
    cancelled = [e for e in events if e["event"] == "cancelled"]
    links = sorted(ended)
    assert len(links) >= 2
    assert links == list(range(1, len(submits) + 1 - len(cancelled)))
    jobs = [ended[i]["job"] for i in links]
    assert len(set(jobs)) == len(jobs) and {e["chain"] for e in ended.values()} == {jobs[0]}
    for i in links[:-1]:
        assert (ended[i]["status"], ended[i]["outcome"]) == ("3", "continued")
        assert ended[i]["next"] == jobs[i]
        assert fakes.calls and _job_rc(fakes, jobs[i - 1]) == 0, "a continued link failed"
    assert (ended[links[-1]]["status"], ended[links[-1]]["outcome"]) == ("0", "succeeded")
    assert _job_rc(fakes, jobs[-1]) == 0
    names = sorted(f"t{i}" for i in range(n_tasks))
    assert rescue_done(fakes.work / f"{dag}.rescue") == names
    ran = (fakes.work / "ran.txt").read_text().split()
    assert sorted(ran) == names, "a finished task ran again"
    out = fakes.job_output()
    for i in links[:-1]:
        if ahead:
            assert (f"queued job {jobs[i]} as link {i + 1} of at most 8 in chain {jobs[0]}, "
                    "to start when this job ends") in out
            assert (f"job {jobs[i]}, queued as link {i + 1} of at most 8 in chain {jobs[0]}, "
                    "goes on; this link ends as a success") in out
        else:
            assert (f"submitted job {jobs[i]} as link {i + 1} of at most 8 in chain "
                    f"{jobs[0]}; this link ends as a success") in out
    if ahead:
        [extra] = cancelled
        assert (extra["link"], extra["by"]) == (str(links[-1] + 1), jobs[-1])
        assert f"cancelled job {extra['job']}, queued as link {links[-1] + 1}" in out
        assert json.loads((fakes.state / f"job-{extra['job']}.json").read_text()) == {
            "rc": 271, "cancelled": True}, "the link not needed never ran"
    else:
        assert not cancelled
    return jobs


def _job_rc(fakes: Fakes, job_id: str) -> int:
    import json

    rc: int = json.loads((fakes.state / f"job-{job_id}.json").read_text())["rc"]
    return rc


@pytest.mark.slow
def test_until_done_chain_resumes_until_the_workflow_succeeds(fakes: Fakes) -> None:
    # 8 tasks of 2 s on 2 workers = 8 s of work; each job may run 5 s (walltime
    # 00:00:15 less a 10 s margin), so the chain needs several jobs.
    (fakes.work / "par.dag").write_text(_parallel_dag(8, 2))
    data = base_profile("pbs", walltime="00:00:15", walltime_margin="00:00:10")
    site = fakes.profile("site.yaml", data)
    proc = fakes.pmc("submit", "--site", str(site), "--until-done", "--max-jobs", "8", "par.dag")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.strip()
    assert f"pmc: chain {first}: up to 8 jobs" in proc.stderr
    submits = fakes.calls("qsub")
    # Follow-ups depend on the job before them and carry the chain's id and index.
    for prev, nxt in itertools.pairwise(submits):
        assert "-W" in nxt["argv"] and any(a.startswith("depend=afterany:") for a in nxt["argv"])
        assert nxt["env"]["PMC_CHAIN_ID"] == first
        assert (
            int(nxt["env"]["PMC_CHAIN_INDEX"]) == int(prev["env"].get("PMC_CHAIN_INDEX", "1")) + 1
        )
    jobs = _check_chain(fakes, "par.dag", "qsub", 8)
    assert jobs[0] == first

    # Any link's id, or the DAG, shows the whole chain.
    for arg in (jobs[1], "par.dag"):
        status = fakes.pmc("jobs", "status", "--scheduler", "pbs", arg, check=True)
        lines = status.stdout.splitlines()
        # The link queued behind the last one, cancelled, is in the chain too.
        assert lines[0].startswith(f"chain {first} (") and lines[0].endswith(
            f": {len(jobs) + 1} links, succeeded"
        )
        for i, job in enumerate(jobs[:-1], 1):
            assert lines[i] == (
                f"  link {i}: job {job} COMPLETED (native: F, exit 0); pmc run exit 3: "
                f"incomplete by design, continued as job {jobs[i]}"
            )
        assert lines[-2].endswith("pmc run exit 0: workflow succeeded")
        assert lines[-1].endswith("CANCELLED (native: F, exit 271); cancelled before it "
                                  "started: the workflow ended in the link before")


@pytest.mark.slow
@pytest.mark.parametrize(("scheduler", "submit_tool", "follow_up"),
                         [("slurm", "sbatch", "ahead"), ("pbs", "qsub", "at-end")])
def test_until_done_script_saved_and_submitted_by_hand(
    fakes: Fakes, scheduler: str, submit_tool: str, follow_up: str
) -> None:
    # `pmc script --until-done > job.sh && sbatch job.sh`: the follow-ups are the
    # batch system's copy of job.sh ($0), not a file pmc would have written. The links
    # queue the next as they start, or (--follow-up at-end) submit it as they end.
    (fakes.work / "par.dag").write_text(_parallel_dag(8, 2))
    data = base_profile(scheduler, walltime="00:00:15", walltime_margin="00:00:10")
    site = fakes.profile("site.yaml", data)
    proc = fakes.pmc("script", "--site", str(site), "--until-done", "--max-jobs", "8",
                     "--follow-up", follow_up, "par.dag")
    assert proc.returncode == 0, proc.stderr
    (fakes.work / "job.sh").write_text(proc.stdout)
    import subprocess

    sub = subprocess.run(
        [submit_tool, "job.sh"], cwd=fakes.work, env=fakes.env, capture_output=True, text=True
    )
    assert sub.returncode == 0, sub.stderr
    assert not (fakes.work / f"par.dag.{scheduler}.sh").exists()
    jobs = _check_chain(fakes, "par.dag", submit_tool, 8, ahead=follow_up == "ahead")
    # Follow-ups were submitted from the spooled copy of job.sh.
    for call in fakes.calls(submit_tool)[1:]:
        assert re.search(r"spool-[^/]*\.sh$", call["argv"][-1]), call["argv"]
    status = fakes.pmc("jobs", "status", "--scheduler", scheduler, jobs[-1], check=True)
    assert status.stdout.startswith(f"chain {jobs[0]} (")


@pytest.mark.slow
def test_until_done_chain_stops_at_max_jobs(fakes: Fakes) -> None:
    # A job runs at most 2 rounds of 2 tasks here: 12 tasks cannot finish in 2 jobs.
    (fakes.work / "par.dag").write_text(_parallel_dag(12, 2))
    data = base_profile("slurm", walltime="00:00:15", walltime_margin="00:00:10")
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
    # The link that handed over succeeded; the last one carries the workflow's status.
    assert (_job_rc(fakes, "100"), _job_rc(fakes, "101")) == (0, 3)
    status = fakes.pmc("jobs", "status", "--scheduler", "slurm", "100", check=True)
    assert status.stdout.splitlines()[0].endswith("2 links, ended incomplete (max-jobs)")


@pytest.mark.slow
def test_local_chain_runs_detached_links(fakes: Fakes) -> None:
    (fakes.work / "par.dag").write_text(_parallel_dag(6, 2))
    data = base_profile("local", walltime="00:00:15", walltime_margin="00:00:10")
    site = fakes.profile("site.yaml", data)
    first = fakes.pmc(
        "submit", "--site", str(site), "--until-done", "--max-jobs", "8", "par.dag", check=True
    ).stdout.strip()
    deadline = time.monotonic() + 200
    while True:
        entries = _chain_lines(fakes, "par.dag")
        last = [e for e in entries if e["event"] == "ended" and e["outcome"] != "continued"]
        if last:
            break
        assert time.monotonic() < deadline, entries
        time.sleep(0.5)
    assert last[0]["outcome"] == "succeeded"
    ended = sorted((int(e["link"]), e["job"]) for e in entries if e["event"] == "ended")
    assert len(ended) >= 2 and ended[0][1] == first
    for _, job in ended:
        _wait_local(fakes, job)
        status = fakes.pmc("jobs", "status", "--scheduler", "local", job).stdout
        assert f"job {job} COMPLETED" in status


def test_a_queued_link_that_starts_after_the_workflow_ended_does_nothing(
        fakes: Fakes) -> None:
    """The workflow ends in link 1 and the cancel of link 2, queued behind it, fails
    (qdel refused): link 2 starts, finds that link 1 did not hand over, records itself
    skipped and exits 0 without running pmc."""
    site = fakes.profile("site.yaml", base_profile("pbs"))
    fakes.env["FAKE_CANCEL_FAILS"] = "1"
    first = fakes.pmc("submit", "--site", str(site), "--until-done", "--max-jobs", "4",
                      "diamond.dag", check=True).stdout.strip()
    # (pmc submit notes link 1 as submitted once qsub returns: here, after the jobs ran.)
    events = [e for e in _chain_lines(fakes, "diamond.dag")
              if (e["link"], e["event"]) != ("1", "submitted")]
    second = next(e["job"] for e in events if e["event"] == "submitted")
    assert [(e["link"], e["event"], e.get("outcome")) for e in events] == [
        ("1", "started", None), ("2", "submitted", None), ("1", "ended", "succeeded"),
        ("2", "started", None), ("2", "ended", "skipped")]
    assert events[-1]["status"] == "-" and events[-1]["next"] == "-"
    assert [c["argv"][-1] for c in fakes.calls("qdel")] == [second]
    assert len(fakes.calls("mpiexec")) == 1, "pmc ran in the link not needed"
    assert (_job_rc(fakes, first), _job_rc(fakes, second)) == (0, 0)
    first_out = (fakes.state / f"job-{first}.out").read_text()
    assert f"could not cancel job {second}, queued as link 2: it ends at once when it " \
           "starts" in first_out
    second_out = (fakes.state / f"job-{second}.out").read_text()
    assert f"pmc: link 1 of chain {first} did not hand over to this one " \
           "(outcome=succeeded): the chain has ended; nothing to do" in second_out
    assert "pmc: run exited" not in second_out
    assert rescue_done(fakes.work / "diamond.dag.rescue") == ["A", "B", "C", "D"]
    lines = fakes.pmc("jobs", "status", "--scheduler", "pbs", first,
                      check=True).stdout.splitlines()
    assert lines[0].endswith(": 2 links, succeeded")
    assert lines[2] == (f"  link 2: job {second} COMPLETED (native: F, exit 0); started after "
                        "the workflow had ended in the link before; did nothing")


def _pmc_ranks(work: Path) -> list[int]:
    """The processes of ``pmc run`` (every rank and keeper) started in ``work``: the
    tasks of the job step, which Slurm's --signal reaches (not the launcher)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cwd == str(work) and argv[1:4] == [b"-m", b"pmc", b"run"]:
            pids.append(int(proc.name))
    return pids


def _wait_for(what: str, check: Callable[[], object], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_warning_that_time_is_short_hands_over_to_the_queued_link(fakes: Fakes) -> None:
    """A chain on Slurm: while link 1 runs, pmc jobs status shows link 2 queued behind
    it (pending, reason Dependency). SIGUSR1 to every rank of link 1 (Slurm's
    --signal=USR1@60): no task starts any more, the running one ends, pmc exits 3 and
    link 2 carries on from the rescue log; every task runs once."""
    (fakes.work / "w.dag").write_text(
        "TASK A /bin/sh -c 'touch started; while [ ! -e release ]; do sleep 0.1; done; "
        "echo A $PMC_JOB_ID >> ran.txt'\n"
        "TASK B /bin/sh -c 'echo B $PMC_JOB_ID >> ran.txt'\n"
        "TASK C /bin/sh -c 'echo C $PMC_JOB_ID >> ran.txt'\n"
        "EDGE A B\nEDGE A C\n")
    site = fakes.profile("site.yaml", base_profile("slurm"))
    submit = subprocess.Popen(
        [sys.executable, "-m", "pmc", "submit", "--site", str(site), "--until-done",
         "--max-jobs", "4", "w.dag"], cwd=fakes.work, env=fakes.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("task A started", (fakes.work / "started").exists)
        chain = fakes.work / "w.dag.chain"
        _wait_for("link 2 queued", lambda: "event=submitted" in chain.read_text())
        first, second = (e["job"] for e in _chain_lines(fakes, "w.dag")
                         if e["event"] in ("started", "submitted"))
        lines = fakes.pmc("jobs", "status", "--scheduler", "slurm", first,
                          check=True).stdout.splitlines()
        assert lines == [
            f"chain {first} ({chain}): 2 links, running (link 1); link 2 (job {second}) "
            "queued behind it",
            f"  link 1: job {first} RUNNING (native: RUNNING); pmc run has not ended",
            f"  link 2: job {second} PENDING (native: PENDING, reason: Dependency); "
            "not started"]

        ranks = _pmc_ranks(fakes.work)
        assert len(ranks) >= 3, ranks  # the master and two workers, at least
        for pid in ranks:
            os.kill(pid, signal.SIGUSR1)
        out = fakes.state / f"job-{first}.out"
        # The master tells of the first warning to reach it: its own signal's, or a
        # worker's message (whichever the master takes first; the other then finds the
        # run draining).
        warning = re.compile(r"^\[warn\] (Caught|Worker \d+ caught) signal 10 \(SIGUSR1\): "
                             r"time is short: no task starts any more", re.M)
        _wait_for("the master's warning", lambda: warning.search(out.read_text()))
    finally:
        # Whatever happened, the task ends and the chain with it.
        (fakes.work / "release").touch()
        try:
            _, err = submit.communicate(timeout=240)
        finally:
            submit.kill()
    assert submit.returncode == 0, err
    ended = {e["link"]: e for e in _chain_lines(fakes, "w.dag") if e["event"] == "ended"}
    assert (ended["1"]["status"], ended["1"]["outcome"], ended["1"]["next"]) == (
        "3", "continued", second)
    assert (ended["2"]["status"], ended["2"]["outcome"]) == ("0", "succeeded")
    assert "Workflow incomplete: received SIGUSR1, a warning that time is short; run " \
           "again to resume from" in out.read_text()
    ran = sorted((fakes.work / "ran.txt").read_text().splitlines())
    assert ran == [f"A {first}", f"B {second}", f"C {second}"]
    assert rescue_done(fakes.work / "w.dag.rescue") == ["A", "B", "C"]
    assert (_job_rc(fakes, first), _job_rc(fakes, second)) == (0, 0)
