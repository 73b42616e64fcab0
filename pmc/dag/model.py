"""The DAG in memory: Task, DAG, DagError, and TaskOptions, the table of a task's options.

What a parsed DAG is, not how it is read (``pmc.dag.reader``): tasks in DAG order, and
edges in compressed (CSR) form, both small enough for a million tasks.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import count, groupby, islice
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple, Protocol, cast


class DagError(Exception):
    """A DAG file that cannot be run; ``str()`` is the one message for the user."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.message = message


class TaskOptions(NamedTuple):
    """The task options most tasks leave at their defaults."""

    memory: int = 0  # MB; 0 = not considered
    cpus: int = 1
    tries: int | None = None  # None = the run's --tries
    priority: int = 0
    pipe_forwards: tuple[tuple[str, str], ...] | None = None  # ((VAR, FILE), ...)
    file_forwards: tuple[tuple[str, str], ...] | None = None  # ((SRC, DEST), ...)
    expected_runtime: float | None = None  # seconds (extension option)
    # pmc extensions (issue 22): GPUs per rank, MPI ranks, ranks on each host (0: any)
    gpus: int = 0
    ranks: int = 1
    ranks_per_host: int = 0
    # pmc extensions: declared files (paths as written, relative to the DAG's directory)
    inputs: tuple[str, ...] | None = None
    outputs: tuple[str, ...] | None = None


def request_of(o: TaskOptions) -> tuple[int, ...]:
    """What a task asks of the hosts, its ready class: (cpus, memory) for the usual task,
    (cpus, memory, gpus, ranks, ranks_per_host) for one asking for GPUs or ranks."""
    if o.gpus == 0 and o.ranks == 1:
        return (o.cpus, o.memory)
    return (o.cpus, o.memory, o.gpus, o.ranks, o.ranks_per_host)


DEFAULT_OPTIONS = TaskOptions()
# The options of a DAG's hidden join nodes (``pmc.dag.arrays``), told apart by identity:
# a join asks for nothing and takes no time.
JOIN_OPTIONS = TaskOptions(cpus=0, expected_runtime=0.0)
new_task = object.__new__  # a Task with no attributes set, for the parse loop
_changes = [0]  # options set on a Task after it was made (Optioned._set)


