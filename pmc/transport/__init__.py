"""How the master and workers talk: one interface (``Transport``, in ``interface``), an
MPI and a local implementation.

The master and workers never import mpi4py themselves: ``pmc.transport.mpi`` does, and
only when the run was started by an MPI launcher (importing mpi4py initialises MPI).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from pmc.transport.interface import Transport as Transport


def __getattr__(name: str) -> type[Transport]:
    """``Transport``, from ``pmc.transport.interface`` when asked for: a worker rank,
    which only names it in annotations, imports no typing."""
    if name != "Transport":
        raise AttributeError(f"module 'pmc.transport' has no attribute {name!r}")
    from pmc.transport.interface import Transport as Transport

    return Transport


def look_interval(quiet: float) -> float:
    """How often to look for messages on a transport that can only be polled, after
    ``quiet`` seconds without one: every millisecond while they flow (the master answers
    a result with the next task), every 50 ms after a quiet second, every 200 ms after
    ten. Waiting must not burn a core: each look is a turn of the MPI library's
    progress engine."""
    return 0.001 if quiet < 1.0 else 0.05 if quiet < 10.0 else 0.2


class TransportError(Exception):
    pass
