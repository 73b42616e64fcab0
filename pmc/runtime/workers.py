"""``Workers``: the run's workers until the master takes them over (``pmc.commands.run``
holds them from before the DAG is read); ``serve_forked``, the entry of an embedded
worker forked from the master."""

from __future__ import annotations

from collections.abc import Callable

from pmc.core import protocol
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
                t.send(rank, protocol.shutdown(False))
            except TransportError:
                pass  # gone already: nothing to tell it
        t.close()


def serve_forked(fd: int, rank: int, size: int) -> int:
    """A forked embedded worker's entry (``pmc.transport.local``). It imports the
    worker's modules itself, beside the master, which imports its own and reads the DAG
    meanwhile, on a core the master leaves idle: not in the master before the fork."""
    from pmc.runtime import worker

    return worker.serve(fd, rank, size)
