"""The embedded transport: worker processes on this machine, one socket pair each.

Used when ``pmc run`` was not started by an MPI launcher. The master starts a Python
running ``pmc.worker`` for ranks 1..N (see ``pmc.pychild``) with one end of a
socketpair; messages are length-prefixed pickles. Waiting is a ``select`` on the
sockets: no polling, no spinning. A worker whose socket closes is reported by ``lost()``.
"""

from __future__ import annotations

import pickle
import selectors
import signal
import socket
import struct
import subprocess
import time

from pmc.protocol import Message
from pmc.pychild import python_command
from pmc.transport import TransportError

_HEADER = struct.Struct("!I")
# Reads go into one preallocated buffer: recv(n) allocates n bytes each call, and for
# 1 MiB that costs ~30 µs a message, more than the rest of receiving it.
_RECV = 1 << 20


class _Conn:
    __slots__ = ("buf", "rank", "sock")

    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank = rank
        self.sock = sock
        self.buf = bytearray()


def _frame(msg: Message) -> bytes:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _unframe(buf: bytearray, out: list[Message]) -> None:
    pos = 0
    size = len(buf)
    while size - pos >= 4:
        (n,) = _HEADER.unpack_from(buf, pos)
        if size - pos - 4 < n:
            break
        out.append(pickle.loads(buf[pos + 4 : pos + 4 + n]))  # noqa: S301 - our own peer
        pos += 4 + n
    if pos:
        del buf[:pos]


class LocalMaster:
    """Rank 0's end: spawns the workers and talks to them."""

    rank = 0

    def __init__(self, workers: int, env: dict[str, str] | None = None) -> None:
        self.size = workers + 1
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, _Conn] = {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._lost: list[int] = []
        self._rview = memoryview(bytearray(_RECV))
        for rank in range(1, workers + 1):
            mine, theirs = socket.socketpair()
            proc = subprocess.Popen(
                python_command("pmc.worker", "--fd", str(theirs.fileno()),
                               "--rank", str(rank), "--size", str(self.size)),
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
                # Ctrl-C reaches the master only; it decides how the workers stop.
                start_new_session=True,
            )
            theirs.close()
            conn = _Conn(rank, mine)
            self.conns[rank] = conn
            self.procs[rank] = proc
            self.sel.register(mine, selectors.EVENT_READ, conn)

    def send(self, dest: int, msg: Message) -> None:
        conn = self.conns.get(dest)
        if conn is None:
            raise TransportError(f"worker {dest} is gone")
        try:
            conn.sock.sendall(_frame(msg))
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
            conn: _Conn = key.data
            try:
                n = conn.sock.recv_into(self._rview)
            except OSError:
                n = 0
            if not n:
                self._drop(conn)
                continue
            conn.buf += self._rview[:n]
            msgs: list[Message] = []
            _unframe(conn.buf, msgs)
            out.extend((conn.rank, m) for m in msgs)
        return out

    def fileno(self) -> int | None:
        return self.sel.fileno() if hasattr(self.sel, "fileno") else None

    def lost(self) -> list[int]:
        lost, self._lost = self._lost, []
        return lost

    def _drop(self, conn: _Conn) -> None:
        if conn.rank in self.conns:
            del self.conns[conn.rank]
            self.sel.unregister(conn.sock)
            conn.sock.close()
            self._lost.append(conn.rank)

    def kill(self, rank: int) -> None:
        proc = self.procs.get(rank)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)

    def close(self, grace: float = 5.0) -> None:
        for conn in list(self.conns.values()):
            self.sel.unregister(conn.sock)
            conn.sock.close()
        self.conns.clear()
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.sel.close()


class LocalWorker:
    """A worker's end of the socket pair."""

    def __init__(self, fd: int, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self.sock = socket.socket(fileno=fd)
        self.sock.set_inheritable(False)
        self.buf = bytearray()
        self.pending: list[Message] = []
        self._rview = memoryview(bytearray(_RECV))

    def send(self, dest: int, msg: Message) -> None:
        try:
            self.sock.sendall(_frame(msg))
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
        try:
            n = self.sock.recv_into(self._rview, 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError as e:  # e.g. reset: the master was killed
            raise TransportError(f"master is gone: {e}") from e
        if not n:
            raise TransportError("master is gone")
        self.buf += self._rview[:n]
        _unframe(self.buf, self.pending)

    def fileno(self) -> int | None:
        return self.sock.fileno()

    def lost(self) -> list[int]:
        return []

    def close(self) -> None:
        self.sock.close()


def worker_pids(master: LocalMaster) -> dict[int, int]:
    return {rank: p.pid for rank, p in master.procs.items()}


__all__ = ["LocalMaster", "LocalWorker", "worker_pids"]
