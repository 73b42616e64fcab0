"""A Python client of an open run (``pmc run --open``, a pmc extension).

Submit tasks to a running open run, wait for them and read how they ended::

    from pmc.client import Client

    with Client.connect("wf.dag") as run:
        a = run.submit(["/bin/sh", "-c", "echo A > a.txt"])
        b = run.submit(["/usr/bin/sort", "a.txt"], cpus=2, memory=512, after=[a])
        (state,) = run.wait([b], timeout=600)
        print(state.state, state.exit_code)
        run.close_run()  # the run ends once what it has is done

The client talks to the run's Unix socket beside the DAG (``DAG.sock``) with the token
in ``DAG.token``; both are readable by the run's user alone. When that socket cannot be
reached (the run is on another host) and the run listens on TCP too (``pmc run --open
--open-tcp``), it connects to the first host in ``DAG.tcp`` that answers as the run.
Each ``submit`` is one batch, added whole or refused (``SubmitError``); ``add`` takes
TASK/EDGE lines as they are written in a DAG file.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shlex
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from pmc.openchannel import (
    GREETING,
    ChannelError,
    address,
    encode,
    host_port,
    keepalive,
    proof,
    read_tcp,
    receive,
    socket_path,
    tcp_path,
    token_path,
)

__all__ = ["ChannelError", "Client", "Handle", "SubmitError", "TaskState"]

FINISHED = frozenset({"done", "failed", "reused"})
CHANNELS = ("auto", "unix", "tcp")
TCP_CONNECT = 15.0  # seconds at most for each host of DAG.tcp to answer


class SubmitError(Exception):
    """The run refused a request (a bad batch, a closed run): ``str()`` says why."""


class TaskState(NamedTuple):
    """What the run says of a task: ``state`` is one of waiting, ready, running, done,
    failed, held, reused (or unknown); ``record`` describes its last try (None before
    one ended): outcome, attempt, status (the raw wait status), exit_code, signal,
    start (Unix time), duration, cpu_time (seconds), max_rss_kb, error, stderr_path."""

    name: str
    state: str
    tries: int
    record: dict[str, Any] | None

    @property
    def finished(self) -> bool:
        """Done, reused or failed for good: it will not run again in this run."""
        return self.state in FINISHED

    @property
    def ok(self) -> bool:
        return self.state in ("done", "reused")

    @property
    def exit_code(self) -> int | None:
        """The last try's exit code (None: no try ended yet, or a signal ended it)."""
        if self.record is None or self.record["signal"]:
            return None
        return int(self.record["exit_code"])


class Handle:
    """A task submitted through a ``Client``."""

    __slots__ = ("client", "name")

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = name

    def state(self) -> TaskState:
        return self.client.states([self.name])[self.name]

    def wait(self, timeout: float | None = None) -> TaskState:
        return self.client.wait([self], timeout)[0]

    def __repr__(self) -> str:
        return f"Handle({self.name!r})"


def _word(arg: str) -> str:
    if "\n" in arg or "\r" in arg or "\0" in arg:
        raise ValueError(f"a task's argument cannot hold a line break or NUL: {arg!r}")
    return shlex.quote(arg)


def task_line(name: str, argv: Sequence[str], *, cpus: int = 1, memory: int = 0,
              gpus: int = 0, ranks: int = 1, tries: int | None = None,
              priority: int = 0) -> str:
    """The TASK line of a task running ``argv`` (no shell) with these requests."""
    if not argv:
        raise ValueError("a task needs a program to run")
    if not name or any(c.isspace() for c in name) or name.startswith("-"):
        raise ValueError(f"not a task name: {name!r}")
    opts = []
    if cpus != 1:
        opts += ["-c", str(int(cpus))]
    if memory:
        opts += ["-m", str(int(memory))]
    if gpus:
        opts += ["--request-gpus", str(int(gpus))]
    if ranks != 1:
        opts += ["--ranks", str(int(ranks))]
    if tries is not None:
        opts += ["-t", str(int(tries))]
    if priority:
        opts += ["-p", str(int(priority))]
    words = " ".join(map(_word, argv))
    return " ".join(["TASK", name, *opts, words])


