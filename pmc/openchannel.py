"""What an open run's channel is (a pmc extension): where its socket and token are, how
a message is framed, and how long one may be. Shared by the run's side
(``pmc.runtime.channel``) and the client's (``pmc.client``).

A message is a 4-byte big-endian length and that many bytes of a UTF-8 JSON object.
Every request carries the run's token, read by the client from a file only its owner
can read; the token is never on a command line or in a log.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any

MAX_MESSAGE = 16 << 20  # bytes: a request or a reply longer than this is refused
HEADER = struct.Struct(">I")


class ChannelError(Exception):
    """A message that cannot be read, or a channel that cannot be reached."""


def socket_path(dag: str) -> str:
    """The open run's Unix socket, beside the DAG."""
    return f"{dag}.sock"


def token_path(dag: str) -> str:
    """The file holding the open run's token, beside the DAG (mode 0600)."""
    return f"{dag}.token"


def address(path: str) -> tuple[str, int]:
    """An address for ``path`` that fits a Unix socket's 107 bytes, and a descriptor to
    close once bound or connected (-1: none): a longer path is reached through its
    directory's descriptor in /proc/self/fd."""
    if len(os.fsencode(path)) <= 100:
        return path, -1
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd


def encode(obj: dict[str, Any]) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    if len(body) > MAX_MESSAGE:
        raise ChannelError(f"message of {len(body)} bytes is over the limit of {MAX_MESSAGE}")
    return HEADER.pack(len(body)) + body


def _read_exact(sock: socket.socket, n: int) -> bytes:
    parts: list[bytes] = []
    left = n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def receive(sock: socket.socket) -> dict[str, Any] | None:
    """The next message, or None when the peer closed the connection between messages.
    Raises ChannelError for one that is truncated, too long or not a JSON object."""
    head = _read_exact(sock, HEADER.size)
    if not head:
        return None
    if len(head) < HEADER.size:
        raise ChannelError("truncated message header")
    (size,) = HEADER.unpack(head)
    if size > MAX_MESSAGE:
        raise ChannelError(f"message of {size} bytes is over the limit of {MAX_MESSAGE}")
    body = _read_exact(sock, size)
    if len(body) < size:
        raise ChannelError(f"truncated message: {len(body)} of {size} bytes")
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ChannelError(f"message is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ChannelError("message is not a JSON object")
    return obj
