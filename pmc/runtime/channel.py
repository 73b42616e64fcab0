"""An open run's channel (a pmc extension): the Unix socket beside the DAG that ``pmc
add``, ``pmc close`` and ``pmc.client`` talk to, and with ``--open-tcp`` a TCP socket
for clients on other hosts, served by threads of its own.

Only the run's user gets in: the socket and the token file are mode 0600, a peer whose
uid (SO_PEERCRED) is not the run's is turned away, and every request must carry the
token. Over TCP, where no peer's uid is known, the token alone admits: the file that
holds it is readable by its owner only (on the shared file system, that is what shows
a client on another host to be the run's user); each connection is greeted with a
random challenge and its requests carry ``proof(token, challenge)``, so the token never
crosses the network, and one that is silent or wrong is turned away within
``TCP_FIRST_MESSAGE`` seconds. TCP connections have slots of their own: peers on the
network cannot keep the Unix socket's clients out. Where the run listens on TCP is
written to ``DAG.tcp`` (mode 0600, atomically, once it listens).

A message that is malformed, truncated, too long or has the wrong token is refused with
a logged reason (never the token) and its connection closed; nothing else is touched.
Requests that pass are queued for the master's loop, which alone reads and changes the
run (``take``), woken by a byte on a pipe (``fileno``); the connection's thread waits
for the master's reply and sends it.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pmc import log
from pmc.files import atomic_write
from pmc.openchannel import (
    GREETING,
    ChannelError,
    address,
    encode,
    host_port,
    keepalive,
    proof,
    receive,
    socket_path,
    tcp_path,
    tcp_text,
    token_path,
)
from pmc.optiontypes import Listen

MAX_CONNECTIONS = 64  # at once; more are turned away
IDLE_TIMEOUT = 600.0  # seconds a connection may stay silent mid-message or between them
TCP_FIRST_MESSAGE = 30.0  # seconds a TCP peer has to send its first request, whole
REPLY_WAIT = 5.0  # seconds the end of a run waits for replies to be sent
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Request:
    """One request for the master: its operation and fields; ``answer`` replies."""

    __slots__ = ("_done", "body", "op", "reply")

    def __init__(self, op: str, body: dict[str, Any]) -> None:
        self.op = op
        self.body = body
        self.reply: dict[str, Any] = {"ok": False, "error": "the run ended"}
        self._done = threading.Event()

    def answer(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self._done.set()

    def answered(self) -> bool:
        return self._done.is_set()

    def wait(self) -> dict[str, Any]:
        self._done.wait()
        return self.reply


def _write_private(path: str, text: str) -> None:
    """``text`` to ``path``, mode 0600 from the start, whole or not at all."""
    mask = os.umask(0o177)
    try:
        atomic_write(path, text, mode=0o600)
    finally:
        os.umask(mask)


class Channel:
    """The sockets and token of an open run of ``dag`` (all removed by ``close``);
    ``tcp``: listen on TCP too."""

    def __init__(self, dag: str, ops: frozenset[str], tcp: Listen | None = None) -> None:
        self.ops = ops
        self.path = socket_path(dag)
        self.token_file = token_path(dag)
        self.tcp_file = tcp_path(dag)
        for stale in (self.token_file, self.tcp_file, self.path):  # of a run killed
            with contextlib.suppress(FileNotFoundError):  # before its end (DAG locked)
                os.unlink(stale)
        self.tcp: socket.socket | None = None
        self.tcp_where = ""  # host:port, ... for the log
        tcp_file_text = ""
        if tcp is not None:  # first: an address that cannot be had stops the run here
            from pmc.runtime.tcplisten import listen

            self.tcp, hosts, port = listen(tcp, MAX_CONNECTIONS)
            self.tcp_where = ", ".join(host_port(h, port) for h in hosts)
            tcp_file_text = tcp_text(port, hosts)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        where, fd = address(self.path)
        mask = os.umask(0o177)
        try:
            self.sock.bind(where)
        finally:
            os.umask(mask)
            if fd >= 0:
                os.close(fd)
        os.chmod(self.path, 0o600)
        self.sock.listen(MAX_CONNECTIONS)
        self._token_text = secrets.token_urlsafe(32)
        self._token = self._token_text.encode()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._queue: deque[Request] = deque()
        self._open: set[Request] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, args=(self.sock, self._serve_unix),
                         name="pmc-open-channel", daemon=True).start()
        if self.tcp is not None:
            _write_private(self.tcp_file, tcp_file_text)
            threading.Thread(target=self._accept, args=(self.tcp, self._serve_tcp),
                             name="pmc-open-channel-tcp", daemon=True).start()
        # The token last: once it exists, a client that reads it can connect.
        _write_private(self.token_file, self._token_text + "\n")

    def fileno(self) -> int:
        """Readable when requests wait for ``take``."""
        return self._wake_r

    def take(self) -> list[Request]:
        """The requests waiting for the master, oldest first."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        with self._lock:
            taken = list(self._queue)
            self._queue.clear()
        return taken

    def close(self) -> None:
        """Stop taking requests; those not answered hear that the run ended."""
        with self._lock:
            self._closed = True
            pending = list(self._open)
        for req in pending:
            if not req.answered():
                req.answer({"ok": False, "error": "the run ended"})
        # The replies go out before the run goes on to end (a client told its run is
        # closed hears so); a client that does not read them is not waited for long.
        end = time.monotonic() + REPLY_WAIT
        while self._open and time.monotonic() < end:
            time.sleep(0.01)
        for sock in (self.sock, self.tcp):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        for path in (self.path, self.token_file, *([self.tcp_file] if self.tcp else [])):
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the channel's threads -----------------------------------------------------------

    def _accept(self, sock: socket.socket,
                serve: Callable[[socket.socket, Any], None]) -> None:
        slots = threading.BoundedSemaphore(MAX_CONNECTIONS)  # each socket its own
        while True:
            try:
                conn, peer = sock.accept()
            except OSError:
                return  # closed
            if not slots.acquire(blocking=False):
                log.warn("Open run: refused a connection: too many at once")
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(serve, conn, peer, slots),
                             daemon=True).start()

    def _serve(self, serve: Callable[[socket.socket, Any], None], conn: socket.socket,
               peer: Any, slots: threading.BoundedSemaphore) -> None:
        try:
            with conn:
                serve(conn, peer)
        except OSError:
            pass  # the peer went away (or timed out): nothing was queued for it
        finally:
            slots.release()

    def _serve_unix(self, conn: socket.socket, _peer: Any) -> None:
        conn.settimeout(IDLE_TIMEOUT)
        pid, uid, _gid = _CRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
        if uid != os.getuid():
            log.warn(f"Open run: refused a connection from uid {uid} (pid {pid}): "
                     "not the run's user")
            return
        while self._serve_one(conn, f"pid {pid}", self._token):
            pass

    def _serve_tcp(self, conn: socket.socket, peer: Any) -> None:
        host, port = peer[0], peer[1]
        who = f"{host_port(host, port)} (TCP)"
        challenge = secrets.token_hex(16)
        keepalive(conn)
        conn.settimeout(TCP_FIRST_MESSAGE)
        conn.sendall(encode({"pmc": GREETING, "challenge": challenge}))
        expected = proof(self._token_text, challenge).encode()
        if self._serve_one(conn, who, expected, first=True):
            conn.settimeout(IDLE_TIMEOUT)
            while self._serve_one(conn, who, expected):
                pass

    def _serve_one(self, conn: socket.socket, who: str, expected: bytes,
                   first: bool = False) -> bool:
        """One request and its reply; False to close the connection. ``who``: the peer,
        for the log; ``expected``: the token its requests must carry; ``first``: a TCP
        connection's first request, which must come whole in time."""
        try:
            msg = receive(conn)
        except TimeoutError:
            if first:
                return self._refuse(conn, who, f"no whole request in {TCP_FIRST_MESSAGE:g} s")
            return False  # silent too long: closed, as a peer's own close
        except ChannelError as e:
            return self._refuse(conn, who, str(e))
        if msg is None:
            return False
        token = msg.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), expected):
            return self._refuse(conn, who, "wrong token")
        op = msg.get("op")
        if op not in self.ops:
            return self._refuse(conn, who, f"unknown operation {str(op)[:40]!r}")
        req = Request(str(op), msg)
        with self._lock:
            if self._closed:
                return self._refuse(conn, who, "the run ended")
            self._queue.append(req)
            self._open.add(req)
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"!")
        try:
            conn.sendall(encode(req.wait()))
        finally:
            with self._lock:
                self._open.discard(req)
        return True

    def _refuse(self, conn: socket.socket, who: str, why: str) -> bool:
        log.warn(f"Open run: refused a request from {who}: {why}")
        with contextlib.suppress(OSError):
            conn.sendall(encode({"ok": False, "error": f"refused: {why}"}))
        return False
