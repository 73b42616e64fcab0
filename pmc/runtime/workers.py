"""``Workers``: the run's workers until the master takes them over (``pmc.commands.run``
holds them from before the DAG is read)."""

from __future__ import annotations

from collections.abc import Callable

from pmc.core.protocol import SHUTDOWN
from pmc.errors import FatalError
from pmc.transport import Transport, TransportError


class Workers:
    """The run's workers, until the master takes them over: under MPI there from the
    start, embedded ones started when first asked for. Those started but never taken
    over (the run stopped before it began: a bad DAG, the DAG locked by another run, an
    unreadable rescue log) wait for their configuration, and would wait for ever:
    ``release`` tells them there is no run."""

    def __init__(self, start: Callable[[], Transport]) -> None:
        self._start = start
        self.transport: Transport | None = None
        self.taken = False

    def started(self) -> Transport:
        if self.transport is None:
            try:
                self.transport = self._start()
            except OSError as e:
                raise FatalError(f"Cannot start the workers: {e}") from e
        return self.transport

    def take(self) -> Transport:
        self.taken = True
        return self.started()

    def release(self) -> None:
        t = self.transport
        if t is None or self.taken:
            return
        for rank in range(1, t.size):
            try:
                t.send(rank, (SHUTDOWN,))
            except TransportError:
                pass  # gone already: nothing to tell it
        t.close()
