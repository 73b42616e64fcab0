"""Real DAGs through the real one-node Slurm cluster (ci/slurm-up.sh): submit, status,
a failing task then resume, cancel (and cancel of an unknown job), the pending reason,
and a continuation chain across allocations, both from ``pmc submit --until-done`` (each
link queued behind the one before as that one starts: pmc jobs status shows it pending
with the reason Dependency, Slurm's SubmitTime of the next before EndTime of the last,
and nothing left in the queue at the end) and from ``pmc
script --until-done --follow-up at-end`` saved and submitted with sbatch by hand."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from pmctest import rescue_done

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "configs" / "site-slurm-local.yaml"


def job_env(cwd: Path) -> dict[str, str]:
    # The job inherits this environment (sbatch --export=ALL): put this Python's pmc first,
    # and keep the chain index out of the user's own state directory.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMC_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        XDG_STATE_HOME=str(cwd / ".state"),
        XDG_CONFIG_HOME=str(cwd / ".config"),
    )
    return env


def pmc(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = job_env(cwd)
    return subprocess.run(
        [sys.executable, "-m", "pmc", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def submit(cwd: Path, *args: str) -> str:
    proc = pmc(cwd, "submit", *args)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout
    return job_id


def wait_finished(cwd: Path, job_id: str, limit: float = 180) -> str:
    """Poll ``pmc jobs status`` until the job has ended; return its status line."""
    deadline = time.monotonic() + limit
    while True:
        proc = pmc(cwd, "jobs", "status", "--scheduler", "slurm", job_id)
        assert proc.returncode == 0, proc.stderr
        line = proc.stdout.strip()
        state = line.split()[1]
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return line
        assert time.monotonic() < deadline, f"job {job_id} still {state}"
        time.sleep(0.5)


def test_diamond_runs_through_slurm(tmp_path: Path) -> None:
    (tmp_path / "diamond.dag").write_text((REPO / "examples" / "diamond.dag").read_text())
    job_id = submit(tmp_path, "--site", str(PROFILE), "diamond.dag")
    status = wait_finished(tmp_path, job_id)
    assert status.startswith(f"{job_id} COMPLETED")
    assert rescue_done(tmp_path / "diamond.dag.rescue") == ["A", "B", "C", "D"]
    out = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert "I am D" in out and "pmc: run exited with status 0" in out
    # Three ranks under srun: one master, two workers.
    assert "slots=2" in out


def test_failed_task_then_resume_without_rerunning(tmp_path: Path) -> None:
    (tmp_path / "flaky.dag").write_text(
        "TASK A /bin/sh -c 'echo A >> ran.txt'\n"
        "TASK B /bin/sh -c 'test -f ok && echo B >> ran.txt'\n"
        "TASK C /bin/sh -c 'echo C >> ran.txt'\n"
        "EDGE A B\nEDGE B C\n"
    )
    first = submit(tmp_path, "--site", str(PROFILE), "flaky.dag")
    assert wait_finished(tmp_path, first).startswith(f"{first} FAILED")
    assert rescue_done(tmp_path / "flaky.dag.rescue") == ["A"]
    (tmp_path / "ok").write_text("")
    second = submit(tmp_path, "--site", str(PROFILE), "flaky.dag")
    assert wait_finished(tmp_path, second).startswith(f"{second} COMPLETED")
    assert rescue_done(tmp_path / "flaky.dag.rescue") == ["A", "B", "C"]
    assert (tmp_path / "ran.txt").read_text().split() == ["A", "B", "C"]


def test_cancel(tmp_path: Path) -> None:
    (tmp_path / "slow.dag").write_text("TASK A /bin/sleep 120\n")
    job_id = submit(tmp_path, "--site", str(PROFILE), "slow.dag")
    proc = pmc(tmp_path, "jobs", "cancel", "--scheduler", "slurm", job_id)
    assert proc.returncode == 0, proc.stderr
    assert wait_finished(tmp_path, job_id).startswith(f"{job_id} CANCELLED")


def test_cancel_of_unknown_or_ended_job_is_an_error(tmp_path: Path) -> None:
    # scancel itself exits 0 and says nothing for both.
    proc = pmc(tmp_path, "jobs", "cancel", "--scheduler", "slurm", "987654")
    assert proc.returncode == 1
    assert proc.stderr.startswith("pmc: error: slurm job 987654: not cancelled: ")
    (tmp_path / "one.dag").write_text("TASK A /bin/true\n")
    job_id = submit(tmp_path, "--site", str(PROFILE), "one.dag")
    assert wait_finished(tmp_path, job_id).startswith(f"{job_id} COMPLETED")
    proc = pmc(tmp_path, "jobs", "cancel", "--scheduler", "slurm", job_id)
    assert proc.returncode == 1
    assert f"slurm job {job_id}: not cancelled: it has already ended (COMPLETED" in proc.stderr


def test_pending_job_shows_the_reason(tmp_path: Path) -> None:
    (tmp_path / "one.dag").write_text("TASK A /bin/true\n")
    # Held at submission: Slurm says why it waits (JobHeldUser).
    script = pmc(tmp_path, "script", "--site", str(PROFILE), "--set", "directives=[--hold]",
                 "one.dag")
    assert script.returncode == 0, script.stderr
    (tmp_path / "held.sh").write_text(script.stdout)
    job_id = subprocess.run(
        ["sbatch", "--parsable", "held.sh"], cwd=tmp_path, env=job_env(tmp_path),
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    try:
        status = pmc(tmp_path, "jobs", "status", "--scheduler", "slurm", job_id)
        assert status.stdout.strip() == (
            f"{job_id} PENDING (native: PENDING, reason: JobHeldUser)"
        ), status.stdout + status.stderr
        proc = pmc(tmp_path, "jobs", "cancel", "--scheduler", "slurm", job_id)
        assert proc.returncode == 0 and "(was PENDING)" in proc.stderr
    finally:
        subprocess.run(["scancel", job_id], check=False)
    assert wait_finished(tmp_path, job_id).startswith(f"{job_id} CANCELLED")


def long_dag(cwd: Path) -> list[str]:
    # 12 tasks of 6 s = 36 s of work on two workers; an allocation is 1 minute, and pmc
    # run stops after 20 s (40 s margin), so no single job can finish the DAG.
    names = [f"t{i:02d}" for i in range(12)]
    lines = [
        f"TASK {n} --expected-runtime 6 /bin/sh -c 'sleep 6; echo {n} >> ran.txt'"
        for n in names
    ]
    (cwd / "long.dag").write_text("\n".join(lines) + "\n")
    profile = yaml.safe_load(PROFILE.read_text())
    profile.update(walltime=1, walltime_margin="00:00:40")
    (cwd / "site.yaml").write_text(yaml.safe_dump(profile))
    return names


def chain_events(cwd: Path) -> list[dict[str, str]]:
    path = cwd / "long.dag.chain"
    if not path.exists():
        return []
    return [dict(w.split("=", 1) for w in ln.split()[1:]) for ln in path.read_text().splitlines()]


def wait_chain(cwd: Path, limit: float = 300) -> list[tuple[str, str, str]]:
    """Wait for the chain's last link to end; (job, pmc status, outcome) per link."""
    deadline = time.monotonic() + limit
    while True:
        ended = {int(e["link"]): e for e in chain_events(cwd) if e["event"] == "ended"}
        if ended and ended[max(ended)]["outcome"] != "continued":
            return [
                (ended[i]["job"], ended[i]["status"], ended[i]["outcome"]) for i in sorted(ended)
            ]
        assert time.monotonic() < deadline, f"chain did not finish: {chain_events(cwd)}"
        time.sleep(1)


