"""A worker dies (kill -9 of a worker process or rank) while its tasks run.

Embedded: the master requeues the lost worker's task, another worker runs it, the run
succeeds and the loss is not a task failure. Under MPI: mpiexec tears the job down, and
the run ends within seconds with a valid rescue log. In both, the dead worker's tasks
(and their children) do not survive it: the worker's guard terminates their groups.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import (
    cmdline,
    descendants,
    finish,
    is_worker,
    mpi_argv,
    mpi_ranks,
    pmc_argv,
    start,
    wait_for,
    wait_gone,
    worker_rank,
)
from pmctest import clean_env, rescue_done

pytestmark = pytest.mark.faults

# Runs until the test creates "release"; a child of the task blocks the same way, so the
# task's whole process group has to be terminated.
BLOCK = ("/bin/sh -c 'echo $PMC_TASK >> ran.log; "
         "(while [ ! -e release ]; do sleep 0.1; done) & wait' {marker}")
QUICK = "/bin/sh -c 'echo $PMC_TASK >> ran.log' {marker}"
SUMMARY = re.compile(r"\[cluster-summary stat=\"(\w+)\", tasks=(\d+), submitted=(\d+), "
                     r"succeeded=(\d+), failed=(\d+), extra=(\d+),")


def lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def worker_pid(master: int, rank: int) -> int:
    for pid in descendants(master):
        if is_worker(pid, master) and worker_rank(pid) == rank:
            return pid
    raise AssertionError(f"no worker {rank} under {master}")


def test_embedded_lost_worker_task_runs_elsewhere(tmp_path: Path, marker: str) -> None:
    dag = "".join(f"TASK b{i} {BLOCK.format(marker=marker)}\n" for i in range(3))
    (tmp_path / "w.dag").write_text(dag)
    proc = start(pmc_argv(["run", "w.dag", "--workers", "2"]), tmp_path)
    try:
        wait_for(lambda: len(lines(tmp_path / "ran.log")) >= 2, 30, "two tasks running")
        victim = worker_pid(proc.pid, 1)
        tasks = descendants(victim)
        assert tasks, "the worker runs a task"
        os.kill(victim, signal.SIGKILL)
        left = wait_gone(tasks, 10)
        assert not left, ("the killed worker's task processes survived: "
                          f"{ {pid: cmdline(pid) for pid in left} }")
        (tmp_path / "release").touch()
        code = finish(proc, 60)
    finally:
        (tmp_path / "release").touch()
    out = (tmp_path / "run.stdout").read_text()
    err = (tmp_path / "run.stderr").read_text()
    assert code == 0, err
    assert "Worker 1 was lost; 1 task(s) it was running will run again elsewhere" in err
    assert "failed with exitcode" not in err, "a lost worker is not a task failure"
    m = SUMMARY.search(out)
    assert m is not None and m.group(1) == "ok" and m.group(5) == "0", out
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == ["b0", "b1", "b2"]
    ran = lines(tmp_path / "ran.log")
    assert sorted(set(ran)) == ["b0", "b1", "b2"]
    assert len(ran) == 4, "exactly the lost task ran twice"


@pytest.mark.parametrize("always_mpi", ["", "1"], ids=["no-mpi", "mpi"])
def test_mpi_lost_worker_rank_ends_the_run(tmp_path: Path, marker: str,
                                           always_mpi: str) -> None:
    """Under Hydra's defaults a rank that dies ends the job, with MPI or without it
    (every rank on one host, pmc.transport.onehost: the rank left the launcher's store
    unannounced)."""
    quick = [f"TASK q{i} {QUICK.format(marker=marker)}\n" for i in range(4)]
    block = [f"TASK b{i} {BLOCK.format(marker=marker)}\n" for i in range(4)]
    # The quick tasks come first (DAG order), so the rescue log has records at the kill.
    (tmp_path / "w.dag").write_text("".join(quick + block))
    env = clean_env(PMC_ALWAYS_MPI=always_mpi)
    proc = start(mpi_argv(3, ["run", "w.dag"]), tmp_path, env=env)
    try:
        wait_for(lambda: sum(n.startswith("b") for n in lines(tmp_path / "ran.log")) >= 2,
                 60, "two blocking tasks running")
        # Their results travel in batches (a worker holds them up to 20 ms while its slot
        # has work): recorded a moment after the blocking tasks started.
        wait_for(lambda: len(rescue_done(tmp_path / "w.dag.rescue")) == 4, 60,
                 "the quick tasks recorded")
        ranks = mpi_ranks(proc.pid)
        tree = descendants(proc.pid)
        t0 = time.monotonic()
        os.kill(ranks[1], signal.SIGKILL)
        finish(proc, 20, "mpiexec after a worker rank was killed")
        ended = time.monotonic() - t0
        left = wait_gone(tree, 10)
        assert not left, f"processes outlived the job: {[cmdline(p) for p in left]}"
    finally:
        (tmp_path / "release").touch()
    data = (tmp_path / "w.dag.rescue").read_bytes()
    assert data.startswith(b"\n") and not data.endswith(b"\n"), "newline-first records"
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == ["q0", "q1", "q2", "q3"]
    path = "MPI" if always_mpi else "no MPI"
    print(f"\n[worker-loss] mpi ({path}): job ended {ended:.2f} s after kill -9 of rank 1")
    # The rescue log is good for a restart that finishes the rest.
    again = start(mpi_argv(3, ["run", "w.dag"]), tmp_path, tmp_path / "again", env=env)
    assert finish(again, 60) == 0, (tmp_path / "again.stderr").read_text()
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == [
        "b0", "b1", "b2", "b3", "q0", "q1", "q2", "q3"]
    assert sorted(lines(tmp_path / "ran.log")).count("q0") == 1, "done tasks do not rerun"


@pytest.mark.parametrize("mode", ["local", "mpi"])
def test_killed_master_leaves_no_tasks(mode: str, tmp_path: Path, marker: str) -> None:
    """kill -9 of the master while long tasks (with children) run: no process survives."""
    (tmp_path / "w.dag").write_text(
        "".join(f"TASK b{i} {BLOCK.format(marker=marker)}\n" for i in range(4)))
    argv = (pmc_argv(["run", "w.dag", "--workers", "2"]) if mode == "local"
            else mpi_argv(3, ["run", "w.dag"]))
    proc = start(argv, tmp_path)
    try:
        wait_for(lambda: len(lines(tmp_path / "ran.log")) >= 2, 60, "two tasks running")
        victim = proc.pid if mode == "local" else mpi_ranks(proc.pid)[0]
        tree = descendants(proc.pid)
        os.kill(victim, signal.SIGKILL)
        finish(proc, 20, "the killed run")
        left = wait_gone(tree, 10)
        assert not left, f"processes outlived the master: {[cmdline(p) for p in left]}"
    finally:
        (tmp_path / "release").touch()


# A worker that spawns its tasks as Launcher.start does (the guard marked, the task
# spawned in a group of its own), holds the first, not the second, and is killed.
_DYING_WORKER = """
import os, signal, sys
from pmc.runtime import guard
g = guard.Guard(0.5)
pids = []
for hold in (True, False):
    g.spawning()
    pids.append(os.posix_spawn("/bin/sleep", ["sleep", "300"], os.environ, setpgroup=0,
                               file_actions=[(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0)
                                             for fd in (1, 2)]))
    if hold:
        g.hold(pids[-1])
if sys.argv[1] == "unmarked":
    g.spawned_none()  # (as if the second were no task: no mark left)
print(*pids, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("mark", ["marked", "unmarked"])
def test_a_worker_killed_before_it_holds_its_task_leaves_no_task(mark: str) -> None:
    """Killed between the spawn and the hold (the task runs, its group not yet in the
    table): the guard finds the task by the spawn's mark and ends it as it ends those
    held. With no mark left, a process the worker spawned but did not hold is not the
    guard's."""
    out = subprocess.run([sys.executable, "-c", _DYING_WORKER, mark], capture_output=True,
                         text=True, timeout=60)
    held, unheld = map(int, out.stdout.split())
    try:
        assert not wait_gone({held}, 10)
        assert (not wait_gone({unheld}, 10) if mark == "marked"
                else wait_gone({unheld}, 2) == {unheld})
    finally:
        for pid in (held, unheld):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
