"""What each task slot holds: the task running there and the tasks queued behind it.

Prefetching sends a worker a task to start in the place of one of its running tasks the
moment that one ends, so the slot does not wait for a round trip to the master. Such a
task takes the slot and the resources over from the task it follows; until that one's
result arrives it is "queued", unseen by the observers. The tasks of one slot form a
chain: the running task, then up to ``limit`` queued ones, each behind the last.

How deep: enough queued tasks to hold ``COVER`` seconds of work at the tasks' mean
duration (``depth_for``; the master tells ``limit`` as results come), one at least and
``PREFETCH_DEPTH`` at most. Short tasks get deep queues, so that their results and the
next tasks travel many to a message (10,000 /bin/true drop-in: 0.70 of the spawn floor
with 2, 0.80 with 6, 0.85 with 16; 32, holding 20 ms, half the messages of 16 and a
fifth less master cpu per task, embedded); long ones one queued task each, as more
would only keep tasks from slots that free up sooner, and from higher priorities that
become ready meanwhile (which take queued tasks back: ``pmc.runtime.placement``).
``FIRST_DEPTH`` until a duration is known.

A task may wait only behind one that asks for at least its cpus, memory and GPUs (it
takes over the first of that task's GPU ids, and of its cpu ids), and not behind a task
bound to its cpus (``--set-affinity``) nor a multi-rank one; a multi-rank task waits
behind none. The
chains with room are kept by depth and by what their last task asks for, so the next
one to take a task is found without looking at every slot: the shallowest first (each
slot gets one queued task before any gets two), and among those the one expected to
free up first where the tasks' runtimes are expected (``--schedule``: given, or learned),
else the one that had room first (a queued task is bound to its slot: behind a task that
runs on while another slot frees up, it waits).

Pure bookkeeping: no messages, no resources, no engine. The master asks this class what
to do and does it (sends, releases slots, readies tasks again).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from pmc.core.resources import Worker

PREFETCH_DEPTH = 32  # the most tasks queued behind a running one
FIRST_DEPTH = 2  # before the first result tells how long tasks take
COVER = 0.020  # seconds of work a slot's queue holds


def depth_for(mean_duration: float) -> int:
    """Tasks to queue behind each running one when tasks take ``mean_duration`` seconds
    (see the module docstring)."""
    if mean_duration * PREFETCH_DEPTH <= COVER:
        return PREFETCH_DEPTH
    return max(1, math.ceil(COVER / mean_duration))

Affinity = tuple[int, ...] | None
Kind = tuple[int, ...]  # what a task asks for: (cpus, memory MB[, gpus, ...])


def _holds(kind: Kind, cpus: int, memory: int, gpus: int) -> bool:
    """Whether a task asking for ``kind`` holds enough for one asking for the rest."""
    return kind[0] >= cpus and kind[1] >= memory and (
        not gpus or (len(kind) > 2 and kind[2] >= gpus))


class Chains:
    """Running tasks and the queued tasks behind them, per slot."""

    def __init__(self) -> None:
        # Running tasks -> (worker, the cpus they are bound to). A queued task is here
        # once the task before it has ended.
        self.running: dict[int, tuple[Worker, Affinity]] = {}
        # Running tasks the worker has not said yet that it started (sent to start at
        # once, or promoted in their predecessor's place): observers hear "task_started"
        # when it does, with the worker's own start time.
        self.unstarted: set[int] = set()
        self.queued: dict[int, tuple[Worker, int]] = {}  # task -> (worker, predecessor)
        self._next: dict[int, int] = {}  # running or queued task -> its successor
        # The last task of each chain -> how many tasks wait in the chain (0: a running
        # task with none behind it).
        self._tails: dict[int, int] = {}
        self._recalling: set[int] = set()  # queued tasks asked back, not returned yet
        self._closed: set[int] = set()  # ranks no task may queue on (quarantined hosts)
        # What each running or queued task that may have a successor asks for (a task
        # bound to its cpus may not: it is not here).
        self._kind: dict[int, Kind] = {}
        # The chains with room, by depth, then by what their last task asks for: heaps
        # of (when the chain is expected to free up, order, last task), the order as they
        # got room. Entries are not taken out when a chain changes; those no longer true
        # are dropped when they come first.
        self._open: list[dict[Kind, list[tuple[float, int, int]]]] = [
            {} for _ in range(PREFETCH_DEPTH)]
        self._lowest = 0  # no depth below this one has a chain with room
        # Where runtimes are expected: the seconds each running or queued task is expected
        # to take, and when each is expected to end (the callers' clock).
        self._takes: dict[int, float] = {}
        self._ends: dict[int, float] = {}
        self._limit = FIRST_DEPTH
        self._order = 0

    @property
    def limit(self) -> int:
        """How many queued tasks a chain may hold now (``depth_for``)."""
        return self._limit

    @limit.setter
    def limit(self, limit: int) -> None:
        # Only chains with room are in the heaps (else a full chain's entries would pile
        # up, one per task, for as long as the run lasts): those the new depth gives
        # room go in.
        low, self._limit = self._limit, limit
        for tail, depth in self._tails.items():
            if low <= depth < limit:
                self._offer(tail, depth)

    # -- queries -----------------------------------------------------------------

    def open_tails(self) -> list[tuple[int, int]]:
        """(last task, depth) of each chain with room for one more queued task."""
        limit = self.limit
        return [(tail, depth) for tail, depth in self._tails.items() if depth < limit]

    def open_tail(self, cpus: int, memory: int, gpus: int = 0) -> int:
        """The last task of the chain that takes the next task asking for ``cpus``,
        ``memory`` and ``gpus`` (see the module docstring), or -1 if none may."""
        tails = self._tails
        kinds = self._kind
        ends = self._ends
        opened = self._open
        lowest = self._lowest
        for depth in range(lowest, self.limit):
            by_kind = opened[depth]
            if by_kind:
                best: tuple[float, int, int] | None = None
                spent: list[Kind] = []
                for kind, entries in by_kind.items():
                    if not _holds(kind, cpus, memory, gpus):
                        continue
                    while entries:
                        entry = entries[0]
                        tail = entry[2]
                        if tails.get(tail) == depth and kinds.get(tail) == kind and \
                                ends.get(tail, 0.0) == entry[0]:
                            if best is None or entry < best:
                                best = entry
                            break
                        heapq.heappop(entries)  # no longer true
                    else:
                        spent.append(kind)
                for kind in spent:
                    del by_kind[kind]  # so that a depth with no chain is passed at once
                if best is not None:
                    self._lowest = lowest
                    return best[2]
            if not by_kind and depth == lowest:
                lowest += 1  # looked at from the next one up from now on
        self._lowest = lowest
        return -1

    def _set_tail(self, task_id: int, depth: int) -> None:
        """``task_id`` is the last task of its chain, ``depth`` tasks waiting in it."""
        self._tails[task_id] = depth
        if depth < self._limit:
            self._offer(task_id, depth)

    def _offer(self, task_id: int, depth: int) -> None:
        """The chain ending in ``task_id`` has room: in the heaps (but for a task that
        may have no successor)."""
        kind = self._kind.get(task_id)
        if kind is not None:
            heapq.heappush(self._open[depth].setdefault(kind, []),
                           (self._ends.get(task_id, 0.0), self._order, task_id))
            self._order += 1
            self._lowest = min(self._lowest, depth)

    def holder(self, task_id: int) -> tuple[Worker, Affinity]:
        """The worker a running or queued task is on, and the running task's cpu set."""
        entry = self.running.get(task_id)
        if entry is not None:
            return entry
        return self.queued[task_id][0], None

    def replaceable(self, task_id: int, kind: Kind) -> bool:
        """Whether a task asking for ``kind`` could wait in this queued task's place: it
        is not asked back already, and asks for no less."""
        own = self._kind.get(task_id)
        return own is not None and task_id not in self._recalling and \
            _holds(own, kind[0], kind[1], kind[2] if len(kind) > 2 else 0)

    def busy_workers(self) -> set[Worker]:
        return {w for w, _a in self.running.values()}

    def depth(self, task_id: int) -> int:
        """How many tasks wait in a chain up to this one (0: it is running)."""
        depth = 0
        queued = self.queued
        while task_id in queued:
            task_id = queued[task_id][1]
            depth += 1
        return depth

    # -- transitions -------------------------------------------------------------

    def start(self, task_id: int, worker: Worker, affinity: Affinity,
              kind: Kind | None = (0, 0), takes: float | None = None,
              now: float = 0.0) -> None:
        """A task sent to start at once (asking for ``kind``; None: nothing may wait
        behind it, a task bound to its cpus or a multi-rank one), with the cpu ids it
        holds: a chain of its own. ``takes``: the seconds it is expected to run from
        ``now``, if expected."""
        self.running[task_id] = (worker, affinity)
        if takes is not None:
            self._takes[task_id] = takes
            self._ends[task_id] = now + takes
        self.unstarted.add(task_id)
        if kind is None:
            self._kind.pop(task_id, None)
        else:
            self._kind[task_id] = kind
        self._set_tail(task_id, 0)

    def queue(self, task_id: int, tail: int, kind: Kind = (0, 0),
              takes: float | None = None) -> Worker:
        """Queue a task (asking for ``kind``, expected to run ``takes`` seconds if
        expected) behind the last task of a chain (one of ``open_tails``); returns the
        worker that holds the chain."""
        worker = self.holder(tail)[0]
        self._kind[task_id] = kind
        if takes is not None:
            self._takes[task_id] = takes
            before = self._ends.get(tail)
            if before is not None:
                self._ends[task_id] = before + takes
        self._set_tail(task_id, self._tails.pop(tail) + 1)
        self._next[tail] = task_id
        self.queued[task_id] = (worker, tail)
        return worker

    def hold_cpus(self, task_id: int, affinity: Affinity) -> None:
        """A running task (promoted in its predecessor's place) holds these cpu ids."""
        self.running[task_id] = (self.running[task_id][0], affinity)

    def started(self, task_id: int) -> Worker:
        """The worker said it started the task; returns that worker."""
        self.unstarted.discard(task_id)
        return self.running[task_id][0]

    def end(self, task_id: int) -> tuple[Worker, Affinity]:
        """A running task ended (call ``promote`` next for its successor)."""
        self.unstarted.discard(task_id)
        self._takes.pop(task_id, None)
        self._ends.pop(task_id, None)
        return self.running.pop(task_id)

    def promote(self, pred: int, now: float = 0.0) -> int:
        """``pred`` ended: its queued successor, if any, runs now in its place (returned;
        -1 if none, and the slot is free). ``now``: the time, on the clock of the runtimes
        expected."""
        succ = self._next.pop(pred, None)
        self._kind.pop(pred, None)
        if succ is None:
            self._tails.pop(pred, None)
            return -1
        worker = self.queued.pop(succ)[0]
        self._recalling.discard(succ)
        self.running[succ] = (worker, None)
        self.unstarted.add(succ)
        takes, ends, following = self._takes, self._ends, self._next
        end = succ
        if takes:  # when the chain's tasks are now expected to end
            if succ in takes:
                ends[succ] = now + takes[succ]
            while end in following:
                after = following[end]
                if end in ends and after in takes:
                    ends[after] = ends[end] + takes[after]
                end = after
        else:
            later = following.get(end)
            while later is not None:
                end = later
                later = following.get(end)
        if end in self._tails:
            self._set_tail(end, self._tails[end] - 1)  # the chain moved up by one
        return succ

    def recall(self, task_ids: Iterable[int]) -> set[Worker]:
        """Queued tasks to ask back: the workers to ask (none for tasks asked already)."""
        workers = set()
        for tid in task_ids:
            if tid not in self._recalling:
                self._recalling.add(tid)
                workers.add(self.queued[tid][0])
        return workers

    def returned(self, task_ids: Iterable[int]
                 ) -> tuple[list[int], list[tuple[int, Worker, Affinity]]]:
        """Tasks a worker gave back unstarted. Returns the queued ones (their chains are
        cut behind their predecessors) and the running ones it refused to start, with
        their worker and cpu set (their slots are free)."""
        back: list[int] = []
        refused: list[tuple[int, Worker, Affinity]] = []
        cut: list[int] = []  # tasks whose successors went back
        for tid in task_ids:
            entry = self.queued.pop(tid, None)
            self._recalling.discard(tid)
            if entry is None:
                if tid in self.unstarted and tid in self.running:
                    worker, affinity = self.running.pop(tid)
                    self.unstarted.discard(tid)
                    self._tails.pop(tid, None)
                    self._kind.pop(tid, None)
                    self._takes.pop(tid, None)
                    self._ends.pop(tid, None)
                    refused.append((tid, worker, affinity))
                continue
            pred = entry[1]
            if self._next.get(pred) == tid:
                del self._next[pred]
            self._next.pop(tid, None)
            self._tails.pop(tid, None)
            self._kind.pop(tid, None)
            self._takes.pop(tid, None)
            self._ends.pop(tid, None)
            cut.append(pred)
            back.append(tid)
        for pred in cut:
            if pred not in self._next and (pred in self.running or pred in self.queued) \
                    and self.holder(pred)[0].rank not in self._closed:
                self._set_tail(pred, self.depth(pred))
        return back, refused

    def close_worker(self, rank: int) -> None:
        """No more tasks queue on this worker (its host is quarantined): its chains get
        no room, now or when tasks come back from them."""
        self._closed.add(rank)
        for table in (self.running, self.queued):
            for tid, (w, _) in table.items():
                if w.rank == rank:
                    self._tails.pop(tid, None)

    def drop_worker(self, rank: int) -> tuple[list[tuple[int, Affinity]], list[int]]:
        """A worker is gone: its running tasks (with their cpu sets) and its queued ones,
        all forgotten here."""
        running = [(tid, a) for tid, (w, a) in self.running.items() if w.rank == rank]
        for tid, _a in running:
            del self.running[tid]
            self._forget(tid)
        queued = [tid for tid, (w, _pred) in self.queued.items() if w.rank == rank]
        for tid in queued:
            del self.queued[tid]
            self._forget(tid)
        return running, queued

    def clear(self) -> list[int]:
        """Give up on every task: those running, then those queued."""
        tasks = [*self.running, *self.queued]
        self.running.clear()
        self.unstarted.clear()
        self.queued.clear()
        self._next.clear()
        self._tails.clear()
        self._recalling.clear()
        self._kind.clear()
        self._takes.clear()
        self._ends.clear()
        for by_kind in self._open:
            by_kind.clear()
        self._lowest = 0
        return tasks

    def _forget(self, task_id: int) -> None:
        self.unstarted.discard(task_id)
        self._recalling.discard(task_id)
        self._tails.pop(task_id, None)
        self._next.pop(task_id, None)
        self._kind.pop(task_id, None)
        self._takes.pop(task_id, None)
        self._ends.pop(task_id, None)
