"""The signals a worker gets, and how they reach its loop.

SIGTERM and SIGINT (a batch system's time limit, Ctrl-C) kill the worker's tasks, while
the worker itself keeps talking to the master, which decides when everyone stops
(``catch_stops``: the handler only sets the worker's flag). A warning that time is short
(``pmc.batchsignals``) is noted and passed on to the master. Either wakes the worker's
loop at once (``Wakeup``): Python writes a byte to a pipe the loop waits on with the
rest, where the loop's wait could otherwise last a quarter of --worker-timeout.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from pmc.runtime.poller import Poller

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import Any

STOPS = (signal.SIGTERM, signal.SIGINT)


def catch_stops(stop: Callable[[], None]) -> dict[int, Any]:
    """``stop()`` on SIGTERM and SIGINT; the handlers before."""
    def on_stop(signum: int, frame: object) -> None:
        stop()

    return {sig: signal.signal(sig, on_stop) for sig in STOPS}


class Wakeup:
    """The pipe Python writes to as it catches a signal, waited on as ``"signal"``
    (none where there can be none: not in the main thread, as a worker run by a test)."""

    def __init__(self, poller: Poller) -> None:
        self.poller = poller
        self.fd = -1
        rd, wr = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            signal.set_wakeup_fd(wr, warn_on_full_buffer=False)
        except ValueError:
            os.close(rd)
            os.close(wr)
            return
        self.fd = rd
        poller.add(rd, "signal")

    def empty(self) -> None:
        """Read what is there (the handlers have done their part)."""
        try:
            while os.read(self.fd, 512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(signal.set_wakeup_fd(-1))  # the write end
            self.poller.remove(self.fd)
            os.close(self.fd)
            self.fd = -1
