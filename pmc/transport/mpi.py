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
"""

from __future__ import annotations

import os
import time

from mpi4py import MPI

from pmc.protocol import Message
from pmc.transport import TransportError, look_interval

_SPIN = 0.0002
_FIRST = 0.0001
_IDLE_AFTER = 1.0  # no spinning after this long without a message


def launched_size() -> int:
    return int(MPI.COMM_WORLD.Get_size())


class MpiTransport:
    def __init__(self, sleep_on_recv: bool = True, spin: bool = True) -> None:
        self.comm = MPI.COMM_WORLD
        self.spin = _SPIN if spin else 0.0
        self.rank = int(self.comm.Get_rank())
        self.size = int(self.comm.Get_size())
        self.sleep_on_recv = sleep_on_recv
        self._last_message = time.monotonic()
        self._status = MPI.Status()

    def send(self, dest: int, msg: Message) -> None:
        try:
            self.comm.send(msg, dest=dest, tag=0)
        except MPI.Exception as e:
            raise TransportError(f"cannot send to rank {dest}: {e}") from e

    def _drain(self, out: list[tuple[int, Message]]) -> None:
        status = self._status
        while True:
            handle = self.comm.improbe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
            if handle is None:
                return
            out.append((int(status.Get_source()), handle.recv()))

    def poll(self, timeout: float | None) -> list[tuple[int, Message]]:
        out: list[tuple[int, Message]] = []
        self._drain(out)
        if out or timeout == 0:
            if out:
                self._last_message = time.monotonic()
            return out
        if timeout is None and not self.sleep_on_recv:
            status = self._status
            msg = self.comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
            out.append((int(status.Get_source()), msg))
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
            elif self.sleep_on_recv:
                nap = delay if deadline is None else min(delay, max(0.0, deadline - now))
                time.sleep(nap)
                delay = min(delay * 2, cap)
            self._drain(out)
            now = time.monotonic()
            if out:
                self._last_message = now
                return out
            if deadline is not None and now >= deadline:
                return out

    def fileno(self) -> int | None:
        return None

    def lost(self) -> list[int]:
        return []

    def close(self) -> None:
        pass

    def abort(self, code: int) -> None:
        self.comm.Abort(code)
