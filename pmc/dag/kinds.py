"""The kind of each task, for what is learned of tasks alike: its Pegasus transformation
where the DAG file names one (the ``#@ SEQ TRANSFORMATION DAX_ID`` line before its TASK
line), else its executable (the command's first word).

The parser keeps no transformation (a million tasks would each hold one more slot for
it): the file is read again here, only by runs that ask (``--schedule``).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

from pmc.dag.model import DAG


def task_kinds(dag: DAG) -> tuple[array[int], list[str]]:
    """(kind of each task, as an index into the names; the names). A transformation is
    named ``pegasus::NAME``, apart from every executable."""
    names: list[str] = []
    number: dict[str, int] = {}
    kinds = array("I", bytes(4 * len(dag)))

    def kind(name: str) -> int:
        k = number.get(name)
        if k is None:
            k = number[name] = len(names)
            names.append(name)
        return k

    if dag.arrays:
        _array_kinds(dag, kinds, kind)
        return kinds, names
    given = _transformations(dag.path, len(dag)) if dag.path else {}
    for tid in range(len(dag)):
        transformation = given.get(tid)
        if transformation is not None:
            kinds[tid] = kind("pegasus::" + transformation)
        else:
            words = dag.command_of(tid).split(None, 1)
            kinds[tid] = kind(words[0] if words else "")
    return kinds, names


def _array_kinds(dag: DAG, kinds: array[int], kind: Callable[[str], int]) -> None:
    """``task_kinds`` of a DAG with task arrays (pmc extension): every member of an
    array is of its TASK line's kind (its joins take no time: of no matter)."""
    lines = len(dag) - sum(a.n + 1 for a in dag.arrays.values())  # the TASK lines
    given = _transformations(dag.path, lines) if dag.path else {}
    starts = {a.start: a for a in dag.arrays.values()}
    tid = ordinal = 0
    while tid < len(dag):
        owner = starts.get(tid)
        command = owner.command if owner is not None else dag.command_of(tid)
        transformation = given.get(ordinal)
        if transformation is not None:
            k = kind("pegasus::" + transformation)
        else:
            words = command.split(None, 1)
            k = kind(words[0] if words else "")
        if owner is None:
            kinds[tid] = k
            tid += 1
        else:
            kinds[owner.first : owner.end] = array("I", [k]) * owner.n
            tid = owner.end + 1
        ordinal += 1


def _transformations(path: str, ntasks: int) -> dict[int, str]:
    """The transformation of each task whose TASK line follows a ``#@`` line; the file
    is one the parser read whole (its TASK lines are the tasks, in order)."""
    found: dict[int, str] = {}
    pending: str | None = None
    tid = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split(None, 3)
                if not fields:
                    continue
                if fields[0] == "TASK":
                    if pending is not None:
                        found[tid] = pending
                        pending = None
                    tid += 1
                elif fields[0] == "#@" and len(fields) >= 3:
                    pending = fields[2]
    except OSError:
        return {}  # the executables then
    return found if tid == ntasks else {}
