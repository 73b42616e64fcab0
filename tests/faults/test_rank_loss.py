"""The run outlives its workers: a rank killed or stopped under the real pip MPI, and a
task that kills whatever worker runs it.

Under ``mpiexec -disable-auto-cleanup`` the master notices a lost rank (its socket
breaks, or it falls silent for ``--worker-timeout``), runs its tasks elsewhere and the
workflow finishes: ``pmc status`` exits 0 whatever mpiexec's own status. Hydra's proxy
may still end the whole job when it reaps a rank killed by a signal (a race in MPICH's
hydra_pmi_proxy, see docs/reliability.md): then the rescue log must be good for a run
that finishes the rest, and the test says so (xfail) rather than pass.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import (
    all_pids,
    cmdline,
    descendants,
    finish,
    is_worker,
    mpi_ranks,
    pmc_argv,
    start,
    wait_for,
    wait_gone,
)
from pmctest import MPIEXEC, clean_env, rescue_done

pytestmark = pytest.mark.faults

SLOW = "/bin/sh -c 'echo $PMC_TASK >> ran.log; sleep 0.3' {marker}"


def lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def mpi_run(n: int, args: list[str]) -> list[str]:
    if MPIEXEC is None:
        pytest.skip("mpiexec not installed (pip install '.[mpi]')")
    return [MPIEXEC, "-disable-auto-cleanup", "-n", str(n), sys.executable, "-m", "pmc",
            "run", *args]


def status(tmp_path: Path) -> int:
    return subprocess.run(pmc_argv(["status", "w.dag"]), cwd=tmp_path, env=clean_env(),
                          capture_output=True).returncode


def write_dag(tmp_path: Path, marker: str, n: int = 30) -> list[str]:
    names = [f"t{i:02d}" for i in range(n)]
    (tmp_path / "w.dag").write_text(
        "".join(f"TASK {name} {SLOW.format(marker=marker)}\n" for name in names))
    return names


def seen(path: Path, text: str) -> bool:
    try:
        return text in path.read_text()
    except FileNotFoundError:
        return False


def test_mpi_stopped_worker_is_lost_after_worker_timeout(tmp_path: Path, marker: str) -> None:
    """SIGSTOP of a worker rank that talks through MPI: declared lost after
    --worker-timeout, its task runs elsewhere, every task is done; once continued it
    stops by itself."""
    names = write_dag(tmp_path, marker)
    proc = start(mpi_run(4, ["--no-host-sockets", "--worker-timeout", "2", "w.dag"]),
                 tmp_path)
    victim = 0
    try:
        wait_for(lambda: len(lines(tmp_path / "ran.log")) >= 4, 60, "tasks running")
        victim = mpi_ranks(proc.pid)[1]
        os.kill(victim, signal.SIGSTOP)
        t0 = time.monotonic()
        wait_for(lambda: seen(tmp_path / "run.stderr", "Worker 1 was lost (silent for 2 s)"),
                 30, "the stopped worker declared lost")
        detect = time.monotonic() - t0
        wait_for(lambda: seen(tmp_path / "run.stderr", "Workflow succeeded"), 60,
                 "the workflow to finish without worker 1")
        os.kill(victim, signal.SIGCONT)
        finish(proc, 60, "mpiexec after the stopped worker was continued")
        assert not wait_gone({victim}, 10), "the continued worker went on running"
    finally:
        if victim:
            try:
                os.kill(victim, signal.SIGCONT)
            except OSError:
                pass
    err = (tmp_path / "run.stderr").read_text()
    assert "failed with exitcode" not in err, "a lost worker is not a task failure"
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == names
    assert status(tmp_path) == 0
    rerun = len(lines(tmp_path / "ran.log")) - len(names)
    print(f"\n[rank-loss] SIGSTOP, MPI path: lost {detect:.2f} s after the stop "
          f"(--worker-timeout 2); {rerun} task(s) ran again")


@pytest.mark.parametrize("path", ["mpi", "host-socket"])
def test_mpi_killed_worker_rank(path: str, tmp_path: Path, marker: str) -> None:
    """kill -9 of a worker rank: its tasks run elsewhere and the workflow succeeds, or
    (Hydra's proxy ended the job) the rescue log lets a rerun finish it."""
    names = write_dag(tmp_path, marker)
    args = ["--worker-timeout", "3", "w.dag"]
    if path == "mpi":
        args.insert(0, "--no-host-sockets")
    proc = start(mpi_run(4, args), tmp_path)
    wait_for(lambda: len(lines(tmp_path / "ran.log")) >= 4, 60, "tasks running")
    ranks = mpi_ranks(proc.pid)
    tree = descendants(proc.pid)
    t0 = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    finish(proc, 90, "mpiexec after a worker rank was killed")
    ended = time.monotonic() - t0
    left = wait_gone(tree, 10)
    assert not left, f"processes outlived the job: {[cmdline(p) for p in left]}"
    err = (tmp_path / "run.stderr").read_text()
    if status(tmp_path) == 0:
        # mpiexec's own status is the dead rank's (9), and its proxy may kill the
        # other ranks once they start to exit: the workflow's record is what counts.
        assert "Worker 1 was lost" in err
        assert "failed with exitcode" not in err
        assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == names
        rerun = len(lines(tmp_path / "ran.log")) - len(names)
        print(f"\n[rank-loss] kill -9, {path} path: mpiexec over {ended:.2f} s after the "
              f"kill; {rerun} task(s) ran again")
        return
    # Hydra tore the job down mid-run: what is done is recorded, a rerun does the rest.
    assert status(tmp_path) == 3
    again = start(mpi_run(4, args), tmp_path, tmp_path / "again")
    finish(again, 90)
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == names
    assert status(tmp_path) == 0
    pytest.xfail("mpiexec's proxy ended the job when it reaped the killed rank")


def test_task_that_kills_its_worker_fails_after_max_worker_losses(
        tmp_path: Path, marker: str) -> None:
    """A task that kills the worker running it (its parent) is tried on two workers,
    then fails with the reason; every other task finishes; the run exits 1."""
    quick = [f"q{i:02d}" for i in range(12)]
    dag = "".join(f"TASK {name} {SLOW.format(marker=marker)}\n" for name in quick)
    # The task's shell is a child of the worker that spawned it.
    dag += f"TASK killer /bin/sh -c 'echo killer >> ran.log; kill -9 $PPID; sleep 5' {marker}\n"
    (tmp_path / "w.dag").write_text(dag)
    proc = start(pmc_argv(["run", "--workers", "4", "w.dag"]), tmp_path)
    code = finish(proc, 90)
    err = (tmp_path / "run.stderr").read_text()
    assert code == 1, err
    assert "Task killer failed: 2 workers were lost while it ran on them" in err
    assert "--max-worker-losses is 2" in err
    # Twice as the master saw it run; once more when it started from a worker's queue
    # and killed that worker before the worker could say it started.
    assert lines(tmp_path / "ran.log").count("killer") in (2, 3)
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == quick
    assert status(tmp_path) == 1


def test_embedded_killed_worker_is_replaced(tmp_path: Path, marker: str) -> None:
    """kill -9 of an embedded worker process: its task runs again, a new worker takes
    its slot, every task is done and the status snapshot counts the slots of the start."""
    names = write_dag(tmp_path, marker, 40)
    proc = start(pmc_argv(["run", "--workers", "3", "w.dag"]), tmp_path)
    wait_for(lambda: len(lines(tmp_path / "ran.log")) >= 4, 60, "tasks running")
    victim = [p for p in all_pids() if is_worker(p, proc.pid) and "--rank 1 " in cmdline(p)]
    assert len(victim) == 1
    t0 = time.monotonic()
    os.kill(victim[0], signal.SIGKILL)
    wait_for(lambda: seen(tmp_path / "run.stderr", "replaced lost worker 1"), 30,
             "a worker in place of worker 1")
    replaced = time.monotonic() - t0
    code = finish(proc, 90)
    err = (tmp_path / "run.stderr").read_text()
    assert code == 0, err
    assert "Worker 1 was lost" in err
    assert "Worker 4 on " in err and "replaced lost worker 1 (1 slot(s))" in err
    assert "failed with exitcode" not in err, "a lost worker is not a task failure"
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == names
    assert status(tmp_path) == 0
    snapshot = json.loads((tmp_path / "w.dag.status.json").read_text())
    assert snapshot["slots"] == 3, snapshot
    # The replacement ran tasks: its output file was merged like the others'.
    assert not list(tmp_path.glob("w.dag.out.*")), "every worker's output merged"
    rerun = len(lines(tmp_path / "ran.log")) - len(names)
    print(f"\n[rank-loss] kill -9, embedded worker: replaced {replaced:.2f} s after the "
          f"kill; {rerun} task(s) ran again")
