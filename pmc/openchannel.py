"""What an open run's channel is (a pmc extension): where its socket, token and TCP
address file are, how a message is framed, how long one may be, and how a TCP
connection proves it knows the token. Shared by the run's side (``pmc.runtime.channel``)
and the client's (``pmc.client``).

A message is a 4-byte big-endian length and that many bytes of a UTF-8 JSON object.
Every request carries the run's token, read by the client from a file only its owner
can read; the token is never on a command line or in a log. Over TCP (``--open-tcp``)
the token itself never crosses the network: the run greets each connection with a
random challenge, and that connection's requests carry ``proof(token, challenge)``.
"""

from __future__ import annotations

import hashlib
import hmac
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


def tcp_path(dag: str) -> str:
    """The file saying where the open run listens on TCP, beside the DAG (mode 0600)."""
    return f"{dag}.tcp"


GREETING = "pmc-open-run"  # the "pmc" field of the first message of a TCP connection


def proof(token: str, challenge: str) -> str:
    """What a TCP connection greeted with ``challenge`` sends as its requests' token."""
    return hmac.new(token.encode(), f"{GREETING}:{challenge}".encode(),
                    hashlib.sha256).hexdigest()


def keepalive(sock: socket.socket) -> None:
    """A TCP peer whose host died or left the network is noticed within about a minute
    (not the kernel's two hours): its connection then fails rather than waits."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def tcp_text(port: int, hosts: list[str]) -> str:
    """The TCP address file: JSON, the port and the hosts to try in order."""
    return json.dumps({"port": port, "hosts": hosts}) + "\n"


def host_port(host: str, port: int) -> str:
    """``host:port`` as written for people, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def read_tcp(dag: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of the open run's TCP channel, to try in order. Raises
    OSError when there is no address file, ChannelError when it is not one."""
    with open(tcp_path(dag), encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
        port, hosts = data["port"], data["hosts"]
    except (ValueError, TypeError, KeyError):
        raise ChannelError(f"{tcp_path(dag)}: not an open run's TCP address file") from None
    if not isinstance(port, int) or not isinstance(hosts, list) or not all(
            isinstance(h, str) for h in hosts):
        raise ChannelError(f"{tcp_path(dag)}: not an open run's TCP address file")
    return [(h, port) for h in hosts]


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
