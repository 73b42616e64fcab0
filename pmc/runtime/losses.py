"""Lost workers: how the master notices them (heartbeats) and what it does about them.

A worker is lost when its connection breaks, it reports its own failure, or it is silent
for --worker-timeout (workers PING after a quiet quarter of it; so does the master, that
they know it is there). When the transport says a rank ended (under MPI, Hydra's
SIGUSR1), the ranks that talk through MPI are probed, and those that do not answer
within ``probe_wait`` are lost at once rather than after --worker-timeout.

A lost worker's running and queued tasks are ready again without counting as tries; a
task that was running on --max-worker-losses lost workers fails for good (it may be what
kills them). A task queued on the lost worker counts the loss too, apart: the worker
starts each queued task the moment the one ahead ends, and tells the master of starts
with its results, which wait for company (up to the worker's RESULT_HOLD): any of them
may have started unheard. Such losses doom a task only together with one while it was
known to run, or when there is one more of them than --max-worker-losses. And from then
on such a task starts only on a free slot, never from a queue (``Placer.never_queue``):
where it runs the master knows it, and a task that kills each worker it starts on fails
after --max-worker-losses workers, the tasks queued beside it having run elsewhere. A
host that loses ``QUARANTINE_AFTER`` workers gets no more tasks, unless it is the last
one with workers.

In embedded mode a lost worker is replaced (at most as many times as the run started
with workers): the transport starts a new rank, which gets the run's CONFIG and START as
the first ones did (its host rank the lost one's, the host script again if the lost one
ran it), and takes up the slots once it has said hello. ``Losses`` is the master's (its
``losses``), with the state of its own; what it needs of the master is ``Owner``.
"""

from __future__ import annotations

import signal
import time
from array import array
from typing import Protocol

from pmc import log
from pmc.core import protocol
from pmc.core.chains import Chains
from pmc.core.engine import Engine
from pmc.core.events import Observer
from pmc.core.protocol import TaskResult, WorkerConfig
from pmc.core.resources import Resources, Worker
from pmc.dag import DAG
from pmc.errors import FatalError
from pmc.options import RunOptions
from pmc.runtime import startup
from pmc.runtime.placement import Placer
from pmc.runtime.stopping import Stopping
from pmc.transport import Transport, TransportError

BEAT_CHECK = 1.0  # how often silent workers are looked for (see ``beat_check``)
QUARANTINE_AFTER = 2  # lost workers after which a host gets no more tasks

Finished = list[tuple[TaskResult, str | None]]


def beat_check(worker_timeout: float) -> float:
    """Seconds between two looks for silent workers (and PINGs to quiet ones): a quarter
    of --worker-timeout where that is less than ``BEAT_CHECK``, so that a worker hears
    its master well within it."""
    return min(BEAT_CHECK, worker_timeout / 4)


class Joiner:
    """A worker started in place of a lost one, until it takes up the slots."""

    __slots__ = ("deadline", "hello", "host", "host_rank", "replaces")

    def __init__(self, replaces: int, host: str, host_rank: int, deadline: float) -> None:
        self.replaces = replaces
        self.host = host
        self.host_rank = host_rank
        self.deadline = deadline
        self.hello: protocol.Message | None = None  # kept while it runs the host script


class Owner(Protocol):
    """What the loss handling reads and calls of the master that owns it."""

    t: Transport
    opts: RunOptions
    dag: DAG
    engine: Engine
    resources: Resources
    chains: Chains
    out: Observer
    seq: array[int]
    ranks_alive: set[int]
    forward_errors: dict[int, str]
    stop_reason: str | None
    clock: float
    heard: dict[int, float]
    sent: dict[int, float]
    beat_due: float
    placer: Placer
    stops: Stopping

    def remaining(self) -> float | None: ...
    def send(self, rank: int, msg: protocol.Message) -> None: ...
    def mark_ready(self, task_id: int) -> None: ...
    def complete(self, finished: Finished) -> None: ...
    def recall(self, task_ids: list[int]) -> None: ...


