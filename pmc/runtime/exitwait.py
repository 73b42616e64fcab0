"""Waiting for a worker's one running task in the kernel's wait itself.

While one task runs and no pipe of it needs reading, the worker sleeps in ``waitid()`` on
that task instead of in its epoll over a pidfd: no pidfd to open, register, unregister
and close for every task, and one wake-up, by the task's exit. SIGALRM ends the wait
when the loop's own wait would have ended (results held for company, a heartbeat, a
kill's grace), and after ``CAP`` at the most: what the master sent meanwhile is read
then. Nothing it sends is urgent while the task runs: the next task is read as this one
ends, and a stop or a recall waits at most ``CAP``. The worker's stop handler
(SIGTERM, SIGINT) ends the wait at once (``interrupt``). A handler raises only inside
the wait, once, and the wait does not reap (``WNOWAIT``): an exit seen just as the wait
is cut short is seen again by the loop.

The timer is set for each wait and left to run out: the next wait sets it again, and a
worker that waits in its epoll instead takes one SIGALRM more (its handler does nothing
outside a wait). Only where a signal reaches the waiting thread for certain (the
process's only thread, its main one); otherwise ``usable`` is False and the worker waits
in its epoll, a pidfd per task.
"""

from __future__ import annotations

import os
import signal

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import Any

CAP = 0.05  # seconds: the longest a wait lasts before the loop looks around again


class _CutShort(Exception):
    """Raised by a signal handler inside the wait."""


class ExitWait:
    def __init__(self) -> None:
        self.usable = False
        self.waiting = False
        self.saved: Any = None
        if not _only_thread():
            return
        try:
            self.saved = signal.signal(signal.SIGALRM, self._signalled)
        except ValueError:  # not the main thread
            return
        self.usable = True

    def wait(self, pid: int, timeout: float) -> bool:
        """Sleep until task ``pid`` exits (True; it is left to be reaped) or something
        else needs the worker, at most ``timeout`` seconds (False)."""
        signal.setitimer(signal.ITIMER_REAL, max(min(timeout, CAP), 1e-6))
        try:
            self.waiting = True
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            self.waiting = False
            return True
        except _CutShort:
            return False

    def interrupt(self) -> None:
        """From a signal handler: end the wait under way, if there is one."""
        if self.waiting:
            self.waiting = False
            raise _CutShort

    def _signalled(self, signum: int, frame: object) -> None:
        self.interrupt()

    def close(self) -> None:
        if self.usable:
            self.usable = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM,
                          signal.SIG_DFL if self.saved is None else self.saved)


def _only_thread() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False
