"""From the edges a reader collected to a DAG: compressed (CSR) form, each edge once,
and no cycle.
"""

from __future__ import annotations

import sys
from array import array
from itertools import accumulate, compress, count, islice, repeat
from operator import gt, le, lt, sub
from typing import TYPE_CHECKING

from pmc.dag.model import DAG, DagError, Optioned

if TYPE_CHECKING:
    from collections.abc import MutableSequence

    from pmc.dag.arrays import Array


class EdgeTally:
    """What ``build_dag`` counts over the edges, counted run by run as they come (a
    helper's edges while it sends the rest: ``pmc.dag.edgehelper``): how many parents
    each task waits for, how many children each has, whether the edges are grouped by
    parent in file order (``ordered``), and whether each parent's children come in
    ascending order too (``ascending``: then no edge is given twice, as generators
    write them). Runs are added from the end of the file back: each run added comes
    before every edge added so far."""

    __slots__ = ("ascending", "counts", "edges", "ends", "next_key", "ordered")

    def __init__(self, n: int) -> None:
        # Each task's parents and children, an edge at a time, in lists: an "I" array's
        # item takes ~25 ns more to add to (ten million edges: 0.25 s), where one copy of
        # the counts to an array takes 9 ns a task (build_dag).
        self.counts: MutableSequence[int] = [0] * n
        self.ends: MutableSequence[int] = [0] * n
        self.ascending = True  # (parent, child) in file order always goes up
        self.ordered = True  # parents in file order never go down
        self.next_key = -1  # the first edge of the run added last as _keys has it (-1: none)
        self.edges = 0  # edges counted

    def add_before(self, parents: array[int], children: array[int]) -> None:
        """Count a run of edges that comes before every edge counted so far; IndexError
        for an id of no task."""
        if not parents:
            return
        counts = self.counts
        for c in children:
            counts[c] += 1
        ends = self.ends
        for p in parents:
            ends[p] += 1
        following = self.next_key
        if self.ascending:  # (one look, where grouping by parent alone would take as long)
            keys = _keys(parents, children).tolist()  # (each made an int once, not twice)
            self.ascending = (following < 0 or keys[-1] < following) and all(
                map(lt, keys, islice(keys, 1, None)))
        if not self.ascending and self.ordered:  # (all ascending before: all ordered)
            self.ordered = (following < 0 or parents[-1] <= following >> 32) and all(
                map(le, parents, islice(parents, 1, None)))
        self.next_key = parents[0] << 32 | children[0]
        self.edges += len(parents)


def _keys(parents: array[int], children: array[int]) -> memoryview:
    """Each edge as one number, parent << 32 | child, made in C: the two arrays' words
    interleaved, read as 64-bit numbers."""
    words = array("I", [0]) * (2 * len(parents))
    high, low = (1, 0) if sys.byteorder == "little" else (0, 1)
    words[high::2] = parents
    words[low::2] = children
    return memoryview(words).cast("B").cast("Q")


def build_dag(
    path: str,
    tasks: list[Optioned],
    index: dict[str, int] | None,
    edges: list[array[int]],
    backward: bool,
    arrays: dict[str, Array] | None = None,
    tally: EdgeTally | None = None,
) -> DAG:
    """Turn the edge lists into CSR form, each edge once; reject cycles.

    ``edges`` holds the parents, the children and the line of each edge, in "I" arrays
    as the reader made them; it is emptied, so that each goes as soon as it is used up
    (the lines at once when no edge points backward: only such can close a cycle).
    ``tally``: the last edges counted already (``EdgeTally``), the rest counted here.

    A repeated EDGE line is accepted, as the reference accepts it, and counts once:
    the child waits for its parent once and runs once. (The reference lists such a
    child twice under its parent and queues it twice when the parent succeeds.)

    This is the peak of a big parse: counts in "I" arrays (four bytes a task, where a
    list takes eight), no copy of the start offsets for the counting sort, and no
    more than three arrays of n at once (ten million tasks: 70 MB less than before).
    """
    parents, children, edge_lines = edges
    edges.clear()
    if not backward:
        del edge_lines
    n = len(tasks)
    if tally is None:
        tally = EdgeTally(n)
    if not tally.edges:
        tally.add_before(parents, children)
    elif len(parents) > tally.edges:
        ours = len(parents) - tally.edges
        tally.add_before(parents[:ours], children[:ours])
    nparents = _signed(array("I", tally.counts))
    tally.counts = []
    ends = array("I", accumulate(tally.ends))  # where each parent's run ends
    ordered, ascending = tally.ordered, tally.ascending
    del tally
    if ordered:
        # Edges already grouped by parent, as generators usually write them.
        by_parent = children
        ends.insert(0, 0)  # the starts
    else:
        # Stable counting sort, from the last edge back: children keep their file
        # order within a parent, and each parent's end becomes its start.
        by_parent = array("I", bytes(4 * len(children)))
        for p, c in zip(reversed(parents), reversed(children), strict=True):
            k = ends[p] - 1
            by_parent[k] = c
            ends[p] = k
        ends.append(len(children))  # the starts
    if not backward:  # (by_parent may be children: that goes with by_parent)
        del parents, children
    starts = ends
    del ends
    if not ascending and _repeats_a_child(by_parent, starts):
        by_parent, starts = _without_repeats(by_parent, starts)
        nparents = array("i", bytes(4 * n))
        for c in by_parent:
            nparents[c] += 1
    child_list = _signed(by_parent)
    del by_parent
    child_start = _signed(starts)
    del starts
    dag = DAG(path, tasks, index, child_start, child_list, nparents, arrays)
    # With every edge pointing forward in DAG order there can be no cycle.
    if backward:
        _check_acyclic(dag, list(nparents), parents, children, edge_lines)
    return dag


