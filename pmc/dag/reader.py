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

from pmc.dag import edgehelper
from pmc.dag.graph import build_dag
from pmc.dag.lines import edge_ids, is_plain, read_blocks, reason, show, split_fields
from pmc.dag.model import DAG, DEFAULT_OPTIONS, DagError, Task, TaskOptions, new_task
from pmc.dag.taskline import SIMPLE_OPTIONS, option_values, parse_task, pegasus_seq
from pmc.dag.words import has_quoting

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
    tasks: list[Task] = []
    index: dict[str, int] = {}
    # "I", not "i": array("i") converts every item through PyArg_Parse, several times
    # slower than the unsigned types (a million edges make three million appends).
    parents = array("I")
    children = array("I")
    edge_lines = array("I")
    add_task = tasks.append
    add_parent = parents.append
    add_child = children.append
    add_line = edge_lines.append
    pegasus: str | int | None = None
    last_command = ""
    known: dict[object, TaskOptions] = {}  # option text (and TaskOptions) -> shared TaskOptions
    last_prefix = "\n"  # the option text of the last line that had some (no line has this)
    last_options = DEFAULT_OPTIONS
    cut = 1
    simple_options = SIMPLE_OPTIONS.match
    backward = False
    split = -1  # the byte offset from which EDGE lines are the helper's; -1: none are
    theirs = False  # are this block's EDGE lines the helper's?
    nlines = 0
    for offset, before, data, lines in read_blocks(path, f, _CHUNK):
        nlines = before + len(lines)
        if helper is not None:
            if split < 0 and b"EDGE" in data:
                split = helper.split_offset(offset)
            theirs = 0 <= split <= offset
            if theirs and data.startswith(b"EDGE ") + data.count(b"\nEDGE ") == len(lines):
                continue  # nothing but the helper's EDGE lines
        quoting = b"'" in data or b'"' in data or b"\\" in data
        plain = is_plain(data)
        for lineno, line in enumerate(lines, before + 1):
            # At most three fields: the rest of a TASK line is its command, kept as
            # written; the rest of an EDGE line must be exactly one name.
            parts = line.split(None, 2) if plain else split_fields(line)
            if not parts:
                continue
            kind = parts[0]
            if kind == "EDGE":
                if theirs:
                    continue
                try:
                    p = index[parts[1]]
                    c = index[parts[2]]
                except (KeyError, IndexError):
                    p, c = edge_ids(path, lineno, line, index)
                if p >= c:
                    if p == c:
                        raise DagError(
                            path,
                            lineno,
                            f"self edge: task {parts[1]!r} cannot depend on itself: {show(line)}",
                        )
                    # Only an edge to a task defined earlier can close a cycle.
                    backward = True
                add_parent(p)
                add_child(c)
                add_line(lineno)
            elif kind == "TASK":
                tid = len(tasks)
                command = None
                prefix = None
                if (
                    len(parts) == 3
                    and parts[1][0] != "-"
                    and not (quoting and has_quoting(parts[2]))
                ):
                    rest = parts[2]
                    if rest[0] != "-":
                        # The common line: no options, no quotes. (split_fields leaves no
                        # trailing blank; rstrip() would also take Unicode spaces.)
                        command = rest.rstrip() if plain else rest
                        options = DEFAULT_OPTIONS
                    elif (
                        plain
                        and rest.startswith(last_prefix)
                        and rest[cut : cut + 1] not in "- \t\r"  # "" is in it too
                    ):
                        # The same options as the last line that had some.
                        command = rest[cut:].rstrip()
                        options = last_options
                    elif plain and (m := simple_options(rest)) is not None:
                        # Options as planners write them, the same on many lines
                        # ("-m 1 -c 1"): parsed once, then shared; whole numbers here,
                        # the rest by parse_task (below).
                        prefix = m.group()
                        found = known.get(prefix)
                        if found is None and (found := option_values(prefix)) is not None:
                            # Equal options, one object; a new text is kept while
                            # there is room ("-p 17" on one line, "-p 18" on the next).
                            found = known.get(found, found)
                            if len(known) < _KNOWN_OPTIONS:
                                known[prefix] = known[found] = found
                        if found is not None:
                            command = rest[m.end() :].rstrip()
                            options = last_options = found
                            last_prefix = prefix
                            cut = len(prefix)
                if command is not None:
                    # Generated DAGs often repeat one command: keep one copy of a run.
                    if command == last_command:
                        command = last_command
                    last_command = command
                    # Task(tid, parts[1], command, line=lineno), made without calling
                    # the class: in Python 3.11 that call costs three times these lines.
                    task = new_task(Task)
                    task.id = tid
                    task.name = parts[1]
                    task.command = command
                    task._line_after_id = lineno - tid
                    task._options = options
                else:
                    task = parse_task(path, lineno, line, parts, tid)
                    if prefix is not None and len(known) < _KNOWN_OPTIONS:
                        # The options came from the prefix alone: the command starts
                        # right after it. Equal options, one object.
                        found = known[prefix] = known.get(task._options, task._options)
                        known[task._options] = found
                        task._options = last_options = found
                        last_prefix = prefix
                        cut = len(prefix)
                if pegasus is not None:
                    # A plain decimal SEQ is kept as its distance from the id (see
                    # Task.pegasus_id): one shared small int when SEQ counts with it.
                    task._pegasus = pegasus - tid if isinstance(pegasus, int) else pegasus
                    task._line_after_id = lineno - 2 * tid  # see Task.line
                    pegasus = None
                if index.setdefault(task.name, tid) != tid:
                    first = tasks[index[task.name]].line
                    raise DagError(
                        path,
                        lineno,
                        f"duplicate task id {task.name!r} (first defined at line {first}): "
                        f"{show(line)}",
                    )
                add_task(task)
            elif (
                kind == "#@"
                and plain
                and len(parts) == 3
                and (" " in (tail := parts[2].rstrip()) or "\t" in tail or "\r" in tail)
            ):
                # "#@ SEQ TRANSFORMATION DAX_ID ...", as Pegasus writes it before every
                # TASK line: in an is_plain block the rest, its trailing blanks cut,
                # holds two fields or more when it holds a blank. SEQ is an int when it
                # reads back the same (see Task.pegasus_id); ASCII in such a block.
                seq = parts[1]
                pegasus = int(seq) if seq.isdigit() and seq[0] != "0" else seq
            elif kind[0] == "#":
                if kind.startswith("#@"):
                    pegasus = pegasus_seq(path, lineno, line)
            else:
                raise DagError(
                    path,
                    lineno,
                    f"unknown record type {show(kind)} (expected TASK or EDGE): {show(line)}",
                )
    if split >= 0:
        assert helper is not None
        # The helper's edges follow every one of ours in the file.
        ours = len(parents)
        theirs_backward = helper.result(nlines, len(tasks), parents, children)
        if theirs_backward is None:
            raise _HelperFailed
        # Their line numbers would only be shown in an error, and an error makes
        # parse_dag parse again alone.
        edge_lines.frombytes(bytes(4 * (len(parents) - ours)))
        backward = backward or theirs_backward
    return build_dag(path, tasks, index, parents, children, edge_lines, backward)
