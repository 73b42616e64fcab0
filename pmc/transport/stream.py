"""Messages over a stream socket: length-prefixed pickles, read into one buffer.

Shared by the embedded transport (a socket pair per worker) and the MPI transport's
host sockets (workers on the master's host).
"""

from __future__ import annotations

import pickle
import socket
import struct

from pmc.core.protocol import Message, from_wire, to_wire

_HEADER = struct.Struct("!I")
# Reads go into one preallocated buffer: recv(n) allocates n bytes each call, and for
# 1 MiB that costs ~30 µs a message, more than the rest of receiving it.
RECV = 1 << 20


def frame(msg: Message) -> bytes:
    data = pickle.dumps(to_wire(msg), protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def unframe(buf: bytearray, out: list[Message]) -> None:
    """Move every whole message at the start of ``buf`` to ``out``."""
    pos = 0
    size = len(buf)
    while size - pos >= 4:
        (n,) = _HEADER.unpack_from(buf, pos)
        if size - pos - 4 < n:
            break
        out.append(from_wire(pickle.loads(buf[pos + 4 : pos + 4 + n])))  # noqa: S301 - our own peer
        pos += 4 + n
    if pos:
        del buf[:pos]


class Conn:
    """One peer's socket and the bytes received from it that make no whole message yet."""

    __slots__ = ("buf", "rank", "sock")

    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank = rank
        self.sock = sock
        self.buf = bytearray()

    def receive(self, view: memoryview, out: list[Message], flags: int = 0) -> bool:
        """Read what is there into ``out``; False when the peer closed or broke the
        connection. With MSG_DONTWAIT, nothing there yet is not an end."""
        try:
            n = self.sock.recv_into(view, 0, flags)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not n:
            return False
        self.buf += view[:n]
        unframe(self.buf, out)
        return True