def scontrol_times(job: str) -> tuple[str, str]:
    """(SubmitTime, EndTime) of a job as Slurm recorded them (ISO, to the second)."""
    show = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                          check=True).stdout
    fields = dict(w.split("=", 1) for w in show.split() if "=" in w)
    return fields["SubmitTime"], fields["EndTime"]


def check_chain(cwd: Path, names: list[str], first: str, ahead: bool) -> None:
    links = wait_chain(cwd)
    assert len(links) >= 2, links
    assert links[0][0] == first
    assert [(s, o) for _, s, o in links[:-1]] == [("3", "continued")] * (len(links) - 1)
    assert links[-1][1:] == ("0", "succeeded"), links
    assert rescue_done(cwd / "long.dag.rescue") == names
    ran = (cwd / "ran.txt").read_text().split()
    assert sorted(ran) == names, "a finished task ran again"
    jobs = [job for job, _, _ in links]
    # Queued ahead: each link's successor was in the queue before it ended; the one
    # queued behind the last link, not needed, was cancelled.
    cancelled = [e["job"] for e in chain_events(cwd) if e["event"] == "cancelled"]
    # (Slurm's times are to the second: a link that ended the second it started, as one
    # whose ranks could not start does, may end as its successor is queued.) Submitted
    # at the end, the successor is queued by the link's script just before it exits:
    # its SubmitTime is the link's EndTime or, across a second's turn, the second before.
    for i, (before, after) in enumerate(itertools.pairwise(jobs)):
        submitted, _ = scontrol_times(after)
        _, ended = scontrol_times(before)
        if not ahead:
            gap = datetime.fromisoformat(ended) - datetime.fromisoformat(submitted)
            assert gap <= timedelta(seconds=1), (before, ended, after, submitted)
        elif i == 0:  # the first link runs its 20 s: its successor queued well before
            assert submitted < ended, (before, ended, after, submitted)
        else:
            assert submitted <= ended, (before, ended, after, submitted)
    assert len(cancelled) == (1 if ahead else 0)
    # Nothing of the chain is left waiting in the queue.
    deadline = time.monotonic() + 60
    while True:
        queue = subprocess.run(["squeue", "-h", "-o", "%i %T", "-j", ",".join(jobs + cancelled)],
                               capture_output=True, text=True, check=False).stdout
        if not queue.strip():
            break
        assert time.monotonic() < deadline, f"still in the queue: {queue}"
        time.sleep(1)
    # Every link COMPLETED in Slurm (a link that handed over exits 0), the cancelled one
    # CANCELLED, and any link's id shows the whole chain.
    for job in jobs:
        deadline = time.monotonic() + 60
        while True:
            report = pmc(cwd, "jobs", "status", "--scheduler", "slurm", job)
            assert report.returncode == 0, report.stderr
            lines = report.stdout.splitlines()
            if all("COMPLETED (native: COMPLETED, exit 0:0)" in ln
                   for ln in lines[1:len(jobs) + 1]):
                break
            assert time.monotonic() < deadline, report.stdout
            time.sleep(1)
        assert lines[0].startswith(f"chain {first} (") and lines[0].endswith(
            f": {len(jobs) + len(cancelled)} links, succeeded"
        ), lines
        assert [ln.split()[3] for ln in lines[1:]] == jobs + cancelled
        for ln in lines[len(jobs) + 1:]:
            assert " CANCELLED (native: CANCELLED" in ln and "cancelled before it started" \
                in ln, ln
    out = "".join((cwd / f"slurm-{job}.out").read_text() for job in jobs)
    for i, job in enumerate(jobs[1:], 2):
        if ahead:
            assert (f"queued job {job} as link {i} of at most 6 in chain {first}, to start "
                    "when this job ends") in out
        else:
            assert f"submitted job {job} as link {i} of at most 6 in chain {first}" in out


