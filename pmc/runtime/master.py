"""The master (rank 0): hands ready tasks to workers that have room and records results.

One loop: dispatch what fits, wait for messages (with the wall-time deadline and signals
in mind), turn results into rescue records, engine transitions and observer events. The
engine decides order and readiness, ``Resources`` decides where; this module only moves
data between them and the transport.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

from pmc import log
from pmc.core import protocol
from pmc.core.engine import Engine, Outcome
from pmc.core.events import Observer, RunInfo, Summary
from pmc.core.protocol import TaskResult, TaskSpec, WorkerConfig
from pmc.core.records import cluster_summary_record
from pmc.core.rescue import RescueError, RescueLog
from pmc.core.resources import Resources, Worker
from pmc.dag import DAG
from pmc.errors import FatalError, Interrupted
from pmc.options import RunOptions
from pmc.transport import Transport, TransportError

HELLO_TIMEOUT = 120.0
BYE_TIMEOUT = 30.0
STOP_GRACE = 10.0  # after a stop, how long killed tasks may take to report
SIGNAL_CHECK = 0.25  # longest wait before noticing a signal or the wall-time limit
SYNC_CHECK = 0.0005  # how soon to look again while rescue records are being synced
PREFETCH_DEPTH = 2  # tasks queued behind each running one: room for results to batch


class ForwardFiles:
    """The master's appending writers for I/O forwarding, at most ``maxfds`` open at once
    (least recently used closed first). Files are opened in append mode, never truncated."""

    def __init__(self, maxfds: int) -> None:
        self.maxfds = maxfds
        self.fds: OrderedDict[str, int] = OrderedDict()
        self.bytes_written = 0
        self.hits = 0  # writes to a file already open, for the end-of-run hit rate
        self.misses = 0

    def write(self, path: str, data: bytes) -> None:
        fd = self.fds.get(path)
        if fd is None:
            self.misses += 1
            if len(self.fds) >= self.maxfds:
                _, old = self.fds.popitem(last=False)
                os.close(old)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
            self.fds[path] = fd
        else:
            self.hits += 1
            self.fds.move_to_end(path)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        self.bytes_written += len(data)

    def hitrate(self) -> float:
        """Share of writes that found their file open (1.0 with none, as PMC's)."""
        total = self.hits + self.misses
        return self.hits / total if total else 1.0

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


class Master:
    def __init__(
        self,
        transport: Transport,
        opts: RunOptions,
        dag: DAG,
        done: set[int],
        observers: list[Observer],
        mode: str,
        open_outputs: Callable[[], list[Observer]] = list,
    ) -> None:
        self.t = transport
        self.opts = opts
        self.dag = dag
        self.done_at_start = done
        self.observers = observers
        self.hooks: dict[str, list[Callable[..., None]]] = {}  # hook -> observers' methods
        self.open_outputs = open_outputs  # output files, opened once the run can start
        self.mode = mode
        self.resources = Resources()
        self.engine = Engine(dag, tries=opts.tries, max_failures=opts.max_failures, done=done)
        self.seq = array("i", bytes(4 * len(dag)))  # jobstate sequence number, 0 = none yet
        self.next_seq = 1
        self.running: dict[int, tuple[Worker, tuple[int, ...] | None]] = {}
        # Prefetching: a task sent to a worker to start in the place of one of its running
        # tasks the moment that ends, so the slot does not wait for a round trip to the
        # master. It takes the slot and the resources over from that task; until its
        # predecessor's result arrives it is "queued", unseen by the observers.
        self.prefetch = opts.prefetching
        self.queued: dict[int, tuple[Worker, int]] = {}  # task -> (worker, predecessor)
        self.next_of: dict[int, int] = {}  # running or queued task -> its successor
        # The last task of each slot's chain (running, or queued behind running ones) ->
        # how many tasks wait in the chain (0: a running task with none behind it).
        self.tails: dict[int, int] = {}
        self.recalling: set[int] = set()  # queued tasks asked back, not returned yet
        # Tasks sent to start at once, or promoted in their predecessor's place, whose
        # worker has not said yet that it started them: observers see "task_started"
        # when it does, with the worker's own start time.
        self.unstarted: set[int] = set()
        self.queued_seen = 0  # len(self.queued) as the observers last heard it
        self.accounting: set[str] = set()  # the workers' accounting methods
        self.memory_limits: set[str] = set()  # how they enforce --strict-limits memory
        self.rescue: RescueLog | None = None
        # (sync ticket, results) whose DONE records are written but not yet durable
        self.unsynced: deque[tuple[int, list[tuple[TaskResult, str | None]]]] = deque()
        self.forward = ForwardFiles(opts.maxfds or default_maxfds())
        self.start = time.time()
        self.t0 = time.monotonic()
        self.deadline: float | None = None
        if opts.max_wall_time is not None:
            self.deadline = self.t0 + opts.max_wall_time * 60.0
        self.stop_reason: str | None = None  # set when the run is being stopped early
        self.gave_up = False  # tasks killed by the stop never reported: may still write
        # Tries as the reference's [cluster-summary] counts them: every try sent to a
        # worker, every try that failed (retried or not).
        self.tries_submitted = 0
        self.tries_failed = 0
        self.tries_stopped = 0  # killed by a stop of the run
        # Tasks whose streamed pipe data (FORWARD) could not be written: task -> why.
        self.forward_errors: dict[int, str] = {}
        self.stop_deadline: float | None = None
        self.signal_received: int | None = None
        self.runtime = 0.0
        self.cpu_time = 0.0
        self.first_start: float | None = None
        self.last_end = 0.0
        self.per_host_runtime: dict[str, float] = {}
        self.ranks_alive: set[int] = set(range(1, transport.size))
        self.out_template = f"{opts.dag}.out.{{rank}}"
        # Log levels, fixed for the run: per-task lines cost one attribute test when off.
        self.debug = log.enabled(log.DEBUG)
        self.trace = log.enabled(log.TRACE)
        self.err_template = f"{opts.dag}.err.{{rank}}"

    # -- helpers ---------------------------------------------------------------------------

    def emit(self, hook: str, *args: Any) -> None:
        hooks = self.hooks.get(hook)
        if hooks is None:
            hooks = self.hooks[hook] = _overrides(self.observers, hook)
        for fn in hooks:
            fn(*args)

    def broadcast(self, msg: protocol.Message) -> None:
        for rank in sorted(self.ranks_alive):
            try:
                self.t.send(rank, msg)
            except TransportError:
                self.worker_lost(rank)

    def remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return self.deadline - time.monotonic()

    # -- start-up --------------------------------------------------------------------------

    def worker_config(self) -> WorkerConfig:
        o = self.opts
        return WorkerConfig(
            dag_path=o.dag,
            out_path="" if o.per_task_stdio else self.out_template,
            err_path="" if o.per_task_stdio else self.err_template,
            per_task_stdio=o.per_task_stdio,
            host_cpus=o.host_cpus,
            host_memory=o.host_memory,
            slots=o.worker_slots,
            strict_limits=o.strict_limits,
            keep_affinity=o.keep_affinity,
            set_affinity=o.set_affinity,
            host_script=o.host_script,
            host_script_timeout=o.host_script_timeout,
            sleep_on_recv=not o.no_sleep_on_recv,
            log_level=log.level(),
            log_format=o.log_format,
        )

    def gather_workers(self) -> None:
        self.broadcast((protocol.CONFIG, protocol.VERSION, self.worker_config()))
        waiting = set(self.ranks_alive)
        deadline = time.monotonic() + HELLO_TIMEOUT
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FatalError(f"Workers {sorted(waiting)} did not report within "
                                 f"{HELLO_TIMEOUT:.0f} s")
            for rank, msg in self.t.poll(min(left, SIGNAL_CHECK)):
                if msg[0] == protocol.HELLO:
                    if msg[1] != protocol.VERSION:
                        raise FatalError(f"Worker {rank} speaks protocol {msg[1]}, "
                                         f"the master {protocol.VERSION}")
                    _, _, hostname, cpus, memory, slots, pid, sockets = msg[:8]
                    # A worker that does not say how it measures: unknown.
                    method, limits, why = msg[8:11] if len(msg) >= 11 else (
                        "unknown", "rlimit", "")
                    self.accounting.add(method)
                    self.memory_limits.add(limits)
                    if why:
                        log.debug(f"Worker {rank}: task accounting through {method}: {why}")
                    self.resources.add_worker(rank, hostname, cpus, memory, slots, pid,
                                              sockets)
                    waiting.discard(rank)
                elif msg[0] == protocol.ERROR:
                    raise FatalError(str(msg[1]))
            for rank in self.t.lost():
                raise FatalError(f"Worker {rank} exited before it reported")
            self.check_signal()
            if self.stop_reason:
                raise Interrupted(self.stop_reason)
        # Host ranks in rank order on each host (the lowest rank is 0), as the reference
        # gives them, whatever order the workers registered in.
        for host in self.resources.hosts.values():
            host.workers.sort(key=lambda w: w.rank)
            for i, w in enumerate(host.workers):
                w.host_rank = i
        if log.enabled(log.DEBUG):
            for host in self.resources.hosts.values():
                log.debug(f"Got new host: name={host.name}, mem={host.memory}, "
                          f"threads/cpus={host.cpus}")
            workers = sorted(self.resources.workers.values(), key=lambda w: w.rank)
            for w in workers:
                log.debug(f"Slot {w.rank} on host {w.host.name}")
            for w in workers:
                log.debug(f"Host rank of worker {w.rank} is {w.host_rank}")

    def check_capable(self) -> None:
        """Abort before anything runs if some task can never fit on any host."""
        seen: set[tuple[int, int]] = set()
        state = self.engine.state
        for task in self.dag.tasks:
            cls = (task.cpus, task.memory)
            if cls in seen or state[task.id] == 3:
                continue
            seen.add(cls)
            if not self.resources.can_ever_run(*cls):
                raise FatalError(f"FATAL ERROR: No host is capable of running task {task.name}")

    def start_hosts(self) -> None:
        """START every worker; the first worker on each host runs the host script."""
        scripts: set[int] = set()
        for host in self.resources.hosts.values():
            for w in host.workers:
                run_script = bool(self.opts.host_script) and w.host_rank == 0
                if run_script:
                    scripts.add(w.rank)
                try:
                    self.t.send(w.rank, (protocol.START, w.host_rank, run_script,
                                         self.remaining()))
                except TransportError:
                    self.worker_lost(w.rank)
        failures: list[str] = []
        while scripts:
            for rank, msg in self.t.poll(SIGNAL_CHECK):
                if msg[0] == protocol.HOST_SCRIPT:
                    scripts.discard(rank)
                    if not msg[1]:
                        failures.append(msg[2])
            for rank in self.t.lost():
                scripts.discard(rank)
                failures.append(f"Worker {rank} was lost while running the host script")
            self.check_signal()
            if self.stop_reason:
                raise Interrupted(self.stop_reason)
        if failures:
            raise FatalError("; ".join(failures))

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> Summary:
        self.gather_workers()
        self.check_capable()
        self.rescue = RescueLog(self.opts.rescue_path, self.dag, self.done_at_start)
        try:
            self.observers.extend(self.open_outputs())
            self.hooks.clear()
        except OSError as e:
            raise FatalError(f"Cannot open output file: {e}") from e
        self.start_hosts()
        info = RunInfo(
            dag_path=self.opts.dag, tasks=len(self.dag), recovered=self.engine.recovered,
            workers=len(self.resources.workers), slots=self.resources.total_slots,
            cpus=self.resources.total_cpus, hosts=list(self.resources.hosts),
            start=self.start, mode=self.mode, site=self.opts.site,
            max_wall_time=None if self.opts.max_wall_time is None
            else self.opts.max_wall_time * 60.0,
            accounting=",".join(sorted(self.accounting)),
            memory_limits=",".join(sorted(self.memory_limits)) if self.opts.strict_limits
            else "",
        )
        self.emit("started", info)
        log.info("Starting workflow")
        if self.engine.recovered:
            log.info(f"Recovered {self.engine.recovered} finished task(s) from the rescue log")
        for task_id in range(len(self.dag)):
            if self.engine.state[task_id] == 1:
                self.mark_ready(task_id)
        for host in self.resources.hosts.values():
            self.emit("host_changed", host)
        self.emit("flush")
        while True:
            self.complete_synced()
            if self.stop_reason is None:
                self.dispatch()
            if not self.running:
                if self.queued:
                    # Never with a worker that keeps the protocol: nothing is left to
                    # start these in its place. Ready them again rather than wait.
                    self.returned(list(self.queued))
                    continue
                if self.unsynced:
                    self.complete_synced(block=True)  # nothing else to wait for
                    continue
                if self.stop_reason or self.engine.finished():
                    break
            if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
                log.error(f"{len(self.running)} task(s) did not report after the stop; "
                          "giving up on them")
                self.gave_up = True
                for task_id in [*self.running, *self.queued]:
                    self.engine.requeue(task_id)
                self.running.clear()
                self.unstarted.clear()
                self.queued.clear()
                self.next_of.clear()
                self.tails.clear()
                self.complete_synced(block=True)
                break
            timeout = SIGNAL_CHECK
            if self.unsynced and (self.resources.any_idle() or not self.engine.nready):
                # Tasks waiting for their records to be durable may free the next ready
                # ones for an idle slot: look again soon. With every slot busy and tasks
                # ready, the next message is soon enough (no wake-up per millisecond).
                timeout = SYNC_CHECK
            left = self.remaining()
            if left is not None:
                timeout = max(0.0, min(timeout, left))
            msgs = self.t.poll(timeout)
            # Before the results: when a batch system signals every rank at once, tasks
            # its SIGTERM killed on the workers are stopped, not failed.
            self.check_signal()
            results: list[TaskResult] = []
            starts: list[tuple[int, float]] = []
            for rank, msg in msgs:
                tag = msg[0]
                if tag == protocol.RESULTS:
                    results.extend(msg[1])
                    if len(msg) > 2:
                        starts.extend(msg[2])
                elif tag == protocol.STARTED:
                    starts.extend(msg[1])
                elif tag == protocol.RETURNED:
                    # Handled at once: a worker sends it before any result that follows.
                    self.returned(msg[1])
                elif tag == protocol.FORWARD:
                    self.forwarded(msg[1], msg[2], msg[3])
                elif tag == protocol.ERROR:
                    log.error(str(msg[1]))
                elif tag == protocol.BYE:
                    self.ranks_alive.discard(rank)
            if results or starts:
                self.handle_results(results, starts)
            for rank in self.t.lost():
                self.worker_lost(rank)
            if self.prefetch and self.queued and not self.engine.accepting():
                # The failure limit stops the run: what waits on workers goes back.
                self.recall(list(self.queued))
            if len(self.queued) != self.queued_seen:
                self.queued_seen = len(self.queued)
                self.emit("queue_changed", self.queued_seen)
            now_left = self.remaining()
            if self.stop_reason is None and now_left is not None and now_left <= 0:
                log.fatal("Workflow wall time exceeded!")
                self.stop(f"maximum wall time of {self.opts.max_wall_time:g} minutes reached")
            self.emit("flush")
        return self.finish()

    def mark_ready(self, task_id: int) -> None:
        # A new sequence number each time a task is queued, a retry too (2.0, then 3.0),
        # as the reference numbers its submissions.
        self.seq[task_id] = self.next_seq
        self.next_seq += 1
        if self.debug:
            log.debug(f"Queueing task {self.dag.tasks[task_id].name}")
        self.emit("ready", self.dag.tasks[task_id], self.seq[task_id])

    def dispatch(self) -> None:
        engine = self.engine
        res = self.resources
        if not engine.accepting():
            return
        tasks = self.dag.tasks
        batches: dict[int, list[TaskSpec]] = {}
        left = self.remaining()
        scheduled = 0
        if self.debug and engine.nready and res.any_idle():
            log.debug(f"Scheduling {engine.nready} tasks on {res.free_slots()} slots...")
        while engine.nready and res.any_idle():
            placed = False
            for _key, cpus, memory in engine.ready_heads():
                worker = res.find(cpus, memory)
                if worker is None:
                    continue
                task_id = engine.pop(cpus, memory)
                placed = True
                if not self.admit(task_id, left):
                    break
                res.allocate(worker, cpus, memory)
                if self.debug:
                    self.log_placed(task_id, worker)
                scheduled += 1
                affinity = None
                if self.opts.set_affinity and cpus > 1:
                    cpu_set = worker.host.take_cpu_set(cpus)
                    affinity = tuple(cpu_set) if cpu_set else None
                self.running[task_id] = (worker, affinity)
                self.unstarted.add(task_id)
                self.tails[task_id] = 0
                batches.setdefault(worker.rank, []).append(self.spec(task_id, affinity))
                self.emit_dispatched(task_id, worker)
                self.emit("host_changed", worker.host)
                break
            if not placed:
                break
        if scheduled and self.debug:
            log.debug(f"Scheduled {scheduled} tasks and deferred {engine.nready} tasks")
        if self.prefetch:
            if engine.nready:
                self.prefetch_successors(batches, left)
            elif self.queued and res.any_idle():
                # A slot is idle while tasks wait behind running ones: take back those
                # that could start there now (the end of a layer, uneven task lengths).
                self.recall(tid for tid in self.queued
                            if res.find(tasks[tid].cpus, tasks[tid].memory) is not None)
        for rank, specs in batches.items():
            try:
                self.t.send(rank, (protocol.TASKS, specs))
            except TransportError:
                self.worker_lost(rank)

    def prefetch_successors(self, batches: dict[int, list[TaskSpec]], left: float | None) -> None:
        """Queue ready tasks behind running ones, one more per slot each round, up to
        PREFETCH_DEPTH, when they ask for no more than the task they follow (each takes
        over that task's slot and resources)."""
        engine = self.engine
        tasks = self.dag.tasks
        grew = True
        while grew and engine.nready:
            grew = False
            for pred, depth in list(self.tails.items()):
                if depth >= PREFETCH_DEPTH:
                    continue
                if not engine.nready:
                    break
                # Only the task that would be chosen next anyway: prefetching must not
                # reorder priorities, nor starve a bigger task waiting for resources.
                _key, cpus, memory = engine.ready_heads()[0]
                before = tasks[pred]
                if cpus > before.cpus or memory > before.memory:
                    continue
                if pred in self.running:
                    worker, affinity = self.running[pred]
                    if affinity:
                        continue  # its cpus are bound: keep them for one task at a time
                else:
                    worker = self.queued[pred][0]
                task_id = engine.pop(cpus, memory)
                if not self.admit(task_id, left):
                    continue
                del self.tails[pred]
                self.tails[task_id] = depth + 1
                self.next_of[pred] = task_id
                self.queued[task_id] = (worker, pred)
                if self.debug:
                    self.log_placed(task_id, worker, pred)
                batches.setdefault(worker.rank, []).append(self.spec(task_id, None, after=pred))
                grew = True

    def log_placed(self, task_id: int, worker: Worker, after: int = -1) -> None:
        """PMC's scheduling lines (debug and trace) for a task sent to a worker."""
        name = self.dag.tasks[task_id].name
        if self.trace:
            host = worker.host
            log.trace(f"Scheduling task {name}")
            log.trace(f"Matched task {name} to slot {worker.rank} on host {host.name}")
            log.trace(f"Host {host.name} now has {host.free_memory} MB, {host.free_cpus} "
                      f"CPUs, and {host.free_slots} slots free")
        if after < 0:
            log.debug(f"Submitting task {name} to slot {worker.rank}")
        else:
            log.debug(f"Submitting task {name} to slot {worker.rank}, to start when task "
                      f"{self.dag.tasks[after].name} ends")

    def admit(self, task_id: int, left: float | None) -> bool:
        """False (and the task held for the next run) if it would outlast the wall time."""
        task = self.dag.tasks[task_id]
        if left is None or task.expected_runtime is None or task.expected_runtime <= left:
            return True
        self.engine.hold(task_id)
        reason = (f"expected runtime {task.expected_runtime:g} s exceeds the "
                  f"{max(left, 0):.0f} s left")
        log.info(f"Task {task.name} not started: {reason}")
        self.emit("held", task, reason)
        return False

    def spec(self, task_id: int, affinity: tuple[int, ...] | None, after: int = -1) -> TaskSpec:
        task = self.dag.tasks[task_id]
        return TaskSpec(task_id, task.name, task.command, task.cpus, task.memory,
                        self.engine.attempts[task_id], task.pipe_forwards, task.file_forwards,
                        task.pegasus_id, affinity, after, task.expected_runtime)

    def emit_dispatched(self, task_id: int, worker: Worker) -> None:
        self.tries_submitted += 1
        self.emit("dispatched", self.dag.tasks[task_id], self.seq[task_id],
                  self.engine.attempts[task_id], worker.rank, worker.host.name)

    def recall(self, task_ids: Iterable[int]) -> None:
        """Ask workers to give queued tasks back (those not started meanwhile)."""
        ranks = set()
        for tid in task_ids:
            if tid not in self.recalling:
                self.recalling.add(tid)
                ranks.add(self.queued[tid][0].rank)
        for rank in sorted(ranks & self.ranks_alive):
            try:
                self.t.send(rank, (protocol.RECALL,))
            except TransportError:
                self.worker_lost(rank)

    def returned(self, task_ids: list[int]) -> None:
        """Queued tasks a worker gave back unstarted: ready again, the try not counted."""
        cut: list[int] = []  # tasks whose successors went back
        for tid in task_ids:
            entry = self.queued.pop(tid, None)
            self.recalling.discard(tid)
            if entry is None:
                if tid in self.unstarted and tid in self.running:
                    self.refused(tid)
                continue
            pred = entry[1]
            if self.next_of.get(pred) == tid:
                del self.next_of[pred]
            self.next_of.pop(tid, None)
            self.tails.pop(tid, None)
            cut.append(pred)
            self.engine.requeue(tid)
        for pred in cut:
            if pred not in self.next_of and (pred in self.running or pred in self.queued):
                self.tails[pred] = self.chain_depth(pred)

    def refused(self, task_id: int) -> None:
        """A task sent to start at once came back unstarted (its worker was stopping, by
        a signal of its own or its wall time): its slot is free, the task ready again."""
        worker, affinity = self.running.pop(task_id)
        self.unstarted.discard(task_id)
        task = self.dag.tasks[task_id]
        if affinity:
            worker.host.give_cpu_set(list(affinity))
        self.tails.pop(task_id, None)
        self.resources.release(worker, task.cpus, task.memory)
        self.emit("host_changed", worker.host)
        self.engine.requeue(task_id)
        if self.stop_reason is None:
            self.mark_ready(task_id)  # observers saw it dispatched: queued again

    def chain_depth(self, task_id: int) -> int:
        """How many tasks wait in a chain up to this one (0: it is running)."""
        depth = 0
        while task_id in self.queued:
            task_id = self.queued[task_id][1]
            depth += 1
        return depth

    def promote(self, pred: int, worker: Worker) -> int:
        """``pred`` ended on ``worker``: its queued successor (if any) started in its
        place and takes over its slot and resources (returned: the successor, -1 if
        none). Otherwise the slot is free."""
        tasks = self.dag.tasks
        before = tasks[pred]
        succ = self.next_of.pop(pred, None)
        if succ is None:
            self.tails.pop(pred, None)
            self.resources.release(worker, before.cpus, before.memory)
            self.emit("host_changed", worker.host)
            return -1
        del self.queued[succ]
        self.recalling.discard(succ)
        self.running[succ] = (worker, None)
        self.unstarted.add(succ)
        end = succ
        while end in self.next_of:
            end = self.next_of[end]
        if end in self.tails:
            self.tails[end] -= 1  # the chain moved up by one
        after = tasks[succ]
        if (after.cpus, after.memory) != (before.cpus, before.memory):
            self.resources.release(worker, before.cpus, before.memory)
            self.resources.allocate(worker, after.cpus, after.memory)
            self.emit("host_changed", worker.host)
        self.emit_dispatched(succ, worker)
        return succ

    def note_started(self, task_id: int, start: float) -> None:
        """The worker started the task at ``start`` (its Unix time): observers hear it
        once, after its predecessor's end and before its own."""
        self.unstarted.discard(task_id)
        worker = self.running[task_id][0]
        self.emit("task_started", self.dag.tasks[task_id], self.seq[task_id],
                  self.engine.attempts[task_id], worker.rank, worker.host.name, start)

    def handle_results(self, results: list[TaskResult],
                       starts: list[tuple[int, float]] | None = None) -> None:
        """Results and starts from workers, told to the observers in the order they
        happened on each slot: a try's start, its end, its successor's start."""
        tasks = self.dag.tasks
        unstarted = self.unstarted
        starts = starts or []
        start_of = dict(starts)
        good: list[tuple[TaskResult, str | None]] = []
        for res in results:
            entry = self.running.get(res.id)
            if entry is None:
                continue  # a result from a worker already given up on
            if res.id in unstarted:
                self.note_started(res.id, start_of.get(res.id, res.start))
            del self.running[res.id]
            worker, affinity = entry
            task = tasks[res.id]
            if affinity:
                worker.host.give_cpu_set(list(affinity))
            self.runtime += res.duration
            self.cpu_time += res.cpu_time
            host = worker.host.name
            self.per_host_runtime[host] = self.per_host_runtime.get(host, 0.0) + res.duration
            if self.first_start is None or res.start < self.first_start:
                self.first_start = res.start
            self.last_end = max(self.last_end, res.start + res.duration)
            error = res.error
            if self.forward_errors and res.id in self.forward_errors:
                error = error or self.forward_errors.pop(res.id)
            if res.status == 0 and error is None and res.forwards:
                error = self.write_forwards(task.name, res.forwards)
            self.emit("ended", task, self.seq[res.id], res, error)
            if res.status == 0 and error is None:
                good.append((res, error))
            else:
                # At once, before the successor's start: nothing to make durable first.
                self.complete([(res, error)])
            succ = self.promote(res.id, worker)
            if succ >= 0 and succ in start_of:
                self.note_started(succ, start_of[succ])
        for tid, start in starts:  # tasks started that are still running
            if tid in unstarted and tid in self.running:
                self.note_started(tid, start)
        assert self.rescue is not None
        succeeded: list[tuple[TaskResult, str | None]] = [
            (r, err) for r, err in good if r.status == 0 and err is None]
        if succeeded:
            # Group commit: the records are written now and made durable by a thread;
            # these tasks count as done, and their children become ready, once the
            # sync is through. Meanwhile the freed slots take other ready tasks.
            self.rescue.write(tasks[r.id].name for r, _err in succeeded)
            urgent = self.awaited(succeeded)
            self.unsynced.append((self.rescue.request_sync(urgent), succeeded))

    def awaited(self, finished: list[tuple[TaskResult, str | None]]) -> bool:
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

    def complete(self, finished: list[tuple[TaskResult, str | None]]) -> None:
        """Engine transitions, events and log lines for finished tries."""
        tasks = self.dag.tasks
        for res, error in finished:
            task = tasks[res.id]
            ok = res.status == 0 and error is None
            if not ok and self.stop_reason is not None:
                # Killed by the stop: not the task's fault, and not done either.
                self.engine.requeue(res.id)
                self.tries_stopped += 1
                self.emit("result", task, self.seq[res.id], res._replace(error=error),
                          "stopped")
                continue
            outcome, newly = self.engine.complete(res.id, ok)
            io_failed = error is not None and res.error is None
            if io_failed:
                res = res._replace(status=res.status or protocol.FAILED_STATUS, error=error)
            if not ok:
                self.tries_failed += 1
            self.emit("result", task, self.seq[res.id], res, outcome.value)
            if outcome is Outcome.SUCCEEDED:
                if self.debug:
                    log.debug(f"Task {task.name} finished with exitcode 0")
                for child in newly:
                    self.mark_ready(child)
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

    def forwarded(self, task_id: int, dest: str, data: bytes) -> None:
        """A piece of a finished try's large pipe output, sent before its result (which
        says it succeeded): written at once, as the reference writes its I/O messages."""
        if task_id not in self.running or task_id in self.forward_errors:
            return  # given up on, or already failed to write
        error = self.write_forwards(self.dag.tasks[task_id].name, ((dest, data),))
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

    def worker_lost(self, rank: int) -> None:
        if rank not in self.ranks_alive:
            return
        self.ranks_alive.discard(rank)
        worker = self.resources.remove_worker(rank)
        lost = [tid for tid, (w, _a) in self.running.items() if w.rank == rank]
        for tid in lost:
            _w, affinity = self.running.pop(tid)
            self.unstarted.discard(tid)
            task = self.dag.tasks[tid]
            if worker is not None:
                worker.host.free_cpus += task.cpus
                worker.host.free_memory += task.memory
                if affinity:
                    worker.host.give_cpu_set(list(affinity))
            self.tails.pop(tid, None)
            self.next_of.pop(tid, None)
            self.forward_errors.pop(tid, None)
            self.engine.requeue(tid)
            if self.stop_reason is None:
                self.mark_ready(tid)
        for tid in [tid for tid, (w, _pred) in self.queued.items() if w.rank == rank]:
            del self.queued[tid]  # never started, never seen by observers: ready again
            self.recalling.discard(tid)
            self.tails.pop(tid, None)
            self.next_of.pop(tid, None)
            self.engine.requeue(tid)
        log.error(f"Worker {rank} was lost; {len(lost)} task(s) it was running will run "
                  "again elsewhere" if lost else f"Worker {rank} was lost")
        if not self.ranks_alive and self.stop_reason is None:
            log.fatal("No workers left")
            self.stop("no workers left")

    def check_signal(self) -> None:
        sig = self.signal_received
        if sig is not None and self.stop_reason is None:
            log.fatal(f"Caught signal {sig}")
            self.stop(f"received {signal.Signals(sig).name}")

    def stop(self, reason: str) -> None:
        """Stop dispatching and kill running tasks (SIGTERM, then SIGKILL on the workers)."""
        self.stop_reason = reason
        self.stop_deadline = time.monotonic() + STOP_GRACE
        busy = {w.rank for w, _a in self.running.values()}
        for rank in sorted(busy & self.ranks_alive):
            try:
                self.t.send(rank, (protocol.KILL,))
            except TransportError:
                self.worker_lost(rank)

    # -- the end ---------------------------------------------------------------------------

    def shutdown_workers(self) -> None:
        pending = set(self.ranks_alive)
        if self.debug:
            for rank in sorted(pending):
                log.debug(f"Sending shutdown message to worker {rank}")
        self.broadcast((protocol.SHUTDOWN,))
        deadline = time.monotonic() + BYE_TIMEOUT
        while pending & self.ranks_alive and time.monotonic() < deadline:
            for rank, msg in self.t.poll(SIGNAL_CHECK):
                if msg[0] == protocol.BYE:
                    pending.discard(rank)
                elif msg[0] == protocol.RESULTS:
                    pass  # tasks killed after the end: nothing left to record
            for rank in self.t.lost():
                pending.discard(rank)
        if pending & self.ranks_alive:
            log.warn(f"Workers {sorted(pending)} did not say goodbye")

    def finish(self) -> Summary:
        engine = self.engine
        wall = time.monotonic() - self.t0
        n = len(self.dag)
        if engine.nfailed:
            outcome, ok = "failed", False
        elif engine.succeeded():
            outcome, ok = "succeeded", True
        else:
            outcome, ok = "incomplete", False
        reason = self.stop_reason or ""
        if not reason and engine.nheld:
            reason = f"{engine.nheld} task(s) held back: not enough wall time left"
        makespan = (self.last_end - self.first_start) if self.first_start is not None else 0.0
        return Summary(
            ok=ok, outcome=outcome, reason=reason, tasks=n,
            submitted=engine.nsubmitted, succeeded=engine.ndone - engine.recovered,
            failed=engine.nfailed, extra=engine.nretries, recovered=engine.recovered,
            tries_submitted=self.tries_submitted, tries_failed=self.tries_failed,
            tries_retried=engine.nretries, tries_stopped=self.tries_stopped,
            start=self.start, wall=wall, pid=os.getpid(), app=os.path.abspath(sys.argv[0]),
            runtime=self.runtime, cpu_time=self.cpu_time, slots=self.resources.total_slots,
            cpus=self.resources.total_cpus, workers=len(self.resources.workers),
            makespan=makespan, held=engine.nheld, per_host_runtime=self.per_host_runtime,
        )

    def close(self) -> None:
        if self.rescue is not None:
            self.rescue.close()
        self.forward.close()


def _overrides(observers: list[Observer], hook: str) -> list[Callable[..., None]]:
    """The observers' own methods for a hook: several run per task on the master's loop,
    and most observers leave most hooks as the base class's no-op."""
    base = getattr(Observer, hook)
    return [getattr(obs, hook) for obs in observers if getattr(type(obs), hook) is not base]


def default_maxfds() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 256
    # Leave room for the master's own files and the transport's sockets.
    return max(1, min(256, soft // 2))


def write_summary(summary: Summary) -> None:
    """The [cluster-summary] record on stdout (always stdout, even with -o, as PMC)."""
    try:
        sys.stdout.write(cluster_summary_record(summary))
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
