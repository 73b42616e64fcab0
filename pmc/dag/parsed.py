"""A parse's tasks: its tables by id, and the placeholders ``DAG.tasks`` holds for them.

A parsed task is no object of its own until it is taken to run: ``DAG.tasks`` holds, for
each, the ``TaskSlot`` of its options (one for all the tasks of a parse that share a
``TaskOptions``), and the parse's ``Parsed`` tables hold the rest by id: its name and
command as one bytes object, the UTF-8 of ``NAME\\nCOMMAND`` (no name holds a line end),
its line, and its Pegasus id. ``TaskSlot.made`` makes its Task (``pmc.dag.model.MadeTask``)
from them when asked. Ten million tasks cost 640 MB less so than as Task objects.

The ids of a task array (``pmc.dag.arrays``) have no text: a slot reads the text of id
``i`` at ``i - offset``, ``offset`` the ids of the arrays before (its slots are new after
each array), so an array's million members cost the texts nothing.
"""

from __future__ import annotations

from array import array

from pmc.dag.model import MadeTask, Optioned, TaskOptions, new_task

# A Pegasus SEQ kept in the table of four bytes a task: a plain decimal below this (no
# leading zero, so never 0: 0 there is none). Any other is kept by id in a dict.
SEQ_LIMIT = 1 << 32


class Parsed:
    """A parse's tables: ``texts`` (NAME\\nCOMMAND in UTF-8, by id less the array ids
    before), ``lines`` (where each id was defined), the tasks' Pegasus ids by id."""

    __slots__ = ("_slots", "lines", "offset", "other_seqs", "seqs", "texts")

    def __init__(self) -> None:
        self.texts: list[bytes] = []
        self.offset = 0  # the ids of task arrays so far: they have no text
        self.lines = array("I")
        # SEQ by id: an id past its end, or 0 there, has none (or one in other_seqs).
        self.seqs = array("I")
        self.other_seqs: dict[int, str] = {}
        self._slots: dict[TaskOptions, TaskSlot] = {}

    def slot(self, options: TaskOptions) -> TaskSlot:
        """The placeholder of this parse's tasks with ``options``."""
        found = self._slots.get(options)
        if found is None:
            found = self._slots[options] = TaskSlot(options, self)
        return found

    def skip(self, n: int, line: int) -> None:
        """A task array's ``n`` ids (joins and members), defined at ``line``."""
        self.lines.extend(array("I", [line]) * n)
        self.offset += n
        self._slots = {}

    def add_seq(self, task_id: int, seq: int | str) -> None:
        """Task ``task_id`` has a Pegasus id (the parse's loop appends the usual one
        itself: an int below SEQ_LIMIT, ids in order)."""
        if isinstance(seq, int) and seq < SEQ_LIMIT:
            seqs = self.seqs
            seqs.frombytes(bytes(4 * (task_id - len(seqs))))
            seqs.append(seq)
        else:
            self.other_seqs[task_id] = str(seq)

    def seq_of(self, task_id: int) -> str | None:
        seqs = self.seqs
        if task_id < len(seqs) and seqs[task_id]:
            return str(seqs[task_id])
        return self.other_seqs.get(task_id) if self.other_seqs else None

    def names(self) -> list[str]:
        """Every task's name by id (a parse without task arrays: each id has its text)."""
        return [text.partition(b"\n")[0].decode() for text in self.texts]

    def made(self, task_id: int, slot: TaskSlot) -> MadeTask:
        task = new_task(MadeTask)
        name, _, command = self.texts[task_id - slot.offset].partition(b"\n")
        task.id, task.name, task.command = task_id, name.decode(), command.decode()
        task._options, task.line, task.slot = slot._options, self.lines[task_id], slot
        seq = self.seq_of(task_id)
        if seq is not None:
            task._pegasus = seq
        return task


class TaskSlot(Optioned):
    """What ``DAG.tasks`` holds for every parsed task of one ``TaskOptions`` not taken to
    run (``pmc.runtime.placement`` puts its Task there while it runs)."""

    __slots__ = ("_options", "offset", "parsed")

    def __init__(self, options: TaskOptions, parsed: Parsed) -> None:
        self._options = options
        self.parsed = parsed
        self.offset = parsed.offset  # its tasks' texts: at their ids less this

    def made(self, task_id: int) -> MadeTask:
        return self.parsed.made(task_id, self)

    def name_of(self, task_id: int) -> str:
        # (a partition and a decode: 0.33 µs a read)
        return self.parsed.texts[task_id - self.offset].partition(b"\n")[0].decode()

    def command_of(self, task_id: int) -> str:
        return self.parsed.texts[task_id - self.offset].partition(b"\n")[2].decode()

    def __repr__(self) -> str:
        return f"TaskSlot({self._options!r})"
