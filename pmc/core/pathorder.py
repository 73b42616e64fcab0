"""Critical-path order (the pmc extension ``--schedule``): ready tasks taken by the longest
path of runtimes left from them to an end of the DAG, so that the long chains start first
and the run does not end waiting for one started late.

A task's runtime is its ``--expected-runtime`` where the DAG gives one, else the mean of
the successful tries of its kind so far (``pmc.dag.kinds``: its Pegasus transformation,
else its executable); before any of a kind has ended, the mean of the kinds seen, and
before anything has ended, 1 s for every task (the path is then the number of tasks on
it). Pure: durations come in as numbers, and when to compute the paths again is the
caller's choice (``stale``; ``compute`` walks every task and edge once).

Two orders: the longest path first, priority next, DAG order last (``path_first``,
``--schedule critical-path``); or priority first (as the reference orders), then the
longest path, then DAG order (``--schedule priority-path``).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from pmc.dag import DAG
from pmc.dag.model import Optioned, options_of

_QUANTUM = 1000  # paths compared to the millisecond
_MAXQ = (1 << 32) - 1
_PRIORITY_BIAS = 1 << 63  # priorities are within a C long long (pmc.dag.taskline)


class PathOrder:
    """The keys of ready tasks by path (lower first), and what has been learned."""

    def __init__(self, dag: DAG, kinds: Sequence[int], nkinds: int, path_first: bool) -> None:
        self.dag = dag
        self.path_first = path_first
        self.kinds = kinds
        self.sums = [0.0] * nkinds
        self.counts = [0] * nkinds
        self.given = array("d", (_given(t) for t in dag.tasks))  # -1: none given
        self.bottom = array("d", bytes(8 * len(dag)))
        self.backwards = _reverse_topological(dag)
        self.stale = False  # learned something that could change the order
        self.computed = 0  # times the paths were computed
        self.compute()

    def expected(self, task_id: int) -> float:
        """The runtime the paths take for ``task_id`` now (see the module docstring)."""
        given = self.given[task_id]
        if given >= 0:
            return given
        k = self.kinds[task_id]
        count = self.counts[k]
        return self.sums[k] / count if count else self._unseen()

    def _unseen(self) -> float:
        """The runtime of a task of a kind none of which has ended yet."""
        known = [s / c for s, c in zip(self.sums, self.counts, strict=True) if c]
        return sum(known) / len(known) if known else 1.0

    def compute(self) -> None:
        """The longest path from every task to an end (its own runtime included)."""
        default = self._unseen()
        means = [s / c if c else default for s, c in zip(self.sums, self.counts, strict=True)]
        kinds, given, bottom = self.kinds, self.given, self.bottom
        start, children = self.dag.child_start, self.dag.child_list
        for t in self.backwards:
            own = given[t]
            if own < 0:
                own = means[kinds[t]]
            a, b = start[t], start[t + 1]
            if a == b:
                bottom[t] = own
            else:
                bottom[t] = own + max(bottom[c] for c in children[a:b])
        self.stale = False
        self.computed += 1

    def learn(self, task_id: int, duration: float) -> None:
        """A successful try of ``task_id`` took ``duration`` seconds."""
        if self.given[task_id] >= 0 or duration < 0:
            return
        k = self.kinds[task_id]
        count = self.counts[k]
        before = self.sums[k] / count if count else None
        self.sums[k] += duration
        self.counts[k] = count + 1
        after = self.sums[k] / (count + 1)
        # A kind's first figure, or a mean that moved by a fifth: the paths may differ.
        if before is None or abs(after - before) > 0.2 * max(before, 1e-3):
            self.stale = True

    def key(self, task_id: int, priority: int) -> int:
        """The ready heap's key of a task (lower first); its low 32 bits are its id."""
        q = _MAXQ - min(int(self.bottom[task_id] * _QUANTUM), _MAXQ)
        if self.path_first:
            return (q << 96) | ((_PRIORITY_BIAS - priority) << 32) | task_id
        return (-priority << 64) | (q << 32) | task_id


def _given(task: Optioned) -> float:
    runtime: float | None = options_of(task).expected_runtime
    return -1.0 if runtime is None else runtime


def _reverse_topological(dag: DAG) -> array[int]:
    """Every task after all of its children (Kahn's algorithm, reversed)."""
    n = len(dag)
    waiting = array("i", dag.nparents)
    start, children = dag.child_start, dag.child_list
    order = array("I", (t for t in range(n) if waiting[t] == 0))
    i = 0
    while i < len(order):
        t = order[i]
        i += 1
        for c in children[start[t] : start[t + 1]]:
            waiting[c] -= 1
            if waiting[c] == 0:
                order.append(c)
    order.reverse()
    return order