class Losses:
    """The master's lost workers: what it knows of them, and what it does about them."""

    def __init__(self, master: Owner) -> None:
        self.m = master
        # Lost workers each task was on (few tasks ever are: not an array of every task).
        self.per_task: dict[int, int] = {}
        self.host_losses: dict[str, int] = {}
        self.quarantined: set[str] = set()
        self.benched: dict[int, str] = {}  # quarantined hosts' workers: their host
        # Embedded mode: workers started in place of lost ones, as many as at the start.
        self.config: WorkerConfig | None = None  # what they are sent (set at the start)
        self.joining: dict[int, Joiner] = {}
        self.replacements_left = master.t.size - 1
        # When the probe after a rank's end is due, and the losses each task had while
        # queued on the lost worker.
        self.probe_due: float | None = None
        self.suspected: dict[int, int] | None = None
        # When the last worker was lost, and the last probe sent (monotonic).
        self.lost_at = float("-inf")
        self.probed_at = 0.0

    def heartbeats(self, now: float) -> None:
        """Workers silent for --worker-timeout are lost; those the master has sent
        nothing for a while get a PING, so that they know it is there."""
        m = self.m
        m.beat_due = now + beat_check(m.opts.worker_timeout)
        self.probe_ended(now)
        timeout = m.opts.worker_timeout
        for rank in [r for r in m.ranks_alive if now - m.heard.get(r, now) > timeout]:
            self.worker_lost(rank, f"silent for {timeout:g} s")
        for rank in [r for r, j in self.joining.items() if now > j.deadline]:
            self.worker_lost(rank, f"no hello within {startup.HELLO_TIMEOUT:.0f} s")
        self.ping_quiet(now)

    def probe_wait(self) -> float:
        """How long a probed rank has to answer: a tenth of --worker-timeout, at least
        2 s (a live rank's MPI library takes the PING within its next look, 0.2 s apart
        at most when idle), never more than --worker-timeout."""
        m = self.m
        timeout = m.opts.worker_timeout
        return min(timeout, max(2.0, timeout / 10))

    def probe_ended(self, now: float) -> None:
        """The launcher said a rank ended (Hydra's SIGUSR1): probe the ranks that talk
        through MPI; those that have not answered when the wait is over are lost."""
        m = self.m
        t = m.t
        if self.probe_due is not None:
            if now < self.probe_due:
                m.beat_due = min(m.beat_due, self.probe_due)
                return
            self.probe_due = None
            why = (f"no answer within {self.probe_wait():g} s after the launcher "
                   "reported a rank's end")
            for rank in t.unanswered():  # type: ignore[attr-defined]
                if rank in m.ranks_alive:
                    self.worker_lost(rank, why)
            if self.lost_at < self.probed_at - self.probe_wait():
                # No rank was lost around the notice (a rank's end is seen as its socket
                # breaks, a moment before, or here): Hydra's mpiexec passed on a SIGUSR1
                # sent to it, a warning that time is short (pmc.batchsignals).
                log.debug("The launcher's SIGUSR1 came with no rank's end: mpiexec passed "
                          "on a SIGUSR1")
                m.stops.warned(signal.SIGUSR1)
        ended = getattr(t, "rank_ended", None)
        if ended is not None and ended():
            t.probe()  # type: ignore[attr-defined]
            self.probed_at = now
            self.probe_due = now + self.probe_wait()
            m.beat_due = min(m.beat_due, self.probe_due)

    def ping_quiet(self, now: float) -> None:
        """A PING to the workers the master has sent nothing for a while: also after the
        loop, while it merges their output, so that idle workers do not take its
        silence for its loss."""
        m = self.m
        quiet = now - m.opts.worker_timeout / 4
        for rank in [r for r in m.ranks_alive if m.sent.get(r, now) <= quiet]:
            m.send(rank, protocol.ping())

    def worker_lost(self, rank: int, why: str | None = None) -> None:
        """A worker died, broke its connection or went silent: its running and queued
        tasks are ready again, the tries not counted, but a task that was running on
        --max-worker-losses lost workers fails. A silent one is told to stop should it
        wake up, and not heard any more."""
        m = self.m
        if rank in self.joining:
            self.join_failed(rank, why or "its connection broke")
            return
        if rank not in m.ranks_alive:
            return
        m.ranks_alive.discard(rank)
        self.lost_at = time.monotonic()
        if why is not None:
            for msg in (protocol.kill(), protocol.shutdown(False)):
                try:
                    m.t.send(rank, msg)
                except TransportError:
                    break
        m.t.abandon(rank)
        chains = m.chains
        # Queued there: perhaps started, unheard of.
        suspects = {tid: w for tid, (w, _pred) in chains.queued.items() if w.rank == rank}
        m.placer.never_queue.update(suspects)
        worker = m.resources.remove_worker(rank)
        running, queued = chains.drop_worker(rank)
        doomed: list[int] = []
        for tid, affinity in running:
            if worker is not None:
                # The slot went with the worker; its host (and every other host of a
                # multi-rank task) gets the cpus, memory and GPUs back, and observers
                # hear of each.
                m.placer.release(tid, worker, affinity)
            m.forward_errors.pop(tid, None)
            self.per_task[tid] = self.per_task.get(tid, 0) + 1
            if self.doomed(tid):
                doomed.append(tid)
                continue
            m.engine.requeue(tid)
            if m.stop_reason is None:
                m.mark_ready(tid)
        again = len(running) - len(doomed)
        if self.suspected is None:
            self.suspected = {}
        m.placer.unqueued(queued)
        for tid in queued:  # never seen by observers as started: ready again
            self.suspected[tid] = self.suspected.get(tid, 0) + 1
            if self.doomed(tid):
                m.placer.dispatched(tid, suspects[tid])  # it may have run: tell it
                doomed.append(tid)
                continue
            m.engine.requeue(tid)
        how = f" ({why})" if why else ""
        log.error(f"Worker {rank} was lost{how}; {again} task(s) it was running will "
                  "run again elsewhere" if again else f"Worker {rank} was lost{how}")
        host = worker.host.name if worker is not None else self.benched.pop(rank, "")
        m.out.worker_lost(rank, host, worker.slots if worker is not None else 0,
                             why or "its connection broke", again)
        for tid in doomed:
            self.fail_lost(tid, rank)
        if worker is not None:
            self.host_lost_worker(worker.host.name)
            if worker.host.name not in self.quarantined:
                self.replace(worker)
        self.check_workers_left()

    def doomed(self, tid: int) -> bool:
        """Has the task been on --max-worker-losses lost workers, one of them while it
        was known to run (or on one more while only queued there)?"""
        m = self.m
        known = self.per_task.get(tid, 0)
        queued = self.suspected.get(tid, 0) if self.suspected else 0
        limit = m.opts.max_worker_losses
        return known + queued >= limit and (known > 0 or queued > limit)

    def check_workers_left(self) -> None:
        m = self.m
        if not m.ranks_alive and not self.joining and m.stop_reason is None:
            log.fatal("No workers left")
            m.stops.stop("no workers left")

    def fail_lost(self, tid: int, rank: int) -> None:
        """A task whose workers keep being lost under it (it may be what kills them)
        fails for good, with the reason in its record."""
        m = self.m
        task = m.dag.made[tid]
        queued = self.suspected.get(tid, 0) if self.suspected else 0
        n = self.per_task.get(tid, 0) + queued
        how = "ran or was queued" if queued else "ran"
        reason = (f"Task {task.name} failed: {n} workers were lost while it {how} on them "
                  f"(the last, worker {rank}); --max-worker-losses is "
                  f"{m.opts.max_worker_losses}")
        log.error(reason)
        engine = m.engine
        engine.attempts[tid] = max(engine.attempts[tid], engine.tries_of(tid))  # no retry
        res = TaskResult(id=tid, attempt=engine.attempts[tid], status=protocol.FAILED_STATUS,
                         start=time.time(), duration=0.0, cpu_time=0.0, max_rss_kb=None,
                         error=reason, forwards=None)
        m.out.ended(task, m.seq[tid], res, reason)
        m.complete([(res, reason)])

    def host_lost_worker(self, host: str) -> None:
        """A host that keeps losing workers gets no more tasks (its other workers finish
        what they run), unless it is the last host with workers."""
        m = self.m
        n = self.host_losses[host] = self.host_losses.get(host, 0) + 1
        if n < QUARANTINE_AFTER or host in self.quarantined:
            return
        res = m.resources
        others = [w for w in res.workers.values() if w.host.name != host]
        if not others:
            log.warn(f"Host {host} lost {n} workers, but it is the last host with workers: "
                     "it keeps getting tasks")
            return
        self.quarantined.add(host)
        mine = [w for w in res.workers.values() if w.host.name == host]
        log.error(f"Host {host} lost {n} workers: quarantined, no more tasks go there "
                  f"({len(mine)} worker(s) on it finish what they run)")
        for w in mine:
            res.remove_worker(w.rank)
            m.chains.close_worker(w.rank)
            self.benched[w.rank] = host
        m.out.host_quarantined(host, f"lost {n} workers", sum(w.slots for w in mine))
        m.recall([tid for tid, (w, _pred) in m.chains.queued.items()
                     if w.host.name == host])
        if mine:
            m.out.host_changed(mine[0].host)

    # -- replacements (embedded mode) -------------------------------------------------------

    def replace(self, lost: Worker) -> None:
        """Start a worker in place of ``lost``, if the transport can (embedded mode), the
        run goes on, and the replacements are not used up."""
        m = self.m
        spawn = getattr(m.t, "spawn", None)
        if (spawn is None or self.config is None or self.replacements_left <= 0
                or m.stop_reason is not None or m.engine.finished()):
            return
        try:
            rank: int = spawn()
        except OSError as e:
            log.error(f"Cannot start a worker in place of worker {lost.rank}: {e}")
            return
        self.replacements_left -= 1
        self.joining[rank] = Joiner(lost.rank, lost.host.name, lost.host_rank,
                                    m.clock + startup.HELLO_TIMEOUT)
        log.info(f"Starting worker {rank} in place of worker {lost.rank}")
        try:
            m.t.send(rank, protocol.config(self.config))
        except TransportError:
            self.worker_lost(rank)

    def joiner_says(self, rank: int, msg: protocol.Message) -> None:
        """A message from a worker that has not taken up its slots yet: its HELLO (then
        START; the host script first if the worker it replaces ran it), or the result of
        its host script."""
        m = self.m
        j = self.joining[rank]
        if msg[0] == protocol.HELLO:  # of any version: add_worker checks
            script = bool(m.opts.host_script) and j.host_rank == 0
            j.hello = msg
            try:
                m.t.send(rank, protocol.start(j.host_rank, script, m.remaining()))
            except TransportError:
                self.worker_lost(rank)
                return
            if not script:
                self.joined(rank)
        elif isinstance(msg, protocol.HostScript):
            if msg.ok:
                self.joined(rank)
            else:
                self.worker_lost(rank, f"its host script failed: {msg.message}")
        elif isinstance(msg, protocol.WorkerFailed):
            startup.log_failure(rank, msg.hostname, msg.traceback)
            self.worker_lost(rank)
        elif isinstance(msg, protocol.Error):
            log.error(str(msg.message))
            self.worker_lost(rank)

    def joined(self, rank: int) -> None:
        """The replacement takes up its slots: tasks go there from now on."""
        m = self.m
        j = self.joining.pop(rank)
        assert j.hello is not None
        try:
            startup.add_worker(rank, j.hello, m.resources)
        except FatalError as e:
            log.error(str(e))
            m.t.abandon(rank)
            self.check_workers_left()
            return
        worker = m.resources.workers[rank]
        worker.host_rank = j.host_rank
        m.ranks_alive.add(rank)
        m.heard[rank] = m.sent[rank] = m.clock
        log.info(f"Worker {rank} on {worker.host.name} replaced lost worker {j.replaces} "
                 f"({worker.slots} slot(s))")
        m.out.worker_joined(rank, worker.host.name, worker.slots, j.replaces)
        m.out.host_changed(worker.host)

    def join_failed(self, rank: int, why: str) -> None:
        m = self.m
        j = self.joining.pop(rank)
        log.error(f"Worker {rank}, started in place of worker {j.replaces}, was lost "
                  f"({why})")
        m.t.abandon(rank)
        self.check_workers_left()

    def drop_joiners(self) -> None:
        """At the end: workers still on their way in are stopped."""
        m = self.m
        for rank in list(self.joining):
            del self.joining[rank]
            m.t.abandon(rank)
