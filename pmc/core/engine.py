"""The pure DAG state machine: which tasks are ready, in what order, and what a result means.

No MPI, no files, no clocks. Tasks are integer ids (their index in DAG order). Ready tasks
are grouped into resource classes (what they ask of a host: ``pmc.dag.model.request_of``,
(cpus, memory) for the usual task) so the master can match the best task to
a free slot in O(classes); within a class a heap of packed integers orders them by priority
(higher first), then DAG order, without a tuple per entry. Between the two, an array
member's index (a plain task's is 0): the members of arrays linked member by member
(``EDGE A[i] B[i]``) go through their stages one index after the other, and a sweep's
results come in order.

Task arrays (a pmc extension, ``pmc.dag.arrays``) cost the engine a few bytes per
member: members that become ready together (an array without parents at the start, or
once its join is done) are one heap entry, a *run* of ids (``runs``: its first id ->
one past its last), taken one member at a time; and the joins between arrays are done
the moment their parents are, counted as no task (``npassed``).
"""

from __future__ import annotations

import enum
import heapq
import re
from array import array
from collections.abc import Iterable, Iterator
from itertools import compress
from typing import TYPE_CHECKING

from pmc.core.pathorder import PathOrder
from pmc.core.startready import ids_where, no_parent, readied
from pmc.dag import DAG
from pmc.dag.model import JOIN_OPTIONS, TaskOptions, options_of, request_of

if TYPE_CHECKING:
    from pmc.dag.arrays import Array

_ID_MASK = 0xFFFFFFFF
_NEXT_MEMBER = (1 << 32) + 1  # from one member's key to the next one's, alike
_READY_RUN = re.compile(b"\x01+")  # READY, in a state bytearray


class State(enum.IntEnum):
    WAITING = 0  # parents not done yet
    READY = 1
    RUNNING = 2
    DONE = 3
    FAILED = 4  # permanently: all tries used
    HELD = 5  # not admitted in this run (e.g. expected runtime exceeds the time left)
    REUSED = 6  # not run: its declared outputs are up to date (--reuse, pmc extension)


class Outcome(enum.Enum):
    SUCCEEDED = "succeeded"
    RETRY = "retry"  # failed, will be tried again
    FAILED = "failed"  # failed permanently


_WAITING, _READY, _RUNNING, _DONE, _REUSED = (
    int(State.WAITING), int(State.READY), int(State.RUNNING), int(State.DONE),
    int(State.REUSED))


def _key(priority: int, task_id: int, index: int = 0) -> int:
    """A ready heap's key: priority (higher first), then an array member's index, then
    the id (DAG order)."""
    return (-priority << 64) | (index << 32) | task_id


