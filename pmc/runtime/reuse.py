"""``--reuse`` (a pmc extension): what the declared files say of each task, read before the
run starts, and the tasks it then does not run (``pmc.core.reuse`` decides).

A task's declared files are its ``--inputs`` and ``--outputs`` (an array member's with its
``{}`` and ``{#}`` filled in), relative to the DAG's directory; every file is looked at
once. Under ``--reuse`` a task that declares outputs is judged by its files, whatever
the rescue log says of it; one that declares none keeps the rescue log's word.
"""

from __future__ import annotations

import os
from array import array

from pmc.core import reuse
from pmc.dag import DAG
from pmc.dag.model import JOIN_OPTIONS, options_of
from pmc.runtime.declared import FileTimes


def reusable(dag: DAG, done: set[int]) -> tuple[set[int], set[int]]:
    """(the tasks the rescue log says are done that stay done, the tasks reused)."""
    parents = reuse.parents_of(dag)
    return reuse.plan(dag, file_states(dag, done, parents), parents)


def file_states(dag: DAG, done: set[int],
                parents: tuple[array[int], array[int]]) -> bytearray:
    """What each id's declared files say (``pmc.core.reuse``: CURRENT, STALE, ...)."""
    times = FileTimes(os.path.dirname(os.path.abspath(dag.path)))
    tasks = dag.tasks
    parent_start, parent_list = parents
    joined: dict[int, int] = {}  # a join's newest output of its parents

    def newest_out(p: int) -> int:
        if options_of(tasks[p]) is not JOIN_OPTIONS:
            return times.newest(tasks[p].files(p)[1])
        found = joined.get(p)
        if found is None:
            found = joined[p] = max(map(newest_out, parent_list[parent_start[p]:
                                                                 parent_start[p + 1]]),
                                    default=-1)
        return found

    status = bytearray(len(dag))
    for t, task in enumerate(tasks):
        if options_of(task) is JOIN_OPTIONS:
            status[t] = reuse.JOIN
            continue
        inputs, outputs = task.files(t)
        if not outputs:
            status[t] = reuse.DONE if t in done else reuse.MISSING
            continue
        oldest = times.oldest(outputs)
        if oldest < 0:
            status[t] = reuse.MISSING
            continue
        newest = max(times.newest(inputs),
                     max(map(newest_out, parent_list[parent_start[t]:parent_start[t + 1]]),
                         default=-1))
        status[t] = reuse.STALE if oldest < newest else reuse.CURRENT
    return status
