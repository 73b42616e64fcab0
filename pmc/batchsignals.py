"""The signals batch systems and MPI launchers send pmc's processes besides SIGTERM, and
what each means.

- Warnings (``WARNINGS``): a batch system's notice that time is short — Slurm's
  ``--signal=USR1@60`` (or ``USR2``, or ``scancel --signal``), PBS's ``qsig``, the
  SIGXCPU of LoadLeveler's and Grid Engine's soft limits. They never kill a pmc process:
  every one of them catches them from its start (``catch``) and notes them (``note``);
  the master acts on them as ``--on-warning`` says, a worker passes them on to it.
- Hydra's notice: MPICH's launcher proxy (``hydra_pmi_proxy``) sends SIGUSR1 to every
  rank when one ends, which pmc takes as a sign that a rank may be gone. Told apart from
  a user's or a batch system's SIGUSR1 by its sender (``from_hydra``): a rank without a
  keeper (rank 0) waits for SIGUSR1 in a thread (``sigwaitinfo`` names the sender; the
  signal is blocked before MPI starts its threads), and a worker rank's keeper
  (``pmc.runtime.rankshim``), which waits the same way, passes the notice on as
  ``RANK_ENDED``, a signal that means nothing else, and a warning as it came.

Base layer: the transport, the runtime and the commands all read it.
"""

from __future__ import annotations

import signal

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import Any

WARNINGS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGXCPU)
# From a worker rank's keeper: Hydra said a rank ended. A real-time signal, clear of the
# two glibc keeps for itself below SIGRTMIN.
RANK_ENDED = signal.SIGRTMIN + 4
HYDRA_PROXY = "hydra_pmi_proxy"

_noted: list[int] = []  # warnings caught and not yet taken, in order


def note(signum: int, frame: object = None) -> None:
    """A warning arrived (a signal handler: it only appends)."""
    _noted.append(signum)


def catch() -> dict[int, Any]:
    """Note the warnings from now on rather than die of them; the handlers before."""
    return {sig: signal.signal(sig, note) for sig in WARNINGS}


def pending() -> bool:
    return bool(_noted)


def take() -> list[int]:
    """The warnings noted since the last call, in order."""
    out = _noted[:]
    del _noted[:len(out)]
    return out


def name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def from_hydra(pid: int) -> bool:
    """Whether process ``pid`` (a signal's sender) is Hydra's launcher proxy."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() == HYDRA_PROXY
    except OSError:
        return False
