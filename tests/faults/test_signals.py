"""SIGTERM / SIGINT to a running workflow: what a batch system sends at the time limit,
and Ctrl-C; and the warnings that time is short (SIGUSR1, SIGUSR2, SIGXCPU), which drain
the run. Embedded the signal goes to the master; under MPI to mpiexec (as Slurm or
PBS would) or to rank 0 only.

What must hold: no new task starts, the running tasks' whole process groups die
(SIGTERM, then SIGKILL for a task that ignores SIGTERM), task stdio is merged, the rescue
log is valid and has exactly the tasks that finished, the exit code is 3 (incomplete)
within a few seconds, and a restart finishes the workflow without rerunning done tasks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from faultkit import (
    comm,
    descendants,
    finish,
    mpi_argv,
    mpi_ranks,
    pmc_argv,
    rank_keepers,
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


# -- warnings that time is short (pmc.batchsignals) ------------------------------------

DRAIN_DAG = f"""\
TASK w1 /bin/sh -c 'echo $PMC_TASK >> ran.log; {WAIT}' {{m}}
TASK w2 /bin/sh -c 'echo $PMC_TASK >> ran.log; {WAIT}' {{m}}
TASK n0 /bin/sh -c 'echo $PMC_TASK >> ran.log' {{m}}
TASK n1 /bin/sh -c 'echo $PMC_TASK >> ran.log' {{m}}
TASK n2 /bin/sh -c 'echo $PMC_TASK >> ran.log' {{m}}
TASK n3 /bin/sh -c 'echo $PMC_TASK >> ran.log' {{m}}
TASK later /bin/sh -c 'echo $PMC_TASK >> ran.log' {{m}}
EDGE w1 later
"""

WARN_CASES = [
    ("local", signal.SIGUSR1, "master"),
    ("local", signal.SIGXCPU, "worker"),
    ("mpi", signal.SIGUSR1, "rank0"),
    ("mpi", signal.SIGUSR2, "keeper"),
    ("mpi", signal.SIGUSR1, "mpiexec"),
]


def warned_process(mode: str, target: str, proc: subprocess.Popen[bytes], tmp: Path) -> int:
    """The pid a warning goes to: the master (its pid in the status snapshot), embedded
    worker 1, a worker rank's keeper (as a batch system signalling every process of the
    job reaches it), or mpiexec (which passes SIGUSR1 on to every rank, from the same
    proxy as its notice that a rank ended)."""
    snapshot = tmp / "w.dag.status.json"
    wait_for(snapshot.exists, 30, "the status snapshot")
    master = int(json.loads(snapshot.read_text())["pid"])
    if target in ("master", "rank0"):
        return master
    if target == "mpiexec":
        return proc.pid
    if target == "worker":
        [worker] = [p for p in descendants(master) if comm(p) == "pmc-worker-1"]
        return worker
    return rank_keepers(proc.pid)[1]


@pytest.mark.parametrize(("mode", "sig", "target"), WARN_CASES,
                         ids=[f"{m}-{s.name}-{t}" for m, s, t in WARN_CASES])
def test_warning_drains_the_run(mode: str, sig: signal.Signals, target: str, tmp_path: Path,
                                marker: str) -> None:
    """A warning that time is short, to the master or to any worker: no task starts any
    more (those queued behind the running ones come back unstarted), the running ones
    end as they will, and the run ends incomplete with everything written; a rerun
    finishes the rest."""
    (tmp_path / "w.dag").write_text(DRAIN_DAG.format(m=marker))
    args = ["run", "w.dag", "-o", "tasks.out"]
    argv = pmc_argv([*args, "--workers", "2"]) if mode == "local" else mpi_argv(3, args)
    if target == "mpiexec":
        # As pmc's batch scripts start it: every rank takes mpiexec's SIGUSR1 for a
        # rank's end, and leaves without MPI_Finalize, which Hydra would otherwise take
        # for a failure and SIGKILL the others.
        argv.insert(1, "-disable-auto-cleanup")
    proc = start(argv, tmp_path)
    try:
        wait_for(lambda: {"w1", "w2"} <= set(ran(tmp_path)), 60, "the waiting tasks to start")
        os.kill(warned_process(mode, target, proc, tmp_path), sig)
        wait_for(lambda: "time is short" in (tmp_path / "run.stderr").read_text(), 30,
                 "the warning to be heard")
        assert proc.poll() is None, "the running tasks go on"
    finally:
        (tmp_path / "release").touch()
    code = finish(proc, 60, f"the run after {sig.name}")
    err = (tmp_path / "run.stderr").read_text()
    assert code == 3, err
    who = "Worker 1 caught" if target in ("worker", "keeper") else "Caught"
    assert f"[warn] {who} signal {sig.value} ({sig.name}): time is short: no task starts " \
           "any more; the 2 running go on until they end (a SIGTERM stops them)\n" in err, err
    assert f"Workflow incomplete: received {sig.name}, a warning that time is short; run " \
           "again to resume from w.dag.rescue" in err
    assert sorted(ran(tmp_path)) == ["w1", "w2"], "no task started after the warning"
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == ["w1", "w2"]
    assert "[cluster-summary stat=\"failed\", tasks=7, submitted=2, succeeded=2," in \
        (tmp_path / "run.stdout").read_text()
    status = json.loads((tmp_path / "w.dag.status.json").read_text())
    assert (status["state"], status["succeeded"]) == ("incomplete", 2)
    assert not list(tmp_path.glob("w.dag.out.*")), "per-worker files merged and removed"

    again = start(argv, tmp_path, tmp_path / "again")
    assert finish(again, 60) == 0, (tmp_path / "again.stderr").read_text()
    assert sorted(ran(tmp_path)) == ["later", "n0", "n1", "n2", "n3", "w1", "w2"]


def test_warning_stops_the_run_when_told(tmp_path: Path, marker: str) -> None:
    """--on-warning stop: a warning is a stop, as SIGTERM; ignore: only a log line."""
    (tmp_path / "w.dag").write_text(DRAIN_DAG.format(m=marker))
    argv = pmc_argv(["run", "w.dag", "--workers", "2", "--on-warning", "stop"])
    proc = start(argv, tmp_path)
    wait_for(lambda: {"w1", "w2"} <= set(ran(tmp_path)), 60, "the waiting tasks to start")
    os.kill(proc.pid, signal.SIGUSR2)
    code = finish(proc, 30, "the run after SIGUSR2")
    err = (tmp_path / "run.stderr").read_text()
    assert code == 3, err
    assert f"[fatal] Caught signal {signal.SIGUSR2.value}\n" in err
    assert "Workflow aborted: received SIGUSR2" in err
    assert rescue_done(tmp_path / "w.dag.rescue") == []

    argv = pmc_argv(["run", "w.dag", "--workers", "2", "--on-warning", "ignore"])
    proc = start(argv, tmp_path, tmp_path / "ignored")
    try:
        wait_for(lambda: ran(tmp_path).count("w1") == 2, 60, "the waiting tasks to start")
        os.kill(proc.pid, signal.SIGUSR1)
        wait_for(lambda: "ignored (--on-warning ignore)" in
                 (tmp_path / "ignored.stderr").read_text(), 30, "the warning to be heard")
    finally:
        (tmp_path / "release").touch()
    assert finish(proc, 60) == 0, (tmp_path / "ignored.stderr").read_text()