def check_queued_link(cwd: Path, first: str) -> None:
    """While link 1 runs (20 s), pmc jobs status shows link 2 pending behind it, held by
    its dependency."""
    deadline = time.monotonic() + 120
    while True:
        queued = [e["job"] for e in chain_events(cwd)
                  if e["event"] == "submitted" and e["link"] == "2"]
        if queued:
            report = pmc(cwd, "jobs", "status", "--scheduler", "slurm", first)
            assert report.returncode == 0, report.stderr
            if "RUNNING" in report.stdout:
                break
        assert time.monotonic() < deadline, f"link 2 never queued behind a running link 1: " \
            f"{chain_events(cwd)}"
        time.sleep(0.5)
    assert report.stdout.splitlines() == [
        f"chain {first} ({cwd / 'long.dag.chain'}): 2 links, running (link 1); link 2 "
        f"(job {queued[0]}) queued behind it",
        f"  link 1: job {first} RUNNING (native: RUNNING); pmc run has not ended",
        f"  link 2: job {queued[0]} PENDING (native: PENDING, reason: Dependency); not started",
    ], report.stdout


def test_until_done_chain_from_pmc_submit(tmp_path: Path) -> None:
    """The default: each link queues the next behind itself as it starts; pmc jobs
    status shows it queued while the link before runs."""
    names = long_dag(tmp_path)
    first = submit(tmp_path, "--site", "site.yaml", "--until-done", "--max-jobs", "6", "long.dag")
    check_queued_link(tmp_path, first)
    check_chain(tmp_path, names, first, ahead=True)


def test_until_done_script_submitted_by_hand(tmp_path: Path) -> None:
    # pmc script --until-done > job.sh && sbatch job.sh, each link submitting the next
    # as it ends (--follow-up at-end).
    names = long_dag(tmp_path)
    script = pmc(tmp_path, "script", "--site", "site.yaml", "--until-done", "--max-jobs", "6",
                 "--follow-up", "at-end", "long.dag")
    assert script.returncode == 0, script.stderr
    (tmp_path / "job.sh").write_text(script.stdout)
    sbatch = subprocess.run(
        ["sbatch", "--parsable", "job.sh"], cwd=tmp_path, env=job_env(tmp_path),
        capture_output=True, text=True, check=False,
    )
    assert sbatch.returncode == 0, sbatch.stderr
    check_chain(tmp_path, names, sbatch.stdout.strip(), ahead=False)
    assert not (tmp_path / "long.dag.slurm.sh").exists()
