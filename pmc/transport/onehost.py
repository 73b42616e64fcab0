"""Every rank on one host: the run without MPI.

When MPICH's launcher (Hydra: ``mpiexec``) put every rank of the job on this host, the
ranks need nothing of MPI: on one host pmc's messages go through Unix sockets anyway
(``pmc.transport.hostsockets``). So no rank loads the MPI library: the master listens
on an abstract socket and passes its name and a random token to the workers through
the launcher's key-value store (PMI-1 on the socket Hydra gives each rank,
``pmc.transport.pmi``); each worker connects and introduces itself. What that saves is
what every rank paid before its first message: loading MPI and mpi4py (~75 ms of cpu a
rank on the 2-core machine of ``benchmarks/RESULTS.md``) and ``MPI_Init``, which ends in
a wait for the slowest rank. Users see the run as under MPI: the same ranks, records,
files and exit status; a rank that dies is a lost worker as before (its socket breaks).

The decision is made by every rank alone, from the environment Hydra gives it, so all
take the same way: every rank on this host (``mpisettings.one_host``), PMI's socket in
``PMI_FD``, and not ``PMC_ALWAYS_MPI`` (set, non-empty: MPI as across hosts). The master
puts one word in the store under ``pmc``, and all meet at the store's barrier:

- ``sock:NAME:TOKEN`` (hex): connect there;
- ``mpi``: start MPI after all (``--no-host-sockets``, ``--no-sleep-on-recv``, or no
  socket could be made); MPI's own start speaks PMI again on the same socket;
- ``exit:CODE``: the master ended before its run began (a bad command line): end with
  its exit code.

The master does not wait at the barrier (it reads the DAG meanwhile); a worker does,
blocked in a read. Every rank leaves the store (``finalize``) as it exits, not before:
as with MPI, a rank that ends without leaving it (killed) ends the job under Hydra's
defaults, and is a lost worker under ``-disable-auto-cleanup``.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Mapping

from pmc import log
from pmc.core.protocol import Message
from pmc.errors import ExitCode
from pmc.process import flush_stdio
from pmc.transport import TransportError, notices
from pmc.transport.hostsockets import HostSockets, connect
from pmc.transport.local import LocalWorker
from pmc.transport.mpisettings import one_host
from pmc.transport.pmi import Pmi

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import NoReturn

ALWAYS_MPI = "PMC_ALWAYS_MPI"
KEY = "pmc"
_SETTLE = 30.0  # seconds close() waits for workers that messages still wait for

_used: list[Pmi] = []  # this process's store, once opened (PMI's init comes once)


def store(environ: Mapping[str, str] = os.environ) -> Pmi | None:
    """This rank's way into the launcher's key-value store when the run goes without MPI
    (see the module docstring); None: MPI. Opened once per process."""
    if _used or environ.get(ALWAYS_MPI) or not one_host(environ):
        return None
    try:
        pmi = Pmi(int(environ["PMI_FD"]))
    except (KeyError, ValueError, OSError):
        return None
    _used.append(pmi)
    return pmi


def start(sockets: bool, environ: Mapping[str, str] = os.environ
          ) -> HostMaster | LocalWorker | None:
    """This rank's transport without MPI; None when MPI is to start (then it may).
    ``sockets``: the master's choice (False: every message through MPI); a worker
    takes the master's."""
    pmi = store(environ)
    if pmi is None:
        return None
    rank, size = int(environ["PMI_RANK"]), int(environ["PMI_SIZE"])
    if rank != 0:
        return join(pmi, rank, size)
    if sockets:
        try:
            return HostMaster(pmi, size)
        except OSError:
            pass
    pmi.put(KEY, "mpi")
    pmi.barrier()
    pmi.release()
    return None


def join(pmi: Pmi, rank: int, size: int) -> LocalWorker | None:
    """A worker: meet the others, take the master's word; its connection to the master,
    or None (MPI). SystemExit with the master's code when it ended before its run (or
    failure when it is gone)."""
    pmi.barrier()
    word = pmi.get(KEY)
    kind, _, rest = word.partition(":")
    if kind == "mpi":
        pmi.release()
        return None
    atexit.register(pmi.finalize)
    if kind == "exit":
        raise SystemExit(int(rest))
    name, token = rest.split(":")
    try:
        sock = connect(bytes.fromhex(name).decode(), rank, bytes.fromhex(token))
    except OSError as e:  # the master is gone already
        log.error(f"Worker {rank}: cannot reach the master: {e}")
        raise SystemExit(ExitCode.FAILED) from e
    return LocalWorker(sock.detach(), rank, size)