class Optioned:
    """What reads a ``TaskOptions`` as attributes: a Task, and the placeholders that stand
    for tasks not made yet: of a parse's tasks alike (``pmc.dag.parsed``), of a task
    array's members (``pmc.dag.arrays``)."""

    # Each subclass holds ``_options`` in its own slots: a Task's slots in one class, as
    # cheap to walk (by the collector, at its end) as those of a class of its own.
    __slots__ = ()
    _options: TaskOptions
    # An array member's (its placeholder's, or its Task's) array; a plain task reads
    # None from the class, at no cost per task.
    array: Any = None

    def _set(self, **changes: Any) -> None:
        """A Task's option set (its TaskOptions, shared, are replaced, never changed)."""
        object.__setattr__(self, "_options", self._options._replace(**changes))
        _changes[0] += 1  # every DAG counts its tasks' options again (DAG.option_kinds)

    @property
    def memory(self) -> int:
        return self._options.memory

    @memory.setter
    def memory(self, value: int) -> None:
        self._set(memory=value)

    @property
    def cpus(self) -> int:
        return self._options.cpus

    @cpus.setter
    def cpus(self, value: int) -> None:
        self._set(cpus=value)

    @property
    def tries(self) -> int | None:
        return self._options.tries

    @tries.setter
    def tries(self, value: int | None) -> None:
        self._set(tries=value)

    @property
    def priority(self) -> int:
        return self._options.priority

    @priority.setter
    def priority(self, value: int) -> None:
        self._set(priority=value)

    @property
    def pipe_forwards(self) -> tuple[tuple[str, str], ...] | None:
        return self._options.pipe_forwards

    @pipe_forwards.setter
    def pipe_forwards(self, value: tuple[tuple[str, str], ...] | None) -> None:
        self._set(pipe_forwards=value)

    @property
    def file_forwards(self) -> tuple[tuple[str, str], ...] | None:
        return self._options.file_forwards

    @file_forwards.setter
    def file_forwards(self, value: tuple[tuple[str, str], ...] | None) -> None:
        self._set(file_forwards=value)

    @property
    def expected_runtime(self) -> float | None:
        return self._options.expected_runtime

    @expected_runtime.setter
    def expected_runtime(self, value: float | None) -> None:
        self._set(expected_runtime=value)

    @property
    def gpus(self) -> int:
        """GPUs per rank (--request-gpus, a pmc extension)."""
        return self._options.gpus

    @property
    def ranks(self) -> int:
        """MPI ranks (--ranks, a pmc extension): 1 for a plain task."""
        return self._options.ranks

    @property
    def ranks_per_host(self) -> int:
        """Ranks on each host used (--ranks-per-host, a pmc extension); 0: any."""
        return self._options.ranks_per_host

    @property
    def inputs(self) -> tuple[str, ...] | None:
        """Declared input files (--inputs, a pmc extension)."""
        return self._options.inputs

    @property
    def outputs(self) -> tuple[str, ...] | None:
        """Declared output files (--outputs, a pmc extension)."""
        return self._options.outputs

    def made(self, task_id: int) -> Task:
        """The Task at ``task_id`` (a member placeholder makes one, not kept)."""
        raise NotImplementedError

    def files(self, task_id: int) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
        """The declared (inputs, outputs) of the task at ``task_id``."""
        return self._options.inputs, self._options.outputs

    def name_of(self, task_id: int) -> str:
        """The name of the task at ``task_id``."""
        raise NotImplementedError

    def command_of(self, task_id: int) -> str:
        """The command of the task at ``task_id``."""
        return self.made(task_id).command


class Task(Optioned):
    """One TASK record. ``id`` is its index in DAG order; ``command`` is the raw text of
    executable and arguments, split only at launch (``split_command``); ``line`` is the
    line of the DAG file it was defined on (0: not from a file).

    The options live in one immutable ``TaskOptions`` shared by every task that
    sets none of them, and by tasks whose option text is the same (``-m 1 -c 1`` on
    every line); they read and assign like plain attributes. A parsed DAG holds no Task
    for a task until it is taken to run (``pmc.dag.parsed``): a Task is for the few at
    hand, and for a DAG made in code.
    """

    __slots__ = ("_options", "_pegasus", "command", "id", "line", "name")
    _pegasus: str  # set only on a task with a Pegasus id
    # A member of a task array (pmc.dag.arrays.MemberTask) sets this; a plain task reads
    # it from its class, at no cost per task.
    env: tuple[tuple[str, str], ...] | None = None  # added to its environment

    def __init__(
        self,
        id: int,
        name: str,
        command: str,
        *,
        memory: int = 0,
        cpus: int = 1,
        tries: int | None = None,
        priority: int = 0,
        pipe_forwards: tuple[tuple[str, str], ...] | None = None,
        file_forwards: tuple[tuple[str, str], ...] | None = None,
        pegasus_id: str | None = None,
        expected_runtime: float | None = None,
        line: int = 0,
        gpus: int = 0,
        ranks: int = 1,
        ranks_per_host: int = 0,
        inputs: tuple[str, ...] | None = None,
        outputs: tuple[str, ...] | None = None,
    ) -> None:
        self.id = id
        self.name = name
        self.command = command
        if pegasus_id is not None:
            self._pegasus = pegasus_id
        self.line = line
        if (
            memory
            or cpus != 1
            or tries is not None
            or priority
            or pipe_forwards is not None
            or file_forwards is not None
            or expected_runtime is not None
            or gpus
            or ranks != 1
            or ranks_per_host
            or inputs is not None
            or outputs is not None
        ):
            self._options = TaskOptions(
                memory,
                cpus,
                tries,
                priority,
                pipe_forwards,
                file_forwards,
                expected_runtime,
                gpus,
                ranks,
                ranks_per_host,
                inputs,
                outputs,
            )
        else:
            self._options = DEFAULT_OPTIONS

    @property
    def pegasus_id(self) -> str | None:
        """SEQ of the task's "#@ SEQ TRANSFORMATION DAX_ID" line, if it has one."""
        # The slot of a task without one is never set. getattr's default, not a
        # try/except: a Python-level exception per dispatched task cost 0.4 µs.
        return getattr(self, "_pegasus", None)

    @pegasus_id.setter
    def pegasus_id(self, value: str | None) -> None:
        if value is not None:
            self._pegasus = value
        elif hasattr(self, "_pegasus"):
            del self._pegasus

    def made(self, task_id: int) -> Task:
        return self

    def name_of(self, task_id: int) -> str:
        return self.name

    def command_of(self, task_id: int) -> str:
        return self.command

    def __repr__(self) -> str:
        return f"Task({self.id}, {self.name!r}, {self.command!r})"


