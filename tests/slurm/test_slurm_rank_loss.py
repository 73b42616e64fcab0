"""A worker rank killed with -9 inside a job on the real one-node Slurm cluster
(ci/slurm-up.sh), through the batch script ``pmc submit`` generates (``srun
--kill-on-bad-exit=0 --no-kill``): the job ends COMPLETED, every task is in the rescue
log and ``pmc status`` exits 0, although srun reports the rank's end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pmctest import rescue_done

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "configs" / "site-slurm-local.yaml"


def job_env(cwd: Path) -> dict[str, str]:
    # The job inherits this environment (sbatch --export=ALL): this Python's pmc first,
    # the chain index out of the user's own state directory.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMC_")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               XDG_STATE_HOME=str(cwd / ".state"), XDG_CONFIG_HOME=str(cwd / ".config"))
    return env


def pmc(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pmc", *args], cwd=cwd, env=job_env(cwd),
                          capture_output=True, text=True, timeout=120, check=False)


def proc_env(pid: int) -> dict[str, str]:
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.decode(errors="replace").partition("=")[::2]
                for item in data.split(b"\0") if b"=" in item)


def parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    return int(stat[stat.rindex(b")") + 2:].split()[1])


def worker_rank(job_id: str, rank: int) -> int | None:
    """The pid of a worker rank of the job: ``pmc run``, the child of the process srun
    started (its keeper, pmc.runtime.rankshim, forked from it and named ``pmc-keeper``)."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"run" not in argv or not any(a.endswith(b"pmc") for a in argv[:3]):
            continue
        env = proc_env(int(name))
        if env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_PROCID") == str(rank) \
                and env.get("SLURM_STEP_ID") not in (None, "batch"):
            found.add(int(name))
    inner = [p for p in found if comm(parent(p)) == b"pmc-keeper"]
    return inner[0] if inner else None


def comm(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/comm").read_bytes().strip()
    except OSError:
        return b""


def job_state(cwd: Path, job_id: str) -> str:
    proc = pmc(cwd, "jobs", "status", "--scheduler", "slurm", job_id)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("path", ["host-socket", "mpi"])
def test_killed_worker_rank_in_a_slurm_job(path: str, tmp_path: Path) -> None:
    """On one node the workers talk to the master through a Unix socket, which breaks
    with the rank; through MPI (as from other nodes) srun says nothing to the other
    ranks, and the rank is lost once silent for --worker-timeout."""
    names = [f"t{i:02d}" for i in range(40)]
    (tmp_path / "w.dag").write_text("".join(
        f"TASK {n} /bin/sh -c 'echo {n} >> ran.log; sleep 0.3'\n" for n in names))
    extra = ["--set", "pmc.no_host_sockets=true", "--set", "pmc.worker_timeout=5"] \
        if path == "mpi" else []
    sub = pmc(tmp_path, "submit", "--site", str(PROFILE), *extra, "w.dag")
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    ran = tmp_path / "ran.log"
    out = tmp_path / f"slurm-{job_id}.out"
    deadline = time.monotonic() + 120
    while not (ran.exists() and len(ran.read_text().split()) >= 4):
        assert time.monotonic() < deadline, job_state(tmp_path, job_id)
        time.sleep(0.05)
    victim = worker_rank(job_id, 1)
    assert victim is not None, "worker rank 1 running under its keeper"
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    while "Worker 1 was lost" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < t0 + 90, "worker 1 not declared lost"
        time.sleep(0.05)
    detect = time.monotonic() - t0
    while True:
        state = job_state(tmp_path, job_id)
        if state.split()[1] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        assert time.monotonic() < t0 + 180, state
        time.sleep(0.5)
    text = out.read_text()
    assert state.startswith(f"{job_id} COMPLETED"), state + "\n" + text
    assert "Workflow succeeded" in text
    assert "failed with exitcode" not in text, "a lost worker is not a task failure"
    # srun reports the rank's end; the script exits with the workflow's record.
    assert "task 1: Exited with exit code 137" in text, text
    assert "pmc: run exited with status 137" in text
    assert "the workflow's record says status 0; the script exits with it" in text
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == names
    assert pmc(tmp_path, "status", "w.dag").returncode == 0
    rerun = len(ran.read_text().split()) - len(names)
    if path == "mpi":
        assert "Worker 1 was lost (silent for 5 s)" in text, text
    print(f"\n[rank-loss] kill -9, Slurm job {job_id}, {path} path: lost {detect:.2f} s "
          f"after the kill; {rerun} task(s) ran again; job {state.split()[1]}")