def dismiss(code: int, environ: Mapping[str, str] = os.environ) -> bool:
    """The master, ending before its run began: tell the workers to end with ``code``
    through the store. False when the run would have used MPI (nothing said)."""
    pmi = store(environ)
    if pmi is None:
        return False
    pmi.put(KEY, f"exit:{code}")
    pmi.barrier(wait=False)
    pmi.finalize()
    return True


def leave(code: int) -> NoReturn:
    """A worker rank at its end: leave with ``code`` once the exit handlers have run
    (leaving the store is one), without the interpreter's teardown (~9 ms of cpu a rank,
    every rank of a short run): its files are written and closed by then."""
    atexit._run_exitfuncs()
    flush_stdio()
    os._exit(code)


def opened() -> bool:
    """Has this process opened the store (its transport started, or was told)?"""
    return bool(_used)


class HostMaster:
    """Rank 0's end of a run without MPI: the workers' sockets, messages for a worker
    that has yet to connect kept until it does, the ranks given up on."""

    rank = 0

    def __init__(self, pmi: Pmi, size: int) -> None:
        """OSError if there can be no socket (nothing was put in the store then)."""
        self.size = size
        self.pmi = pmi
        self.host = HostSockets(set(range(1, size)))
        self._waiting: dict[int, list[Message]] = {}
        self._abandoned: set[int] = set()
        notices.listen()
        pmi.put(KEY, f"sock:{self.host.name.encode().hex()}:{self.host.token.hex()}")
        pmi.barrier(wait=False)
        atexit.register(pmi.finalize)

    def send(self, dest: int, msg: Message) -> None:
        if dest in self._abandoned or not 0 < dest < self.size:
            raise TransportError(f"worker {dest} is gone")
        if dest in self.host.expected:
            self._waiting.setdefault(dest, []).append(msg)  # sent once it connects
            return
        if dest not in self.host.conns:
            raise TransportError(f"worker {dest} is gone")
        self.host.send(dest, msg)

    def poll(self, timeout: float | None) -> list[tuple[int, Message]]:
        out: list[tuple[int, Message]] = []
        for rank in self.host.wait(timeout, out):
            for msg in self._waiting.pop(rank, ()):
                try:
                    self.host.send(rank, msg)
                except TransportError:
                    break  # its socket broke: lost() says so
        return out

    def fileno(self) -> int | None:
        return self.host.sel.fileno()

    def lost(self) -> list[int]:
        lost, self.host.lost = self.host.lost, []
        return lost

    def abandon(self, rank: int) -> None:
        """Stop talking to ``rank``: its socket closes (a worker that wakes up finds the
        master gone), and nothing more goes to it."""
        self._abandoned.add(rank)
        self._waiting.pop(rank, None)
        self.host.expect_no(rank)
        self.host.drop(rank, lost=False)  # the master knows
        notices.LOST_PEER.append(rank)

    def given_up(self) -> list[int]:
        """The ranks given up on (``abandon``), which may never end."""
        return sorted(self._abandoned)

    def rank_ended(self) -> bool:
        """Has the launcher said (SIGUSR1) that a rank ended since the last call?"""
        return notices.rank_ended()

    def probe(self) -> None:
        """Nothing to ask: every worker talks through its socket, whose end is seen."""

    def unanswered(self) -> list[int]:
        return []

    def abort(self, code: int) -> None:
        """End the job: the launcher kills every rank and exits with ``code``."""
        self.pmi.abort(code)

    def close(self) -> None:
        # What still waits for a worker yet to connect (a run stopped before it began
        # sends SHUTDOWN at once) goes out first, or that worker would wait for it for
        # ever, and the whole job with it.
        deadline = time.monotonic() + _SETTLE
        while self._waiting and self.host.expected and time.monotonic() < deadline:
            self.poll(0.05)
        self.host.close()
