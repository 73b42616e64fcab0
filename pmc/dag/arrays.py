"""Task arrays (a pmc extension): one TASK line that stands for many members.

``TASK NAME --array 0-999 CMD ...`` (or ``--each-line FILE``, ``--from-json FILE``,
values from ``pmc.dag.sweeps``) defines members ``NAME[0]``, ``NAME[1]``, ... Member
``i`` runs CMD with ``{}`` replaced by its value and ``{#}`` by ``i`` in its arguments (and
in its ``--inputs``/``--outputs``), with ``PMC_ARRAY_INDEX`` and ``PMC_ARRAY_VALUE`` in its
environment; the line's options are every member's.

In the DAG an array takes ids ``start, first .. first+n-1, end``: two hidden join nodes
around its members. ``dag.tasks`` holds no Task for a member until one is needed: the
array's one ``MemberSlot`` stands for all of them (it carries their options, all the
engine needs), and ``MemberSlot.made`` (``DAG.task``) makes a member's Task when asked.
The joins (``JoinSlot``) carry ``JOIN_OPTIONS``; the engine completes one the moment its
parents are done, and counts it as no task. ``EDGE A t`` is ``end -> t`` (the members
wired to ``end`` once), ``EDGE t A`` is ``t -> start``, ``EDGE A B`` is ``A.end -> B.start``:
never members x members edges. ``EDGE A[i] B[i]`` links member by member (n edges).

Owns: the Array and its placeholders, making a member's Task, EDGE lines that name
arrays, member names (``NAME[INDEX]``, resolved by arithmetic, never in the name index),
and the rules that keep task and member names apart.
"""

from __future__ import annotations

import os
import re
from array import array
from itertools import repeat
from typing import NamedTuple

from pmc.dag.lines import all_fields, show
from pmc.dag.model import (
    DAG,
    JOIN_OPTIONS,
    DagError,
    MadeTask,
    Optioned,
    TaskOptions,
    member_id,
    new_task,
)
from pmc.dag.sweeps import RangeValues, Values
from pmc.dag.words import split_command

EACH = "[i]"  # EDGE A[i] B[i]: member by member
_MOST_IDS = (1 << 31) - 1  # ids are C ints in the engine's arrays
_PLACEHOLDER = re.compile(r"\{#?\}")
_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_ENV_INDEX = "PMC_ARRAY_INDEX"
_ENV_VALUE = "PMC_ARRAY_VALUE"


class ArrayDef(NamedTuple):
    """An array's TASK line as ``pmc.dag.taskline.parse_task`` reads it."""

    name: str
    command: str
    options: TaskOptions
    values: Values
    sweep: str  # how its values were given, for messages: "--array 0-9"
    line: int


class Array:
    """A task array in a DAG: its name, its members' ids and values, its command."""

    __slots__ = ("_by_index", "_files", "_wired", "_words", "command", "first", "joins",
                 "line", "n", "name", "options", "pegasus", "slot", "sweep", "values")

    def __init__(self, d: ArrayDef, first: int, pegasus: str | None) -> None:
        self.name = d.name
        self.first = first  # member i's id is first + i
        self.n = len(d.values)
        self.values = d.values
        self.command = d.command
        self.options = d.options
        self.sweep = d.sweep
        self.line = d.line
        self.pegasus = pegasus
        self.slot = MemberSlot(self)
        self.joins = (JoinSlot(self), JoinSlot(self))  # before and after the members
        self._wired = [False, False]  # the joins' edges to and from the members, made
        # The command's words, quoted, with a word to fill in for each argument holding
        # {} or {#} (the executable is taken as written); None if none does.
        words = split_command(d.command)
        self._words: list[tuple[bool, str]] | None = [(False, _quoted(words[0]))] + [
            (True, word) if _PLACEHOLDER.search(word) else (False, _quoted(word))
            for word in words[1:]]
        if not any(fill for fill, _word in self._words):
            self._words = None
        self._files = bool(d.options.inputs or d.options.outputs)
        # --array 0-N: a member's value is its index's text (made once, not twice).
        self._by_index = isinstance(d.values, RangeValues) and (
            d.values.first, d.values.step) == (0, 1)

    @property
    def start(self) -> int:
        """The join before the members: EDGE t NAME is t -> start."""
        return self.first - 1

    @property
    def end(self) -> int:
        """The join after the members: EDGE NAME t is end -> t."""
        return self.first + self.n

    def member_name(self, index: int) -> str:
        return f"{self.name}[{index}]"

    def member(self, index: int) -> MemberTask:
        """Member ``index``'s Task, made now (once for each try it runs: kept short)."""
        index_text = str(index)
        value = index_text if self._by_index else self.values.value(index)
        task = new_task(MemberTask)
        task_id = self.first + index
        task.id = task_id
        task.name = f"{self.name}[{index_text}]"
        words = self._words
        task.command = self.command if words is None else " ".join(
            _quoted(_fill(word, index_text, value)) if filled else word
            for filled, word in words)
        options = self.options
        if self._files:
            options = options._replace(inputs=_filled(options.inputs, index_text, value),
                                       outputs=_filled(options.outputs, index_text, value))
        task._options = options
        task.line = self.line
        if self.pegasus is not None:
            task._pegasus = self.pegasus
        task.array, task.slot = self, self.slot
        task.env = ((_ENV_INDEX, index_text), (_ENV_VALUE, value))
        return task

    def wire(self, which: int, edges: Edges, lineno: int) -> int:
        """The id of join ``which`` (0: start, 1: end), its edges to or from every member
        made the first time."""
        if not self._wired[which]:
            self._wired[which] = True
            members = range(self.first, self.first + self.n)
            join = repeat(self.end if which else self.start, self.n)
            edges.add(members if which else join, join if which else members, lineno,
                      self.n)
        return self.end if which else self.start