class Engine:
    """Readiness, ordering, tries and failure accounting for one run of a DAG."""

    def __init__(
        self,
        dag: DAG,
        *,
        tries: int = 1,
        max_failures: int = 0,
        done: Iterable[int] = (),
        order: PathOrder | None = None,
        reused: Iterable[int] = (),
    ) -> None:
        if tries < 1:
            raise ValueError("tries must be at least 1")
        self.dag = dag
        self.order = order  # None: by priority, then DAG order (as the reference)
        self.default_tries = tries
        self.max_failures = max_failures
        n = len(dag)
        self.ntasks = dag.ntasks  # the joins of task arrays are no tasks
        self.state = bytearray(n)
        self.waiting_on = array("i", dag.nparents)
        # Tries started per task, and whether it ever started (the "submitted" count):
        # flat arrays, not a dict, so a million tasks cost 5 MB here, not 70.
        self.attempts = array("i", bytes(4 * n))
        self._started = bytearray(n)
        self.nsubmitted = 0
        # Only classes with ready tasks are present: the master scans these per dispatch.
        self.classes: dict[tuple[int, ...], list[int]] = {}
        # Ready runs of array members: the first id a heap holds -> one past the last.
        self.runs: dict[int, int] = {}
        self.new_runs: list[tuple[int, int]] = []  # runs made ready since take_runs
        self.ndone = 0
        self.nfailed = 0
        self.nrunning = 0
        self.nready = 0
        self.nheld = 0
        self.nretries = 0
        self.nreused = 0  # not run: declared outputs up to date (--reuse)
        self.npassed = 0  # joins of task arrays done
        self.recovered = 0  # tasks DONE from the rescue log
        self._mark_finished(done, reused)
        roots, runs = self._find_ready()
        self.nready = len(roots) + sum(end - first for first, end in runs)
        # The tasks ready at the start, in DAG order, for the master to announce (then
        # dropped): found here once rather than searched for again.
        self.initial: list[int] = roots
        self.new_runs = runs
        self._fill_heaps(roots, runs)

    def _mark_finished(self, done: Iterable[int], reused: Iterable[int]) -> None:
        """At the start: the tasks the rescue log says are DONE, those --reuse reuses."""
        state = self.state
        for task_id in done:
            if state[task_id] != State.DONE:
                state[task_id] = State.DONE
                self.ndone += 1
        self.recovered = self.ndone
        for task_id in reused:
            if state[task_id] == _WAITING:
                state[task_id] = _REUSED
                self.nreused += 1

    def _find_ready(self) -> tuple[list[int], list[tuple[int, int]]]:
        """At the start: the tasks ready (their state READY), as the root ids and the
        runs of array members (first, one past the last)."""
        dag, state, waiting_on = self.dag, self.state, self.waiting_on
        if self.ndone or self.nreused or dag.arrays:
            for finished in (_DONE, _REUSED):
                for task_id in self.ids_in(State(finished)):
                    for child in dag.children(task_id):
                        waiting_on[child] -= 1
            if dag.arrays:
                self._pass_joins()
            state[:] = readied(state, waiting_on)
            return self._ready_at_start()
        # No rescue log: READY (1) exactly where no parent is, built in C, not a Python
        # loop over a million tasks.
        state[:] = no_parent(waiting_on)
        return ids_where(dag, state), []

    def _fill_heaps(self, roots: list[int], runs: list[tuple[int, int]]) -> None:
        """The ready classes' heaps at the start."""
        # Tasks share their TaskOptions (one for every task with the same option text):
        # the distinct ones among the roots are few, whatever their number.
        tasks, order = self.dag.tasks, self.order
        heads = roots + [first for first, _end in runs] if runs else roots
        # Where every task has the same options the roots have them too, no look needed.
        every = self.dag.option_kinds()
        kinds = {(request_of(o), o.priority)
                 for o in (every if len(every) == 1 and heads
                           else set(map(options_of, map(tasks.__getitem__, heads))))}
        if len(kinds) == 1 and order is None and not runs:
            # The usual case: one class, one priority. Keys ascend with the id, and a
            # sorted list is already a heap: the very list of the roots, which the master
            # announces (``take_initial``) before anything is taken from a heap.
            ((request, priority),) = kinds
            self.classes[request] = (
                roots if priority == 0 else [_key(priority, t) for t in roots])
        elif kinds:
            buckets: dict[tuple[int, ...], list[int]] = {}
            for task_id in roots:
                o = options_of(tasks[task_id])
                key = (_key(o.priority, task_id) if order is None
                       else order.key(task_id, o.priority))
                buckets.setdefault(request_of(o), []).append(key)
            for cls, heap in buckets.items():
                heapq.heapify(heap)
                self.classes[cls] = heap
            for first, end in runs:
                slot = tasks[first]
                self._ready_run(first, end, options_of(slot), slot.array, counted=True)

    def _pass_joins(self) -> None:
        """At the start: the joins whose parents are all done are done too (their
        children ready or not, as the state says next)."""
        waiting_on, state, tasks = self.waiting_on, self.state, self.dag.tasks
        joins = [join for owner in self.dag.arrays.values() for join in (owner.start, owner.end)
                 if not waiting_on[join] and state[join] == _WAITING]
        while joins:
            join = joins.pop()
            state[join] = _DONE
            self.npassed += 1
            for child in self.dag.children(join):
                waiting_on[child] -= 1
                if not waiting_on[child] and options_of(tasks[child]) is JOIN_OPTIONS:
                    joins.append(child)

    def _ready_at_start(self) -> tuple[list[int], list[tuple[int, int]]]:
        """The READY ids: tasks, and array members as runs of consecutive ids."""
        state = self.state
        is_ready = _READY.__eq__
        runs: list[tuple[int, int]] = []
        if not self.dag.arrays:
            return ids_where(self.dag, map(is_ready, state)), runs
        roots: list[int] = []
        pos = 0
        for owner in self.dag.arrays.values():
            roots.extend(compress(range(pos, owner.first), map(is_ready, state[pos:owner.first])))
            runs.extend(m.span() for m in _READY_RUN.finditer(state, owner.first, owner.end))
            pos = owner.end
        roots.extend(compress(range(pos, len(state)), map(is_ready, state[pos:])))
        return roots, runs

    # -- queries -----------------------------------------------------------------

    def accepting(self) -> bool:
        """False once --max-failures tasks have failed: start nothing new."""
        return not (self.max_failures and self.nfailed >= self.max_failures)

    def ready_heads(self) -> list[tuple[int, tuple[int, ...]]]:
        """(key, class) of each non-empty class's best task, best first; a class is what
        its tasks ask for (``request_of``: cpus and memory first)."""
        classes = self.classes
        if len(classes) == 1:  # the usual case: every task asks for the same
            for cls, heap in classes.items():
                return [(heap[0], cls)]
        heads = [(heap[0], cls) for cls, heap in classes.items()]
        heads.sort()
        return heads

    @staticmethod
    def task_of(key: int) -> int:
        """The task of a ``ready_heads`` key."""
        return key & _ID_MASK

    def finished(self) -> bool:
        """Nothing runs and nothing more will be started in this run."""
        return self.nrunning == 0 and (self.nready == 0 or not self.accepting())

    def succeeded(self) -> bool:
        return self.ndone + self.nreused == self.ntasks

    def ids_in(self, state: State) -> Iterator[int]:
        """The tasks in a state, in DAG order."""
        states = self.state
        value = bytes((state,))
        i = states.find(value)
        while i >= 0:
            yield i
            i = states.find(value, i + 1)

    def take_initial(self) -> list[int]:
        """The tasks ready at the start, in DAG order, once (the list is then let go).
        Read it before the first ``pop`` or ``mark_ready``: it may be a ready heap too."""
        initial, self.initial = self.initial, []
        return initial

    def take_runs(self) -> list[tuple[int, int]]:
        """The runs of array members made ready (at the start, or since the last call),
        as (first id, one past the last), once."""
        runs, self.new_runs = self.new_runs, []
        return runs

    def tries_of(self, task_id: int) -> int:
        tries = self.dag.tasks[task_id].tries
        return self.default_tries if tries is None else tries

    def add(self, first: int, edges: Iterable[tuple[int, int]]) -> list[int]:
        """Tasks ``first`` .. the DAG's last, just added to it with ``edges`` (an open
        run, ``pmc.dag.extend``): each waits for its parents not done yet; those with
        none are ready now. Returns them, in id order."""
        n = len(self.dag)
        added = n - first
        self.state.extend(bytes(added))
        self.waiting_on.frombytes(bytes(4 * added))
        self.attempts.frombytes(bytes(4 * added))
        self._started.extend(bytes(added))
        self.ntasks += added
        state, waiting_on = self.state, self.waiting_on
        for parent, child in edges:
            if state[parent] not in (_DONE, _REUSED):
                waiting_on[child] += 1
        newly = [t for t in range(first, n) if not waiting_on[t]]
        tasks = self.dag.tasks
        for task_id in newly:
            self._ready(task_id, options_of(tasks[task_id]), None)
        return newly

    # -- transitions -------------------------------------------------------------

    def pop(self, cls: tuple[int, ...]) -> int:
        """Take the best ready task of a class; it is now running. Returns its id."""
        heap = self.classes[cls]
        task_id = self._pop_run(heap) if self.runs else heapq.heappop(heap) & _ID_MASK
        if not heap:
            del self.classes[cls]
        self.state[task_id] = _RUNNING
        self.nready -= 1
        self.nrunning += 1
        self.attempts[task_id] += 1
        if not self._started[task_id]:
            self._started[task_id] = 1
            self.nsubmitted += 1
        return task_id

    def _pop_run(self, heap: list[int]) -> int:
        """``pop`` while runs of array members are ready: the head of a run is its
        first member, and the run's next member takes its place."""
        key = heap[0]
        task_id = key & _ID_MASK
        end = self.runs.pop(task_id, 0)
        if task_id + 1 < end:
            heapq.heapreplace(heap, key + _NEXT_MEMBER)
            self.runs[task_id + 1] = end
        else:
            heapq.heappop(heap)
        return task_id

    def hold(self, task_id: int) -> None:
        """A task popped but not admitted in this run (it stays undone for the next)."""
        self.state[task_id] = State.HELD
        self.nrunning -= 1
        self.attempts[task_id] -= 1
        self.nheld += 1

    def requeue(self, task_id: int) -> None:
        """A running task whose worker was lost: ready again, the try not counted."""
        self.attempts[task_id] -= 1
        self.nrunning -= 1
        self._make_ready(task_id)

    def reorder(self) -> None:
        """Compute the order's paths again, and the ready tasks' places by them."""
        order = self.order
        assert order is not None
        order.compute()
        tasks = self.dag.tasks
        for heap in self.classes.values():
            ids = [k & _ID_MASK for k in heap]
            heap[:] = [order.key(t, options_of(tasks[t]).priority) for t in ids]
            heapq.heapify(heap)

    def complete(self, task_id: int, ok: bool,
                 duration: float = -1.0) -> tuple[Outcome, list[int]]:
        """Record a finished try (of ``duration`` seconds, when known). Returns the
        outcome and the tasks that became ready."""
        self.nrunning -= 1
        if ok:
            if self.order is not None:
                self.order.learn(task_id, duration)
            self.state[task_id] = _DONE
            self.ndone += 1
            newly: list[int] = []
            waiting_on = self.waiting_on
            state = self.state
            tasks = self.dag.tasks
            for child in self.dag.children(task_id):
                left = waiting_on[child] - 1
                waiting_on[child] = left
                if left == 0 and state[child] == _WAITING:
                    task = tasks[child]
                    o = options_of(task)
                    if o is JOIN_OPTIONS:
                        self._pass(child, newly)  # a task array's join: done at once
                    else:
                        self._ready(child, o, task.array)
                        newly.append(child)
            return Outcome.SUCCEEDED, newly
        if self.attempts[task_id] < self.tries_of(task_id):
            self.nretries += 1
            self._make_ready(task_id)
            return Outcome.RETRY, [task_id]
        # Descendants stay WAITING for ever: they never run in this run.
        self.state[task_id] = State.FAILED
        self.nfailed += 1
        return Outcome.FAILED, []

    def _make_ready(self, task_id: int) -> None:
        task = self.dag.tasks[task_id]
        self._ready(task_id, options_of(task), task.array)

    def rank_of(self, task_id: int) -> int:
        """A task's rank among the ready tasks (lower goes first): its ready key without
        the id, so tasks of equal priority (and path) rank alike (an array's members by
        their index too)."""
        task = self.dag.tasks[task_id]
        return self._key_of(task_id, options_of(task), task.array) >> 32

    def _key_of(self, task_id: int, o: TaskOptions, owner: Array | None) -> int:
        order = self.order
        if order is not None:
            return order.key(task_id, o.priority)
        if owner is None:
            return (-o.priority << 64) | task_id  # see _key
        return _key(o.priority, task_id, task_id - owner.first)

    def _ready(self, task_id: int, o: TaskOptions, owner: Array | None,
               counted: bool = False) -> None:
        """``owner``: the array of a member (its index orders it), else None."""
        self.state[task_id] = _READY
        if not counted:
            self.nready += 1
        cls = (o.cpus, o.memory) if o.gpus == 0 and o.ranks == 1 else request_of(o)
        key = self._key_of(task_id, o, owner)
        heap = self.classes.get(cls)
        if heap is None:
            self.classes[cls] = [key]
        else:
            heapq.heappush(heap, key)

    def _ready_run(self, first: int, end: int, o: TaskOptions, owner: Array,
                   counted: bool = False) -> None:
        """Array members ``first`` .. ``end - 1``, alike, ready together: one heap entry
        (a key per member with ``--schedule``, whose keys differ by member)."""
        if self.order is not None:
            for task_id in range(first, end):
                self._ready(task_id, o, owner, counted)
            return
        self.state[first:end] = bytes((_READY,)) * (end - first)
        if not counted:
            self.nready += end - first
        self.runs[first] = end
        cls = request_of(o)
        key = _key(o.priority, first, first - owner.first)
        heap = self.classes.get(cls)
        if heap is None:
            self.classes[cls] = [key]
        else:
            heapq.heappush(heap, key)

    def _pass(self, join: int, newly: list[int]) -> None:
        """A join whose parents are done is done; its children whose parents are all
        done now become ready (in ``newly``, or, members of one array in a row, as a
        run in ``new_runs``), or are joins done in turn."""
        state, waiting_on, tasks = self.state, self.waiting_on, self.dag.tasks
        joins = [join]
        while joins:
            join = joins.pop()
            state[join] = _DONE
            self.npassed += 1
            run: list[int] = []  # consecutive members of one array, ready
            for child in self.dag.children(join):
                left = waiting_on[child] - 1
                waiting_on[child] = left
                if left or state[child] != _WAITING:
                    continue
                task = tasks[child]
                if options_of(task) is JOIN_OPTIONS:
                    joins.append(child)
                elif run and child == run[1] + 1 and task is tasks[run[0]]:
                    run[1] = child  # the same placeholder: the same array
                else:
                    self._ready_ids(run, newly)
                    run = [child, child]
            self._ready_ids(run, newly)

    def _ready_ids(self, run: list[int], newly: list[int]) -> None:
        """Ids ``run[0]`` .. ``run[1]`` ready, alike: one task, or a run of members."""
        if not run:
            return
        first, last = run
        task = self.dag.tasks[first]
        if first == last:
            self._ready(first, options_of(task), task.array)
            newly.append(first)
        else:
            self._ready_run(first, last + 1, options_of(task), task.array)
            self.new_runs.append((first, last + 1))
