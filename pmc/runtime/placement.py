"""Which ready task goes to which worker now, and which waits behind which running task.

One round of dispatch: the engine's best ready tasks onto free slots that fit them (as
the reference matches them), then, with prefetching, the next tasks queued behind running
ones. Tasks that would outlast the wall time are held for the next run. The messages are
the master's to send.
"""

from __future__ import annotations

from array import array

from pmc import log
from pmc.core.chains import Chains
from pmc.core.engine import Engine
from pmc.core.events import Observer
from pmc.core.protocol import TaskSpec
from pmc.core.resources import Resources, Worker
from pmc.dag import DAG
from pmc.runtime.summary import Counts

Batches = dict[int, list[TaskSpec]]  # worker rank -> tasks to send it


class Placer:
    def __init__(self, dag: DAG, engine: Engine, resources: Resources, chains: Chains,
                 seq: array[int], counts: Counts, out: Observer, *, prefetch: bool,
                 set_affinity: bool) -> None:
        self.dag = dag
        self.engine = engine
        self.resources = resources
        self.chains = chains
        self.seq = seq  # the master's jobstate sequence numbers
        self.counts = counts
        self.out = out
        self.prefetch = prefetch
        self.set_affinity = set_affinity
        self.debug = log.enabled(log.DEBUG)
        self.trace = log.enabled(log.TRACE)

    def announce(self, task_ids: list[int], number: int) -> int:
        """Tell the observers the tasks ready at the start (the master's ``mark_ready``
        for each, numbered from ``number``); returns the next number. A big DAG has a
        few hundred thousand roots: the loop does nothing per task but this."""
        tasks = self.dag.tasks
        seq = self.seq
        ready = self.out.ready
        debug = self.debug
        for task_id in task_ids:
            task = tasks[task_id]
            seq[task_id] = number
            if debug:
                log.debug(f"Queueing task {task.name}")
            ready(task, number)
            number += 1
        return number

    def place(self, left: float | None) -> Batches:
        """Place what fits (``left``: seconds of wall time left, None: no limit)."""
        engine = self.engine
        res = self.resources
        chains = self.chains
        out = self.out
        batches: Batches = {}
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
                if self.set_affinity and cpus > 1:
                    cpu_set = worker.host.take_cpu_set(cpus)
                    affinity = tuple(cpu_set) if cpu_set else None
                chains.start(task_id, worker, affinity, (cpus, memory))
                batches.setdefault(worker.rank, []).append(self.spec(task_id, affinity))
                self.dispatched(task_id, worker)
                out.host_changed(worker.host)
                break
            if not placed:
                break
        if scheduled and self.debug:
            log.debug(f"Scheduled {scheduled} tasks and deferred {engine.nready} tasks")
        if self.prefetch and engine.nready:
            self.prefetch_successors(batches, left)
        return batches

    def prefetch_successors(self, batches: Batches, left: float | None) -> None:
        """Queue ready tasks behind running ones, up to the chains' depth, when they ask
        for no more than the task they follow (each takes over that task's slot and
        resources); which chain takes each is the chains' choice (shallowest first)."""
        engine = self.engine
        chains = self.chains
        while engine.nready:
            # Only the task that would be chosen next anyway: prefetching must not
            # reorder priorities, nor starve a bigger task waiting for resources.
            _key, cpus, memory = engine.ready_heads()[0]
            tail = chains.open_tail(cpus, memory)
            if tail < 0:
                break
            task_id = engine.pop(cpus, memory)
            if not self.admit(task_id, left):
                continue
            worker = chains.queue(task_id, tail, (cpus, memory))
            if self.debug:
                self.log_placed(task_id, worker, tail)
            batches.setdefault(worker.rank, []).append(self.spec(task_id, None, after=tail))

    def admit(self, task_id: int, left: float | None) -> bool:
        """False (and the task held for the next run) if it would outlast the wall time."""
        task = self.dag.tasks[task_id]
        if left is None or task.expected_runtime is None or task.expected_runtime <= left:
            return True
        self.engine.hold(task_id)
        reason = (f"expected runtime {task.expected_runtime:g} s exceeds the "
                  f"{max(left, 0):.0f} s left")
        log.info(f"Task {task.name} not started: {reason}")
        self.out.held(task, reason)
        return False

    def spec(self, task_id: int, affinity: tuple[int, ...] | None, after: int = -1) -> TaskSpec:
        task = self.dag.tasks[task_id]
        return TaskSpec(task_id, task.name, task.command, task.cpus, task.memory,
                        self.engine.attempts[task_id], task.pipe_forwards, task.file_forwards,
                        task.pegasus_id, affinity, after, task.expected_runtime)

    def dispatched(self, task_id: int, worker: Worker) -> None:
        """A try is the worker's: sent to start now, or promoted in its predecessor's
        place (until then, queued tasks are not the observers' business)."""
        self.counts.tries_submitted += 1
        self.out.dispatched(self.dag.tasks[task_id], self.seq[task_id],
                            self.engine.attempts[task_id], worker.rank, worker.host.name)

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
