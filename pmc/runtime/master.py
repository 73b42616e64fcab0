"""The master (rank 0): hands ready tasks to workers that have room and records results.

One loop: dispatch what fits, wait for messages (with the wall-time deadline and signals
in mind), turn results into rescue records, engine transitions and observer events. The
engine decides order and readiness, ``Resources`` decides where, ``Chains`` what each
slot holds; this module only moves data between them, the transport and the observers.
The hand-shake before the loop is ``startup``'s, the end-of-run figures ``summary``'s.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Iterable

from pmc import log
from pmc.core import protocol
from pmc.core.chains import Chains, depth_for
from pmc.core.engine import Engine, Outcome, State
from pmc.core.events import Observer, RunInfo, Summary
from pmc.core.protocol import TaskResult
from pmc.core.rescue import RescueError, RescueLog
from pmc.core.resources import Resources
from pmc.dag import DAG
from pmc.dag.model import options_of
from pmc.errors import FatalError
from pmc.options import RunOptions
from pmc.runtime import ordering, startup
from pmc.runtime.forward import ForwardFiles, default_maxfds
from pmc.runtime.losses import Losses, beat_check
from pmc.runtime.openrun import OpenRun
from pmc.runtime.placement import Placer
from pmc.runtime.stopping import Stopping
from pmc.runtime.summary import Counts
from pmc.transport import Transport, TransportError

BYE_TIMEOUT = 30.0
SIGNAL_CHECK = startup.SIGNAL_CHECK  # longest wait before noticing a signal or the wall time
SYNC_CHECK = 0.0005  # how soon to look again while rescue records are being synced

Finished = list[tuple[TaskResult, str | None]]  # tries that ended, with the master's error


class Master:
    """Rank 0: its state in parts, each set up by a line of ``__init__``'s table."""

    def __init__(self, transport: Transport, opts: RunOptions, dag: DAG, done: set[int],
                 out: Observer, mode: str, reused: set[int] | None = None) -> None:
        # The run: its transport, options, DAG and observers (every one, through a Fanout).
        self.t, self.opts, self.dag, self.out, self.mode = transport, opts, dag, out, mode
        self.done_at_start = done
        # The tasks' progress: the engine (readiness, tries), its order, jobstate numbers.
        order = ordering.path_order(dag, opts.schedule)
        self.engine = Engine(dag, tries=opts.tries, max_failures=opts.max_failures, done=done,
                             order=order, reused=reused or ())
        self.reorder = ordering.Reorder(self.engine) if order is not None else None
        self.seq = array("i", bytes(4 * len(dag)))  # jobstate sequence number, 0 = none yet
        self.next_seq = 1
        # Where tasks go: the hosts' resources, what each slot holds, the placer.
        self.resources = Resources()
        self.chains = Chains()
        self.prefetch = opts.prefetching  # tasks queued behind running ones (Chains)
        self.mean_duration = -1.0  # of the tries ended, moving (-1: none yet): chains' depth
        self.queued_seen = 0  # how many tasks were queued as the observers last heard
        self.counts = Counts()
        self.placer = Placer(dag, self.engine, self.resources, self.chains, self.seq,
                             self.counts, out, prefetch=self.prefetch,
                             set_affinity=opts.set_affinity)
        # What results leave behind: rescue records (DONE durable before children run:
        # (sync ticket, results) written, not yet synced), forwarded data.
        self.rescue: RescueLog | None = None
        self.unsynced: deque[tuple[int, Finished]] = deque()
        self.forward = ForwardFiles(opts.maxfds or default_maxfds())
        # Tasks whose streamed pipe data (FORWARD) could not be written: task -> why.
        self.forward_errors: dict[int, str] = {}
        # The clock, the wall-time deadline and stops (``stops``: signals and warnings).
        self.start_time = time.time()
        self.t0 = time.monotonic()
        self.deadline: float | None = None
        if opts.max_wall_time is not None:
            self.deadline = self.t0 + opts.max_wall_time * 60.0
        self.stop_reason: str | None = None  # set when the run is being stopped early
        self.stop_deadline: float | None = None
        self.gave_up = False  # tasks killed by the stop never reported: may still write
        self.signal_received: int | None = None
        self.stops = Stopping(self)
        # The workers: those alive, and heartbeats (see protocol.PING): when each was last
        # heard from and sent anything, by the loop's clock (read once a turn); ``losses``:
        # lost workers, probes, replacements.
        self.ranks_alive: set[int] = set(range(1, transport.size))
        self.clock = time.monotonic()
        self.heard: dict[int, float] = {}
        self.sent: dict[int, float] = {}
        self.beat_due = 0.0
        self.losses = Losses(self)
        # Log levels, fixed for the run: per-task lines cost one attribute test when off.
        self.debug = log.enabled(log.DEBUG)
        self.trace = log.enabled(log.TRACE)
        self.open: OpenRun | None = None  # an open run's requests (pmc run --open)

    # -- helpers ---------------------------------------------------------------------------

    def broadcast(self, msg: protocol.Message) -> None:
        for rank in sorted(self.ranks_alive):
            self.send(rank, msg)

    def send(self, rank: int, msg: protocol.Message) -> None:
        self.sent[rank] = self.clock
        try:
            self.t.send(rank, msg)
        except TransportError:
            self.losses.worker_lost(rank)

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def stopping(self) -> str | None:
        """Why the run is being stopped (a signal noticed now), or None."""
        self.stops.check_signal()
        return self.stop_reason

    # -- start-up --------------------------------------------------------------------------

    def gather_workers(self) -> None:
        o = self.opts
        config = startup.worker_config(o, f"{o.dag}.out.{{rank}}", f"{o.dag}.err.{{rank}}")
        self.losses.config = config  # for workers started later in place of lost ones
        self.broadcast(protocol.config(config))
        self.accounting, self.memory_limits = startup.gather_workers(
            self.t, self.ranks_alive, self.resources, self.stopping)

    def start(self) -> RunInfo:
        """Hand-shake with the workers, open the rescue log, set up the hosts: what the
        observers are told when the run has started."""
        startup.check_launcher(self.opts.task_launcher)
        self.gather_workers()
        startup.check_capable(self.dag, self.engine.state, self.resources)
        self.rescue = RescueLog(self.opts.rescue_path, self.dag, self.done_at_start,
                                self.engine.ids_in(State.REUSED))
        startup.start_hosts(self.t, self.resources, bool(self.opts.host_script),
                            self.remaining(), self.losses.worker_lost, self.stopping)
        o, res = self.opts, self.resources
        return RunInfo(
            dag_path=o.dag, tasks=self.dag.ntasks, recovered=self.engine.recovered,
            workers=len(res.workers), slots=res.total_slots, cpus=res.total_cpus,
            hosts=list(res.hosts), start=self.start_time, mode=self.mode, site=o.site,
            max_wall_time=None if o.max_wall_time is None else o.max_wall_time * 60.0,
            accounting=",".join(sorted(self.accounting)),
            memory_limits=",".join(sorted(self.memory_limits)) if o.strict_limits else "",
            reused=self.engine.nreused, arrays=startup.array_info(self.dag, self.engine.state),
            counts=self.counts)

    # -- the loop --------------------------------------------------------------------------

    def loop(self) -> Summary:
        """Run the workflow (after ``start``); returns the end-of-run figures."""
        log.info("Starting workflow")
        if self.engine.recovered:
            log.info(f"Recovered {self.engine.recovered} finished task(s) from the rescue log")
        self.next_seq = self.placer.announce_start(self.next_seq)
        for host in self.resources.hosts.values():
            self.out.host_changed(host)
        self.out.flush()
        chains = self.chains
        self.clock = time.monotonic()
        self.heard = dict.fromkeys(self.ranks_alive, self.clock)
        self.beat_due = self.clock + beat_check(self.opts.worker_timeout)
        while True:
            self.complete_synced()
            if self.stopping() is None:  # a signal noticed since the turn: nothing more
                self.dispatch()
            # Observers hear the queues and write what they hold once the step is
            # whole: results taken, slots and queues refilled (a status snapshot between
            # the two would show the queues emptier than they are for the whole wait
            # that follows).
            self.tell_queued()
            self.out.flush()
            if not chains.running:
                if chains.queued:
                    # Never with a worker that keeps the protocol: nothing is left to
                    # start these in its place. Ready them again rather than wait.
                    self.returned(list(chains.queued))
                    continue
                if self.unsynced:
                    self.complete_synced(block=True)  # nothing else to wait for
                    continue
                if self.stop_reason or self.stops.draining or (self.engine.finished() and (
                        self.open is None or self.open.may_end())):
                    break
            if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
                log.error(f"{len(chains.running)} task(s) did not report after the stop; "
                          "giving up on them")
                self.gave_up = True
                for task_id in chains.clear():
                    self.engine.requeue(task_id)
                self.complete_synced(block=True)
                break
            self.turn()
        return self.counts.summary(self.engine, self.resources,
                                   self.stop_reason or self.stops.draining, self.start_time,
                                   time.monotonic() - self.t0)

    def turn(self) -> None:
        """Wait for messages and act on them."""
        chains = self.chains
        timeout = SIGNAL_CHECK
        if self.unsynced and (self.resources.any_idle() or not self.engine.nready):
            # Tasks waiting for their records to be durable may free the next ready
            # ones for an idle slot: look again soon. With every slot busy and tasks
            # ready, the next message is soon enough (no wake-up per millisecond).
            timeout = SYNC_CHECK
        left = self.remaining()
        if left is not None:
            timeout = max(0.0, min(timeout, left))
        msgs = (self.open or self.t).poll(timeout)  # serves an open run's requests
        self.clock = now = time.monotonic()
        # Before the results: when a batch system signals every rank at once, tasks
        # its SIGTERM killed on the workers are stopped, not failed.
        self.stops.check_signal()
        results: list[TaskResult] = []
        starts: list[tuple[int, float]] = []
        failed: list[tuple[int, protocol.WorkerFailed]] = []
        alive, heard = self.ranks_alive, self.heard
        for rank, msg in msgs:
            if rank not in alive:
                if rank in self.losses.joining:
                    self.losses.joiner_says(rank, msg)
                continue  # or given up on: its tasks are someone else's now
            heard[rank] = now
            if isinstance(msg, protocol.Results):
                results.extend(msg.results)
                starts.extend(msg.starts)
            elif isinstance(msg, protocol.Started):
                starts.extend(msg.starts)
            elif isinstance(msg, protocol.Returned):
                # Handled at once: a worker sends it before any result that follows.
                self.returned(msg.task_ids)
            elif isinstance(msg, protocol.Forward):
                self.forwarded(msg.task_id, msg.destination, msg.data)
            elif isinstance(msg, protocol.Error):
                log.error(str(msg.message))
            elif isinstance(msg, protocol.Bye):
                self.ranks_alive.discard(rank)
            elif isinstance(msg, protocol.WorkerFailed):
                failed.append((rank, msg))
            elif isinstance(msg, protocol.Warned):
                for sig in msg.signals:
                    self.stops.warned(sig, rank)
        if results or starts:
            self.handle_results(results, starts)  # sent before it failed: they count
        for rank, why in failed:
            startup.log_failure(rank, why.hostname, why.traceback)
            self.losses.worker_lost(rank)
        for rank in self.t.lost():
            self.losses.worker_lost(rank)
        if now >= self.beat_due:
            self.losses.heartbeats(now)
        if self.prefetch and chains.queued and not self.engine.accepting():
            # The failure limit stops the run: what waits on workers goes back.
            self.recall(list(chains.queued))
        now_left = self.remaining()
        if self.stop_reason is None and now_left is not None and now_left <= 0:
            log.fatal("Workflow wall time exceeded!")
            self.stops.stop(f"maximum wall time of {self.opts.max_wall_time:g} minutes reached")

    def mark_ready(self, task_id: int) -> None:
        # A new sequence number each time a task is queued, a retry too (2.0, then 3.0),
        # as the reference numbers its submissions.
        self.seq[task_id] = self.next_seq
        self.next_seq += 1
        task = self.dag.task(task_id)
        self.placer.readied(task_id)
        if self.debug:
            log.debug(f"Queueing task {task.name}")
        self.out.ready(task, self.seq[task_id])

    def dispatch(self) -> None:
        engine = self.engine
        if not engine.accepting() or self.stops.draining:
            return
        batches = self.placer.place(self.remaining())
        chains = self.chains
        res = self.resources
        if self.prefetch and not engine.nready and chains.queued and res.any_idle():
            # A slot is idle while tasks wait behind running ones: take back those that
            # could start there now (the end of a layer, uneven task lengths).
            self.recall(tid for tid in chains.queued if self.placer.fits_now(tid))
        for rank, specs in batches.items():
            self.send(rank, protocol.tasks(specs))
        back = self.placer.take_back()
        if back:
            self.recall(back)

    def tell_queued(self) -> None:
        """Observers hear how many tasks wait on workers, when it changed."""
        if len(self.chains.queued) != self.queued_seen:
            self.queued_seen = len(self.chains.queued)
            self.out.queue_changed(self.queued_seen)

    def recall(self, task_ids: Iterable[int]) -> None:
        """Ask workers to give queued tasks back (those not started meanwhile)."""
        ranks = {w.rank for w in self.chains.recall(task_ids)}
        for rank in sorted(ranks & self.ranks_alive):
            self.send(rank, protocol.recall())

    def returned(self, task_ids: list[int]) -> None:
        """Tasks a worker gave back unstarted: ready again, the try not counted. Queued
        ones were never seen by the observers; one sent to start at once was refused
        (its worker was stopping, by a signal of its own or its wall time): its slot is
        free and the observers, who saw it dispatched, see it queued again."""
        back, refused = self.chains.returned(task_ids)
        self.placer.unqueued(back)
        for tid in back:
            self.engine.requeue(tid)
        for tid, worker, affinity in refused:
            self.placer.release(tid, worker, affinity)
            self.engine.requeue(tid)
            if self.stop_reason is None:
                self.mark_ready(tid)

    def note_started(self, task_id: int, start: float) -> None:
        """The worker started the task at ``start`` (its Unix time): observers hear it
        once, after its predecessor's end and before its own."""
        worker = self.chains.started(task_id)
        self.out.task_started(self.dag.made[task_id], self.seq[task_id],
                              self.engine.attempts[task_id], worker.rank,
                              self.placer.where(task_id, worker) if self.resources.grants
                              else worker.host.name, start)

    def handle_results(self, results: list[TaskResult],
                       starts: list[tuple[int, float]] | None = None) -> None:
        """Results and starts from workers, told to the observers in the order they
        happened on each slot: a try's start, its end, its successor's start."""
        tasks = self.dag.made
        chains = self.chains
        running, unstarted = chains.running, chains.unstarted
        counts = self.counts
        out = self.out
        starts = starts or []
        start_of = dict(starts)
        good: Finished = []
        mean = self.mean_duration
        for res in results:
            if res.id not in running:
                continue  # a result from a worker already given up on
            mean = res.duration if mean < 0 else mean + (res.duration - mean) / 16
            if res.id in unstarted:
                self.note_started(res.id, start_of.get(res.id, res.start))
            worker, affinity = chains.end(res.id)
            task = tasks[res.id]
            if affinity:
                worker.host.give_cpu_set(list(affinity))
            opts = options_of(task)
            counts.ended(res, self.placer.where(res.id, worker) if self.resources.grants
                         else worker.host.name, opts.cpus * opts.ranks)
            error = res.error
            if self.forward_errors and res.id in self.forward_errors:
                error = error or self.forward_errors.pop(res.id)
            if res.status == 0 and error is None and res.forwards:
                error = self.write_forwards(task.name, res.forwards)
            out.ended(task, self.seq[res.id], res, error)
            if res.status == 0 and error is None:
                good.append((res, error))
            else:
                # At once, before the successor's start: nothing to make durable first.
                self.complete([(res, error)])
            succ = self.placer.promote(res.id, worker)
            if succ >= 0 and succ in start_of:
                self.note_started(succ, start_of[succ])
        for tid, start in starts:  # tasks started that are still running
            if tid in unstarted and tid in running:
                self.note_started(tid, start)
        if mean != self.mean_duration:
            self.mean_duration = mean
            chains.limit = depth_for(mean)
        if good:
            # Group commit: the records are written now and made durable by a thread;
            # these tasks count as done, and their children become ready, once the
            # sync is through. Meanwhile the freed slots take other ready tasks.
            assert self.rescue is not None
            self.rescue.write(tasks[r.id].name for r, _err in good)
            urgent = self.awaited(good)
            self.unsynced.append((self.rescue.request_sync(urgent), good))

    def awaited(self, finished: Finished) -> bool:
        """Whether work waits for these tasks to count as done: some have children, and
        a slot is idle or fewer tasks are ready than there are slots. Otherwise their
        records may wait to be made durable together with later ones."""
        start = self.dag.child_start
        if not any(start[r.id + 1] > start[r.id] for r, _err in finished):
            return False
        return self.resources.any_idle() or self.engine.nready < self.resources.total_slots

    def complete_synced(self, block: bool = False) -> None:
        """Finish the batches whose DONE records are durable (all of them if block)."""
        if not self.unsynced:
            return
        assert self.rescue is not None
        try:
            if block:
                self.rescue.wait_synced(self.unsynced[-1][0])
            synced = self.rescue.synced()
        except RescueError as e:
            raise FatalError(str(e)) from e
        while self.unsynced and self.unsynced[0][0] <= synced:
            self.complete(self.unsynced.popleft()[1])

    def complete(self, finished: Finished) -> None:
        """Engine transitions, events and log lines for finished tries."""
        tasks = self.dag.made
        for res, error in finished:
            task = tasks[res.id]
            ok = res.status == 0 and error is None
            if not ok and self.stop_reason is not None:
                # Killed by the stop: not the task's fault, and not done either.
                self.engine.requeue(res.id)
                self.counts.tries_stopped += 1
                self.out.result(task, self.seq[res.id], res._replace(error=error), "stopped")
                continue
            outcome, newly = self.engine.complete(res.id, ok, res.duration)
            io_failed = error is not None and res.error is None
            if io_failed:
                res = res._replace(status=res.status or protocol.FAILED_STATUS, error=error)
            if not ok:
                self.counts.tries_failed += 1
            self.out.result(task, self.seq[res.id], res, outcome.value)
            if outcome is not Outcome.RETRY:
                self.placer.let_go(res.id)  # its last try: a Task made for it let go
            if outcome is Outcome.SUCCEEDED:
                if self.debug:
                    log.debug(f"Task {task.name} finished with exitcode 0")
                for child in newly:
                    self.mark_ready(child)
                if self.engine.new_runs:  # array members ready together
                    self.next_seq = self.placer.announce_runs(self.next_seq)
            else:
                if io_failed:
                    # The master's own failure to write the task's forwarded data.
                    log.error(f"Task {task.name} failed due to collective I/O errors")
                else:
                    # PMC's "exitcode" is the raw wait status (768 for exit code 3).
                    log.error(f"Task {task.name} failed with exitcode {res.status}")
                if outcome is Outcome.RETRY:
                    if self.debug:
                        log.debug(f"Task {task.name} will be tried again (try "
                                  f"{res.attempt + 1} of {self.engine.tries_of(res.id)})")
                    self.mark_ready(res.id)
        if self.reorder is not None:
            self.reorder()

    def forwarded(self, task_id: int, dest: str, data: bytes) -> None:
        """A piece of a finished try's large pipe output, sent before its result (which
        says it succeeded): written at once, as the reference writes its I/O messages."""
        if task_id not in self.chains.running or task_id in self.forward_errors:
            return  # given up on, or already failed to write
        error = self.write_forwards(self.dag.made[task_id].name, ((dest, data),))
        if error is not None:
            self.forward_errors[task_id] = error

    def write_forwards(self, name: str, forwards: tuple[tuple[str, bytes], ...]) -> str | None:
        for dest, data in forwards:
            try:
                self.forward.write(dest, data)
            except OSError as e:
                log.error(f"Error writing {len(data)} bytes to {dest} for task {name}")
                return f"Task {name} failed due to I/O forwarding errors: {dest}: {e.strerror}"
        return None

    # -- the end ---------------------------------------------------------------------------

    def shutdown_workers(self) -> None:
        self.losses.drop_joiners()
        pending = set(self.ranks_alive)
        if self.debug:
            for rank in sorted(pending):
                log.debug(f"Sending shutdown message to worker {rank}")
        # Whether a worker was lost: MPI workers then leave without MPI_Finalize.
        self.broadcast(protocol.shutdown(bool(self.losses.host_losses)))
        deadline = time.monotonic() + BYE_TIMEOUT
        while pending & self.ranks_alive and time.monotonic() < deadline:
            for rank, msg in self.t.poll(SIGNAL_CHECK):
                if isinstance(msg, protocol.Bye):
                    pending.discard(rank)
                elif isinstance(msg, protocol.WorkerFailed):
                    startup.log_failure(rank, msg.hostname, msg.traceback)
                    pending.discard(rank)
                # Anything else (results of tasks killed after the end): nothing to record.
            for rank in self.t.lost():
                pending.discard(rank)
        if pending & self.ranks_alive:
            log.warn(f"Workers {sorted(pending)} did not say goodbye")

    def close(self) -> None:
        if self.rescue is not None:
            self.rescue.close()
        self.forward.close()
