"""The DAG file: Task, DAG and ``parse_dag``.

Owns the PMC DAG format (TASK and EDGE records, ``#`` comments, ``#@`` Pegasus lines,
shell-style quoting, task options) and everything that makes a DAG runnable: unique task
ids, edges between known tasks (a repeated edge counts once), no self edges, no cycles.
No I/O beyond reading the file. Every error names file:line and the offending text.

Extension to the reference format: the task option ``--expected-runtime SECONDS`` (a
non-negative number) sets ``Task.expected_runtime``. The reference rejects it as an
unknown option, so DAGs that use it only run here.
"""

from __future__ import annotations

import gc
import math
import os
import re
import struct
from array import array
from collections.abc import Iterator, Sequence
from itertools import accumulate, islice
from operator import le
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

if TYPE_CHECKING:
    from pmc.dag.edgehelper import EdgeHelper


class DagError(Exception):
    """A DAG file that cannot be run; ``str()`` is the one message for the user."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.message = message


class _Options(NamedTuple):
    """The task options most tasks leave at their defaults."""

    memory: int = 0  # MB; 0 = not considered
    cpus: int = 1
    tries: int | None = None  # None = the run's --tries
    priority: int = 0
    pipe_forwards: tuple[tuple[str, str], ...] | None = None  # ((VAR, FILE), ...)
    file_forwards: tuple[tuple[str, str], ...] | None = None  # ((SRC, DEST), ...)
    expected_runtime: float | None = None  # seconds (extension option)


_DEFAULTS = _Options()
_new_task = object.__new__  # a Task with no attributes set, for the parse loop


class Task:
    """One TASK record. ``id`` is its index in DAG order; ``command`` is the raw text of
    executable and arguments, split only at launch (``split_command``).

    The seven options live in one immutable ``_Options`` shared by every task that
    sets none of them, and by tasks whose option text is the same (``-m 1 -c 1`` on
    every line), so a task costs six slots instead of twelve (a million tasks: 48 MB
    less). They read and assign like plain attributes. The Pegasus id, different for
    every task that has one, has a slot of its own, left unset (None) by the others.
    ``line`` is kept as
    its distance from ``id``: in a DAG without comments between its TASK lines that is
    one small number Python shares, not a 32-byte int per task.
    """

    __slots__ = ("_line_after_id", "_options", "_pegasus", "command", "id", "name")
    _pegasus: str | int  # set only for a task with a Pegasus id

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
        ):
            self._options = _Options(
                memory,
                cpus,
                tries,
                priority,
                pipe_forwards,
                file_forwards,
                expected_runtime,
            )
        else:
            self._options = _DEFAULTS

    # In a Pegasus DAG every TASK line follows its "#@" line: a task with a Pegasus id
    # keeps its line as the distance from 2 * id, one shared small number again.
    @property
    def line(self) -> int:
        """The line of the DAG file the task was defined on (0: not from a file)."""
        if hasattr(self, "_pegasus"):
            return 2 * self.id + self._line_after_id
        return self.id + self._line_after_id

    @line.setter
    def line(self, value: int) -> None:
        self._line_after_id = value - (2 * self.id if hasattr(self, "_pegasus") else self.id)

    @property
    def memory(self) -> int:
        return self._options.memory

    @memory.setter
    def memory(self, value: int) -> None:
        self._options = self._options._replace(memory=value)

    @property
    def cpus(self) -> int:
        return self._options.cpus

    @cpus.setter
    def cpus(self, value: int) -> None:
        self._options = self._options._replace(cpus=value)

    @property
    def tries(self) -> int | None:
        return self._options.tries

    @tries.setter
    def tries(self, value: int | None) -> None:
        self._options = self._options._replace(tries=value)

    @property
    def priority(self) -> int:
        return self._options.priority

    @priority.setter
    def priority(self, value: int) -> None:
        self._options = self._options._replace(priority=value)

    @property
    def pipe_forwards(self) -> tuple[tuple[str, str], ...] | None:
        return self._options.pipe_forwards

    @pipe_forwards.setter
    def pipe_forwards(self, value: tuple[tuple[str, str], ...] | None) -> None:
        self._options = self._options._replace(pipe_forwards=value)

    @property
    def file_forwards(self) -> tuple[tuple[str, str], ...] | None:
        return self._options.file_forwards

    @file_forwards.setter
    def file_forwards(self, value: tuple[tuple[str, str], ...] | None) -> None:
        self._options = self._options._replace(file_forwards=value)

    @property
    def pegasus_id(self) -> str | None:
        """SEQ of the task's "#@ SEQ TRANSFORMATION DAX_ID" line, if it has one."""
        try:
            pegasus: str | int = self._pegasus
        except AttributeError:  # the slot of a task without one is never set
            return None
        # The parser keeps a plain decimal SEQ as an int: 28 bytes, not 56.
        return pegasus if type(pegasus) is str else str(pegasus)

    @pegasus_id.setter
    def pegasus_id(self, value: str | None) -> None:
        line = self.line
        if value is not None:
            self._pegasus = value
        elif hasattr(self, "_pegasus"):
            del self._pegasus
        self.line = line

    @property
    def expected_runtime(self) -> float | None:
        return self._options.expected_runtime

    @expected_runtime.setter
    def expected_runtime(self, value: float | None) -> None:
        self._options = self._options._replace(expected_runtime=value)

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


