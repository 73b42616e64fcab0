"""SIGTERM / SIGINT to a running workflow: what a batch system sends at the time limit,
and Ctrl-C. Embedded the signal goes to the master; under MPI to mpiexec (as Slurm or
PBS would) or to rank 0 only.

What must hold: no new task starts, the running tasks' whole process groups die
(SIGTERM, then SIGKILL for a task that ignores SIGTERM), task stdio is merged, the rescue
log is valid and has exactly the tasks that finished, the exit code is 3 (incomplete)
within a few seconds, and a restart finishes the workflow without rerunning done tasks.
"""

from __future__ import annotations

import os
import signal
import time
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
)
from pmctest import rescue_done

pytestmark = pytest.mark.faults

WAIT = "while [ ! -e release ]; do sleep 0.1; done"
DAG = f"""\
TASK q0 /bin/sh -c 'echo $PMC_TASK >> ran.log' {{m}}
TASK q1 /bin/sh -c 'echo $PMC_TASK >> ran.log' {{m}}
TASK q2 /bin/sh -c 'echo $PMC_TASK >> ran.log' {{m}}
TASK q3 /bin/sh -c 'echo $PMC_TASK >> ran.log' {{m}}
TASK plain /bin/sh -c 'echo started $PMC_TASK; echo $PMC_TASK >> ran.log; {WAIT}' {{m}}
TASK forks /bin/sh -c 'echo started $PMC_TASK; echo $PMC_TASK >> ran.log; ({WAIT}) & ({WAIT}) & wait' {{m}}
TASK deaf /bin/sh -c 'trap "" TERM INT; echo started $PMC_TASK; echo $PMC_TASK >> ran.log; {WAIT}' {{m}}
TASK later /bin/sh -c 'echo $PMC_TASK >> ran.log' {{m}}
EDGE plain later
"""  # noqa: E501
BLOCKING = {"plain", "forks", "deaf"}

CASES = [
    ("local", signal.SIGTERM, "master"),
    ("local", signal.SIGINT, "master"),
    ("mpi", signal.SIGTERM, "mpiexec"),
    ("mpi", signal.SIGINT, "mpiexec"),
    ("mpi", signal.SIGTERM, "rank0"),
]


def ran(tmp: Path) -> list[str]:
    try:
        return (tmp / "ran.log").read_text().split()
    except FileNotFoundError:
        return []


@pytest.mark.parametrize(("mode", "sig", "target"), CASES,
                         ids=[f"{m}-{s.name}-{t}" for m, s, t in CASES])
def test_signal_stops_cleanly(mode: str, sig: signal.Signals, target: str, tmp_path: Path,
                              marker: str) -> None:
    (tmp_path / "w.dag").write_text(DAG.format(m=marker))
    args = ["run", "w.dag", "-o", "tasks.out", "--host-cpus", "4"]
    argv = pmc_argv([*args, "--workers", "3"]) if mode == "local" else mpi_argv(4, args)
    proc = start(argv, tmp_path)
    try:
        wait_for(lambda: set(ran(tmp_path)) >= BLOCKING, 60, "the blocking tasks to start")
        time.sleep(0.3)  # let the tasks' children start too
        tree = descendants(proc.pid)
        victim = proc.pid
        if target == "rank0":
            victim = mpi_ranks(proc.pid)[0]
        t0 = time.monotonic()
        os.kill(victim, sig)
        code = finish(proc, 30, f"the run after {sig.name}")
        took = time.monotonic() - t0
        left = wait_gone(tree, 5)
        assert not left, "task processes survived the stop"
    finally:
        (tmp_path / "release").touch()
    err = (tmp_path / "run.stderr").read_text()
    assert code == 3, err
    assert f"[fatal] Caught signal {sig.value}\n" in err
    assert "[error] Aborting workflow\n" in err
    assert f"Workflow aborted: received {sig.name}" in err
    assert "failed with exitcode" not in err, "tasks killed by the stop are not task failures"
    assert took < 15, f"took {took:.1f} s to exit"
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == ["q0", "q1", "q2", "q3"]
    assert "later" not in ran(tmp_path), "no task starts after the signal"
    merged = (tmp_path / "tasks.out").read_text()
    for name in BLOCKING:
        assert f"started {name}\n" in merged, "task stdout is merged"
        assert f"name={name}," in merged, "the killed task's record is merged too"
    assert not list(tmp_path.glob("w.dag.out.*")), "per-worker files merged and removed"
    print(f"\n[signals] {mode} {sig.name} to {target}: exit {code} after {took:.2f} s")

    again = start(argv, tmp_path, tmp_path / "again")
    assert finish(again, 60) == 0, (tmp_path / "again.stderr").read_text()
    counts = ran(tmp_path)
    assert all(counts.count(f"q{i}") == 1 for i in range(4)), "done tasks ran again"
    assert "later" in counts
