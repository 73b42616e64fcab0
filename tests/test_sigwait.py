"""A worker waits for the one task it runs by signal (pmc.runtime.sigwait): what ends the
wait, on real processes, sockets and signals, each check in a fresh interpreter (the
wait needs its caller's thread to be the only one, and it blocks signals); and what
users see of it: tasks start with nothing blocked, a long task's worker stays heard, a
stop reaches a task at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pmctest import REPO, pmc, write_dag

_SETUP = """
import os, signal, socket, subprocess, sys, threading
from pmc.runtime.launch import Running
from pmc.runtime.sigwait import SignalWait
mine, master = socket.socketpair()
rd, wr = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
signal.set_wakeup_fd(wr, warn_on_full_buffer=False)
signal.signal(signal.SIGUSR1, lambda *a: None)
"""


def _check(body: str) -> list[str]:
    """Run ``body`` after ``_SETUP``; the lines it printed."""
    proc = subprocess.run([sys.executable, "-c", _SETUP + body], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_a_child_s_exit_ends_the_wait_unreaped() -> None:
    assert _check("""
w = SignalWait((mine.fileno(), rd))
child = subprocess.Popen(["/bin/sh", "-c", "exit 3"])
print(w.usable, w.wait(30.0) == signal.SIGCHLD)
pid, status = os.waitpid(child.pid, 0)  # not reaped by the wait
print(pid == child.pid, os.waitstatus_to_exitcode(status))
child.returncode = 3
""") == ["True", "True", "True", "3"]


def test_the_master_s_message_and_a_caught_signal_end_it() -> None:
    """Both turn a watched fd readable (the socket, the wake-up pipe): SIGIO."""
    assert _check("""
w = SignalWait((mine.fileno(), rd))
master.send(b"x")
print(w.wait(30.0) == signal.SIGIO, mine.recv(1))
os.kill(os.getpid(), signal.SIGUSR1)  # caught: its handler runs, Python writes the pipe
print(w.wait(30.0) == signal.SIGIO, os.read(rd, 8) == bytes([signal.SIGUSR1]))
print(w.wait(0.05))  # nothing more: the time runs out
""") == ["True", "b'x'", "True", "True", "0"]


def test_close_puts_back_the_mask_and_the_flags() -> None:
    assert _check("""
import fcntl
before = fcntl.fcntl(mine.fileno(), fcntl.F_GETFL)
w = SignalWait((mine.fileno(), rd))
print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, ())) == sorted(w.mask | {17, 29}))
master.send(b"x")  # a SIGIO left pending: ignored once unblocked
w.close()
print(signal.pthread_sigmask(signal.SIG_BLOCK, ()) == set())
print(fcntl.fcntl(mine.fileno(), fcntl.F_GETFL) == before, w.usable)
""") == ["True", "True", "True", "False"]


def test_not_with_a_second_thread() -> None:
    """A signal for the process could go to the other thread, and be lost there."""
    assert _check("""
stop = threading.Event()
threading.Thread(target=stop.wait).start()
w = SignalWait((mine.fileno(), rd))
print(w.usable, signal.pthread_sigmask(signal.SIG_BLOCK, ()) == set())
stop.set()
""") == ["False", "True"]


def test_tasks_start_with_no_signal_blocked(tmp_path: Path) -> None:
    """The worker blocks SIGCHLD and SIGIO while its loop runs; its tasks (and a task
    run through a pre-exec hook, for its memory limit) start with the mask it had."""
    write_dag(tmp_path / "m.dag", "TASK plain /bin/grep SigBlk /proc/self/status\n"
              "TASK limited -m 512 /bin/grep SigBlk /proc/self/status\n")
    res = pmc(["run", "m.dag", "--workers", "1", "--strict-limits", "-s"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("SigBlk:\t0000000000000000") == 2, res.stdout


def test_a_task_longer_than_the_worker_timeout_keeps_its_worker_heard(
        tmp_path: Path) -> None:
    """The wait ends for the worker's heartbeats (a quarter of --worker-timeout): a task
    that runs three times as long does not make the master take its worker for lost."""
    write_dag(tmp_path / "w.dag", "TASK long /bin/sleep 3\n")
    res = pmc(["run", "w.dag", "--workers", "1", "--worker-timeout", "1", "-s"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "lost" not in res.stderr.lower(), res.stderr
    assert 'stat="ok", tasks=1, submitted=1, succeeded=1, failed=0' in res.stdout


def test_a_stop_reaches_a_task_that_runs_alone_at_once(tmp_path: Path) -> None:
    """SIGTERM to a worker whose one task sleeps: the handler's wake-up ends the wait, and
    the task is killed, not left to run for the rest of the worker's beat (150 s)."""
    write_dag(tmp_path / "s.dag", "TASK nap /bin/sleep 600\n")
    proc = subprocess.Popen([sys.executable, "-m", "pmc", "run", "s.dag", "--workers", "1",
                             "--worker-timeout", "600", "-s"], cwd=tmp_path,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        worker = _child_named(proc.pid, "pmc-worker-1")
        _child_named(worker, "sleep")
        os.kill(worker, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert "name=nap" in out and "status=15" in out, out + err


def _child_named(pid: int, name: str, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in map(int, f.read().split()):
                    try:
                        with open(f"/proc/{child}/comm") as c:
                            if c.read().strip() == name:
                                return child
                    except OSError:
                        pass
        time.sleep(0.05)
    raise AssertionError(f"no {name} under {pid}")
