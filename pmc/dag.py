"""The DAG file: Task, DAG and ``parse_dag``.

Owns the PMC DAG format (TASK and EDGE records, ``#`` comments, ``#@`` Pegasus lines,
shell-style quoting, task options). No I/O beyond reading the file. Every error names
file:line and the offending text.
"""

from __future__ import annotations

import shlex
from array import array
from collections.abc import Sequence


class DagError(Exception):
    """A DAG file that cannot be run; ``str()`` is the one message for the user."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.message = message


class Task:
    """One TASK record. ``id`` is its index in DAG order; ``command`` is the raw text of
    executable and arguments, split only at launch (``split_command``)."""

    __slots__ = (
        "command",
        "cpus",
        "expected_runtime",
        "file_forwards",
        "id",
        "line",
        "memory",
        "name",
        "pegasus_id",
        "pipe_forwards",
        "priority",
        "tries",
    )

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
    ) -> None:
        self.id = id
        self.name = name
        self.command = command
        self.memory = memory  # MB; 0 = not considered
        self.cpus = cpus
        self.tries = tries  # None = the run's --tries
        self.priority = priority
        self.pipe_forwards = pipe_forwards  # ((VAR, FILE), ...)
        self.file_forwards = file_forwards  # ((SRC, DEST), ...)
        self.pegasus_id = pegasus_id  # SEQ of a "#@ SEQ TRANSFORMATION DAX_ID" line
        self.expected_runtime = expected_runtime  # seconds (extension option)
        self.line = line

    def __repr__(self) -> str:
        return f"Task({self.id}, {self.name!r}, {self.command!r})"


class DAG:
    """Tasks in DAG order plus edges in compressed (CSR) form: small for a million tasks."""

    __slots__ = ("child_list", "child_start", "index", "nparents", "path", "tasks")

    def __init__(
        self,
        path: str,
        tasks: list[Task],
        index: dict[str, int],
        child_start: array[int],
        child_list: array[int],
        nparents: array[int],
    ) -> None:
        self.path = path
        self.tasks = tasks
        self.index = index
        self.child_start = child_start  # len(tasks) + 1 offsets into child_list
        self.child_list = child_list
        self.nparents = nparents

    def __len__(self) -> int:
        return len(self.tasks)

    def children(self, task_id: int) -> Sequence[int]:
        return self.child_list[self.child_start[task_id] : self.child_start[task_id + 1]]

    def edge_count(self) -> int:
        return len(self.child_list)


_QUOTES = frozenset("'\"\\")


def split_command(command: str) -> list[str]:
    """Split a task's command as a shell would split words (quotes, backslashes), but
    without any expansion: ``<``, ``|`` and ``$X`` reach the program literally."""
    if _QUOTES.isdisjoint(command):
        return command.split()
    return shlex.split(command, comments=False, posix=True)


def parse_dag(path: str) -> DAG:
    """Read and validate a DAG file; raise DagError on the first problem."""
    raise NotImplementedError  # filled in by the parser work
