"""``parse_dag``: read and validate a DAG file.

Owns the PMC DAG format's reading loop (TASK and EDGE records, ``#`` comments, ``#@``
Pegasus lines) and what makes a DAG runnable: unique task ids, edges between known
tasks (a repeated edge counts once), no self edges, no cycles. No I/O beyond reading
the file. Every error names file:line and the offending text. The common lines are
taken here, inline; the rest by ``pmc.dag.taskline`` and ``pmc.dag.lines``; a big
file's EDGE lines are shared with ``pmc.dag.edgehelper``.
"""

from __future__ import annotations

import gc
import os
from array import array
from typing import BinaryIO

from pmc.dag import arrays as task_arrays
from pmc.dag import edgehelper
from pmc.dag.graph import EdgeTally, build_dag
from pmc.dag.lines import (
    decode_block,
    edge_ids,
    holds_edge,
    is_plain,
    read_runs,
    reason,
    show,
    split_fields,
)
from pmc.dag.model import (
    DAG,
    DEFAULT_OPTIONS,
    DagError,
    Optioned,
    Task,
    TaskOptions,
    name_index,
    options_among,
    options_of,
)
from pmc.dag.parsed import SEQ_LIMIT, Parsed, TaskSlot
from pmc.dag.taskline import SIMPLE_OPTIONS, option_values, parse_task, pegasus_seq
from pmc.dag.words import SPACE, has_quoting

_SIMPLE_OPTIONS = SIMPLE_OPTIONS.match
_NOT_CMD = "- \t\r"  # what a command cannot start with ("" is in it too: no command)

# Distinct option texts and values kept and shared: "-p" with a number per task is
# common. Past this many, a task with options no line before had gets a TaskOptions of
# its own (~100 bytes).
_KNOWN_OPTIONS = 1 << 16
# Bytes read and decoded at a time. Small enough that a block's bytes, text and lines
# stay in the CPU's cache while its lines are parsed, and that these short-lived buffers
# leave no holes in the heap: a megabyte cost a million-task parse 10 MB of peak RSS.
_CHUNK = 1 << 16