class MadeTask(Task):
    """A Task made for a placeholder of ``DAG.tasks`` (a parsed task's, an array
    member's) when it is taken to run: it is kept there in the placeholder's place
    until its last try has ended, then ``slot`` is put back (``pmc.runtime.placement``)."""

    __slots__ = ("slot",)
    slot: Optioned


class TaskView:
    """Tasks by id, each made as it is read (an array member not made yet is made then,
    and not kept): many tasks for an observer, without a Task for each at once."""

    __slots__ = ("dag", "ids")

    def __init__(self, dag: DAG, ids: Sequence[int]) -> None:
        self.dag = dag
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[Task]:
        return map(self.dag.task, self.ids)


# A task's TaskOptions, read in C: three property reads a task cost far more.
options_of = attrgetter("_options")


def options_among(tasks: Iterable[Optioned]) -> Iterator[TaskOptions]:
    """The options of ``tasks``, each run of equal ones once (for a set): tasks alike share
    one TaskOptions, compared by identity (~25 ns a task; a set hashes each, ~85)."""
    return map(itemgetter(0), groupby(map(options_of, tasks)))


class ArrayRange(Protocol):
    """What a DAG knows of each of its task arrays (``pmc.dag.arrays.Array``)."""

    name: str
    first: int  # member i's id is first + i
    n: int
    command: str

    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...


