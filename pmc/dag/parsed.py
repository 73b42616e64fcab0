"""The parser's fast-path tasks: the classes a parse makes its tasks of.

Such a task is a ``Task`` of four slots (``pmc.dag.model``): its line is kept by the parse,
in one table of four bytes a task, and its id is given when the DAG hands it out
(``DAG.task``, ``Task.made``), as the int object of whoever asked: the parse makes none,
where ten million of them took 320 MB before the first task could start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from pmc.dag.model import Optioned, Task

_ID_SLOT = Task.__dict__["id"]  # the slot itself, under the parsed classes' ``id``


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
        "id": property(get_id, _ID_SLOT.__set__, doc="The task's id (see parsed_classes).")}))
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
