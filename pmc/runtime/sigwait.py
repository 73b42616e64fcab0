"""Waiting for a worker's one running task by signal: no pidfd, no epoll.

While one task runs and no pipe of it needs reading (most tasks), the worker sleeps in
``sigtimedwait`` for SIGCHLD (a child ended) and SIGIO, which the kernel sends as the
master's socket or the signal wake-up pipe (``pmc.runtime.workersignals``: a stop or a
warning caught) turns readable: all its epoll would wake it for. That spares each task a
pidfd opened, registered, unregistered and closed, and an epoll wait. A task still
running when the worker must watch more (a second task, a pipe) gets its pidfd then
(``Launcher.wait``).

Both signals are blocked while the worker's loop runs, so that they wait, pending, for
``sigtimedwait`` (a blocked signal is queued even where its action is to ignore it).
SIGIO's action is to ignore, so that one still pending when they are unblocked does no
harm. Tasks start with the mask the worker had before (``Launcher``: the spawn's
``setsigmask``). Only where the calling thread is the process's only one: the kernel
gives a signal for the process to any thread that does not block it, and it would be
lost there. The wait reaps nothing: a SIGCHLD may be for any child, or left from a task
already reaped through its pidfd, and a SIGIO from a message read already; the caller
looks (``Launcher.exited``, the transport).
"""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Iterable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import Any

WAITED = (signal.SIGCHLD, signal.SIGIO)


class SignalWait:
    """The wait, and the set-up it needs: ``usable`` says whether it could be made
    (``close`` undoes it)."""

    def __init__(self, fds: Iterable[int]) -> None:
        """``fds``: what the wait must wake for as it becomes readable (SIGIO)."""
        self.usable = False
        self.restore: list[tuple[int, int]] = []  # (fd, its flags before)
        self.mask: set[int] = set()  # blocked before
        self.sigio: Any = None
        if not _only_thread():
            return
        try:
            self.sigio = signal.signal(signal.SIGIO, signal.SIG_IGN)
        except ValueError:  # not the main thread
            return
        pid = os.getpid()
        for fd in fds:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETOWN, pid)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_ASYNC)
            self.restore.append((fd, flags))
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
        self.usable = True

    def wait(self, timeout: float) -> int:
        """Sleep until a child ends, or a watched fd turns readable, for ``timeout``
        seconds at the most; returns the signal that ended the wait (0: none came)."""
        info = signal.sigtimedwait(WAITED, timeout)
        return 0 if info is None else info.si_signo

    def close(self) -> None:
        if not self.usable:
            return
        self.usable = False
        for fd, flags in self.restore:
            try:
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
            except OSError:
                pass  # closed already
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        signal.signal(signal.SIGIO, signal.SIG_DFL if self.sigio is None else self.sigio)


def _only_thread() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False
