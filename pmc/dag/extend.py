"""Tasks added to a DAG that is being run (open runs, a pmc extension): a batch of
TASK and EDGE lines read (``parse_batch``) and joined to the DAG (``extend``).

A batch is read with the DAG's own reader, and taken whole or not at all: a bad line
raises DagError with its line, and nothing of the batch is kept. Its tasks take the ids
after the DAG's last. An EDGE's parent may be any task (of the DAG, of an earlier batch
or of this one; a task array's name stands for all its members); its child must be a
task of the same batch, so no edge of a batch can reach back into what exists and only
the batch's own edges can close a cycle, which is refused. Task arrays cannot be added.
"""

from __future__ import annotations

from array import array
from itertools import repeat
from operator import add
from typing import NamedTuple

from pmc.dag.lines import all_fields, show
from pmc.dag.model import DAG, DagError, Optioned, Task, options_of


class Batch(NamedTuple):
    """Tasks (ids from the DAG's length on) and edges (parent id, child id) to add."""

    tasks: list[Task]
    edges: list[tuple[int, int]]


def parse_batch(dag: DAG, path: str, text: str, before: int = 0) -> Batch:
    """Read ``text`` (lines numbered from ``before + 1`` of ``path``) against ``dag``."""
    from pmc.dag.reader import read_task_lines

    lines = text.splitlines()
    edge_rows: list[tuple[int, str]] = []
    task_lines = list(lines)
    for i, text_line in enumerate(lines):
        if text_line.lstrip(" \t\r").startswith("EDGE"):
            fields = all_fields(text_line)
            if fields and fields[0] == "EDGE":
                edge_rows.append((before + i + 1, text_line))
                task_lines[i] = ""
    tasks, index, arrays = read_task_lines(path, task_lines, before)
    if arrays:
        first = min(a.line for a in arrays.values())
        raise DagError(path, first, "a task array cannot be added to an open run: "
                       f"{show(lines[first - before - 1])}")
    base = len(dag)
    added: list[Task] = []
    for task in tasks:
        assert isinstance(task, Task)
        line = task.line
        if dag.id_of(task.name) is not None or task.name in dag.arrays:
            raise DagError(path, line, f"task {task.name!r} is already in the DAG: "
                           f"{show(lines[line - before - 1])}")
        # Made again with its new id: a parsed task's line and Pegasus id are kept
        # relative to its parse (see Task.line); these keep their own.
        made = Task(base + task.id, task.name, task.command, line=line,
                    pegasus_id=task.pegasus_id)
        made._options = options_of(task)
        added.append(made)
    edges = [_edge(dag, path, lineno, line, index, base) for lineno, line in edge_rows]
    _check_cycle(path, edges, edge_rows, added, base)
    return Batch(added, list(dict.fromkeys((p, c) for p, c, _line in edges)))


def _edge(dag: DAG, path: str, lineno: int, line: str, index: dict[str, int],
          base: int) -> tuple[int, int, int]:
    fields = all_fields(line)
    if len(fields) != 3:
        raise DagError(path, lineno, "EDGE needs a parent and a child, got "
                       f"{len(fields) - 1} field(s): {show(line)}")
    parent, child = fields[1], fields[2]
    if parent == child:
        raise DagError(path, lineno, f"EDGE from task {parent!r} to itself: {show(line)}")
    if child not in index:
        where = "is in no batch" if dag.id_of(child) is None else "was added before"
        raise DagError(path, lineno, f"EDGE child {child!r} {where}: an added EDGE's child "
                       f"must be a task of the same batch: {show(line)}")
    if parent in index:
        p = base + index[parent]
    elif parent in dag.arrays:
        p = dag.arrays[parent].end  # done when every member is
    else:
        found = dag.id_of(parent)
        if found is None:
            raise DagError(path, lineno, f"EDGE names unknown task {parent!r}: {show(line)}")
        p = found
    return p, base + index[child], lineno


def _check_cycle(path: str, edges: list[tuple[int, int, int]],
                 rows: list[tuple[int, str]], tasks: list[Task], base: int) -> None:
    """Refuse a batch whose own edges make a cycle (Kahn's walk over its tasks)."""
    n = len(tasks)
    waiting = [0] * n
    children: list[list[int]] = [[] for _ in range(n)]
    for p, c, _line in edges:
        if p >= base:
            waiting[c - base] += 1
            children[p - base].append(c - base)
    free = [i for i in range(n) if not waiting[i]]
    seen = 0
    while free:
        t = free.pop()
        seen += 1
        for c in children[t]:
            waiting[c] -= 1
            if not waiting[c]:
                free.append(c)
    if seen == n:
        return
    for (p, c, lineno), (_l, line) in zip(edges, rows, strict=True):
        if p >= base and waiting[p - base] and waiting[c - base]:
            raise DagError(path, lineno, f"EDGE would close a cycle: {show(line)}")


def extend(dag: DAG, batch: Batch) -> None:
    """Join a batch's tasks and edges to ``dag`` in place (its arrays are changed, not
    replaced: what holds them sees the new ones). Edges from tasks the DAG had are
    spliced into their parents' runs of the compressed form."""
    tasks: list[Optioned] = dag.tasks
    base = len(tasks)
    tasks.extend(batch.tasks)
    for task in batch.tasks:
        dag.index[task.name] = task.id
    n = len(tasks)
    dag.nparents.frombytes(bytes(4 * (n - base)))
    by_parent: dict[int, list[int]] = {}
    for p, c in batch.edges:
        by_parent.setdefault(p, []).append(c)
        dag.nparents[c] += 1
    start, children = dag.child_start, dag.child_list
    old = [p for p in sorted(by_parent) if p < base]
    if old:
        # Rebuilt once, in slices: each old parent's children, then its new ones.
        merged = array(children.typecode)
        shifted = array(start.typecode, start[: old[0] + 1])
        pos, shift = 0, 0
        for i, p in enumerate(old):
            end = start[p + 1]
            merged.extend(children[pos:end])
            merged.extend(by_parent[p])
            pos = end
            shift += len(by_parent[p])
            upto = old[i + 1] + 1 if i + 1 < len(old) else len(start)
            shifted.extend(map(add, start[p + 1 : upto], repeat(shift)))  # at C speed
        merged.extend(children[pos:])
        children[:] = merged
        start[:] = shifted
    last = start[-1]
    for t in range(base, n):
        new = by_parent.get(t, ())
        children.extend(new)
        last += len(new)
        start.append(last)
