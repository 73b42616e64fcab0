"""The interface every transport implements (``pmc.transport.Transport``)."""

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
