"""The launcher's word that a rank ended, and what this rank knows of lost peers.

Hydra (``mpiexec -disable-auto-cleanup``) tells the other ranks that one ended with
SIGUSR1, which batch systems also send as a warning that time is short. Rank 0 takes
SIGUSR1 in a thread (blocked since before the transport started,
``pmc.runtime.rankshim``) that tells the two apart by the sender
(``pmc.batchsignals``); a worker rank hears Hydra's through its keeper, as
``batchsignals.RANK_ENDED``. Shared by the MPI and the one-host transports.
"""

from __future__ import annotations

import atexit
import signal

from pmc import batchsignals

LOST_PEER: list[object] = []  # a rank died (SIGUSR1) or was given up on
_NOTICES: list[int] = []  # SIGUSR1s the master has not looked at yet (rank_ended)


def listen() -> None:
    """Take the launcher's notices from now on (in the rank that runs a transport)."""
    if signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        _watch_usr1()  # no keeper: told apart here, by its sender
    signal.signal(batchsignals.RANK_ENDED, _peer_died)
    # Hydra's notice comes whenever a rank exits, also at the end of a good run, and a
    # warning may come late: ignored (not caught) from exit on, since Python puts the
    # default (to die) back as it ends.
    for sig in (batchsignals.RANK_ENDED, *batchsignals.WARNINGS):
        atexit.register(signal.signal, sig, signal.SIG_IGN)


def peer_lost() -> bool:
    """Has a rank died, exited or been given up on? MPI_Finalize may wait for it."""
    return bool(LOST_PEER)


def rank_ended() -> bool:
    """Has the launcher said that a rank ended since the last call?"""
    seen = bool(_NOTICES)
    _NOTICES.clear()
    return seen


def _peer_died(signum: int, frame: object) -> None:
    LOST_PEER.append(signum)
    _NOTICES.append(signum)


def _watch_usr1() -> None:
    """SIGUSR1, blocked in every thread of this rank, taken by a thread of its own:
    Hydra's notice that a rank ended, or a warning."""
    def watch() -> None:
        while True:
            info = signal.sigwaitinfo({signal.SIGUSR1})
            if batchsignals.from_hydra(info.si_pid):
                _peer_died(signal.SIGUSR1, None)
            else:
                batchsignals.note(signal.SIGUSR1)

    import threading  # here: a worker rank has a keeper, and does not start this thread
    threading.Thread(target=watch, name="pmc-sigusr1", daemon=True).start()
