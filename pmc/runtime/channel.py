"""An open run's channel (a pmc extension): the Unix socket beside the DAG that ``pmc
add``, ``pmc close`` and ``pmc.client`` talk to, served by threads of its own.

Only the run's user gets in: the socket and the token file are mode 0600, a peer whose
uid (SO_PEERCRED) is not the run's is turned away, and every request must carry the
token. A message that is malformed, truncated, too long or has the wrong token is
refused with a logged reason (never the token) and its connection closed; nothing else
is touched. Requests that pass are queued for the master's loop, which alone reads and
changes the run (``take``), woken by a byte on a pipe (``fileno``); the connection's
thread waits for the master's reply and sends it.
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
from typing import Any

from pmc import log
from pmc.openchannel import ChannelError, address, encode, receive, socket_path, token_path

MAX_CONNECTIONS = 64  # at once; more are turned away
IDLE_TIMEOUT = 600.0  # seconds a connection may stay silent mid-message or between them
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


def _write_token(path: str) -> str:
    token = secrets.token_urlsafe(32)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, token.encode() + b"\n")
    finally:
        os.close(fd)
    return token


class Channel:
    """The socket and token of an open run of ``dag`` (both removed by ``close``)."""

    def __init__(self, dag: str, ops: frozenset[str]) -> None:
        self.ops = ops
        self.path = socket_path(dag)
        self.token_file = token_path(dag)
        for stale in (self.token_file, self.path):  # of a run killed before its end
            with contextlib.suppress(FileNotFoundError):  # (the DAG is locked)
                os.unlink(stale)
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
        # The token last: once it exists, a client that reads it can connect.
        self._token = _write_token(self.token_file).encode()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._queue: deque[Request] = deque()
        self._open: set[Request] = set()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._closed = False
        threading.Thread(target=self._accept, name="pmc-open-channel", daemon=True).start()

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
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for path in (self.path, self.token_file):
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the channel's threads -----------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                log.warn("Open run: refused a connection: too many at once")
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(IDLE_TIMEOUT)
                pid, uid, _gid = _CRED.unpack(
                    conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
                if uid != os.getuid():
                    log.warn(f"Open run: refused a connection from uid {uid} (pid {pid}): "
                             "not the run's user")
                    return
                while self._serve_one(conn, pid):
                    pass
        except OSError:
            pass  # the peer went away (or timed out): nothing was queued for it
        finally:
            self._slots.release()

    def _serve_one(self, conn: socket.socket, pid: int) -> bool:
        """One request and its reply; False to close the connection."""
        try:
            msg = receive(conn)
        except ChannelError as e:
            return self._refuse(conn, pid, str(e))
        if msg is None:
            return False
        token = msg.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self._token):
            return self._refuse(conn, pid, "wrong token")
        op = msg.get("op")
        if op not in self.ops:
            return self._refuse(conn, pid, f"unknown operation {str(op)[:40]!r}")
        req = Request(str(op), msg)
        with self._lock:
            if self._closed:
                return self._refuse(conn, pid, "the run ended")
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

    def _refuse(self, conn: socket.socket, pid: int, why: str) -> bool:
        log.warn(f"Open run: refused a request from pid {pid}: {why}")
        with contextlib.suppress(OSError):
            conn.sendall(encode({"ok": False, "error": f"refused: {why}"}))
        return False
