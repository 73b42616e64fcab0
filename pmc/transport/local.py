"""The embedded transport: worker processes on this machine, one socket pair each.

Used when ``pmc run`` was not started by an MPI launcher. Each worker (ranks 1..N) gets
one end of a socketpair; messages are length-prefixed pickles
(``pmc.transport.stream``). Waiting is a ``select`` on the sockets: no polling, no
spinning. A worker whose socket closes is reported by ``lost()``; ``spawn`` starts one
in place of a lost one.

How a worker process starts: forked from the master, which runs the worker's entry
(``serve``, given by the composition root) in the child, while the master has no thread
but its main one; otherwise (a worker started in place of a lost one, once the run's
threads are going: a thread may hold a lock at the fork that the child then waits for
for ever) a fresh Python running ``pmc.runtime.worker`` (``pmc.pychild``). A forked
worker skips the interpreter's start and the imports the master has done already (a
fresh one spends ~60 ms of cpu on its start, all of it before its first task); its
pages are the master's until either writes to them. Either way the
worker is named ``pmc-worker-R`` (``ps -o comm``; R its rank) and runs in a process
group of its own.
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable

from pmc.core.protocol import Message
from pmc.process import flush_stdio
from pmc.pychild import python_command
from pmc.transport import TransportError
from pmc.transport.stream import RECV, Conn, frame

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    import subprocess
    from typing import NoReturn

# A worker's entry: its end of the socket pair (a descriptor), its rank, the run's size;
# returns the worker's exit code.
Serve = Callable[[int, int, int], int]


def forks() -> bool:
    """Whether workers started now are forked: this process has no thread but its main
    one (C libraries' threads are not seen; pmc starts none before its own)."""
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


class LocalMaster:
    """Rank 0's end: starts the workers and talks to them. Without ``serve`` every
    worker is a fresh Python."""

    rank = 0

    def __init__(self, workers: int, env: dict[str, str] | None = None,
                 serve: Serve | None = None) -> None:
        self.size = workers + 1
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, Conn] = {}
        self.procs: dict[int, subprocess.Popen[bytes] | Forked] = {}
        self._lost: list[int] = []
        self._rview = memoryview(bytearray(RECV))
        self.env = env
        self.serve = serve
        for rank in range(1, workers + 1):
            self._start(rank)

    def _start(self, rank: int) -> None:
        mine, theirs = socket.socketpair()
        try:
            if self.serve is not None and forks():
                proc: subprocess.Popen[bytes] | Forked = self._fork(rank, mine, theirs)
            else:
                proc = self._exec(rank, theirs)
        except OSError:
            mine.close()
            raise
        finally:
            theirs.close()
        conn = Conn(rank, mine)
        self.conns[rank] = conn
        self.procs[rank] = proc
        self.sel.register(mine, selectors.EVENT_READ, conn)

    def _fork(self, rank: int, mine: socket.socket, theirs: socket.socket) -> Forked:
        assert self.serve is not None
        flush_stdio()
        pid = os.fork()
        if pid == 0:
            # The master's ends of this pair and of the earlier workers' pairs: a worker
            # holding one would keep that socket open after the master is gone.
            ends = [mine, *(c.sock for c in self.conns.values())]
            _forked_worker(self.serve, theirs, rank, self.size, ends, self.sel, self.env)
        try:
            os.setpgid(pid, pid)  # as the child does: whichever runs first
        except OSError:
            pass  # it has exited already
        return Forked(pid)

    def _exec(self, rank: int, theirs: socket.socket) -> subprocess.Popen[bytes]:
        # Imported here: a master that forks its workers, and an MPI worker rank (which
        # imports this module for LocalWorker), need no subprocess.
        import subprocess

        return subprocess.Popen(
            python_command("pmc.runtime.worker", "--fd", str(theirs.fileno()),
                           "--rank", str(rank), "--size", str(self.size)),
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=self.env,
            # A process group of its own: a terminal's Ctrl-C (sent to the foreground
            # group) reaches the master only, which decides how the workers stop. Not
            # a session of its own: batch systems that track a job by its session
            # (PBS/Torque) must see the workers and their tasks, and signal them.
            process_group=0,
        )

    def spawn(self) -> int:
        """One more worker, in place of a lost one: the next rank (the size grows by one,
        so that its output files are merged with the others'). Raises OSError if it
        cannot be started."""
        rank = self.size
        self.size += 1
        try:
            self._start(rank)
        except OSError:
            self.size -= 1
            raise
        return rank

    def send(self, dest: int, msg: Message) -> None:
        conn = self.conns.get(dest)
        if conn is None:
            raise TransportError(f"worker {dest} is gone")
        try:
            conn.sock.sendall(frame(msg))
        except OSError as e:
            self._drop(conn)
            raise TransportError(f"worker {dest} is gone: {e}") from e

    def poll(self, timeout: float | None) -> list[tuple[int, Message]]:
        out: list[tuple[int, Message]] = []
        if not self.conns:
            if timeout:
                time.sleep(timeout)
            return out
        for key, _ in self.sel.select(timeout):
            conn: Conn = key.data
            msgs: list[Message] = []
            if not conn.receive(self._rview, msgs):
                self._drop(conn)
            out.extend((conn.rank, m) for m in msgs)
        return out

    def fileno(self) -> int | None:
        return self.sel.fileno() if hasattr(self.sel, "fileno") else None

    def lost(self) -> list[int]:
        lost, self._lost = self._lost, []
        return lost

    def abandon(self, rank: int) -> None:
        conn = self.conns.get(rank)
        if conn is not None:
            self._drop(conn)
            self._lost.remove(rank)  # the master knows
        proc = self.procs.get(rank)
        if proc is not None and proc.poll() is None:
            proc.kill()  # a stopped or hung worker; its guard ends its tasks

    def _drop(self, conn: Conn) -> None:
        if conn.rank in self.conns:
            del self.conns[conn.rank]
            self.sel.unregister(conn.sock)
            conn.sock.close()
            self._lost.append(conn.rank)

    def close(self, grace: float = 5.0) -> None:
        for conn in list(self.conns.values()):
            self.sel.unregister(conn.sock)
            conn.sock.close()
        self.conns.clear()
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            if not _exits_by(proc, deadline):
                proc.kill()
            proc.wait()
        self.sel.close()


