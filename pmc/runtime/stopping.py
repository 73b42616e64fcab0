"""How a run ends before its tasks are all done: a stop, or a warning that time is short.

- A stop (SIGTERM or SIGINT to the master, the wall time running out, a warning under
  ``--on-warning stop``): no task starts any more and the running ones are killed
  (their workers get KILL: SIGTERM to each task, SIGKILL after a grace); the run ends
  once they have reported (``STOP_GRACE`` at most), incomplete, with everything written.
  A try killed so is "stopped", not failed: not the task's fault, and run again by the
  next run.
- A warning (SIGUSR1, SIGUSR2, SIGXCPU, see ``pmc.batchsignals``) to the master or to
  any worker (which passes it on, WARNED): by ``--on-warning``, ``drain`` (the default):
  no task starts any more (those queued on workers are taken back) and the running ones
  go on until they end or a stop comes; the run then ends, incomplete unless nothing was
  left, with everything written (summary, merged output, status), and the next run — a
  chain's next link — resumes from the rescue log. ``stop``: a stop. ``ignore``: logged.

``Stopping`` is the master's (its ``stops``); what it needs of the master is ``Owner``.
"""

from __future__ import annotations

import signal
import time
from typing import Protocol

from pmc import batchsignals, log
from pmc.core import protocol
from pmc.core.chains import Chains
from pmc.options import RunOptions

STOP_GRACE = 10.0  # after a stop, how long killed tasks may take to report


class Owner(Protocol):
    """What the stopping reads and calls of the master that owns it."""

    opts: RunOptions
    chains: Chains
    ranks_alive: set[int]
    stop_reason: str | None  # set when the run is being stopped early
    stop_deadline: float | None
    signal_received: int | None  # a stop signal the handler saw (SIGTERM, SIGINT)

    def send(self, rank: int, msg: protocol.Message) -> None: ...
    def recall(self, task_ids: list[int]) -> None: ...


class Stopping:
    """The master's stops and warnings."""

    def __init__(self, master: Owner) -> None:
        self.m = master
        self.draining: str | None = None  # why the run drains, after a warning

    def check_signal(self) -> None:
        """Act on a stop signal or warnings that came since the last look."""
        m = self.m
        sig = m.signal_received
        if sig is not None and m.stop_reason is None:
            log.fatal(f"Caught signal {sig}")
            self.stop(f"received {signal.Signals(sig).name}")
        if batchsignals.pending():
            for sig in batchsignals.take():
                self.warned(sig)

    def stop(self, reason: str) -> None:
        """Stop dispatching and kill running tasks (SIGTERM, then SIGKILL on the workers)."""
        m = self.m
        m.stop_reason = reason
        m.stop_deadline = time.monotonic() + STOP_GRACE
        busy = {w.rank for w in m.chains.busy_workers()}
        for rank in sorted(busy & m.ranks_alive):
            m.send(rank, protocol.kill())

    def warned(self, sig: int, rank: int = 0) -> None:
        """A warning signal reached this process (``rank`` 0) or a worker."""
        m = self.m
        name = batchsignals.name(sig)
        caught = f"Worker {rank} caught signal" if rank else "Caught signal"
        action = m.opts.on_warning
        if action == "ignore":
            log.warn(f"{caught} {sig} ({name}), a warning that time is short: ignored "
                     "(--on-warning ignore)")
        elif m.stop_reason is not None or self.draining is not None:
            log.info(f"{caught} {sig} ({name}): the run is already "
                     f"{'stopping' if m.stop_reason else 'draining'}")
        elif action == "stop":
            log.fatal(f"{caught} {sig}")
            self.stop(f"received {name}")
        else:
            running = len(m.chains.running)
            log.warn(f"{caught} {sig} ({name}): time is short: no task starts any more; "
                     f"the {running} running go on until they end (a SIGTERM stops them)")
            self.draining = f"received {name}, a warning that time is short"
            if m.chains.queued:
                m.recall(list(m.chains.queued))
