"""A worker that waits for its one running task in waitid (pmc.runtime.exitwait): the
wait itself on real processes, and a long task's worker still heard by its master. (A
stop reaching a worker whose task runs, and the master's word from before a task's end
acted on before the task queued behind it starts: tests/faults/test_signals.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pmctest import pmc, write_dag

from pmc.runtime.exitwait import ExitWait


@pytest.fixture
def exit_wait():
    wait = ExitWait()
    assert wait.usable, "the test process's main thread is its only thread"
    try:
        yield wait
    finally:
        wait.close()


def test_an_exit_ends_the_wait_and_is_left_to_reap(exit_wait: ExitWait) -> None:
    proc = subprocess.Popen(["/bin/sh", "-c", "exit 3"])
    assert exit_wait.wait(proc.pid, 30.0)
    pid, status = os.waitpid(proc.pid, 0)  # not reaped by the wait
    assert (pid, os.waitstatus_to_exitcode(status)) == (proc.pid, 3)
    proc.returncode = 3


def test_the_timer_ends_a_wait_for_a_task_that_runs_on(exit_wait: ExitWait) -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not exit_wait.wait(proc.pid, 0.01)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_a_task_longer_than_the_worker_timeout_keeps_its_worker_heard(
        tmp_path: Path) -> None:
    """The wait ends for the worker's heartbeats (a quarter of --worker-timeout): a task
    that runs three times as long does not make the master take its worker for lost."""
    write_dag(tmp_path / "w.dag", "TASK long /bin/sleep 3\n")
    res = pmc(["run", "w.dag", "--workers", "1", "--worker-timeout", "1", "-s"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "lost" not in res.stderr.lower(), res.stderr
    assert "[cluster-summary stat=\"ok\", tasks=1, submitted=1, succeeded=1, failed=0" in \
        res.stdout
