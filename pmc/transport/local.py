"""The embedded transport: worker processes on this machine, one socket pair each.

Used when ``pmc run`` was not started by an MPI launcher. The master starts a Python
running ``pmc.runtime.worker`` for ranks 1..N (see ``pmc.pychild``) with one end of a
socketpair; messages are length-prefixed pickles (``pmc.transport.stream``). Waiting is
a ``select`` on the sockets: no polling, no spinning. A worker whose socket closes is
reported by ``lost()``; ``spawn`` starts one in place of a lost one.
"""

from __future__ import annotations

import os
import select
import selectors
import socket
import time
from typing import TYPE_CHECKING

from pmc.core.protocol import Message
from pmc.pychild import python_command
from pmc.transport import TransportError
from pmc.transport.stream import RECV, Conn, frame

if TYPE_CHECKING:
    import subprocess


class LocalMaster:
    """Rank 0's end: spawns the workers and talks to them."""

    rank = 0

    def __init__(self, workers: int, env: dict[str, str] | None = None) -> None:
        self.size = workers + 1
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, Conn] = {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._lost: list[int] = []
        self._rview = memoryview(bytearray(RECV))
        self.env = env
        for rank in range(1, workers + 1):
            self._start(rank)

    def _start(self, rank: int) -> None:
        # Imported by the master alone: an MPI worker rank imports this module for
        # LocalWorker, and needs no subprocess.
        import subprocess

        mine, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(
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
        except OSError:
            mine.close()
            raise
        finally:
            theirs.close()
        conn = Conn(rank, mine)
        self.conns[rank] = conn
        self.procs[rank] = proc
        self.sel.register(mine, selectors.EVENT_READ, conn)

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


def _exits_by(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Whether ``proc`` has exited by ``deadline``, told by its pidfd the moment it does
    (``Popen.wait`` with a timeout polls, sleeping up to 50 ms between looks, which every
    run's shut-down waited for)."""
    if proc.poll() is not None:
        return True
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # no pidfds (before Linux 5.3)
        import subprocess

        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
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


__all__ = ["LocalMaster", "LocalWorker"]
