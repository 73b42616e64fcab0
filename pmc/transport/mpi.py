"""The MPI transport (mpi4py): rank 0 is the master, every other rank a worker.

Importing this module initialises MPI, so it is imported only when the run was started
by an MPI launcher. Many MPI libraries spin inside a blocking receive (MPICH burns a full
core), so waiting is ``improbe``: while messages flow, 0.2 ms of looks with
``sched_yield`` between them (unless the run prefetches tasks, which hides the latency
this saves), then capped exponential back-off: 0.1 ms doubling to 1 ms,
reset by every message, the cap growing to 50 ms after a second with no message and to
200 ms after ten.
While messages flow (a result every few milliseconds) a wait ends at most ~1 ms after
its message arrived; a quiet second later it costs 20 look-ups a second.
``--no-sleep-on-recv`` trades that for a blocking receive.

Used across hosts, and on one host when asked for: with every rank on one host under
Hydra no rank starts MPI at all (``pmc.transport.onehost``).

Host sockets (``pmc.transport.hostsockets``): workers on the master's host talk to it
through a Unix socket instead, as embedded workers do, and the master and they wait on
it without polling: no latency, no look-ups, and with every worker on one host no MPI
call after start-up. The master's
first message to every worker, through MPI with its own tag (``_CONTROL``), offers an
abstract socket (a random name, and a random token that only travels over MPI), or
nothing under ``--no-host-sockets`` / ``--no-sleep-on-recv``, and how to wait (a worker
rank reads no command line, ``pmc.commands.mpirank``); or that the worker ends at once
(``dismiss``: the master's command line was wrong). A worker whose host name
is the master's connects and introduces itself with its rank and the token; any other
answers "no" through MPI. What the master sends a worker before its answer waits, and
goes the way the answer says: each worker's messages take one way only and cannot
overtake each other.

Lost ranks: MPI errors raise (mpi4py's ERRORS_RETURN on the communicator) rather than
abort. Hydra (``mpiexec -disable-auto-cleanup``) tells the other ranks that one ended
with SIGUSR1, told apart from a batch system's warning by its sender
(``pmc.transport.notices``). The master never blocks on a worker: its sends through MPI
are non-blocking, and a send to a dead rank (a large one waits for the receiver for
ever) is left behind when the master gives up on that rank (``abandon``). When the
launcher has said a rank ended, the master checks at once rather than after
``--worker-timeout``: ``probe`` sends every worker that talks through MPI a synchronous
PING (``issend``), which completes as soon as that rank's MPI library has taken it,
whatever its loop is doing; ``unanswered`` names those whose PING did not complete.
"""

from __future__ import annotations

import os
import socket
import time

from pmc.core.protocol import Message, Shutdown, from_wire, ping, to_wire
from pmc.transport import TransportError, look_interval, notices
from pmc.transport.hostsockets import HostSockets, connect
from pmc.transport.local import LocalWorker
from pmc.transport.mpisettings import mpi_settings

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import Any

_added = mpi_settings(os.environ)  # taken back out once MPI has started
os.environ.update(_added)
try:
    from mpi4py import MPI  # importing it initialises MPI
finally:
    for _name in _added:
        os.environ.pop(_name, None)

_SPIN = 0.0002
_FIRST = 0.0001
_IDLE_AFTER = 1.0  # no spinning after this long without a message
_CONTROL = 1  # MPI tag of the transport's own messages; the protocol's use 0
_SETTLE = 30.0  # seconds close() waits for answers that messages still wait on


