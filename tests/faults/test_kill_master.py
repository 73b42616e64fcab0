"""kill -9 of the master at random moments of a 2,000-task run, then a restart.

Each task appends its name to a shared log (O_APPEND), so the log counts how often each
task ran. What must hold, in every trial and in both modes:

- a task recorded DONE had succeeded (its line is in the log);
- a task recorded DONE before the kill never runs again;
- only tasks in flight at the kill (started, not yet recorded) may run twice, and there
  are never more than PREFETCH_DEPTH + 1 per slot (the running one and, with
  prefetching, those it replaced whose results were not recorded yet);
- the restart completes the workflow, also when the last rescue record was torn;
- no worker process or task outlives the killed run; nothing hangs.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from faultkit import (
    descendants,
    finish,
    mpi_argv,
    mpi_ranks,
    pmc_argv,
    start,
    wait_for,
    wait_gone,
    with_marker,
)
from pmctest import rescue_done

from pmc.core.chains import PREFETCH_DEPTH

pytestmark = pytest.mark.faults

TASKS = {"local": 2000, "mpi": 1000}  # MPI mode dispatches more slowly: fewer tasks
SLOTS = 2  # two workers, one slot each
TRIALS = [("local", i) for i in range(10)] + [("mpi", i) for i in range(4)]


def name(i: int) -> str:
    # Every name ends in "e" and has no other "e": a torn record is never a valid name.
    return f"t{i}e"


def write_dag(path: Path, n: int, marker: str) -> None:
    path.write_text("".join(
        f"TASK {name(i)} /bin/sh -c 'echo $PMC_TASK >> ran.log' {marker}\n" for i in range(n)))


def ran(tmp: Path) -> Counter[str]:
    try:
        return Counter((tmp / "ran.log").read_text().split())
    except FileNotFoundError:
        return Counter()


def records(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\nDONE ")
    except FileNotFoundError:
        return 0


def launch(mode: str, tmp: Path, tag: str) -> list[str]:
    args = ["run", "w.dag", "-o", "tasks.out", "--no-resource-log"]
    if mode == "local":
        return pmc_argv([*args, "--workers", str(SLOTS)])
    return mpi_argv(SLOTS + 1, args)


@pytest.mark.parametrize(("mode", "trial"), TRIALS, ids=[f"{m}-{i}" for m, i in TRIALS])
def test_kill_master_then_restart(mode: str, trial: int, tmp_path: Path, marker: str) -> None:
    rng = random.Random(f"{mode}{trial}")
    n = TASKS[mode]
    write_dag(tmp_path / "w.dag", n, marker)
    rescue = tmp_path / "w.dag.rescue"
    # Kill after a random number of records; one trial in five at a random early moment
    # (start-up, first dispatch), by the first record at the latest: a run this short
    # may be over before a fixed moment comes.
    early = trial % 5 == 4
    target = 0 if early else rng.randint(1, int(n * 0.9))
    proc = start(launch(mode, tmp_path, "first"), tmp_path, tmp_path / "first")
    try:
        if early:
            moment = time.monotonic() + rng.uniform(0.05, 1.5)
            wait_for(lambda: time.monotonic() >= moment or records(rescue) >= 1
                     or proc.poll() is not None, 60, "an early moment")
        else:
            wait_for(lambda: records(rescue) >= target or proc.poll() is not None, 60,
                     f"{target} rescue records")
        assert proc.poll() is None, "the run ended before the kill"
        if mode == "local":
            victim = proc.pid
        else:
            wait_for(lambda: 0 in mpi_ranks(proc.pid), 30, "rank 0")
            victim = mpi_ranks(proc.pid)[0]
        tree = descendants(proc.pid)
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        finish(proc, 30, "the killed run (mpiexec must tear the job down)")
        survivors = wait_gone(tree, 10)
        assert not survivors, f"processes outlived the killed master: {survivors}"
        assert not with_marker(marker), "tasks outlived the killed master"
        teardown = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    before = ran(tmp_path)
    done_before = set(rescue_done(rescue, missing_ok=True))
    assert done_before <= set(before), "a task recorded DONE had not run"
    torn = None
    if trial % 3 == 1 and done_before:
        # A crash mid-write: cut the file inside its last record.
        data = rescue.read_bytes()
        last = data.rindex(b"\nDONE ")
        cut = rng.randint(last + 1, len(data) - 1)
        torn = data[last + 6 :].decode()
        rescue.write_bytes(data[:cut])
        done_before.discard(torn)

    second = start(launch(mode, tmp_path, "second"), tmp_path, tmp_path / "second")
    code = finish(second, 120, "the restart")
    err = (tmp_path / "second.stderr").read_text()
    assert code == 0, err[-3000:]
    if torn is not None:
        assert "ignoring torn last record" in err or "ignoring unknown task" in err
    after = ran(tmp_path)
    assert set(rescue_done(rescue)) == {name(i) for i in range(n)}
    assert all(after[name(i)] >= 1 for i in range(n)), "the restart left tasks unrun"
    assert not with_marker(marker)

    again = {t for t in done_before if after[t] != before[t]}
    assert not again, f"tasks recorded DONE ran again: {sorted(again)[:10]}"
    assert all(before[t] == 1 for t in done_before), "a task ran twice before the kill"
    in_flight = set(before) - done_before - {torn}
    # Per slot: the running task and, with prefetching, those it replaced whose results
    # the worker still held or the master had not recorded (one per queued place).
    most = (PREFETCH_DEPTH + 1) * SLOTS
    assert len(in_flight) <= most, f"more than {most} tasks in flight: {sorted(in_flight)}"
    rerun = {t for t, c in after.items() if c > 1}
    beyond = rerun - in_flight - {torn}
    assert not beyond, f"tasks re-ran beyond those in flight: {sorted(beyond)}"
    print(f"\n[kill-master] mode={mode} trial={trial} tasks={n} done_before={len(done_before)} "
          f"in_flight={len(in_flight)} rerun={len(rerun)} beyond_in_flight={len(beyond)} "
          f"torn={torn is not None} teardown_s={teardown:.2f}")