class Client:
    """A connection to the open run of one DAG (thread-safe: one request at a time)."""

    def __init__(self, dag: str, sock: socket.socket, token: str) -> None:
        self.dag = dag
        self._sock = sock
        self._token = token
        self._lock = threading.Lock()
        self._names = (f"c{secrets.token_hex(4)}-{n}" for n in itertools.count(1))

    @classmethod
    def connect(cls, dag: str, timeout: float = 60.0, channel: str = "auto") -> Client:
        """Connect to the open run of ``dag`` (its path as the run was given it, or
        any path to the same file's directory and name). ``channel``: "auto" (the Unix
        socket, else TCP when the run listens on it), "unix" or "tcp"."""
        if channel not in CHANNELS:
            raise ValueError(f"channel must be one of {', '.join(CHANNELS)}, not {channel!r}")
        try:
            with open(token_path(dag), encoding="ascii") as f:
                token = f.read().strip()
        except OSError as e:
            raise ChannelError(f"no open run of {dag}: cannot read {token_path(dag)}: "
                               f"{e.strerror}") from None
        if channel != "tcp":
            try:
                return cls(dag, _connect_unix(dag, timeout), token)
            except ChannelError:
                if channel == "unix" or not os.path.exists(tcp_path(dag)):
                    raise
        sock, challenge = _connect_tcp(dag, timeout)
        return cls(dag, sock, proof(token, challenge))

    @property
    def channel(self) -> str:
        """The channel this client reached the run through: "unix" or "tcp"."""
        return "unix" if self._sock.family == socket.AF_UNIX else "tcp"

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request and the run's reply; raises SubmitError if it refused it."""
        with self._lock:
            self._sock.sendall(encode({"op": op, "token": self._token, **fields}))
            reply = receive(self._sock)
        if reply is None:
            raise ChannelError(f"the open run of {self.dag} closed the connection")
        if not reply.get("ok"):
            raise SubmitError(str(reply.get("error")))
        return reply

    def add(self, text: str, source: str = "client") -> list[str]:
        """Add TASK/EDGE lines as a DAG file has them, all or none; their task names."""
        names: list[str] = self.request("add", text=text, source=source)["tasks"]
        return names

    def submit(self, argv: Sequence[str], *, name: str | None = None, cpus: int = 1,
               memory: int = 0, gpus: int = 0, ranks: int = 1, tries: int | None = None,
               priority: int = 0, after: Iterable[Handle | str] = ()) -> Handle:
        """Add one task running ``argv`` (no shell), asking for ``cpus``, ``memory``
        (MB), ``gpus`` (per rank) and ``ranks``; tried up to ``tries`` times (None: the
        run's --tries); started after the tasks in ``after`` are done."""
        name = name or next(self._names)
        lines = [task_line(name, argv, cpus=cpus, memory=memory, gpus=gpus, ranks=ranks,
                           tries=tries, priority=priority)]
        for parent in after:
            lines.append(f"EDGE {parent.name if isinstance(parent, Handle) else parent} {name}")
        self.add("\n".join(lines) + "\n", source=f"client:{name}")
        return Handle(self, name)

    def states(self, names: Iterable[str]) -> dict[str, TaskState]:
        tasks = self.request("state", names=list(names))["tasks"]
        return {n: TaskState(n, t["state"], t.get("tries", 0), t.get("record"))
                for n, t in tasks.items()}

    def wait(self, handles: Handle | Iterable[Handle], timeout: float | None = None,
             ) -> list[TaskState]:
        """Wait until every task has finished (done, reused or failed for good); their
        states, in order. Raises TimeoutError after ``timeout`` seconds."""
        todo = [handles] if isinstance(handles, Handle) else list(handles)
        end = None if timeout is None else time.monotonic() + timeout
        pause = 0.02
        while True:
            states = self.states(h.name for h in todo)
            if all(s.finished or s.state == "unknown" for s in states.values()):
                return [states[h.name] for h in todo]
            if end is not None and time.monotonic() >= end:
                left = [n for n, s in states.items() if not s.finished]
                raise TimeoutError(f"{len(left)} task(s) not finished: {left[:5]}")
            time.sleep(pause if end is None else min(pause, max(0.0, end - time.monotonic())))
            pause = min(pause * 1.5, 1.0)

    def info(self) -> dict[str, Any]:
        """The run's tasks, done and failed, and whether it is closed."""
        return self.request("info")

    def close_run(self) -> None:
        """Let the run end once what it has is done (``pmc close``)."""
        self.request("close")

    def close(self) -> None:
        """Close the connection (the run goes on)."""
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connect_unix(dag: str, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    where, fd = address(socket_path(dag))
    try:
        sock.connect(where)
    except OSError as e:
        sock.close()
        raise ChannelError(f"no open run of {dag}: cannot connect to "
                           f"{socket_path(dag)}: {e.strerror}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    sock.settimeout(None)
    return sock


def _connect_tcp(dag: str, timeout: float) -> tuple[socket.socket, str]:
    """A connection to the first host of ``DAG.tcp`` that greets as an open run, and
    the challenge it greeted with."""
    try:
        hosts = read_tcp(dag)
    except OSError as e:
        raise ChannelError(f"no open run of {dag}: cannot read {tcp_path(dag)}: "
                           f"{e.strerror}") from None
    tried = []
    for host, port in hosts:
        where = host_port(host, port)
        try:
            sock = socket.create_connection((host, port), timeout=min(timeout, TCP_CONNECT))
        except OSError as e:
            tried.append(f"{where}: {e.strerror or e}")
            continue
        try:
            keepalive(sock)
            sock.settimeout(timeout)
            hello = receive(sock)
            if hello is None or hello.get("pmc") != GREETING or not isinstance(
                    hello.get("challenge"), str):
                raise ChannelError("did not answer as an open run")
        except (OSError, ChannelError) as e:
            sock.close()
            tried.append(f"{where}: {getattr(e, 'strerror', None) or e}")
            continue
        sock.settimeout(None)
        return sock, str(hello["challenge"])
    raise ChannelError(f"no open run of {dag} reached over TCP "
                       f"({tcp_path(dag)}): {'; '.join(tried) or 'no host in it'}")
