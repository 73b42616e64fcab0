"""Which ready task goes to which worker now, and which waits behind which running task.

One round of dispatch: the engine's best ready tasks onto free slots that fit them (as
the reference matches them), then, with prefetching, the next tasks queued behind running
ones. Tasks that would outlast the wall time are held for the next run. The messages are
the master's to send.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from itertools import count

from pmc import log
from pmc.core.chains import Chains
from pmc.core.engine import Engine, State
from pmc.core.events import Observer
from pmc.core.protocol import TaskSpec
from pmc.core.resources import Grant, Resources, Worker
from pmc.dag import DAG
from pmc.dag.arrays import MemberSlot
from pmc.dag.model import MadeTask, TaskView, options_of, request_of
from pmc.dag.parsed import TaskSlot
from pmc.runtime.summary import Counts

# What DAG.tasks holds for a task not made yet: made when it is taken to run.
_SLOTS = frozenset((TaskSlot, MemberSlot))

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
        # The GPU ids and cpu ids of queued tasks (taken from the task each follows):
        # theirs once promoted (the master's ``promote``).
        self.queued_gpus: dict[int, tuple[str, ...]] = {}
        self.queued_cpus: dict[int, tuple[int, ...]] = {}
        # Tasks queued on a worker when it was lost, which may have started there unheard
        # (pmc.runtime.losses): they start only on a free slot from now on, where the
        # master knows they run, so that one that kills its workers is told apart.
        self.never_queue: set[int] = set()
        self.fresh: list[int] = []  # tasks ready since the last round (``outranked``)
        self.back: list[int] = []  # queued tasks to take back (``take_back``)
        self.for_free_slot: set[int] = set()  # ready tasks queued behind none

    def announce(self, task_ids: list[int], number: int) -> int:
        """Tell the observers the tasks ready at the start (the master's ``mark_ready``
        for each, numbered from ``number``); returns the next number. A big DAG has
        millions of roots: they are numbered in C and told as one run (``ready_run``),
        which an observer that counts them counts at once."""
        seq = self.seq
        if self.debug:  # each line beside what the observers write of its task
            hand_out = self.dag.task
            ready = self.out.ready
            for task_id in task_ids:
                task = hand_out(task_id)
                seq[task_id] = number
                log.debug(f"Queueing task {task.name}")
                ready(task, number)
                number += 1
            return number
        deque(map(seq.__setitem__, task_ids, count(number)), maxlen=0)
        self.out.ready_run(TaskView(self.dag, task_ids), number, len(task_ids))
        return number + len(task_ids)

    def announce_start(self, number: int) -> int:
        """At the start of the loop: the tasks reused (--reuse) and those ready, told to
        the observers, numbered from ``number``; returns the next number."""
        engine = self.engine
        if engine.nreused:
            log.info(f"Reused {engine.nreused} task(s): their declared outputs are up to "
                     "date")
            self.out.reused(TaskView(self.dag, array("I", engine.ids_in(State.REUSED))))
        return self.announce_runs(self.announce(engine.take_initial(), number))

    def announce_runs(self, number: int) -> int:
        """Tell the observers of the runs of array members the engine made ready together
        (each member made only for the observers that want it), numbered from
        ``number``; returns the next number."""
        seq = self.seq
        for first, end in self.engine.take_runs():
            seq[first:end] = array("i", range(number, number + end - first))
            view = TaskView(self.dag, range(first, end))
            if self.debug:
                for task in view:
                    log.debug(f"Queueing task {task.name}")
            self.out.ready_run(view, number, end - first)
            number += end - first
        return number

    def let_go(self, task_id: int) -> None:
        """A task's last try has ended: a Task made for it is let go, its placeholder
        back in the DAG's tasks."""
        task = self.dag.tasks[task_id]
        if isinstance(task, MadeTask):
            self.dag.tasks[task_id] = task.slot

    def make(self, task_id: int) -> None:
        """A task taken to run is made (a parsed task, an array member), and kept in the
        DAG's tasks until its last try has ended (the master's ``complete``)."""
        tasks = self.dag.tasks
        tasks[task_id] = tasks[task_id].made(task_id)

    def place(self, left: float | None) -> Batches:
        """Place what fits (``left``: seconds of wall time left, None: no limit)."""
        engine = self.engine
        res = self.resources
        chains = self.chains
        out = self.out
        tasks = self.dag.tasks
        batches: Batches = {}
        scheduled = 0
        if self.debug and engine.nready and res.any_idle():
            log.debug(f"Scheduling {engine.nready} tasks on {res.free_slots()} slots...")
        while engine.nready and res.any_idle():
            placed = False
            for _key, cls in engine.ready_heads():
                cpus = cls[0]
                plan = None
                if len(cls) == 2:  # the usual task: cpus and memory on one host
                    worker = res.find(cpus, cls[1])
                    if worker is None:
                        continue
                else:  # GPUs or ranks
                    found = res.find_request(cls)
                    if found is None:
                        continue
                    worker, plan = found
                task_id = engine.pop(cls)
                if tasks[task_id].__class__ in _SLOTS:
                    self.make(task_id)
                if self.for_free_slot:
                    self.for_free_slot.discard(task_id)
                placed = True
                if not self.admit(task_id, left):
                    break
                grant = None
                if plan is None:
                    res.allocate(worker, cpus, cls[1])
                else:
                    grant = res.take(task_id, worker, cls, plan)
                if self.debug:
                    self.log_placed(task_id, worker)
                scheduled += 1
                affinity = None
                single = plan is None or cls[3] == 1
                if cpus > 1 and single:
                    # As PMC: every multi-core task its host can give a compact set of
                    # cpus learns it (PMC_AFFINITY); --set-affinity binds it to them.
                    host = worker.host
                    near = host.gpu_numa.get(grant.gpus[0]) if grant and grant.gpus else None
                    cpu_set = host.take_cpu_set(cpus, near)
                    affinity = tuple(cpu_set) if cpu_set else None
                bound = affinity is not None and self.set_affinity
                chains.start(task_id, worker, affinity, cls if single and not bound else None,
                             *self.expected(task_id))
                batches.setdefault(worker.rank, []).append(
                    self.spec(task_id, affinity, grant=grant))
                self.dispatched(task_id, worker)
                out.host_changed(worker.host)
                if grant is not None and len(grant.parts) > 1:
                    for host, *_rest in grant.parts[1:]:
                        out.host_changed(host)
                break
            if not placed:
                break
        if scheduled and self.debug:
            log.debug(f"Scheduled {scheduled} tasks and deferred {engine.nready} tasks")
        if self.prefetch and engine.nready:
            if self.fresh and engine.order is not None and engine.order.path_first:
                # By the longest path, a task ready since the last round that outranks
                # queued ones lies on a longer path than theirs. The only chains with
                # room (one queued a slot) are behind tasks that have just started:
                # queued there, it would wait for all of one. So it is held for the
                # first slot to free up before anything is queued, and what it
                # outranks is taken back.
                self.back += self.outranked()
            self.prefetch_successors(batches, left)
        return batches

    def prefetch_successors(self, batches: Batches, left: float | None) -> None:
        """Queue ready tasks behind running ones, up to the chains' depth, when they ask
        for no more than the task they follow (each takes over that task's slot and
        resources); which chain takes each is the chains' choice (shallowest first)."""
        engine = self.engine
        chains = self.chains
        tasks = self.dag.tasks
        while engine.nready:
            # Only the task that would be chosen next anyway: prefetching must not
            # reorder priorities, nor starve a bigger task waiting for resources.
            key, cls = engine.ready_heads()[0]
            if (self.never_queue and engine.task_of(key) in self.never_queue) or \
                    (self.for_free_slot and engine.task_of(key) in self.for_free_slot):
                break  # it waits for a free slot
            gpus = 0
            if len(cls) > 2:
                if cls[3] != 1:
                    break  # a multi-rank task waits for hosts, behind no task
                gpus = cls[2]
            tail = chains.open_tail(cls[0], cls[1], gpus)
            if tail < 0:
                break
            task_id = engine.pop(cls)
            if tasks[task_id].__class__ in _SLOTS:
                self.make(task_id)
            if not self.admit(task_id, left):
                continue
            ids: tuple[str, ...] | None = None
            if gpus:
                grant = self.resources.grants.get(tail)
                held = grant.gpus if grant is not None else self.queued_gpus.get(tail, ())
                ids = self.queued_gpus[task_id] = held[:gpus]
            cpu_ids = None
            if cls[0] > 1:  # the first of the cpus the task before it holds
                before = chains.holder(tail)[1] or self.queued_cpus.get(tail)
                if before and len(before) >= cls[0]:
                    cpu_ids = self.queued_cpus[task_id] = before[:cls[0]]
            worker = chains.queue(task_id, tail, cls, self.expected(task_id)[0])
            if self.debug:
                self.log_placed(task_id, worker, tail)
            batches.setdefault(worker.rank, []).append(
                self.spec(task_id, cpu_ids, after=tail, gpus=ids))

    def expected(self, task_id: int) -> tuple[float | None, float]:
        """The seconds a task is expected to run (None: the runtimes are not expected),
        and the clock's time now: with ``--schedule``, which expects them, the chains
        queue the next task behind the slot expected to free up first."""
        order = self.engine.order
        if order is None:
            return None, 0.0
        return order.expected(task_id), time.monotonic()

    def readied(self, task_id: int) -> None:
        """A task became ready while the run is under way (see ``outranked``)."""
        if self.prefetch and self.chains.limit == 1:
            self.fresh.append(task_id)

    def take_back(self) -> list[int]:
        """Queued tasks to ask back after a round of dispatch: those outranked by tasks
        ready since the last round (``outranked``)."""
        back, self.back = self.back, []
        if self.fresh:  # after the tasks just queued, which may be taken back too
            back += self.outranked()
        return back

    def outranked(self) -> list[int]:
        """Queued tasks to ask back: those a task outranks that became ready since the
        last round and found no free slot. That task then starts on the first slot to
        free up, and nothing is queued while it is the next to start (``for_free_slot``),
        as without prefetching; queued behind a running task it would wait for that one,
        however long it has left, and behind tasks queued before it was ready. (Pegasus
        ranks a workflow's later levels higher, and a fan-in task on the critical path
        would wait so.) Only while tasks are queued one to a slot: they are long enough
        that the round trips this costs are small against them."""
        fresh, self.fresh = self.fresh, []
        chains = self.chains
        if not chains.queued or chains.limit != 1:
            return []
        engine = self.engine
        state = engine.state
        tasks = self.dag.tasks  # an array member's placeholder too
        # By rank alone, not the id: a task of the same rank that came later does not
        # take the place of one that came first.
        queued = [(engine.rank_of(q), q) for q in chains.queued]
        worst = max(queued)[0]
        best = worst
        kinds = set()
        for task_id in fresh:
            if state[task_id] != State.READY or task_id in self.never_queue:
                continue
            rank = engine.rank_of(task_id)
            if rank >= worst:
                continue
            cls = request_of(options_of(tasks[task_id]))
            if len(cls) > 2 and cls[3] != 1:
                continue  # a multi-rank task waits behind none anyway
            self.for_free_slot.add(task_id)
            best = min(best, rank)
            kinds.add(cls)
        return [q for rank, q in queued if rank > best
                and any(chains.replaceable(q, cls) for cls in kinds)]

    def unqueued(self, task_ids: list[int]) -> None:
        """Queued tasks came back unstarted: the GPU and cpu ids they were sent with are
        no longer theirs."""
        if self.queued_gpus or self.queued_cpus:
            for task_id in task_ids:
                self.queued_gpus.pop(task_id, None)
                self.queued_cpus.pop(task_id, None)

    def promote(self, pred: int, worker: Worker) -> int:
        """``pred`` ended on ``worker``: its queued successor (if any) started in its
        place and takes over its slot and resources (returned: the successor, -1 if
        none), and the GPU ids it was sent with. Otherwise the slot is free."""
        tasks = self.dag.made
        res = self.resources
        before = tasks[pred]
        # The clock only where runtimes are expected: not per task of a run without.
        succ = self.chains.promote(
            pred, time.monotonic() if self.engine.order is not None else 0.0)
        if succ < 0:
            self.release(pred, worker)
            return -1
        after = tasks[succ]
        cpu_ids = self.queued_cpus.pop(succ, None) if self.queued_cpus else None
        if cpu_ids:  # given back with its predecessor's: taken again
            worker.host.claim_cpu_set(cpu_ids)
            self.chains.hold_cpus(succ, cpu_ids)
        ids = self.queued_gpus.pop(succ, None) if self.queued_gpus else None
        if ids is not None or (res.grants and pred in res.grants) or \
                (after.cpus, after.memory) != (before.cpus, before.memory):
            res.release(worker, before.cpus, before.memory, pred)
            res.allocate(worker, after.cpus, after.memory)
            if ids:
                res.claim(succ, worker, ids)
            self.out.host_changed(worker.host)
        self.dispatched(succ, worker)
        return succ

    def release(self, task_id: int, worker: Worker,
                affinity: tuple[int, ...] | None = None) -> None:
        """A task's slot and all it holds given back (it ended, was refused, or its
        worker was lost), the cpus it was bound to included."""
        if affinity:
            worker.host.give_cpu_set(list(affinity))
        task = self.dag.made[task_id]
        grants = self.resources.grants
        grant = grants.get(task_id) if grants else None
        self.resources.release(worker, task.cpus, task.memory, task_id)
        self.out.host_changed(worker.host)
        if grant is not None and len(grant.parts) > 1:
            for host, *_rest in grant.parts[1:]:
                self.out.host_changed(host)

    def fits_now(self, task_id: int) -> bool:
        """Whether a free slot could start the task now (its GPUs and ranks included)."""
        cls = request_of(options_of(self.dag.made[task_id]))
        if len(cls) == 2:
            return self.resources.find(cls[0], cls[1]) is not None
        return self.resources.find_request(cls) is not None

    def admit(self, task_id: int, left: float | None) -> bool:
        """False (and the task held for the next run) if it would outlast the wall time.
        Where a task is handed out to be placed: from here on it has its id."""
        task = self.dag.task(task_id)
        if left is None or task.expected_runtime is None or task.expected_runtime <= left:
            return True
        self.engine.hold(task_id)
        reason = (f"expected runtime {task.expected_runtime:g} s exceeds the "
                  f"{max(left, 0):.0f} s left")
        log.info(f"Task {task.name} not started: {reason}")
        self.out.held(task, reason)
        return False

    def spec(self, task_id: int, affinity: tuple[int, ...] | None, after: int = -1,
             grant: Grant | None = None, gpus: tuple[str, ...] | None = None) -> TaskSpec:
        task = self.dag.made[task_id]
        o = options_of(task)  # read once: each of a Task's options is a property over it
        hosts = None
        if grant is not None:
            gpus = grant.gpus
            if o.ranks > 1:
                hosts = grant.hosts()
        return TaskSpec(task_id, task.name, task.command, o.cpus, o.memory,
                        self.engine.attempts[task_id], o.pipe_forwards, o.file_forwards,
                        task.pegasus_id, affinity, after, o.expected_runtime, gpus, hosts,
                        task.env, o.outputs)

    def dispatched(self, task_id: int, worker: Worker) -> None:
        """A try is the worker's: sent to start now, or promoted in its predecessor's
        place (until then, queued tasks are not the observers' business)."""
        self.counts.tries_submitted += 1
        self.out.dispatched(self.dag.made[task_id], self.seq[task_id],
                            self.engine.attempts[task_id], worker.rank,
                            self.where(task_id, worker) if self.resources.grants
                            else worker.host.name)

    def where(self, task_id: int, worker: Worker) -> str:
        """The host a task runs on, as observers are told: for a multi-rank task on
        several, their names, comma-separated, its worker's first."""
        grant = self.resources.grants.get(task_id) if self.resources.grants else None
        if grant is None or len(grant.parts) == 1:
            return worker.host.name
        return ",".join(name for name, _n in grant.hosts())

    def log_placed(self, task_id: int, worker: Worker, after: int = -1) -> None:
        """PMC's scheduling lines (debug and trace) for a task sent to a worker."""
        name = self.dag.made[task_id].name
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
                      f"{self.dag.made[after].name} ends")
