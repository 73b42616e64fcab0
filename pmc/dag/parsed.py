"""The parser's fast-path tasks: the classes a parse makes its tasks of.

Such a task is a ``Task`` (``pmc.dag.model``) of three slots in use: its line is kept by
the parse, in one table of four bytes a task, and its id is given when the DAG hands it
out (``DAG.task``, ``Task.made``), as the int object of whoever asked: the parse makes
none, where ten million of them took 320 MB before the first task could start. Its name
and command are one bytes object, the UTF-8 of ``NAME\nCOMMAND`` (no name holds a line
end): one object where a str and a bytes took 48 bytes more a task, 480 MB at ten million.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from pmc.dag.model import Optioned, Task

_ID_SLOT = Task.__dict__["id"]  # the slot itself, under the parsed classes' ``id``


def _name(task: Task) -> str:
    # (the slot read directly, then partition: 0.33 µs a read where the slot descriptor
    # called, a find and a slice took 0.84)
    return task._command.partition(b"\n")[0].decode()  # type: ignore[arg-type, union-attr]


def _command(task: Task) -> str:
    return task._command.partition(b"\n")[2].decode()  # type: ignore[arg-type, union-attr]


def _set_name(task: Task, name: str) -> None:
    if "\n" in name:
        raise ValueError(f"a task name cannot hold a line end: {name!r}")
    task._command = f"{name}\n{_command(task)}".encode()


def _set_command(task: Task, command: str) -> None:
    task._command = f"{_name(task)}\n{command}".encode()


def parsed_classes(lines: Sequence[int], tasks: Sequence[Optioned],
                   ) -> tuple[type[Task], type[Task]]:
    """The classes of a parse's fast-path tasks, their lines in ``lines`` and the tasks
    themselves in ``tasks`` (by id): one with room for a Pegasus id, one without. Where
    an id is read before the task was handed out (an error message's line, a walk over
    ``DAG.tasks``), every task of the parse is given its id then, at once."""

    def get_id(task: Task) -> int:
        try:
            return _ID_SLOT.__get__(task, Task)  # type: ignore[no-any-return]
        except AttributeError:
            give_ids(tasks)
            return _ID_SLOT.__get__(task, Task)  # type: ignore[no-any-return]

    plain = cast("type[Task]", type("Task", (Task,), {
        "__slots__": (), "_lines": lines, "__module__": Task.__module__, "__doc__": Task.__doc__,
        "id": property(get_id, _ID_SLOT.__set__, doc="The task's id (see parsed_classes)."),
        "name": property(_name, _set_name, doc="The task's name, as written."),
        "command": property(_command, _set_command, doc=Task.command.__doc__)}))
    pegasus = cast("type[Task]", type("PegasusTask", (plain,), {
        "__slots__": ("_pegasus",), "__module__": Task.__module__,
        "__doc__": "A parsed Task with a Pegasus id."}))
    return plain, pegasus


def give_ids(tasks: Sequence[Optioned]) -> None:
    """Give every Task of ``tasks`` its id, its place there, in one pass (a parse's
    tasks handed out all at once)."""
    for task_id, each in enumerate(tasks):
        if isinstance(each, Task):
            _ID_SLOT.__set__(each, task_id)