class MpiTransport:
    def __init__(self, sleep_on_recv: bool = True, spin: bool = True,
                 host_sockets: bool = True) -> None:
        """The settings are the master's (a worker takes them from its first message)."""
        self.comm = MPI.COMM_WORLD
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        notices.listen()
        # Master: sends through MPI not yet complete, per rank (the request keeps the
        # pickled buffer alive); ranks given up on.
        self._pending: dict[int, list[MPI.Request]] = {}
        self._abandoned: set[int] = set()
        self._probes: dict[int, MPI.Request | None] = {}  # master: PINGs of ``probe``
        self.spin = _SPIN if spin else 0.0
        self.rank = int(self.comm.Get_rank())
        self.size = int(self.comm.Get_size())
        self.sleep_on_recv = sleep_on_recv
        self._last_message = time.monotonic()
        self._status = MPI.Status()
        # Master: ranks that talk through MPI (all, until they answer the offer), what
        # waits for a rank's answer, the workers on its host (once offered a socket).
        self._mpi_ranks = set(range(1, self.size)) if self.rank == 0 else {0}
        self._waiting: dict[int, list[Message]] = {}
        self.host: HostSockets | None = None
        # Worker: whether the master's offer came yet; the socket once connected.
        self._offered = self.rank == 0
        self._direct: LocalWorker | None = None
        if self.rank == 0:
            offer = self._listen() if host_sockets and sleep_on_recv else None
            for rank in range(1, self.size):
                self.comm.send(("offer", offer, sleep_on_recv, spin), dest=rank, tag=_CONTROL)

    # -- host sockets ----------------------------------------------------------------

    def _listen(self) -> tuple[str, str, bytes] | None:
        """Rank 0: an abstract socket to offer, or None where there is none."""
        try:
            self.host = HostSockets(set(range(1, self.size)))
        except OSError:
            return None
        return (socket.gethostname(), self.host.name, self.host.token)

    def _undecided(self, rank: int) -> bool:
        """Rank 0: has ``rank`` yet to answer the offer?"""
        return self.host is not None and rank in self.host.expected

    def _answer(self, msg: tuple[Any, ...]) -> None:
        """A worker: take the master's settings; connect if the master is on this host,
        else say no. A dismissal ends this process with the master's exit code."""
        if msg[0] == "exit":
            raise SystemExit(msg[1])
        _, offer, self.sleep_on_recv, spin = msg
        self.spin = _SPIN if spin else 0.0
        self._offered = True
        if offer is None:
            return
        host, name, token = offer
        if host == socket.gethostname():
            try:
                sock = connect(name, self.rank, token)
            except OSError:
                pass
            else:
                self._direct = LocalWorker(sock.detach(), self.rank, self.size)
                return
        self.comm.send(None, dest=0, tag=_CONTROL)

    def _decided(self, rank: int) -> None:
        """Rank 0: ``rank`` answered the offer; send what waited for that."""
        if self.host is not None:
            self.host.expect_no(rank)
        for msg in self._waiting.pop(rank, ()):
            try:
                self.send(rank, msg)
            except TransportError:
                break  # its socket broke: lost() says so

    def _wait_sockets(self, timeout: float | None, out: list[tuple[int, Message]]) -> None:
        """Rank 0: wait up to ``timeout`` for the sockets; read what came."""
        assert self.host is not None
        for rank in self.host.wait(timeout, out):
            self._mpi_ranks.discard(rank)
            self._decided(rank)

    # -- the transport ---------------------------------------------------------------

    def send(self, dest: int, msg: Message) -> None:
        if self._direct is not None:
            self._direct.send(dest, msg)
            return
        host = self.host
        if host is not None:
            if dest in host.expected:
                # Not before the worker has said which way it talks: a message through
                # MPI could arrive after one through the socket.
                self._waiting.setdefault(dest, []).append(msg)
                return
            if dest in host.conns:
                host.send(dest, msg)
                return
        if dest in self._abandoned:
            raise TransportError(f"rank {dest} was given up on")
        try:
            if self.rank != 0:
                self.comm.send(to_wire(msg), dest=dest, tag=0)
                return
            req = self.comm.isend(to_wire(msg), dest=dest, tag=0)
            if not req.Test():  # an eager send is done at once
                self._pending.setdefault(dest, []).append(req)
        except MPI.Exception as e:
            raise TransportError(f"cannot send to rank {dest}: {e}") from e

    def _progress(self) -> None:
        """Rank 0: forget the sends that completed."""
        for dest, reqs in list(self._pending.items()):
            left = [r for r in reqs if not r.Test()]
            if left:
                self._pending[dest] = left
            else:
                del self._pending[dest]

    def abandon(self, rank: int) -> None:
        """Stop talking to ``rank``: its socket closes (a worker that wakes up finds the
        master gone), unfinished sends are left behind, and nothing more goes to it."""
        self._abandoned.add(rank)
        self._pending.pop(rank, None)
        self._waiting.pop(rank, None)
        self._mpi_ranks.discard(rank)
        if self.host is not None:
            self.host.expect_no(rank)
            self.host.drop(rank, lost=False)  # the master knows
        notices.LOST_PEER.append(rank)

    def abort(self, code: int) -> None:
        """End the job: the launcher kills every rank and exits with ``code``."""
        self.comm.Abort(code)

    def given_up(self) -> list[int]:
        """Rank 0: the ranks it gave up on (``abandon``), which may never end."""
        return sorted(self._abandoned)

    def rank_ended(self) -> bool:
        """Has the launcher said (SIGUSR1) that a rank ended since the last call?"""
        return notices.rank_ended()

    def probe(self) -> None:
        """Rank 0: a synchronous PING to every worker that talks through MPI (not to one
        that has yet to say which way it talks: its first message must be CONFIG)."""
        for rank in self._mpi_ranks - self._abandoned:
            if rank in self._probes or rank == 0 or self._undecided(rank):
                continue
            try:
                self._probes[rank] = self.comm.issend(to_wire(ping()), dest=rank, tag=0)
            except MPI.Exception:
                self._probes[rank] = None

    def unanswered(self) -> list[int]:
        """Rank 0: the ranks whose PING from ``probe`` has not been taken."""
        out = []
        for rank, req in self._probes.items():
            try:
                done = req is not None and bool(req.Test())
            except MPI.Exception:
                done = False
            if not done:
                out.append(rank)
                if req is not None:
                    self._pending.setdefault(rank, []).append(req)  # dropped by abandon
        self._probes.clear()
        return out

    def _drain(self, out: list[tuple[int, Message]]) -> None:
        status = self._status
        while True:
            handle = self.comm.improbe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
            if handle is None:
                return
            self._take(handle.recv(), out)
            if self._direct is not None:
                return  # the master sends nothing more through MPI

    def _take(self, msg: Message, out: list[tuple[int, Message]]) -> None:
        """A message just received through MPI (``self._status`` says from whom): the
        protocol's go to ``out``, the transport's own are acted on."""
        source = int(self._status.Get_source())
        if self._status.Get_tag() != _CONTROL:
            out.append((source, from_wire(msg)))
        elif self.rank == 0:
            self._decided(source)  # a worker that stays with MPI
        else:
            self._answer(msg)

    def _wait(self, timeout: float) -> list[tuple[int, Message]]:
        """Wait for the sockets up to ``timeout`` (or nap, without any), then look at
        MPI."""
        out: list[tuple[int, Message]] = []
        if self._pending:
            self._progress()
        if self.host is not None:
            self._wait_sockets(timeout, out)
        elif timeout > 0:
            time.sleep(timeout)
        if self._mpi_ranks or not self._offered:
            self._drain(out)
        return out

    def poll(self, timeout: float | None) -> list[tuple[int, Message]]:
        out = self._poll(timeout)
        if self.rank != 0 and out:
            # The master's SHUTDOWN says whether a rank was lost: then MPI_Finalize
            # would wait for it (peer_lost).
            for _src, msg in out:
                if isinstance(msg, Shutdown) and msg.worker_lost:
                    notices.LOST_PEER.append(msg)
        return out

    def _poll(self, timeout: float | None) -> list[tuple[int, Message]]:
        if self._direct is not None:
            return self._direct.poll(timeout)
        out = self._wait(0)
        if out or timeout == 0:
            if out:
                self._last_message = time.monotonic()
            return out
        if self._direct is not None:  # connected just now
            return self._direct.poll(timeout)
        if self.rank == 0 and not self._mpi_ranks:
            # Sockets only: wait on them like the embedded transport.
            self._wait_sockets(timeout, out)
            return out
        if timeout is None and not self.sleep_on_recv:
            status = self._status
            while not out:
                self._take(self.comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG,
                                          status=status), out)
            self._drain(out)
            self._last_message = time.monotonic()
            return out
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        delay = _FIRST
        # While messages flow, an answer is often a few microseconds away: look for it
        # for a moment, yielding the cpu between looks, before napping (a nap costs a
        # few hundred microseconds of latency per hop, whatever its length).
        spin_until = now + self.spin if now - self._last_message < _IDLE_AFTER else now
        while True:
            cap = look_interval(now - self._last_message)
            if now < spin_until:
                os.sched_yield()
                out = self._wait(0)
            elif self.sleep_on_recv:
                nap = delay if deadline is None else min(delay, max(0.0, deadline - now))
                out = self._wait(nap)
                delay = min(delay * 2, cap)
            else:
                out = self._wait(0)
            now = time.monotonic()
            if out:
                self._last_message = now
                return out
            left = None if deadline is None else max(0.0, deadline - now)
            if self._direct is not None or (self.rank == 0 and not self._mpi_ranks):
                # Connected, or every worker is, just now: wait rather than look.
                return self._poll(left)
            if left == 0:
                return out

    def fileno(self) -> int | None:
        """A worker's socket once connected to the master, else None: MPI can only be
        polled. The master's end is only polled."""
        return self._direct.fileno() if self._direct is not None else None

    def lost(self) -> list[int]:
        if self.host is None:
            return []
        lost, self.host.lost = self.host.lost, []
        return lost

    def close(self) -> None:
        # Rank 0: what still waits for a worker's answer to the offer (a run stopped before
        # it began sends SHUTDOWN at once) goes out first, or that worker would wait for
        # it for ever, and the whole job with it.
        deadline = time.monotonic() + _SETTLE
        while self._waiting and time.monotonic() < deadline:
            self._wait(0.01)  # a worker that has not answered has sent nothing to keep
        if self._direct is not None:
            self._direct.close()
        if self.host is not None:
            self.host.close()
            self.host = None
        deadline = time.monotonic() + _SETTLE
        while self._pending and time.monotonic() < deadline:
            self._progress()  # the last messages (SHUTDOWN) to live workers
            time.sleep(0.01)


def dismiss(code: int) -> None:
    """Rank 0, ending before its run began: tell every worker to end with ``code``."""
    comm = MPI.COMM_WORLD
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    for rank in range(1, comm.Get_size()):
        try:
            comm.send(("exit", code), dest=rank, tag=_CONTROL)
        except MPI.Exception:
            pass  # that rank is gone: nothing waits there
