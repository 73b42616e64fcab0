"""Launch and reap (pmc.runtime.launch, pmc.runtime.taskio) with real processes: exit
statuses, deaths by signal, where output goes, the stderr tail of a failed try, -f and
-F forwards, the kill of a task's process group; and the guard (pmc.runtime.guard), both
as a program and through its worker end."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pmc import log
from pmc.core import protocol
from pmc.core.protocol import FAILED_STATUS, TaskResult, TaskSpec, WorkerConfig
from pmc.options import RunOptions
from pmc.runtime import guard, taskio
from pmc.runtime.launch import Launcher, Running
from pmc.runtime.startup import worker_config


def _config(tmp: Path, **over: object) -> WorkerConfig:
    opts = RunOptions(dag=str(tmp / "w.dag"), keep_affinity=True)
    config = worker_config(opts, str(tmp / "out.{rank}"), str(tmp / "err.{rank}"))
    return config._replace(log_level=log.INFO, **over)


def _spec(name: str, command: str, **over: object) -> TaskSpec:
    fields: dict[str, object] = dict(
        id=abs(hash(name)) % 100000, name=name, command=command, cpus=1, memory=0,
        attempt=1, pipe_forwards=None, file_forwards=None, pegasus_id=None, affinity=None)
    fields.update(over)
    return TaskSpec(**fields)  # type: ignore[arg-type]


class _Sent:
    def __init__(self) -> None:
        self.messages: list[protocol.Message] = []

    def __call__(self, msg: protocol.Message) -> None:
        self.messages.append(msg)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    sent = _Sent()
    la = Launcher(_config(tmp_path), 1, "testhost", dict(os.environ), sent)
    la.sent = sent  # type: ignore[attr-defined]
    try:
        yield la
    finally:
        la.signal_all(signal.SIGKILL)
        for r in list(la.running.values()):
            la.reap(r)
        la.accounting.close()
        if la.guard.fd >= 0:
            os.close(la.guard.fd)


def _finish(la: Launcher, spec: TaskSpec, timeout: float = 30.0) -> TaskResult:
    """Launch ``spec`` and run the poller until its try has a result."""
    before = len(la.results)
    la.launch(spec)
    deadline = time.monotonic() + timeout
    while len(la.results) == before:
        assert time.monotonic() < deadline, "the task did not end"
        for data in la.wait(1.0):
            if isinstance(data, Running):
                la.reap(data)
            elif isinstance(data, tuple):
                la.read_pipe(*data)
    return la.results[-1]


def test_exit_status_and_record(launcher: Launcher, tmp_path: Path) -> None:
    res = _finish(launcher, _spec("t", "/bin/sh -c 'echo out; exit 3'"))
    assert res.status == 3 << 8 and protocol.exit_code_of(res.status) == 3
    assert res.error is None and res.forwards is None
    out = (tmp_path / "out.1").read_text()
    assert out.startswith("out\n[cluster-task name=t,") and "status=768," in out
    assert 'hostname="testhost", slot=1,' in out
    assert [s[0] for s in launcher.starts] == [res.id] and not launcher.running


def test_the_guard_starts_with_the_first_task(launcher: Launcher) -> None:
    """A worker that runs no task (most ranks of a short run) starts no guard, a Python
    of its own; its first task does, and the task's group is in the guard's table."""
    assert not launcher.guard.started and launcher.guard.pid == 0
    assert launcher.launch(_spec("g", "/bin/sh -c 'sleep 0.3'"))
    (r,) = launcher.running.values()
    assert launcher.guard.pid > 0 and r.pid in guard.read_table(launcher.guard.table_fd)
    while not launcher.results:
        for data in launcher.wait(1.0):
            if isinstance(data, Running):
                launcher.reap(data)
    assert launcher.results[-1].status == 0
    assert r.pid not in guard.read_table(launcher.guard.table_fd)


def test_success_has_no_stderr_tail(launcher: Launcher, tmp_path: Path) -> None:
    res = _finish(launcher, _spec("ok", "/bin/sh -c 'echo e >&2'"))
    assert res.status == 0 and res.stderr_tail is None and res.stderr_path is None
    assert (tmp_path / "err.1").read_text() == "e\n"


def test_death_by_signal(launcher: Launcher) -> None:
    res = _finish(launcher, _spec("s", "/bin/sh -c 'kill -9 $$'"))
    assert res.status == signal.SIGKILL and protocol.signal_of(res.status) == 9


def test_stderr_tail_of_a_failed_try(launcher: Launcher, tmp_path: Path) -> None:
    (tmp_path / "err.1").write_text("before the try\n")  # not this try's
    script = "for i in $(seq 1 25); do echo line$i >&2; done; exit 2"
    res = _finish(launcher, _spec("f", f"/bin/sh -c '{script}'"))
    assert res.status == 2 << 8
    assert res.stderr_path == str(tmp_path / "err.1")
    assert res.stderr_tail == "\n".join(f"line{i}" for i in range(16, 26))  # TAIL_LINES


def test_stderr_tail_is_bounded_in_bytes(launcher: Launcher) -> None:
    res = _finish(launcher, _spec("big", "/bin/sh -c 'head -c 10000 /dev/zero | tr \"\\0\" x "
                                         ">&2; exit 1'"))
    assert res.stderr_tail is not None and len(res.stderr_tail) <= taskio.TAIL_BYTES


def test_a_program_that_cannot_start(launcher: Launcher, tmp_path: Path) -> None:
    spec = _spec("n", "no-such-program-pmc-test arg")
    assert launcher.launch(spec) is False
    res = launcher.results[-1]
    message = ("Unable to exec command no-such-program-pmc-test for task n: "
               "No such file or directory")
    assert res.status == FAILED_STATUS and res.error == message
    assert res.stderr_tail == message
    assert (tmp_path / "err.1").read_text() == message + "\n"
    assert "[cluster-task name=n," in (tmp_path / "out.1").read_text()
    assert launcher.starts[-1][0] == spec.id and not launcher.running


def test_a_command_that_cannot_be_split(launcher: Launcher) -> None:
    assert launcher.launch(_spec("q", "/bin/echo 'unclosed")) is False
    assert launcher.results[-1].error is not None
    assert launcher.results[-1].error.startswith("cannot split command")


def test_environment_of_a_task(launcher: Launcher, tmp_path: Path) -> None:
    launcher.host_rank = 4
    res = _finish(launcher, _spec("envtask", "/bin/sh -c 'echo $PMC_TASK $PMC_RANK "
                                            "$PMC_HOST_RANK $PMC_CPUS $PMC_MEMORY'",
                                  memory=7))
    assert res.status == 0
    assert (tmp_path / "out.1").read_text().startswith("envtask 1 4 1 7\n")


def test_pipe_forward(launcher: Launcher) -> None:
    res = _finish(launcher, _spec("p", "/bin/sh -c 'echo hello >&$A; echo bye >&$B'",
                                  pipe_forwards=(("A", "a.out"), ("B", "b.out"))))
    assert res.status == 0
    assert sorted(res.forwards or ()) == [("a.out", b"hello\n"), ("b.out", b"bye\n")]


def test_pipe_forward_spills_and_goes_in_pieces(launcher: Launcher,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(taskio, "PIPE_MEMORY", 1000)
    monkeypatch.setattr(taskio, "FORWARD_CHUNK", 4096)
    res = _finish(launcher, _spec("big", "/bin/sh -c 'head -c 10000 /dev/zero >&$A'",
                                  pipe_forwards=(("A", "a.out"),)))
    assert res.status == 0 and res.forwards is None
    sent = launcher.sent.messages  # type: ignore[attr-defined]
    pieces = [m for m in sent if isinstance(m, protocol.Forward)]
    assert len(pieces) == len(sent) == 3
    assert all(m.task_id == res.id and m.destination == "a.out" for m in pieces)
    assert b"".join(m.data for m in pieces) == bytes(10000)


def test_file_forward_read_and_removed(launcher: Launcher, tmp_path: Path) -> None:
    src = tmp_path / "made.txt"
    res = _finish(launcher, _spec("F", f"/bin/sh -c 'echo data > {src}'",
                                  file_forwards=((str(src), "dest.txt"),)))
    assert res.status == 0 and res.forwards == (("dest.txt", b"data\n"),)
    assert not src.exists()


def test_file_forward_not_a_file_fails_the_try(launcher: Launcher, tmp_path: Path) -> None:
    src = tmp_path / "adir"
    res = _finish(launcher, _spec("G", f"/bin/mkdir {src}",
                                  file_forwards=((str(src), "dest.txt"),)))
    assert res.status == FAILED_STATUS and res.error == f"Task G: {src} is not a file"
    assert res.forwards is None


def test_kill_reaches_the_whole_process_group(launcher: Launcher, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    spec = _spec("k", f"/bin/sh -c 'sleep 300 & echo $! > {pidfile}; wait'")
    assert launcher.launch(spec)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    child = int(pidfile.read_text())
    (r,) = launcher.running.values()
    assert os.getpgid(child) == r.pid  # the task's own group
    launcher.signal_all(signal.SIGTERM)
    res = _finish_running(launcher)
    assert res.status == signal.SIGTERM
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, "the task's child survived the kill"
        time.sleep(0.02)


def _finish_running(la: Launcher) -> TaskResult:
    before = len(la.results)
    while len(la.results) == before:
        for data in la.wait(5.0):
            if isinstance(data, Running):
                la.reap(data)
    return la.results[-1]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_per_task_stdio_numbers_each_try(tmp_path: Path) -> None:
    la = Launcher(_config(tmp_path, per_task_stdio=True, out_path="", err_path=""), 1, "h",
                  dict(os.environ), _Sent())
    try:
        for _ in range(2):
            res = _finish(la, _spec("pt", "/bin/sh -c 'echo o; echo e >&2; exit 1'"))
            assert res.status == 1 << 8
        assert (tmp_path / "pt.out.000").read_text().startswith("o\n[cluster-task name=pt,")
        assert (tmp_path / "pt.err.001").read_text() == "e\n"
        assert res.stderr_path == str(tmp_path / "pt.err.001")
    finally:
        la.accounting.close()
        os.close(la.guard.fd)


# -- the guard --------------------------------------------------------------------------


def _group(cmd: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["/bin/sh", "-c", cmd], process_group=0)


def _reap(g: guard.Guard) -> int:
    """The guard's exit code (it is this process's child)."""
    return os.waitstatus_to_exitcode(os.waitpid(g.pid, 0)[1])


def test_guard_terminates_the_groups_held_when_the_worker_is_gone() -> None:
    kept, gone = _group("sleep 300"), _group("sleep 300")
    g = guard.Guard(3.0)
    try:
        assert g.fd >= 0 and g.pid > 0
        g.hold(kept.pid)
        g.release(g.hold(gone.pid))
        time.sleep(0.3)
        assert os.waitpid(g.pid, os.WNOHANG) == (0, 0) and kept.poll() is None  # worker alive
        os.close(g.fd)  # as the worker's death would
        assert _reap(g) == 0
        assert kept.wait(5) == -signal.SIGTERM
        assert gone.poll() is None  # reaped by the worker: not the guard's
    finally:
        for p in (kept, gone):
            p.kill()
            p.wait()


def test_guard_table_grows_and_reuses_slots() -> None:
    g = guard.Guard(3.0)
    try:
        # (The first slot marks a spawn under way: never a group's.)
        slots = [g.hold(100000 + i) for i in range(guard._FIRST_SLOTS + 1)]
        assert sorted(slots) == list(range(1, guard._FIRST_SLOTS + 2))
        g.release(slots[7])
        assert g.hold(123) == slots[7]
        held = guard.read_table(g.table_fd)
        assert 123 in held and 100007 not in held and len(held) == guard._FIRST_SLOTS + 1
        # A slot torn by the worker's death mid-store (the group without its check) is
        # passed over.
        assert g.table is not None
        guard._SLOT.pack_into(g.table, slots[0] * guard._SLOT.size, 4242, 0)
        assert 4242 not in guard.read_table(g.table_fd)
    finally:
        os.close(g.fd)
        _reap(g)


def test_guard_program_kills_what_ignores_sigterm() -> None:
    stubborn = _group("trap '' TERM; sleep 300 & wait; sleep 300")
    time.sleep(0.2)
    g = guard.Guard(0.3)
    g.hold(stubborn.pid)
    t0 = time.monotonic()
    os.close(g.fd)
    try:
        assert _reap(g) == 0
        assert stubborn.wait(5) == -signal.SIGKILL
        assert time.monotonic() - t0 >= 0.3
    finally:
        stubborn.kill()
        stubborn.wait()


def test_guard_program_ignores_the_jobs_signals() -> None:
    g = guard.Guard(3.0)
    try:
        time.sleep(0.3)
        os.kill(g.pid, signal.SIGTERM)
        os.kill(g.pid, signal.SIGHUP)
        time.sleep(0.2)
        assert os.waitpid(g.pid, os.WNOHANG) == (0, 0)
    finally:
        os.close(g.fd)
        _reap(g)


def test_guard_removes_cgroup_directories(tmp_path: Path) -> None:
    d = tmp_path / "pmc-1"
    (d / "slot-1").mkdir(parents=True)
    (d / "slot-2").mkdir()
    guard.remove_cgroups([str(d), str(tmp_path / "gone")])
    assert not d.exists()


def test_guard_worker_end_batches_lines_until_flush(tmp_path: Path) -> None:
    d = tmp_path / "pmc-1"
    (d / "slot-1").mkdir(parents=True)
    g = guard.Guard(3.0)
    try:
        assert g.fd >= 0
        g.announce(b"c%s\n" % str(d).encode())
        assert g.lines == [b"c%s\n" % str(d).encode()]
        g.flush()
        assert g.lines == []
    finally:
        os.close(g.fd)  # as the worker's death would: the guard removes the cgroups
        assert _reap(g) == 0
    assert not d.exists()