class Forked:
    """A worker forked from the master: what the master asks of a ``Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None and not _exits_by(self, time.monotonic() + timeout):
            raise TimeoutError(f"worker {self.pid} still runs after {timeout:g} s")
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _forked_worker(serve: Serve, sock: socket.socket, rank: int, size: int,
                   ends: list[socket.socket], sel: selectors.BaseSelector,
                   env: dict[str, str] | None) -> NoReturn:
    """The child of the master's fork: made like a fresh worker process, it runs the
    worker and leaves, never returning into the master's code (nor running its exit
    handlers)."""
    code = 1
    try:
        os.setpgid(0, 0)  # see _exec
        # A fresh interpreter's handlers (the worker sets its own once configured).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for end in ends:
            end.close()
        sel.close()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        code = serve(sock.detach(), rank, size)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        flush_stdio()
        os._exit(code)


def _exits_by(proc: subprocess.Popen[bytes] | Forked, deadline: float) -> bool:
    """Whether ``proc`` has exited by ``deadline``, told by its pidfd the moment it does
    (``Popen.wait`` with a timeout polls, sleeping up to 50 ms between looks, which every
    run's shut-down waited for)."""
    if proc.poll() is not None:
        return True
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # no pidfds (before Linux 5.3): look every 10 ms
        while proc.poll() is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True
    try:
        return bool(select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0])
    finally:
        os.close(fd)


class LocalWorker:
    """A worker's end of the socket pair."""

    def __init__(self, fd: int, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self.conn = Conn(0, socket.socket(fileno=fd))
        self.sock = self.conn.sock
        self.sock.set_inheritable(False)
        self.pending: list[Message] = []
        self._rview = memoryview(bytearray(RECV))

    def send(self, dest: int, msg: Message) -> None:
        try:
            self.sock.sendall(frame(msg))
        except OSError as e:
            raise TransportError(f"master is gone: {e}") from e

    def poll(self, timeout: float | None) -> list[tuple[int, Message]]:
        if not self.pending:
            if timeout != 0:
                sel = selectors.DefaultSelector()
                sel.register(self.sock, selectors.EVENT_READ)
                ready = sel.select(timeout)
                sel.close()
                if not ready:
                    return []
            self._read()
        out = [(0, m) for m in self.pending]
        self.pending = []
        return out

    def _read(self) -> None:
        if not self.conn.receive(self._rview, self.pending, socket.MSG_DONTWAIT):
            raise TransportError("master is gone")  # closed or reset: it was killed

    def fileno(self) -> int | None:
        return self.sock.fileno()

    def lost(self) -> list[int]:
        return []

    def abandon(self, rank: int) -> None:
        pass

    def close(self) -> None:
        self.sock.close()


__all__ = ["Forked", "LocalMaster", "LocalWorker", "forks"]