# Where the words of a command end: the blanks of C's isspace() in the C locale, as the
# reference's argument splitter uses. Not str.split()'s set, which also holds NBSP,
# U+3000, \x1c-\x1f and other Unicode spaces: a shell keeps those inside a word.
_SPACE = " \t\n\r\x0b\x0c"
_SPACE_RUN = re.compile("[" + _SPACE + "]+")
# Where the fields of a record end (TASK, id, command; EDGE, parent, child): the
# reference splits records at space, tab and CR (and LF, which never is inside a line),
# so a vertical tab or form feed belongs to the field it is in.
_BLANKS = " \t\r"
_BLANK_RUN = re.compile("[" + _BLANKS + "]+")
# Characters str.split() takes for blanks that neither set above does, in ASCII text.
_NOT_SPACE = re.compile("[\x1c-\x1f]")
_ODD_BYTES = (b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\x1f")


def _plain(data: bytes) -> bool:
    """Whether str.split() splits the lines of ``data`` at exactly the record blanks
    (space, tab, CR): true for ASCII text without vertical tab, form feed or
    \x1c-\x1f. Byte searches, a few microseconds per block."""
    return data.isascii() and all(odd not in data for odd in _ODD_BYTES)


def _fields(line: str) -> list[str]:
    """``line.split(None, 2)`` at the record blanks only (the rest keeps no trailing
    blank): for lines ``_plain`` does not vouch for."""
    text = line.strip(_BLANKS)
    return _BLANK_RUN.split(text, 2) if text else []


def _all_fields(line: str) -> list[str]:
    text = line.strip(_BLANKS)
    return _BLANK_RUN.split(text) if text else []


def _split_words(text: str) -> list[str]:
    """``text.split()`` at ``_SPACE`` only."""
    if text.isascii() and _NOT_SPACE.search(text) is None:
        return text.split()  # the same split, in C
    return [word for word in _SPACE_RUN.split(text) if word]


def _has_quoting(text: str) -> bool:
    # Three substring scans run in C; iterating the characters would not.
    return "'" in text or '"' in text or "\\" in text


def split_command(command: str) -> list[str]:
    """Split a task's command as a shell would split words (quotes, backslashes), but
    without any expansion: ``<``, ``|`` and ``$X`` reach the program literally.

    The rules are those of ``shlex.split(command, posix=True)`` with the blanks of C's
    isspace() (``_SPACE``); a bad quote raises ValueError. In linear time: shlex grows a
    word a character at a time, which takes minutes for a quoted argument a megabyte
    long.
    """
    if not _has_quoting(command):
        return _split_words(command)
    return _words(command)[0]


_SPECIAL = re.compile("[" + re.escape(_SPACE + "'\"\\") + "]")
_IN_DOUBLE = re.compile(r'["\\]')


def _words(text: str) -> tuple[list[str], list[int]]:
    """The shell words of ``text`` and the offset where each starts."""
    words: list[str] = []
    starts: list[int] = []
    word: list[str] = []
    in_word = False
    pos = 0
    n = len(text)
    while pos < n:
        m = _SPECIAL.search(text, pos)
        end = m.start() if m else n
        char = text[end] if m else ""
        if not in_word and (end > pos or (char and char not in _SPACE)):
            in_word = True
            starts.append(pos)
        word.append(text[pos:end])
        if char == "'":
            close = text.find("'", end + 1)
            if close < 0:
                raise ValueError("unterminated quote")
            word.append(text[end + 1 : close])
            pos = close + 1
        elif char == '"':
            pos = end + 1
            while True:
                q = _IN_DOUBLE.search(text, pos)
                if q is None or (q.end() == n and q.group() == "\\"):
                    raise ValueError("unterminated quote")
                k = q.start()
                word.append(text[pos:k])
                if text[k] == '"':
                    pos = k + 1
                    break
                # Inside double quotes a backslash escapes only " and itself.
                after = text[k + 1]
                word.append(after if after in '"\\' else "\\" + after)
                pos = k + 2
        elif char == "\\":
            if end + 1 == n:
                raise ValueError("backslash at end of line")
            word.append(text[end + 1])
            pos = end + 2
        else:  # a blank, or the end, ends the word
            if in_word:
                words.append("".join(word))
                in_word = False
            word.clear()
            pos = end + 1
    if in_word:  # the text ended inside a word, after a quote or an escape
        words.append("".join(word))
    return words, starts


_OPTIONS = {
    "-m": "memory",
    "--request-memory": "memory",
    "-c": "cpus",
    "--request-cpus": "cpus",
    "-t": "tries",
    "--tries": "tries",
    "-p": "priority",
    "--priority": "priority",
    "-f": "pipe",
    "--pipe-forward": "pipe",
    "-F": "file",
    "--file-forward": "file",
    "--expected-runtime": "runtime",
}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_FLOAT32 = struct.Struct("f")
# A TASK line's options that take one value, separate words, the value not starting
# with "-", up to the command (which does not start with "-" either): the text such
# options are written as in generated DAGs. Matched in blocks _plain vouches for.
_SIMPLE_OPTIONS = re.compile(
    r"(?:(?:-[mctp]|--(?:request-memory|request-cpus|tries|priority|expected-runtime))"
    r"[ \t\r]+[^- \t\r][^ \t\r]*[ \t\r]+)+(?=[^- \t\r])"
)
_KNOWN_OPTIONS = 4096  # distinct option texts kept: -p with a number per task is common
_INT64 = 2**63 - 1  # option values travel to workers; keep them in a C long long
# Bytes read and decoded at a time. Small enough that a block's bytes, text and lines
# stay in the CPU's cache while its lines are parsed, and that these short-lived buffers
# leave no holes in the heap: a megabyte cost a million-task parse 10 MB of peak RSS.
_CHUNK = 1 << 16
_SHOW = 80  # characters of offending text quoted in a message


def _show(text: str) -> str:
    text = text.strip(_BLANKS)
    if len(text) > _SHOW:
        text = text[:_SHOW] + "..."
    return repr(text)


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
        raise DagError(path, None, f"cannot read DAG file: {_reason(e)}") from None
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


def _start_helper(path: str, f: BinaryIO) -> EdgeHelper | None:
    """An edge helper for a big file, or None."""
    try:
        size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    from pmc.dag import edgehelper  # not at the top: it imports this module

    if size < edgehelper.MIN_BYTES:
        return None
    try:
        return edgehelper.EdgeHelper(path, size, _CHUNK)
    except OSError:
        return None


def _reason(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def _parse(path: str, f: BinaryIO, helper: EdgeHelper | None = None) -> DAG:
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
    known: dict[object, _Options] = {}  # option text (and _Options) -> shared _Options
    last_prefix = "\n"  # the option text of the last line that had some (no line has this)
    last_options = _DEFAULTS
    cut = 1
    simple_options = _SIMPLE_OPTIONS.match
    backward = False
    split = -1  # the byte offset from which EDGE lines are the helper's; -1: none are
    theirs = False  # are this block's EDGE lines the helper's?
    nlines = 0
    for offset, before, data, lines in _blocks(path, f, _CHUNK):
        nlines = before + len(lines)
        if helper is not None:
            if split < 0 and b"EDGE" in data:
                split = helper.split_offset(offset)
            theirs = 0 <= split <= offset
            if theirs and data.startswith(b"EDGE ") + data.count(b"\nEDGE ") == len(lines):
                continue  # nothing but the helper's EDGE lines
        quoting = b"'" in data or b'"' in data or b"\\" in data
        plain = _plain(data)
        for lineno, line in enumerate(lines, before + 1):
            # At most three fields: the rest of a TASK line is its command, kept as
            # written; the rest of an EDGE line must be exactly one name.
            parts = line.split(None, 2) if plain else _fields(line)
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
                    p, c = _edge(path, lineno, line, index)
                if p >= c:
                    if p == c:
                        raise DagError(
                            path,
                            lineno,
                            f"self edge: task {parts[1]!r} cannot depend on itself: {_show(line)}",
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
                    and not (quoting and _has_quoting(parts[2]))
                ):
                    rest = parts[2]
                    if rest[0] != "-":
                        # The common line: no options, no quotes. (_fields leaves no
                        # trailing blank; rstrip() would also take Unicode spaces.)
                        command = rest.rstrip() if plain else rest
                        options = _DEFAULTS
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
                        # ("-m 1 -c 1"): parsed once (below), then shared.
                        prefix = m.group()
                        found = known.get(prefix)
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
                    task = _new_task(Task)
                    task.id = tid
                    task.name = parts[1]
                    task.command = command
                    task._line_after_id = lineno - tid
                    task._options = options
                else:
                    task = _task(path, lineno, line, parts, tid)
                    if prefix is not None and len(known) < _KNOWN_OPTIONS:
                        # The options came from the prefix alone: the command starts
                        # right after it. Equal options, one object.
                        found = known[prefix] = known.get(task._options, task._options)
                        known[task._options] = found
                        task._options = last_options = found
                        last_prefix = prefix
                        cut = len(prefix)
                if pegasus is not None:
                    task._pegasus = pegasus
                    task._line_after_id = lineno - 2 * tid  # see Task.line
                    pegasus = None
                if index.setdefault(task.name, tid) != tid:
                    first = tasks[index[task.name]].line
                    raise DagError(
                        path,
                        lineno,
                        f"duplicate task id {task.name!r} (first defined at line {first}): "
                        f"{_show(line)}",
                    )
                add_task(task)
            elif kind[0] == "#":
                if kind.startswith("#@"):
                    if (
                        plain
                        and kind == "#@"
                        and len(parts) == 3
                        and len(parts[2].split(None, 1)) == 2
                    ):
                        # "#@ SEQ TRANSFORMATION DAX_ID ...": an int when it reads back
                        # the same (see Task.pegasus_id); ASCII in a _plain block.
                        seq = parts[1]
                        pegasus = int(seq) if seq.isdigit() and seq[0] != "0" else seq
                    else:
                        pegasus = _pegasus_seq(path, lineno, line)
            else:
                raise DagError(
                    path,
                    lineno,
                    f"unknown record type {_show(kind)} (expected TASK or EDGE): {_show(line)}",
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
    return _build(path, tasks, index, parents, children, edge_lines, backward)


def _edge(path: str, lineno: int, line: str, index: dict[str, int]) -> tuple[int, int]:
    """An EDGE line the fast path could not take: trailing blanks, or an error."""
    fields = _all_fields(line)
    if len(fields) != 3:
        raise DagError(
            path,
            lineno,
            f"EDGE needs a parent and a child, got {len(fields) - 1} field(s): {_show(line)}",
        )
    for name in fields[1:]:
        if name not in index:
            raise DagError(
                path,
                lineno,
                f"EDGE names unknown task {name!r} (an EDGE may only name tasks defined "
                f"above it): {_show(line)}",
            )
    return index[fields[1]], index[fields[2]]


def _blocks(path: str, f: BinaryIO, chunk: int) -> Iterator[tuple[int, int, bytes, list[str]]]:
    """Yield (offset, lines before, data, lines) for runs of complete lines, read ``chunk``
    bytes at a time: the run's first byte in the file, the number of lines before it,
    its bytes and its decoded lines. A NUL byte or invalid UTF-8 raises DagError after
    the lines before it. The same file and chunk always give the same runs."""
    before = 0
    offset = 0
    pending: list[bytes] = []
    while True:
        try:
            block = f.read(chunk)
        except OSError as e:
            raise DagError(path, None, f"cannot read DAG file: {_reason(e)}") from None
        if block:
            cut = block.rfind(b"\n") + 1
            if not cut:  # a line longer than a block: keep collecting
                pending.append(block)
                continue
            pending.append(block[:cut])
            data = b"".join(pending)
            pending = [block[cut:]] if cut < len(block) else []
        else:
            data = b"".join(pending)
            if not data:
                return
        lines, error = _decode(path, before, data)
        yield offset, before, data, lines
        if error is not None:
            raise error
        before += len(lines)
        offset += len(data)
        if not block:
            return


def _decode(path: str, before: int, data: bytes) -> tuple[list[str], DagError | None]:
    """The lines of ``data`` up to the first bad one, and the error for that one."""
    bad = data.find(b"\0")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if bad < 0 or e.start < bad:
            bad = e.start
            problem = "invalid UTF-8"
        else:
            problem = "NUL byte"
    else:
        if bad < 0:
            if text.endswith("\n"):
                text = text[:-1]
            if "\r" in text:  # DOS line ends; other carriage returns are blanks
                text = text.replace("\r\n", "\n")
            return text.split("\n"), None
        problem = "NUL byte"
    start = data.rfind(b"\n", 0, bad) + 1
    end = data.find(b"\n", bad)
    raw = data[start : end if end >= 0 else len(data)]
    good = data[:start].decode("utf-8")
    lines = good[:-1].split("\n") if good else []
    shown = _show(raw.decode("utf-8", "backslashreplace"))
    lineno = before + len(lines) + 1
    return lines, DagError(path, lineno, f"{problem} at column {bad - start + 1}: {shown}")


def _pegasus_seq(path: str, lineno: int, line: str) -> str:
    # The reference reads the second blank-separated field as SEQ, so "#@7 a b c" would
    # give SEQ "a" there: refused here rather than read either way.
    fields = _all_fields(line)
    if fields[0] != "#@":
        raise DagError(
            path, lineno, f"'#@' must be followed by a blank, then SEQ: {_show(line)}"
        )
    if len(fields) < 4:
        raise DagError(
            path,
            lineno,
            f"'#@' line needs SEQ TRANSFORMATION DAX_ID, got {len(fields) - 1} field(s): "
            f"{_show(line)}",
        )
    return fields[1]


def _task(path: str, lineno: int, line: str, parts: list[str], tid: int) -> Task:
    """A TASK line with options, quotes, or something missing."""
    if len(parts) < 2:
        raise DagError(path, lineno, f"TASK record has no task id: {_show(line)}")
    name = parts[1]
    if name[0] == "-":
        raise DagError(
            path, lineno, f"TASK record has no task id (found option {name!r}): {_show(line)}"
        )
    rest = parts[2] if len(parts) > 2 else ""
    starts: list[int] | None = None
    if _has_quoting(rest):
        words, starts = _shell_words(path, lineno, line, rest)
    else:
        words = _split_words(rest)

    memory = 0
    cpus = 1
    tries: int | None = None
    priority = 0
    runtime: float | None = None
    pipes: list[tuple[str, str]] = []
    files: list[tuple[str, str]] = []
    i = 0
    n = len(words)
    while i < n:
        word = words[i]
        if word[:1] != "-":
            break
        i += 1
        if word == "--":
            break
        if word[:2] == "--":
            opt, eq, value = word.partition("=")
            inline = bool(eq)
        else:
            opt, value = word[:2], word[2:]  # getopt style: -m10
            inline = bool(value)
        what = _OPTIONS.get(opt)
        if what is None:
            raise DagError(path, lineno, f"unknown task option {_show(word)}: {_show(line)}")
        if not inline:
            if i >= n:
                raise DagError(path, lineno, f"task option {opt} needs a value: {_show(line)}")
            value = words[i]
            i += 1
        if what == "memory":
            memory = _rounded_up(path, lineno, opt, value, "a number of MB >= 0")
        elif what == "cpus":
            cpus = _rounded_up(path, lineno, opt, value, "a number of cpus >= 0")
        elif what == "tries":
            tries = _integer(path, lineno, opt, value, 0, "a whole number >= 0")
        elif what == "priority":
            priority = _integer(path, lineno, opt, value, -_INT64, "a whole number")
        elif what == "runtime":
            runtime = _seconds(path, lineno, opt, value)
        else:
            left, eq, right = value.partition("=")
            if what == "pipe":
                if not (eq and right and _ENV_NAME.fullmatch(left)):
                    raise DagError(
                        path,
                        lineno,
                        f"task option {opt} needs VAR=FILE, VAR an environment variable name, "
                        f"got {_show(value)}",
                    )
                pipes.append((left, right))
            else:
                if not (eq and left and right):
                    raise DagError(
                        path, lineno, f"task option {opt} needs SRC=DEST, got {_show(value)}"
                    )
                files.append((left, right))

    if i >= n:
        raise DagError(path, lineno, f"TASK {name} has no executable: {_show(line)}")
    if not words[i]:
        raise DagError(path, lineno, f"TASK {name} has an empty executable: {_show(line)}")
    if starts is not None:
        command = rest[starts[i] :].lstrip(_SPACE)
        trimmed = command.rstrip(_SPACE)
        # "a\ " ends in an escaped space: trimming it would leave a lone backslash.
        if not trimmed.endswith("\\"):
            command = trimmed
    elif i == n - 1:
        command = words[i]
    elif i == 0:  # (re.split's maxsplit 0 would split every word)
        command = rest.strip(_SPACE)
    else:
        command = _SPACE_RUN.split(rest.lstrip(_SPACE), i)[i].rstrip(_SPACE)
    return Task(
        tid,
        name,
        command,
        memory=memory,
        cpus=cpus,
        tries=tries,
        priority=priority,
        pipe_forwards=tuple(pipes) if pipes else None,
        file_forwards=tuple(files) if files else None,
        expected_runtime=runtime,
        line=lineno,
    )


def _shell_words(path: str, lineno: int, line: str, text: str) -> tuple[list[str], list[int]]:
    try:
        return _words(text)
    except ValueError as e:
        raise DagError(path, lineno, f"{e}: {_show(line)}") from None


def _integer(path: str, lineno: int, opt: str, value: str, least: int, want: str) -> int:
    # Not int() alone: it also takes " 5", "5_0" and non-ASCII digits.
    if _INTEGER.fullmatch(value) and len(value) <= 40:
        number = int(value)
        if least <= number <= _INT64:
            return number
    raise DagError(path, lineno, f"task option {opt} needs {want}, got {_show(value)}")


def _rounded_up(path: str, lineno: int, opt: str, value: str, want: str) -> int:
    """-m and -c: a decimal number, rounded up to a whole one as the reference does (it
    reads a C float, so "1.00000001" is 1 there and here). Unlike its sscanf("%f"),
    nothing may follow the number ("1G" is not 1), and nan and inf are refused."""
    if _INTEGER.fullmatch(value) and len(value) <= 7:
        number = int(value)  # below 2**24: the float would be the same number
        if number >= 0:
            return number
    elif _DECIMAL.fullmatch(value):
        # Python's float, then the nearest C float: off from the C library's direct
        # conversion only for a decimal within a hair of half-way between two floats.
        real = _FLOAT32.unpack(_FLOAT32.pack(min(float(value), 1e30)))[0]
        if real >= 0 and (number := math.ceil(real)) <= _INT64:  # -0 is 0, as there
            return number
    raise DagError(path, lineno, f"task option {opt} needs {want}, got {_show(value)}")


def _seconds(path: str, lineno: int, opt: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise DagError(
            path, lineno, f"task option {opt} needs a number of seconds >= 0, got {_show(value)}"
        )
    return seconds


def _build(
    path: str,
    tasks: list[Task],
    index: dict[str, int],
    parents: array[int],
    children: array[int],
    edge_lines: array[int],
    backward: bool,
) -> DAG:
    """Turn the edge lists into CSR form, each edge once; reject cycles.

    A repeated EDGE line is accepted, as the reference accepts it, and counts once:
    the child waits for its parent once and runs once. (The reference lists such a
    child twice under its parent and queues it twice when the parent succeeds.)

    Works in "I" arrays, as ``_parse`` does, and copies the results to the DAG's "i"
    ones. This is the peak of a big parse: every list and array goes as soon as it is
    used up, and no two lists of n counts ever live at once.
    """
    n = len(tasks)
    counts = [0] * n
    for c in children:
        counts[c] += 1
    nparents = array("i", counts)  # straight to "i": an "I" copy would raise the peak
    del counts
    counts = [0] * n
    several = array("I")  # parents with more than one child: only they can repeat one
    for p in parents:
        k = counts[p] + 1
        counts[p] = k
        if k == 2:
            several.append(p)
    starts = array("I", [0])
    starts.extend(accumulate(counts))
    del counts
    if all(map(le, parents, islice(parents, 1, None))):
        # Edges already grouped by parent, as generators usually write them.
        by_parent = children
    else:
        # Stable counting sort: children keep their file order within a parent.
        by_parent = array("I", bytes(4 * len(children)))
        slot = array("I", starts)
        for p, c in zip(parents, children, strict=True):
            k = slot[p]
            by_parent[k] = c
            slot[p] = k + 1
        del slot
    if _repeats_a_child(by_parent, starts, several):
        by_parent, starts = _without_repeats(by_parent, starts)
        nparents = array("i", bytes(4 * n))
        for c in by_parent:
            nparents[c] += 1
    child_list = _signed(by_parent)
    del by_parent
    child_start = _signed(starts)
    del starts
    dag = DAG(path, tasks, index, child_start, child_list, nparents)
    # With every edge pointing forward in DAG order there can be no cycle.
    if backward:
        _check_acyclic(dag, list(nparents), parents, children, edge_lines)
    return dag


def _repeats_a_child(by_parent: array[int], starts: array[int], several: array[int]) -> bool:
    """Whether a parent lists a child twice: a duplicate edge repeats a child within its
    parent's run, so only parents with several children need a look, and no set of all
    edges is ever built."""
    for p in several:
        first = starts[p]
        end = starts[p + 1]
        if end - first == 2:  # the most common run: compared, no set built
            if by_parent[first] == by_parent[first + 1]:
                return True
        elif len(set(by_parent[first:end])) < end - first:
            return True
    return False


def _without_repeats(by_parent: array[int], starts: array[int]) -> tuple[array[int], array[int]]:
    """The CSR lists with each parent's children once, in the order first given."""
    kept = array("I")
    new_starts = array("I", [0])
    for p in range(len(starts) - 1):
        run = by_parent[starts[p] : starts[p + 1]]
        if len(run) > 1:
            kept.extend(dict.fromkeys(run))
        else:
            kept.extend(run)
        new_starts.append(len(kept))
    return kept, new_starts


def _signed(ids: array[int]) -> array[int]:
    """The "i" array of the same ids: their four bytes copied, not converted one by one
    (the same numbers below 2**31, and a DAG with more tasks or edges cannot fit in
    memory)."""
    signed = array("i")
    signed.frombytes(memoryview(ids).cast("B"))
    return signed


def _check_acyclic(
    dag: DAG,
    waiting: list[int],
    parents: array[int],
    children: array[int],
    edge_lines: array[int],
) -> None:
    """Kahn's algorithm, iterative; ``waiting`` (parents not yet done) is consumed."""
    start = dag.child_start
    child_list = dag.child_list
    ready = [i for i, w in enumerate(waiting) if not w]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        for v in child_list[start[u] : start[u + 1]]:
            w = waiting[v] - 1
            waiting[v] = w
            if not w:
                ready.append(v)
    if done == len(dag.tasks):
        return
    # Every task left still waits for a parent that is also left, so walking from any of
    # them to such a parent, again and again, must come back round: that is a cycle.
    via = array("i", [-1]) * len(waiting)
    for p, c in zip(parents, children, strict=True):
        if waiting[p] and waiting[c]:
            via[c] = p
    u = next(i for i, w in enumerate(waiting) if w)
    seen: dict[int, int] = {}
    walk: list[int] = []
    while u not in seen:
        seen[u] = len(walk)
        walk.append(u)
        u = via[u]
    cycle = walk[seen[u] :]
    cycle.reverse()  # the walk went from child to parent
    first = cycle.index(min(cycle))
    cycle = cycle[first:] + cycle[:first]
    keys = {a << 32 | b for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True)}
    line = max(
        line
        for p, c, line in zip(parents, children, edge_lines, strict=True)
        if p << 32 | c in keys
    )
    names = [dag.tasks[i].name for i in cycle]
    if len(names) > 12:
        shown = " -> ".join([*names[:10], "...", names[-1], names[0]])
        message = f"cycle of {len(names)} tasks: {shown}"
    else:
        message = "cycle: " + " -> ".join([*names, names[0]])
    raise DagError(dag.path, line, message)