class DAG:
    """Tasks in DAG order plus edges in compressed (CSR) form: small for a million tasks.

    ``index`` maps each name to its id and holds them in DAG order (ids 0, 1, 2, ...).
    A big DAG's parse leaves it to be built on first use (``index=None``): ten million
    names cost a parse 15 s, and a run that looks no task up by name (no rescue log, no
    open workflow) never needs them.

    ``tasks`` holds placeholders, each standing for many tasks and carrying their
    options (what the engine needs to rank a ready task), the Task made when asked
    (``task``): for a parsed task the placeholder of its options in its parse
    (``pmc.dag.parsed``). A DAG made in code holds its Tasks themselves.

    Task arrays (a pmc extension, ``pmc.dag.arrays``) take a range of ids each: a hidden
    join node, the members, another join. ``tasks`` holds for each member the array's
    one placeholder, and for each join the array's join placeholder; ``index`` holds no
    member (a member's id is found by arithmetic, ``id_of``). ``len(dag)`` counts ids,
    ``ntasks`` the tasks."""

    __slots__ = ("_changes", "_counted", "_index", "_kinds", "arrays", "child_list",
                 "child_start", "made", "nparents", "path", "tasks")

    def __init__(
        self,
        path: str,
        tasks: list[Optioned],
        index: dict[str, int] | None,
        child_start: array[int],
        child_list: array[int],
        nparents: array[int],
        arrays: Mapping[str, ArrayRange] | None = None,
    ) -> None:
        self.path = path
        self.tasks = tasks
        # ``tasks``, read where every id is known to hold its Task: a parsed task's and an
        # array member's from the moment it is taken to run until its last try has ended
        # (``pmc.runtime.placement``, the master's ``complete``). The same list, an
        # attribute: the master reads it several times a task.
        self.made = cast(list[Task], tasks)
        self._index = index
        self.child_start = child_start  # len(tasks) + 1 offsets into child_list
        self.child_list = child_list
        self.nparents = nparents
        # By name, in DAG order: the reader's dict itself (an open run adds to it).
        self.arrays = cast(dict[str, ArrayRange], arrays) if arrays else {}
        self._kinds: set[TaskOptions] = set()  # the distinct options of the first
        self._counted = 0  # so many tasks, while no option was set since:
        self._changes = _changes[0]

    def counted_kinds(self, kinds: set[TaskOptions], counted: int) -> None:
        """The distinct options of the first ``counted`` tasks (the reader's)."""
        self._kinds, self._counted = kinds, counted

    def option_kinds(self) -> AbstractSet[TaskOptions]:
        """The distinct options of every task (a task array's members: the array's; its
        joins: JOIN_OPTIONS). Counted once, and a task added since when asked again."""
        if self._changes != _changes[0]:  # an option set since: count again
            self._kinds, self._counted, self._changes = set(), 0, _changes[0]
        tasks = self.tasks
        if self._counted < len(tasks):
            self._kinds.update(options_among(islice(tasks, self._counted, None)))
            self._counted = len(tasks)
        return self._kinds

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def index(self) -> dict[str, int]:
        """Each task's id by name (array members are in no index: ``id_of``)."""
        if self._index is None:
            # (Each placeholder asked directly, in a list: a third less time than
            # through name_of, 1.1-1.4 s a million names against 1.6-1.8.)
            self._index = name_index([t.name_of(i) for i, t in enumerate(self.tasks)])
        return self._index

    def id_objects(self) -> Iterable[int]:
        """Every id in order: the index's own int objects where it is built and holds
        them all (no task arrays), else new ones."""
        if self._index is not None and not self.arrays:
            return self._index.values()
        return range(len(self.tasks))

    @property
    def ntasks(self) -> int:
        """The tasks: plain ones and array members, not the joins."""
        return len(self.tasks) - 2 * len(self.arrays)

    def children(self, task_id: int) -> Sequence[int]:
        return self.child_list[self.child_start[task_id] : self.child_start[task_id + 1]]

    def edge_count(self) -> int:
        return len(self.child_list)

    def task(self, task_id: int) -> Task:
        """The Task of an id: an array member not made yet is made (and not kept)."""
        return self.tasks[task_id].made(task_id)

    def name_of(self, task_id: int) -> str:
        """A task's name, without making a member (a join: its array's name)."""
        return self.tasks[task_id].name_of(task_id)

    def command_of(self, task_id: int) -> str:
        """A task's command, without making a Task for it."""
        return self.tasks[task_id].command_of(task_id)

    def id_of(self, name: str) -> int | None:
        """The id of a task or array member by name; None if the DAG has no such."""
        found = self.index.get(name)
        if found is None and self.arrays:
            return member_id(self.arrays, name)
        return found


def name_index(names: Iterable[str]) -> dict[str, int]:
    """Each task's id by name, ``names`` being a DAG's from id 0 (a name given twice: the
    last task's, and fewer entries than tasks)."""
    return dict(zip(names, count()))


def member_id(arrays: Mapping[str, ArrayRange], name: str) -> int | None:
    """The id of array member ``NAME[INDEX]`` (INDEX written as ``str`` writes it), or
    None: by arithmetic, members being in no index."""
    if not name.endswith("]"):
        return None
    cut = name.rfind("[")
    owner = arrays.get(name[:cut])
    digits = name[cut + 1 : -1]
    if owner is None or not (digits.isdigit() and digits.isascii()) or (
            digits[0] == "0" and len(digits) > 1):
        return None
    index = int(digits)
    return owner.first + index if index < owner.n else None


# Where the words of a command end: the blanks of C's isspace() in the C locale, as the
