"""What ``--reuse`` (a pmc extension) does not run: Make's rule with Pegasus's cascade.

Pure: the caller says, for every id of the DAG, what its declared files say
(``pmc.runtime.reuse``):

- CURRENT: it declares outputs, all there, none older than its declared inputs or the
  outputs of its parents (those that exist);
- STALE: its outputs are all there but one is older than that;
- MISSING: an output is missing, or it declares none (and the rescue log does not say
  it is done);
- DONE: it declares no outputs and the rescue log says it is done;
- JOIN: a hidden join of a task array (``pmc.dag.arrays``), no task.

A task runs when it is STALE; when a parent runs (its inputs will change); and when it is
MISSING and some child that runs needs it, or it has no child at all. Every other task
not DONE is reused: a CURRENT one, and (Pegasus's cascade) a MISSING one whose outputs
only reused tasks would read. The runs are the least set closed under these rules,
found by one walk forward (to children) and back (to missing parents) from the seeds.
"""

from __future__ import annotations

from array import array
from itertools import accumulate

from pmc.dag import DAG

CURRENT, STALE, MISSING, DONE, JOIN = 1, 2, 3, 4, 5


def parents_of(dag: DAG) -> tuple[array[int], array[int]]:
    """The edges the other way: (start, list), each id's parents at
    ``list[start[id]:start[id + 1]]``."""
    n = len(dag)
    start = array("i", [0])
    start.extend(accumulate(dag.nparents))
    fill = array("i", start)
    found = array("i", bytes(4 * len(dag.child_list)))
    child_start, children = dag.child_start, dag.child_list
    for p in range(n):
        for c in children[child_start[p] : child_start[p + 1]]:
            found[fill[c]] = p
            fill[c] += 1
    return start, found


def plan(dag: DAG, status: bytearray,
         parents: tuple[array[int], array[int]]) -> tuple[set[int], set[int]]:
    """(the DONE tasks that stay done, the tasks reused), by the rules above."""
    n = len(dag)
    child_start, children = dag.child_start, dag.child_list
    parent_start, parent_list = parents
    runs = bytearray(n)
    needed = bytearray(n)  # joins walked back through already
    work = [t for t in range(n) if status[t] == STALE
            or (status[t] == MISSING and child_start[t] == child_start[t + 1])]
    for t in work:
        runs[t] = 1
    while work:
        t = work.pop()
        for c in children[child_start[t] : child_start[t + 1]]:
            if not runs[c]:
                runs[c] = 1
                work.append(c)
        if status[t] == JOIN:
            continue  # runs only in that its parents' outputs change: needs nothing
        back = list(parent_list[parent_start[t] : parent_start[t + 1]])
        while back:
            p = back.pop()
            if status[p] == JOIN:
                if not needed[p]:
                    needed[p] = 1
                    back.extend(parent_list[parent_start[p] : parent_start[p + 1]])
            elif status[p] == MISSING and not runs[p]:
                runs[p] = 1
                work.append(p)
    done = {t for t in range(n) if status[t] == DONE and not runs[t]}
    reused = {t for t in range(n) if not runs[t] and status[t] in (CURRENT, MISSING)}
    return done, reused
