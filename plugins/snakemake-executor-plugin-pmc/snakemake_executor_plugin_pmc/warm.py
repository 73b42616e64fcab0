"""Warm starts (``--pmc-warm``): each job's Snakemake forked from a process that has
already imported Snakemake, instead of a new interpreter importing it again.

A Snakemake job of a remote executor is a Snakemake process of its own; on a small
machine most of its cpu is the import of Snakemake and its plugins (seconds), the job's
own work a fraction. The plugin starts one warm process on its host (``serve``), which
imports Snakemake once and listens on a Unix socket in the run's directory (mode 0600,
peers of another uid turned away). A job's task runs this file as a small client
(``python warm.py SOCKET -m snakemake ARGS``): it hands the warm process its standard
input, output and error, its working directory, environment, umask, cpu affinity and
address-space limit; the warm process forks a child that takes them on and runs
Snakemake's ``main(ARGS)``; the client forwards the signals it gets to the child's
process group and ends with the child's exit status. A client that finds no warm
process (another host, or one that ended) runs ``python -m snakemake ARGS`` itself.

What pmc's records then count of a job's cpu and memory is the client's (the task pmc
started), not the forked child's: use the default (a new interpreter per job) where
those figures matter. Run as a script: it imports nothing of Snakemake or the plugin.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
from typing import Any

HEADER = struct.Struct(">I")
MAX_REQUEST = 4 << 20  # bytes: argv and environment of one job
IDLE_SECONDS = 600.0  # a warm process with no job for this long ends
SNAKEMAKE = ["-m", "snakemake"]


def _address(path: str) -> tuple[str, int]:
    """``path`` as a Unix socket address that fits 107 bytes (through its directory's
    descriptor in /proc/self/fd if longer), and that descriptor to close (-1: none)."""
    if len(os.fsencode(path)) <= 100:
        return path, -1
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _send(conn: socket.socket, obj: dict[str, Any], fds: list[int] | None = None) -> None:
    body = json.dumps(obj).encode()
    if fds:
        socket.send_fds(conn, [HEADER.pack(len(body)) + body], fds)
    else:
        conn.sendall(HEADER.pack(len(body)) + body)


def _receive(conn: socket.socket, nfds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One message (None at end of stream or if malformed) and the descriptors sent
    with its first bytes."""
    first, fds, _flags, _addr = socket.recv_fds(conn, 65536, nfds) if nfds else \
        (conn.recv(65536), [], 0, None)
    data = bytearray(first)
    if len(data) < HEADER.size:
        return None, fds
    (size,) = HEADER.unpack_from(data)
    if size > MAX_REQUEST:
        return None, fds
    while len(data) < HEADER.size + size:
        more = conn.recv(HEADER.size + size - len(data))
        if not more:
            return None, fds
        data += more
    try:
        obj = json.loads(data[HEADER.size:HEADER.size + size])
    except ValueError:
        return None, fds
    return (obj if isinstance(obj, dict) else None), fds


# -- the client: a job's task -------------------------------------------------------------


def client(path: str, argv: list[str]) -> int:
    """Run ``argv`` (``-m snakemake ARGS``) through the warm process at ``path``, else
    with a new interpreter; the job's exit status."""
    try:
        conn = _connect(path)
    except OSError as e:
        print(f"pmc warm start: none on this host ({e.strerror}): a new interpreter",
              file=sys.stderr, flush=True)
        os.execv(sys.executable, [sys.executable, *argv])  # noqa: S606  (argv as given)
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    _send(conn, {"argv": argv[len(SNAKEMAKE):], "cwd": os.getcwd(),
                 "env": dict(os.environ), "umask": _umask(),
                 "affinity": sorted(os.sched_getaffinity(0)), "as": soft}, [0, 1, 2])
    started, _ = _receive(conn)
    if started is None or not isinstance(started.get("pid"), int):
        print("pmc warm start: the warm process did not start the job", file=sys.stderr)
        return 1
    child = started["pid"]

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                   signal.SIGUSR2):
        signal.signal(signum, forward)
    ended, _ = _receive(conn)
    if ended is None or not isinstance(ended.get("exit"), int):
        print("pmc warm start: the warm process ended before the job", file=sys.stderr)
        return 1
    code: int = ended["exit"]
    if code < 0:  # the child was killed by a signal: so is this process
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def _connect(path: str) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    where, fd = _address(path)
    try:
        conn.connect(where)
    except OSError:
        conn.close()
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    if _peer_uid(conn) != os.getuid():  # a socket another user put there
        conn.close()
        raise OSError(0, "its socket belongs to another user")
    return conn


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- the warm process ----------------------------------------------------------------------


def serve(path: str) -> None:
    """Import Snakemake and its plugins, listen at ``path``, fork a child per job."""
    import snakemake.cli

    snakemake.cli.get_argument_parser()  # loads every plugin, as a job's parse would
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    where, fd = _address(path)
    mask = os.umask(0o177)
    try:
        listener.bind(where)
    finally:
        os.umask(mask)
        if fd >= 0:
            os.close(fd)
    listener.listen(64)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the socket removed on the way
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    jobs: dict[int, socket.socket] = {}  # child pid: its client's connection
    try:
        while True:
            events = sel.select(IDLE_SECONDS)
            if not events and not jobs:
                return
            for key, _mask in events:
                if key.data == "accept":
                    _accept(listener, sel, jobs, snakemake.cli.main)
                elif key.data == "child":
                    os.read(wake_r, 4096)
                    _reap(sel, jobs)
                else:  # a client's connection: it ended (its task was killed)
                    _client_gone(key.data, sel, jobs)
    finally:
        os.unlink(path)


def _accept(listener: socket.socket, sel: selectors.BaseSelector,
            jobs: dict[int, socket.socket], main: Any) -> None:
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        if _peer_uid(conn) != os.getuid():
            conn.close()
            return
        request, fds = _receive(conn, 3)
        if request is None or len(fds) != 3:
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            _child(request, fds, main)  # never returns
        _send(conn, {"pid": pid})
        jobs[pid] = conn
        sel.register(conn, selectors.EVENT_READ, pid)
    finally:
        for fd in fds:
            os.close(fd)


def _child(request: dict[str, Any], fds: list[int], main: Any) -> None:
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setpgid(0, 0)
        for fd, std in zip(fds, (0, 1, 2), strict=True):
            os.dup2(fd, std)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.umask(int(request["umask"]))
        os.sched_setaffinity(0, request["affinity"])
        limit = int(request["as"])
        if limit != resource.RLIM_INFINITY:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        sys.argv = ["snakemake", *request["argv"]]
        main(list(request["argv"]))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # said on the job's own stderr, then its exit status
        print(f"pmc warm start: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: S110  (a closed pipe: nothing to flush to)
                pass
        os._exit(code)


def _reap(sel: selectors.BaseSelector, jobs: dict[int, socket.socket]) -> None:
    while jobs:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = jobs.pop(pid, None)
        if conn is not None:
            sel.unregister(conn)
            try:
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass
            conn.close()


def _client_gone(pid: int, sel: selectors.BaseSelector,
                 jobs: dict[int, socket.socket]) -> None:
    conn = jobs.pop(pid)
    sel.unregister(conn)
    conn.close()
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"] and len(sys.argv) == 3:
        serve(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[2:4] == SNAKEMAKE:
        sys.exit(client(sys.argv[1], sys.argv[2:]))
    else:
        print("usage: warm.py --serve SOCKET | warm.py SOCKET -m snakemake ARGS",
              file=sys.stderr)
        sys.exit(2)
