"""How the master and workers talk: one interface, an MPI and a local implementation.

The master and workers never import mpi4py themselves: ``pmc.transport.mpi`` does, and
only when the run was started by an MPI launcher (importing mpi4py initialises MPI).
"""

from __future__ import annotations

from typing import Protocol

from pmc.core.protocol import Message


class Transport(Protocol):
    rank: int
    size: int

    def send(self, dest: int, msg: Message) -> None:
        """Send one message; raise TransportError if the peer is gone."""

    def poll(self, timeout: float | None) -> list[tuple[int, Message]]:
        """Messages that arrived, waiting at most ``timeout`` seconds (None: for ever)
        when none has. Returns [] on timeout."""
        ...

    def fileno(self) -> int | None:
        """A descriptor that becomes readable when a message may be waiting, or None if
        the transport can only be polled (MPI, but for a worker on the master's host)."""
        ...

    def lost(self) -> list[int]:
        """Ranks whose socket broke since the last call (embedded workers, and MPI
        workers on the master's host)."""
        ...

    def abandon(self, rank: int) -> None:
        """The master gives up on a worker (lost, or silent too long): stop talking to
        it, and make sure it does not go on (an embedded worker is killed)."""

    def close(self) -> None: ...


def look_interval(quiet: float) -> float:
    """How often to look for messages on a transport that can only be polled, after
    ``quiet`` seconds without one: every millisecond while they flow (the master answers
    a result with the next task), every 50 ms after a quiet second, every 200 ms after
    ten. Waiting must not burn a core: each look is a turn of the MPI library's
    progress engine."""
    return 0.001 if quiet < 1.0 else 0.05 if quiet < 10.0 else 0.2


class TransportError(Exception):
    pass
