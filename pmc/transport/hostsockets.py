"""Rank 0's end of the workers on its host that talk to it through a Unix socket.

Shared by the MPI transport (``pmc.transport.mpi``: the workers on the master's host,
once they have answered its offer through MPI) and the one-host transport
(``pmc.transport.onehost``: every worker, the offer passed through the launcher). The
master listens on an abstract socket (a random name, nothing in the file system); a
worker connects and introduces itself with its rank and a random token that only travels
the way the offer did. Messages are the embedded transport's length-prefixed pickles
(``pmc.transport.stream``); waiting is a ``select`` on the sockets: no polling.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct

from pmc import log
from pmc.core.protocol import Message
from pmc.transport import TransportError
from pmc.transport.stream import RECV, Conn, frame

INTRO = struct.Struct("!I16s")  # a worker's first bytes on its socket: rank, token
_CREDS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


class HostSockets:
    """The listening socket, the connections not yet introduced, and one ``Conn`` per
    worker that has; the ranks whose socket broke wait in ``lost``."""

    def __init__(self, ranks: set[int]) -> None:
        """Listen for ``ranks`` (OSError if there can be no socket)."""
        self.name = f"\0pmc-{os.getpid()}-{os.urandom(8).hex()}"
        self.token = os.urandom(16)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.name)
            listener.listen(min(len(ranks) + 1, 4096))
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self.listener: socket.socket | None = listener
        self.expected = set(ranks)  # may still connect
        self.conns: dict[int, Conn] = {}
        self.lost: list[int] = []
        self._strangers: dict[socket.socket, bytearray] = {}
        self._view = memoryview(bytearray(RECV))
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ, None)

    def expect_no(self, rank: int) -> None:
        """``rank`` will not connect (it talks another way, or was given up on): once no
        rank may, the listening socket closes."""
        self.expected.discard(rank)
        if not self.expected and self.listener is not None:
            self.sel.unregister(self.listener)
            self.listener.close()
            self.listener = None

    def wait(self, timeout: float | None, out: list[tuple[int, Message]]) -> list[int]:
        """Wait up to ``timeout`` for the sockets; the messages that came go to ``out``.
        Returns the ranks that connected and introduced themselves now."""
        introduced: list[int] = []
        for key, _ in self.sel.select(timeout):
            conn = key.data
            if conn is None:  # the listener
                try:
                    sock, _addr = key.fileobj.accept()  # type: ignore[union-attr]
                except OSError:
                    continue
                sock.setblocking(False)
                self._strangers[sock] = bytearray()
                self.sel.register(sock, selectors.EVENT_READ, sock)
            elif isinstance(conn, socket.socket):
                rank = self._introduce(conn)
                if rank is not None:
                    introduced.append(rank)
            else:
                msgs: list[Message] = []
                if not conn.receive(self._view, msgs):
                    self.drop(conn.rank)
                out.extend((conn.rank, m) for m in msgs)
        return introduced

    def _introduce(self, sock: socket.socket) -> int | None:
        """Read a new connection's introduction; its rank once it is whole and right."""
        buf = self._strangers[sock]
        try:
            data = sock.recv(INTRO.size - len(buf))
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        buf += data
        if data and len(buf) < INTRO.size:
            return None
        del self._strangers[sock]
        self.sel.unregister(sock)
        rank: int
        token: bytes
        rank, token = INTRO.unpack(buf) if len(buf) == INTRO.size else (0, b"")
        _pid, uid, _gid = _CREDS.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size))
        # Another user's process is refused before its token is looked at; the token
        # keeps out this user's other processes (another run's workers), which could
        # read it from this process's memory anyway: a plain comparison will do.
        if uid != os.getuid() or token != self.token or rank not in self.expected:
            sock.close()
            return None
        sock.setblocking(True)
        conn = Conn(rank, sock)
        self.conns[rank] = conn
        self.sel.register(sock, selectors.EVENT_READ, conn)
        log.debug(f"Worker {rank} is on the master's host: messages through a Unix socket")
        self.expect_no(rank)
        return rank

    def send(self, rank: int, msg: Message) -> None:
        """To a connected ``rank``; TransportError (and ``rank`` lost) if it broke."""
        conn = self.conns[rank]
        try:
            conn.sock.sendall(frame(msg))
        except OSError as e:
            self.drop(rank)
            raise TransportError(f"cannot send to rank {rank}: {e}") from e

    def drop(self, rank: int, lost: bool = True) -> None:
        """Close ``rank``'s socket; ``lost``: report it (the master does not know yet)."""
        conn = self.conns.pop(rank, None)
        if conn is not None:
            self.sel.unregister(conn.sock)
            conn.sock.close()
            if lost:
                self.lost.append(rank)

    def close(self) -> None:
        for conn in self.conns.values():
            conn.sock.close()
        self.conns.clear()
        for sock in self._strangers:
            sock.close()
        self._strangers.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        self.sel.close()


def connect(name: str, rank: int, token: bytes) -> socket.socket:
    """A worker: its connection to the master's socket ``name``, introduced (OSError
    if it cannot be made)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(name)
        sock.sendall(INTRO.pack(rank, token))
    except OSError:
        sock.close()
        raise
    return sock