def _quoted(word: str) -> str:
    """``word`` as one shell word (single quotes where it needs any)."""
    if _SAFE_WORD.fullmatch(word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def _fill(word: str, index: str, value: str) -> str:
    """A word with ``{}`` replaced by ``value`` and ``{#}`` by ``index``, in one pass (a
    value holding ``{#}`` stays as it is)."""
    if word == "{}":
        return value
    return _PLACEHOLDER.sub(lambda m: value if m.group() == "{}" else index, word)


def _filled(paths: tuple[str, ...] | None, index: str, value: str) -> tuple[str, ...] | None:
    return None if paths is None else tuple(_fill(path, index, value) for path in paths)


class MemberSlot(Optioned):
    """What ``dag.tasks`` holds for every member of an array not made yet."""

    __slots__ = ("_options", "array")
    array: Array

    def __init__(self, owner: Array) -> None:
        self.array = owner
        self._options = owner.options

    def made(self, task_id: int) -> MadeTask:
        return self.array.member(task_id - self.array.first)

    def name_of(self, task_id: int) -> str:
        return self.array.member_name(task_id - self.array.first)

    def files(self, task_id: int) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
        o = self._options
        if not (o.inputs or o.outputs):
            return None, None
        index = task_id - self.array.first
        value = self.array.values.value(index)
        return _filled(o.inputs, str(index), value), _filled(o.outputs, str(index), value)


class MemberTask(MadeTask):
    """A member of an array, made when it is needed: it sets ``array`` and ``env``
    (its index and value), which a plain Task reads from its class."""

    __slots__ = ("array", "env")


class JoinSlot(Optioned):
    """A hidden join node of an array: no task, done once its parents are."""

    __slots__ = ("_options", "array")
    array: Array

    def __init__(self, owner: Array) -> None:
        self.array = owner
        self._options = JOIN_OPTIONS

    def made(self, task_id: int) -> MadeTask:
        raise ValueError(f"id {task_id} is a join of array {self.array.name}, not a task")

    def name_of(self, task_id: int) -> str:
        return self.array.name


def read_sweep_file(dag_path: str, name: str) -> bytes:
    """An --each-line or --from-json file's bytes, its path relative to the DAG's
    directory; OSError as it comes."""
    path = os.path.join(os.path.dirname(os.path.abspath(dag_path)), name)
    with open(path, "rb") as f:
        return f.read()


class Edges:
    """The reader's edge lists, as array edges add to them."""

    __slots__ = ("children", "lines", "parents")

    def __init__(self, parents: array[int], children: array[int], lines: array[int]) -> None:
        self.parents = parents
        self.children = children
        self.lines = lines

    def add(self, parents: range | repeat[int], children: range | repeat[int], lineno: int,
            n: int) -> None:
        self.parents.extend(parents)
        self.children.extend(children)
        self.lines.extend(repeat(lineno, n))


def define(d: ArrayDef, path: str, line: str, tasks: list[Optioned], index: dict[str, int],
           arrays: dict[str, Array], pegasus: str | int | None) -> None:
    """Add an array's ids to ``tasks`` (join, members, join) and the array to ``arrays``."""
    if "[" in d.name:
        raise DagError(path, d.line, f"an array's name cannot hold '[' (task arrays are "
                                     f"a pmc extension): {show(line)}")
    if d.name in index or d.name in arrays:
        first = index.get(d.name)
        at = arrays[d.name].line if first is None else tasks[first].made(first).line
        raise DagError(path, d.line, f"duplicate task id {d.name!r} (first defined at line "
                                     f"{at}): {show(line)}")
    start = len(tasks)
    n = len(d.values)
    if start + n + 2 > _MOST_IDS:
        raise DagError(path, d.line, f"too many tasks: array {d.name} of {n} members "
                                     f"({d.sweep}) would make {start + n + 2}")
    seq = None if pegasus is None else str(pegasus)
    owner = arrays[d.name] = Array(d, start + 1, seq)
    tasks.append(owner.joins[0])
    tasks.extend(repeat(owner.slot, n))
    tasks.append(owner.joins[1])


def edge(path: str, lineno: int, line: str, index: dict[str, int], arrays: dict[str, Array],
         edges: Edges) -> bool:
    """An EDGE line when the DAG has arrays: added to ``edges``. Whether an edge it added
    points backward in id order (only such can close a cycle)."""
    fields = all_fields(line)
    if len(fields) != 3:
        raise DagError(path, lineno, f"EDGE needs a parent and a child, got "
                                     f"{len(fields) - 1} field(s): {show(line)}")
    parent, child = (_end(path, lineno, line, index, arrays, name) for name in fields[1:])
    if isinstance(parent, Array) and isinstance(child, Array) and parent is child:
        raise DagError(path, lineno, f"self edge: array {parent.name!r} cannot depend on "
                                     f"itself: {show(line)}")
    if isinstance(parent, _Each) or isinstance(child, _Each):
        return _each(path, lineno, line, parent, child, edges)
    p = parent.wire(1, edges, lineno) if isinstance(parent, Array) else parent
    c = child.wire(0, edges, lineno) if isinstance(child, Array) else child
    if p == c:
        raise DagError(path, lineno, f"self edge: task {fields[1]!r} cannot depend on "
                                     f"itself: {show(line)}")
    edges.add(range(p, p + 1), range(c, c + 1), lineno, 1)
    return p > c


class _Each(NamedTuple):
    array: Array


def _end(path: str, lineno: int, line: str, index: dict[str, int], arrays: dict[str, Array],
         name: str) -> int | Array | _Each:
    """What one side of an EDGE names: a task (or member), an array, or an array's
    members one by one."""
    found = index.get(name)
    if found is not None:
        return found
    owner = arrays.get(name)
    if owner is not None:
        return owner
    if name.endswith(EACH) and name[: -len(EACH)] in arrays:
        return _Each(arrays[name[: -len(EACH)]])
    member = member_id(arrays, name)
    if member is not None:
        return member
    raise DagError(path, lineno, f"EDGE names unknown task {name!r} (an EDGE may only name "
                                 f"tasks defined above it): {show(line)}")


def _each(path: str, lineno: int, line: str, parent: int | Array | _Each,
          child: int | Array | _Each, edges: Edges) -> bool:
    """EDGE A[i] B[i]: member i of A before member i of B, for every i."""
    if not (isinstance(parent, _Each) and isinstance(child, _Each)):
        raise DagError(path, lineno, f"a member-by-member edge (a pmc extension) names "
                                     f"two arrays as NAME[i]: {show(line)}")
    a, b = parent.array, child.array
    if a is b:
        raise DagError(path, lineno, f"self edge: array {a.name!r} cannot depend on "
                                     f"itself: {show(line)}")
    if a.n != b.n:
        raise DagError(path, lineno, f"a member-by-member edge needs arrays of one size: "
                                     f"{a.name} has {a.n} members, {b.name} {b.n}: "
                                     f"{show(line)}")
    edges.add(range(a.first, a.first + a.n), range(b.first, b.first + b.n), lineno, a.n)
    return a.first > b.first


def cycle_names(dag: DAG, cycle: list[int]) -> list[str]:
    """A cycle's names, an array's members passed through its joins (an all-members
    edge) shown as the array: ``EDGE a b`` and ``EDGE b a`` make ``a -> b``."""
    tasks = dag.tasks
    n = len(cycle)

    def whole(k: int) -> str | None:
        """The array whose join is at place ``k``, or which a member there joins."""
        task = tasks[cycle[k % n]]
        if isinstance(task, JoinSlot):
            return task.array.name
        owner = task.array
        for near in (cycle[(k - 1) % n], cycle[(k + 1) % n]):
            if owner is not None and tasks[near] in owner.joins:
                return str(owner.name)
        return None

    names = [whole(k) or dag.name_of(cycle[k]) for k in range(n)]
    kept = [name for k, name in enumerate(names) if name != names[k - 1]]
    return kept or names[:1]


def check_names(path: str, tasks: list[Optioned], index: dict[str, int],
                arrays: dict[str, Array]) -> None:
    """No task named as an array, or as an array's member (``A[3]``, ``A[i]``): once the
    whole file is read (a task defined before its array is refused there)."""
    clash = [name for name in arrays if name in index]
    clash += [name for name in index if name.endswith("]") and (
        member_id(arrays, name) is not None
        or (name.endswith(EACH) and name[: -len(EACH)] in arrays))]
    if not clash:
        return
    first = min(index[name] for name in clash)
    task = tasks[first].made(first)
    owner = arrays.get(task.name) or arrays[task.name[: task.name.rfind("[")]]
    raise DagError(path, task.line, f"task id {task.name!r} is taken by the task array "
                                    f"{owner.name} defined at line {owner.line} (task arrays "
                                    f"are a pmc extension)")
