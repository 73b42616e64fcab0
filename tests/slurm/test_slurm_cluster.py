"""Real DAGs through the real one-node Slurm cluster (ci/slurm-up.sh): submit, status,
a failing task then resume, cancel, and a continuation chain across allocations."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "configs" / "site-slurm-local.yaml"


def pmc(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The job inherits this environment (sbatch --export=ALL): put this Python's pmc first.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
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


def done(rescue: Path) -> list[str]:
    return sorted(ln.split()[1] for ln in rescue.read_text().splitlines() if ln.startswith("DONE"))


def test_diamond_runs_through_slurm(tmp_path: Path) -> None:
    (tmp_path / "diamond.dag").write_text((REPO / "examples" / "diamond.dag").read_text())
    job_id = submit(tmp_path, "--site", str(PROFILE), "diamond.dag")
    status = wait_finished(tmp_path, job_id)
    assert status.startswith(f"{job_id} COMPLETED")
    assert done(tmp_path / "diamond.dag.rescue") == ["A", "B", "C", "D"]
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
    assert done(tmp_path / "flaky.dag.rescue") == ["A"]
    (tmp_path / "ok").write_text("")
    second = submit(tmp_path, "--site", str(PROFILE), "flaky.dag")
    assert wait_finished(tmp_path, second).startswith(f"{second} COMPLETED")
    assert done(tmp_path / "flaky.dag.rescue") == ["A", "B", "C"]
    assert (tmp_path / "ran.txt").read_text().split() == ["A", "B", "C"]


def test_cancel(tmp_path: Path) -> None:
    (tmp_path / "slow.dag").write_text("TASK A /bin/sleep 120\n")
    job_id = submit(tmp_path, "--site", str(PROFILE), "slow.dag")
    proc = pmc(tmp_path, "jobs", "cancel", "--scheduler", "slurm", job_id)
    assert proc.returncode == 0, proc.stderr
    assert wait_finished(tmp_path, job_id).startswith(f"{job_id} CANCELLED")


def test_until_done_chain_finishes_more_work_than_one_allocation(tmp_path: Path) -> None:
    # 12 tasks of 6 s = 72 s of work; an allocation is 1 minute, and pmc run stops
    # after 20 s (40 s margin), so no single job can finish the DAG.
    lines = [
        f"TASK t{i:02d} --expected-runtime 6 /bin/sh -c 'sleep 6; echo t{i:02d} >> ran.txt'"
        for i in range(12)
    ]
    (tmp_path / "long.dag").write_text("\n".join(lines) + "\n")
    profile = yaml.safe_load(PROFILE.read_text())
    profile.update(walltime=1, walltime_margin="0:40")
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(profile))
    first = submit(tmp_path, "--site", str(site), "--until-done", "--max-jobs", "6", "long.dag")

    deadline = time.monotonic() + 240
    links: dict[int, tuple[str, int]] = {}
    while True:
        links = {}
        for out in tmp_path.glob("slurm-*.out"):
            for m in re.finditer(
                r"run exited with status (\d+) \(job (\d+), chain link (\d+)\)", out.read_text()
            ):
                links[int(m.group(3))] = (m.group(2), int(m.group(1)))
        if any(code != 3 for _, code in links.values()):
            break
        assert time.monotonic() < deadline, f"chain did not finish: {links}"
        time.sleep(1)

    last = max(links)
    assert last >= 2, links
    assert links[1][0] == first
    assert links[last][1] == 0, links
    assert all(code == 3 for link, (_, code) in links.items() if link < last)
    assert done(tmp_path / "long.dag.rescue") == [f"t{i:02d}" for i in range(12)]
    ran = (tmp_path / "ran.txt").read_text().split()
    assert sorted(ran) == [f"t{i:02d}" for i in range(12)], "a finished task ran again"
    assert wait_finished(tmp_path, links[last][0]).split()[1] == "COMPLETED"
