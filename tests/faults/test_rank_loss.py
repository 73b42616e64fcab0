"""The run outlives its workers: a rank killed or stopped under the real pip MPI, and a
task that kills whatever worker runs it.

Under ``mpiexec -disable-auto-cleanup`` the master notices a lost rank (its socket
breaks, Hydra says a rank ended and it does not answer a probe, or it falls silent for
``--worker-timeout``), runs its tasks elsewhere and the workflow finishes: ``pmc status``
exits 0 whatever mpiexec's own status. Each worker rank is the child of a keeper
(pmc.runtime.rankshim) that turns its death by a signal into an exit, which Hydra's
proxy survives (see docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import re
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
    rank_keepers,
    start,
    wait_for,
    wait_gone,
    worker_rank,
)
from pmctest import clean_env, mpiexec, rescue_done

pytestmark = pytest.mark.faults

SLOW = "/bin/sh -c 'echo $PMC_TASK >> ran.log; sleep 0.3' {marker}"


def lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def mpi_run(n: int, args: list[str]) -> list[str]:
    return [mpiexec(), "-disable-auto-cleanup", "-n", str(n), sys.executable, "-m", "pmc",
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


@pytest.mark.parametrize("path", ["mpi", "no-mpi"])
def test_mpi_stopped_worker_is_lost_and_the_job_ends(path: str, tmp_path: Path,
                                                     marker: str) -> None:
    """Every process of a worker rank stopped (SIGSTOP), as on a node that hangs, the
    rank talking through MPI, or in a run without MPI (every rank on one host,
    pmc.transport.onehost): declared lost after --worker-timeout, its task runs
    elsewhere, every task is done, and then the master ends the job itself (MPI_Abort,
    or PMI's abort, with the workflow's status): mpiexec ends within --worker-timeout +
    30 s of the stop with status 0, the stopped rank gone, rather than wait for it for
    ever."""
    names = write_dag(tmp_path, marker, n=60)
    args = ["--worker-timeout", "5", "w.dag"]
    if path == "mpi":
        args.insert(0, "--no-host-sockets")
    proc = start(mpi_run(4, args), tmp_path)
    stopped: set[int] = set()
    try:
        wait_for(lambda: len(lines(tmp_path / "ran.log")) >= 4, 60, "tasks running")
        keeper = rank_keepers(proc.pid)[1]
        stopped = {keeper, *descendants(keeper)}
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        wait_for(lambda: seen(tmp_path / "run.stderr", "Worker 1 was lost (silent for 5 s)"),
                 30, "the stopped worker declared lost")
        detect = time.monotonic() - t0
        code = finish(proc, 5 + 30, "mpiexec, which the master ends")
        ended = time.monotonic() - t0
    finally:
        for pid in stopped:  # should the job not have ended them
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
    assert ended < 5 + 30
    assert not wait_gone(stopped, 10), "the stopped rank outlived the job"
    err = (tmp_path / "run.stderr").read_text()
    assert "Workflow succeeded" in err, err
    assert "Ranks [1] were given up on and may never end: ending the job" in err, err
    assert "failed with exitcode" not in err, "a lost worker is not a task failure"
    assert code == 0, "mpiexec's status is the workflow's"
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == names
    assert status(tmp_path) == 0
    rerun = len(lines(tmp_path / "ran.log")) - len(names)
    print(f"\n[rank-loss] SIGSTOP, {path} path: lost {detect:.2f} s after the stop "
          f"(--worker-timeout 5), job ended {ended:.2f} s after it; {rerun} task(s) ran again")


@pytest.mark.parametrize("path", [pytest.param("mpi", marks=pytest.mark.slow), "host-socket"])
def test_mpi_killed_worker_rank(path: str, tmp_path: Path, marker: str) -> None:
    """kill -9 of a worker rank under Hydra: the job lives on (the rank's keeper exits
    128+9 rather than die by the signal, which would make Hydra's proxy kill every rank),
    the master notices at once (its socket breaks) or on Hydra's word (the rank does not
    answer a probe), its tasks run elsewhere and the workflow succeeds."""
    names = write_dag(tmp_path, marker)
    args = ["--worker-timeout", "30", "w.dag"]
    if path == "mpi":
        args.insert(0, "--no-host-sockets")
    proc = start(mpi_run(4, args), tmp_path)
    wait_for(lambda: len(lines(tmp_path / "ran.log")) >= 4, 60, "tasks running")
    ranks = mpi_ranks(proc.pid)
    keepers = rank_keepers(proc.pid)
    assert set(keepers) == {1, 2, 3}, "each worker rank is the child of its keeper"
    tree = descendants(proc.pid)
    t0 = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    wait_for(lambda: seen(tmp_path / "run.stderr", "Worker 1 was lost"), 60,
             "worker 1 declared lost")
    detect = time.monotonic() - t0
    code = finish(proc, 90, "mpiexec after a worker rank was killed")
    left = wait_gone(tree, 10)
    assert not left, f"processes outlived the job: {[cmdline(p) for p in left]}"
    err = (tmp_path / "run.stderr").read_text()
    assert "Workflow succeeded" in err, err
    assert "failed with exitcode" not in err, "a lost worker is not a task failure"
    assert err.count("was lost") == 1, "the probe lost no live worker"
    if path == "mpi":
        # Well before --worker-timeout: Hydra's SIGUSR1, then a probe of a tenth of it.
        assert "Worker 1 was lost (no answer within 3 s after the launcher reported a " \
               "rank's end)" in err, err
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == names
    assert status(tmp_path) == 0
    # The master ended the job with the workflow's status (MPI_Abort), not the killed
    # rank's (its keeper's 128 + 9, which mpiexec would report).
    assert code == 0, code
    rerun = len(lines(tmp_path / "ran.log")) - len(names)
    print(f"\n[rank-loss] kill -9, {path} path: lost {detect:.2f} s after the kill; "
          f"{rerun} task(s) ran again; mpiexec exit {code}")


@pytest.mark.parametrize("mode", [
    "embedded",
    "host-socket",
    pytest.param("mpi", marks=pytest.mark.slow),
])
def test_task_that_kills_its_worker_fails_after_max_worker_losses(
        mode: str, tmp_path: Path, marker: str) -> None:
    """A task that kills the worker running it (its parent) is tried on two workers,
    then fails with the reason; every other task finishes; the run exits 1. Under MPI
    (4 workers) the job outlives the ranks the task kills."""
    quick = [f"q{i:02d}" for i in range(12)]
    dag = "".join(f"TASK {name} {SLOW.format(marker=marker)}\n" for name in quick)
    # The task's shell is a child of the worker that spawned it.
    dag += f"TASK killer /bin/sh -c 'echo killer >> ran.log; kill -9 $PPID; sleep 5' {marker}\n"
    (tmp_path / "w.dag").write_text(dag)
    if mode == "embedded":
        argv = pmc_argv(["run", "--workers", "4", "w.dag"])
    else:
        args = ["--worker-timeout", "30", "w.dag"]
        argv = mpi_run(5, ["--no-host-sockets", *args] if mode == "mpi" else args)
    proc = start(argv, tmp_path)
    code = finish(proc, 120)
    err = (tmp_path / "run.stderr").read_text()
    assert "Workflow failed" in err, err
    if mode == "embedded":
        assert code == 1, err
    # Two lost workers, one of them while it was known to run; or three while it only
    # started from a worker's queue, killing that worker before it could say so.
    ran = lines(tmp_path / "ran.log").count("killer")
    assert re.search(r"Task killer failed: [23] workers were lost while it (ran|ran or was "
                     r"queued) on them \(the last, worker \d\); --max-worker-losses "
                     r"is 2", err), err
    assert ran in (2, 3)
    # No other task failed, not even one queued behind the killer on the workers it
    # killed: all of them are done.
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == quick
    assert status(tmp_path) == 1
    print(f"\n[rank-loss] task killing its worker, {mode}: ran {ran} times, "
          f"{err.count('was lost')} workers lost; exit {code}")


def test_embedded_killed_worker_is_replaced(tmp_path: Path, marker: str) -> None:
    """kill -9 of an embedded worker process: its task runs again, a new worker takes
    its slot, every task is done and the status snapshot counts the slots of the start."""
    names = write_dag(tmp_path, marker, 40)
    proc = start(pmc_argv(["run", "--workers", "3", "w.dag"]), tmp_path)
    wait_for(lambda: len(lines(tmp_path / "ran.log")) >= 4, 60, "tasks running")
    victim = [p for p in all_pids() if is_worker(p, proc.pid) and worker_rank(p) == 1]
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