def parse_dag(path: str) -> DAG:
    """Read and validate a DAG file; raise DagError on the first problem.

    Problems within a line are reported in file order; cycles once the whole file has
    been read. A big file's EDGE lines are shared with a helper
    process (``pmc.dag.edgehelper``); should that fail, or the file hold an error, the file
    is parsed again alone, and the error is the one the serial parse finds first.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except (OSError, ValueError) as e:
        raise DagError(path, None, f"cannot read DAG file: {reason(e)}") from None
    # A million Task objects would trigger dozens of full collections that find
    # nothing: parsing creates no reference cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with f:
            helper = _start_helper(path, f)
            if helper is not None:
                try:
                    return _parse(path, f, helper)
                except (DagError, _HelperFailed):
                    f.seek(0)
                finally:
                    helper.stop()
            return _parse(path, f)
    finally:
        if collecting:
            gc.enable()


class _HelperFailed(Exception):
    """The edge helper gave no usable result: parse the file alone."""


def _start_helper(path: str, f: BinaryIO) -> edgehelper.EdgeHelper | None:
    """An edge helper for a big file, or None."""
    try:
        size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    if size < edgehelper.MIN_BYTES:
        return None
    try:
        return edgehelper.EdgeHelper(path, size, _CHUNK)
    except OSError:
        return None


def _parse(path: str, f: BinaryIO, helper: edgehelper.EdgeHelper | None = None) -> DAG:
    # With a helper, the name index waits until an EDGE line of ours needs it: the
    # helper checks that no two TASK lines share a name, and may resolve every EDGE line.
    reader = _Reader(path, lazy=helper is not None)
    split = -1  # the byte offset from which EDGE lines are the helper's; -1: none are
    nlines = 0  # the lines before this block
    for offset, data in read_runs(path, f, _CHUNK):
        if helper is not None:
            if split < 0 and holds_edge(data):
                split = helper.split_offset(offset, reader.unindexed())
                if split < 0:  # the helper has gone: nothing of ours was skipped yet
                    helper.stop()
                    helper = None
                    reader.need_index()
            if 0 <= split <= offset:
                break  # the helper's share: only the runs it maps are read, below
        nlines += reader.take_run(nlines, data, False)
        if helper is not None and reader.arrays:
            # EDGE lines naming arrays are the reader's alone: parse on without the
            # helper.
            helper.stop()
            helper = None
            split = -1
    if split < 0:
        reader.need_index()  # (no EDGE line: the helper was never asked)
    backward = reader.backward
    tally = None
    if split >= 0:
        assert helper is not None
        _read_theirs(f, reader, helper)
        # The helper's edges follow every one of ours in the file.
        ours = len(reader.parents)
        tally = EdgeTally(len(reader.tasks))
        theirs_backward = helper.result(len(reader.tasks), reader.parents, reader.children,
                                        tally)
        if theirs_backward is None:
            raise _HelperFailed
        backward = backward or theirs_backward
        if backward:
            # Their line numbers would only be shown in an error, and an error makes
            # parse_dag parse again alone.
            reader.edge_lines.frombytes(bytes(4 * (len(reader.parents) - ours)))
    if reader.arrays:
        task_arrays.check_names(path, reader.tasks, reader.need_index(), reader.arrays)
    # build_dag lets each of these go once it is used up: nothing else may hold them.
    edges = [reader.parents, reader.children, reader.edge_lines]
    reader.parents = reader.children = reader.edge_lines = array("I")
    dag = build_dag(path, reader.tasks, reader.index, edges, backward, reader.arrays, tally)
    # The helper checks the task names last (seconds at ten million tasks): the DAG is
    # built meanwhile.
    if split >= 0 and helper is not None and not helper.names_unique():
        raise _HelperFailed
    dag.counted_kinds(reader.kinds, len(reader.tasks))
    return dag


def _read_theirs(f: BinaryIO, reader: _Reader, helper: edgehelper.EdgeHelper) -> None:
    """The runs of the helper's share that hold more than EDGE lines (TASK lines,
    comments), as the helper maps them: their EDGE lines are the helper's. The rest
    of its share is not even read here: a NUL, a byte that is not UTF-8 or any record
    but an EDGE there fails the helper, and the parse alone then reports it."""
    mapped = helper.runs_to_read()
    if mapped is None:
        raise _HelperFailed
    for offset, length, before in mapped:
        try:
            data = os.pread(f.fileno(), length, offset)
        except OSError:
            raise _HelperFailed from None  # the parse alone reports it
        if len(data) != length:
            raise _HelperFailed  # the file changed
        reader.take_run(before, data, True)
        if reader.arrays:  # EDGE lines naming arrays are the reader's alone
            raise _HelperFailed


class _Reader:
    """What the lines read so far have made: tasks, their index by name, edges (the
    line numbers beside them), the Pegasus id waiting for the next TASK line.

    ``take`` reads a block of lines at a time, its state in local variables while it
    does: the loop over a million lines is the parse's cost, and every attribute or
    call inside it would be paid per line."""

    __slots__ = ("arrays", "backward", "children", "edge_lines", "index", "kinds",
                 "options", "parents", "parsed", "path", "pegasus", "tasks")

    def __init__(self, path: str, lazy: bool = False) -> None:
        self.path = path
        self.tasks: list[Optioned] = []
        # None (``lazy``) until need_index: an edge helper checks the names meanwhile.
        self.index: dict[str, int] | None = None if lazy else {}
        # "I", not "i": array("i") converts every item through PyArg_Parse, several times
        # slower than the unsigned types (a million edges make three million appends).
        self.parents = array("I")
        self.children = array("I")
        self.edge_lines = array("I")
        self.backward = False  # an edge to a task defined earlier: only such can close a cycle
        self.pegasus: str | int | None = None
        self.options = _SharedOptions()
        self.arrays: dict[str, task_arrays.Array] = {}  # task arrays (a pmc extension)
        self.parsed = Parsed()  # each task's name, command, line, Pegasus id
        # The distinct options of the tasks read (DAG.option_kinds), gathered as they are:
        # a pass over ten million tasks afterwards takes a quarter of a second or more.
        self.kinds: set[TaskOptions] = set()

    def take_run(self, before: int, data: bytes, theirs: bool) -> int:
        """Decode a run of whole lines and ``take`` them, from line ``before + 1`` on; how
        many. The first bad line raises its DagError once the lines above it are read."""
        lines, error = decode_block(self.path, before, data)
        quoting = b"'" in data or b'"' in data or b"\\" in data
        self.take(before, lines, is_plain(data), quoting, theirs)
        if error is not None:
            raise error
        return len(lines)

    def take(self, before: int, lines: list[str], plain: bool, quoting: bool,
             theirs: bool) -> None:
        """Read ``lines`` from line ``before + 1`` on (``plain``: is_plain vouches for them;
        ``quoting``: they may quote; ``theirs``: their EDGEs are the edge helper's)."""
        path, tasks, index, shared, arrays = (self.path, self.tasks, self.index, self.options,
                                              self.arrays)
        add_task, add_parent, add_kind = tasks.append, self.parents.append, self.kinds.add
        add_child, add_line = self.children.append, self.edge_lines.append
        pegasus, backward = self.pegasus, self.backward
        prefix, cut, last_options, kind_seen = shared.prefix, shared.cut, shared.last, None
        parsed = self.parsed
        slot = parsed.slot(last_options)  # (set again with kind_seen)
        add_at, add_text, seqs = parsed.lines.append, parsed.texts.append, parsed.seqs
        add_seq, slot_of = seqs.append, parsed.slot
        for lineno, line in enumerate(lines, before + 1):
            # At most three fields: the rest of a TASK line is its command, kept as
            # written; the rest of an EDGE line must be exactly one name.
            parts = line.split(None, 2) if plain else split_fields(line)
            kind = parts[0] if parts else "#"  # (a blank line reads as a comment)
            if kind == "EDGE":
                if theirs:
                    continue
                index = self.need_index() if index is None else index
                try:
                    p, c = index[parts[1]], index[parts[2]]
                except (KeyError, IndexError):
                    if arrays:  # it may name an array or a member
                        backward = self.array_edge(lineno, line) or backward
                        continue
                    p, c = edge_ids(path, lineno, line, index)
                if p >= c:  # (a self edge raises)
                    backward = _backward(path, lineno, line, p, c, parts[1])
                add_parent(p)
                add_child(c)
                add_line(lineno)
            elif kind == "TASK":
                tid, command = len(tasks), None
                if len(parts) == 3 and parts[1][0] != "-" and not (quoting
                                                                  and has_quoting(parts[2])):
                    rest = parts[2]
                    if rest[0] != "-" and (plain or rest[0] not in SPACE):
                        # The common line: no options, no quotes. (split_fields leaves no
                        # trailing blank; rstrip() would also take Unicode spaces.)
                        command = rest.rstrip() if plain else rest
                        opts = DEFAULT_OPTIONS
                    elif plain and rest.startswith(prefix) and rest[cut : cut + 1] not in _NOT_CMD:
                        command = rest[cut:].rstrip()  # the options of the last line with some
                        opts = last_options
                    elif plain:
                        command, opts = shared.split(rest)
                        prefix, cut, last_options = shared.prefix, shared.cut, shared.last
                if command is not None:
                    name = parts[1]
                    if opts is not kind_seen:  # (tasks alike come in runs: an add a run)
                        kind_seen = add_kind(opts) or opts
                        slot = slot_of(opts)
                else:
                    general = self.general_task(lineno, line, parts, tid, pegasus)
                    prefix, cut, last_options = shared.prefix, shared.cut, shared.last
                    kind_seen = None  # (a new slot after an array: Parsed.skip)
                    if general is None:  # a task array (extension), its members taken
                        pegasus, index = None, self.index  # (the index, built for it)
                        continue
                    name, command, slot = general.name, general.command, slot_of(general._options)
                if pegasus is not None:
                    if isinstance(pegasus, int) and pegasus < SEQ_LIMIT and len(seqs) == tid:
                        add_seq(pegasus)  # (the usual: every task has one)
                    else:
                        parsed.add_seq(tid, pegasus)
                    pegasus = None
                if index is not None and index.setdefault(name, tid) != tid:
                    raise _duplicate(path, lineno, line, name, parsed.lines[index[name]])
                add_task(slot)
                add_text(f"{name}\n{command}".encode())  # one bytes object (pmc.dag.parsed)
                add_at(lineno)
            elif kind.startswith("#@"):
                pegasus = _seq(path, lineno, line, parts, plain)
            elif kind[0] != "#":
                raise _unknown(path, lineno, line, kind)
        self.pegasus, self.backward = pegasus, backward

    def general_task(self, lineno: int, line: str, parts: list[str], tid: int,
                     pegasus: int | str | None) -> Task | None:
        """A TASK line the fast path did not take (options, quotes): its task, or None
        for a task array, whose members are added here."""
        shared, tasks = self.options, self.tasks
        parsed = parse_task(self.path, lineno, line, parts, tid)
        if isinstance(parsed, task_arrays.ArrayDef):
            task_arrays.define(parsed, self.path, line, tasks, self.need_index(), self.arrays,
                               pegasus)
            self.parsed.skip(len(tasks) - tid, lineno)
            self.kinds.update(options_among(tasks[tid:]))
            shared.waiting = None
            return None
        if shared.waiting is not None:
            shared.learn(parsed)
        self.kinds.add(options_of(parsed))
        return parsed

    def array_edge(self, lineno: int, line: str) -> bool:
        """An EDGE line the fast path could not take in a DAG with task arrays."""
        edges = task_arrays.Edges(self.parents, self.children, self.edge_lines)
        return task_arrays.edge(self.path, lineno, line, self.need_index(), self.arrays, edges)

    def unindexed(self) -> int:
        """The tasks need_index would have to add to the index."""
        return len(self.tasks) if self.index is None else 0

    def need_index(self) -> dict[str, int]:
        """The name index, built from the tasks read so far if it was left for later;
        a name twice among them makes the parse start again alone, which reports it."""
        if self.index is None:
            # (No task array yet, which would need the index: every id has its text.)
            self.index = name_index(self.parsed.names())
            if len(self.index) < len(self.tasks):
                raise _HelperFailed
        return self.index


class _SharedOptions:
    """Options as planners write them, the same on many lines (``-m 1 -c 1``): parsed
    once, then one TaskOptions shared by every line whose option text is equal (or whose
    options are). Only for lines that ``is_plain`` vouches for."""

    __slots__ = ("cut", "known", "last", "prefix", "waiting")

    def __init__(self) -> None:
        # option text (and TaskOptions) -> the shared TaskOptions
        self.known: dict[object, TaskOptions] = {}
        self.prefix = "\n"  # the option text of the last line that had some (no line has this)
        self.last = DEFAULT_OPTIONS
        self.cut = 1
        self.waiting: str | None = None  # a prefix parse_task is to read (see learn)

    def split(self, rest: str) -> tuple[str | None, TaskOptions]:
        """The command and options of a TASK line's ``rest`` (after its id) that starts
        with an option other than the last line's; (None, ...) when ``parse_task`` must
        read the line."""
        m = _SIMPLE_OPTIONS(rest)
        if m is None:
            return None, DEFAULT_OPTIONS
        prefix = m.group()
        known = self.known
        found = known.get(prefix)
        if found is None and (found := option_values(prefix)) is not None:
            # Equal options, one object; a new text is kept while there is room ("-p 17"
            # on one line, "-p 18" on the next).
            found = known.get(found, found)
            if len(known) < _KNOWN_OPTIONS:
                known[prefix] = known[found] = found
        if found is None:  # whole numbers only: parse_task reads the rest
            self.waiting = prefix
            return None, DEFAULT_OPTIONS
        self.last = found
        self.prefix = prefix
        self.cut = len(prefix)
        return rest[m.end() :].rstrip(), found

    def learn(self, task: Task) -> bool:
        """After ``parse_task`` read a line whose options were a prefix alone (the
        command starts right after it): share its options. Whether the last options
        changed."""
        prefix = self.waiting
        self.waiting = None
        known = self.known
        if prefix is None or len(known) >= _KNOWN_OPTIONS:
            return False
        found = known[prefix] = known.get(task._options, task._options)
        known[task._options] = found
        task._options = self.last = found
        self.prefix = prefix
        self.cut = len(prefix)
        return True


def _seq(path: str, lineno: int, line: str, parts: list[str], plain: bool) -> int | str:
    """The SEQ of a "#@ SEQ TRANSFORMATION DAX_ID ..." line: an int when it reads back
    the same (kept so in four bytes: ``pmc.dag.parsed``). In an is_plain block, two
    fields or more after SEQ need no second look."""
    if parts[0] == "#@" and plain and len(parts) == 3 and (
            " " in (tail := parts[2].rstrip()) or "\t" in tail or "\r" in tail):
        seq = parts[1]
        return int(seq) if seq.isdigit() and seq[0] != "0" else seq
    return pegasus_seq(path, lineno, line)


def _backward(path: str, lineno: int, line: str, p: int, c: int, name: str) -> bool:
    """True: an edge from ``p`` to ``c <= p``, a task defined earlier (only such edges can
    close a cycle); a self edge raises."""
    if p == c:
        raise DagError(
            path, lineno, f"self edge: task {name!r} cannot depend on itself: {show(line)}")
    return True


def _duplicate(path: str, lineno: int, line: str, name: str, first: int) -> DagError:
    return DagError(
        path, lineno, f"duplicate task id {name!r} (first defined at line {first}): {show(line)}"
    )


def _unknown(path: str, lineno: int, line: str, kind: str) -> DagError:
    return DagError(
        path, lineno, f"unknown record type {show(kind)} (expected TASK or EDGE): {show(line)}"
    )


def read_task_lines(path: str, lines: list[str], before: int = 0,
                    ) -> tuple[list[Optioned], dict[str, int], dict[str, task_arrays.Array]]:
    """The TASK lines (and comments) of ``lines``, numbered from ``before + 1``, read as
    ``parse_dag`` reads them: (tasks, their index by name, task arrays), each task made.
    An EDGE line must have been blanked by the caller (``pmc.dag.extend`` reads those
    itself)."""
    reader = _Reader(path)
    reader.take(before, lines, False, True, False)
    tasks = [t.made(i) if isinstance(t, TaskSlot) else t for i, t in enumerate(reader.tasks)]
    return tasks, reader.need_index(), reader.arrays