def _repeats_a_child(by_parent: array[int], starts: array[int]) -> bool:
    """Whether a parent lists a child twice: a duplicate edge repeats a child within its
    parent's run, so only parents with several children need a look (found in C), and
    no set of all edges is ever built."""
    for p in compress(count(), map(gt, map(sub, islice(starts, 1, None), starts), repeat(1))):
        first = starts[p]
        end = starts[p + 1]
        if end - first == 2:  # the most common run: compared, no set built
            if by_parent[first] == by_parent[first + 1]:
                return True
        elif len(set(by_parent[first:end])) < end - first:
            return True
    return False


def _without_repeats(by_parent: array[int], starts: array[int]) -> tuple[array[int], array[int]]:
    """The CSR lists with each parent's children once, in the order first given."""
    kept = array("I")
    new_starts = array("I", [0])
    for p in range(len(starts) - 1):
        run = by_parent[starts[p] : starts[p + 1]]
        if len(run) > 1:
            kept.extend(dict.fromkeys(run))
        else:
            kept.extend(run)
        new_starts.append(len(kept))
    return kept, new_starts


def _signed(ids: array[int]) -> array[int]:
    """The "i" array of the same ids: their four bytes copied, not converted one by one
    (the same numbers below 2**31, and a DAG with more tasks or edges cannot fit in
    memory)."""
    signed = array("i")
    signed.frombytes(memoryview(ids).cast("B"))
    return signed


def _check_acyclic(
    dag: DAG,
    waiting: list[int],
    parents: array[int],
    children: array[int],
    edge_lines: array[int],
) -> None:
    """Kahn's algorithm, iterative; ``waiting`` (parents not yet done) is consumed."""
    start = dag.child_start
    child_list = dag.child_list
    ready = [i for i, w in enumerate(waiting) if not w]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        for v in child_list[start[u] : start[u + 1]]:
            w = waiting[v] - 1
            waiting[v] = w
            if not w:
                ready.append(v)
    if done == len(dag.tasks):
        return
    # Every task left still waits for a parent that is also left, so walking from any of
    # them to such a parent, again and again, must come back round: that is a cycle.
    via = array("i", [-1]) * len(waiting)
    for p, c in zip(parents, children, strict=True):
        if waiting[p] and waiting[c]:
            via[c] = p
    u = next(i for i, w in enumerate(waiting) if w)
    seen: dict[int, int] = {}
    walk: list[int] = []
    while u not in seen:
        seen[u] = len(walk)
        walk.append(u)
        u = via[u]
    cycle = walk[seen[u] :]
    cycle.reverse()  # the walk went from child to parent
    first = cycle.index(min(cycle))
    cycle = cycle[first:] + cycle[:first]
    keys = {a << 32 | b for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True)}
    line = max(
        line
        for p, c, line in zip(parents, children, edge_lines, strict=True)
        if p << 32 | c in keys
    )
    if dag.arrays:
        from pmc.dag.arrays import cycle_names

        names = cycle_names(dag, cycle)
    else:
        names = [dag.name_of(i) for i in cycle]
    if len(names) > 12:
        shown = " -> ".join([*names[:10], "...", names[-1], names[0]])
        message = f"cycle of {len(names)} tasks: {shown}"
    else:
        message = "cycle: " + " -> ".join([*names, names[0]])
    raise DagError(dag.path, line, message)
