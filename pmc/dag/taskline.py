"""A TASK line's options and command, and a ``#@`` line's Pegasus id: the slow path.

The reader (``pmc.dag.reader``) takes the common TASK lines itself, with
``option_values`` for options as planners write them (``-m 1 -c 1 -p 7``, whole numbers);
every line with quoting, other options or values, or something wrong comes to
``parse_task``. Owns the task options of the format and the checks of their values.

Extensions to the reference format: the task options ``--expected-runtime SECONDS`` (a
non-negative number, ``Task.expected_runtime``), ``--request-gpus N`` (GPUs per rank,
N >= 0), ``--ranks N`` (an N-rank MPI task, N >= 1) and ``--ranks-per-host M`` (M >= 1,
dividing N; only with ``--ranks``), ``--inputs`` and ``--outputs`` (declared files, paths
separated by commas, the option repeatable), and ``--array``, ``--each-line`` and
``--from-json``, which make the line a task array (``pmc.dag.arrays``: ``parse_task``
returns its ``ArrayDef``). The reference rejects them as unknown options, so DAGs that
use them only run here.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from pmc.dag import sweeps
from pmc.dag.arrays import ArrayDef, read_sweep_file
from pmc.dag.lines import all_fields, reason, show
from pmc.dag.model import DagError, Task, TaskOptions
from pmc.dag.words import SPACE, SPACE_RUN, has_quoting, shell_words, split_words

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_FLOAT32 = struct.Struct("f")
# A TASK line's options that take one value, separate words, the value not starting
# with "-", up to the command (which does not start with "-" either): the text such
# options are written as in generated DAGs. Matched in blocks is_plain vouches for.
SIMPLE_OPTIONS = re.compile(
    r"(?:(?:-[mctp]|--(?:request-memory|request-cpus|tries|priority|expected-runtime))"
    r"[ \t\r]+[^- \t\r][^ \t\r]*[ \t\r]+)+(?=[^- \t\r])"
)
_INT64 = 2**63 - 1  # option values travel to workers; keep them in a C long long


def pegasus_seq(path: str, lineno: int, line: str) -> str:
    # The reference reads the second blank-separated field as SEQ, so "#@7 a b c" would
    # give SEQ "a" there: refused here rather than read either way.
    fields = all_fields(line)
    if fields[0] != "#@":
        raise DagError(
            path, lineno, f"'#@' must be followed by a blank, then SEQ: {show(line)}"
        )
    if len(fields) < 4:
        raise DagError(
            path,
            lineno,
            f"'#@' line needs SEQ TRANSFORMATION DAX_ID, got {len(fields) - 1} field(s): "
            f"{show(line)}",
        )
    return fields[1]


def option_values(prefix: str) -> TaskOptions | None:
    """The options of a TASK line's ``prefix`` that ``SIMPLE_OPTIONS`` matched, in a block
    ``is_plain`` vouches for, when every value is a whole number of at most seven digits:
    what ``parse_task`` makes of them, without the words of the whole line. None for any
    other value: ``parse_task`` then takes the line, and words the message of a bad one."""
    words = prefix.split()
    memory = 0
    cpus = 1
    tries: int | None = None
    priority = 0
    for i in range(0, len(words), 2):
        value = words[i + 1]
        if not (value.isdigit() and len(value) <= 7):  # ASCII digits in such a block
            return None
        what = _OPTIONS[words[i]][0]
        if what == "memory":
            memory = int(value)
        elif what == "cpus":
            cpus = int(value)
        elif what == "tries":
            tries = int(value)
        elif what == "priority":
            priority = int(value)
        else:  # --expected-runtime: a number of seconds, not always whole
            return None
    return TaskOptions(memory, cpus, tries, priority)


def parse_task(path: str, lineno: int, line: str, parts: list[str],
               tid: int) -> Task | ArrayDef:
    """A TASK line with options, quotes, or something missing; an array's TASK line."""
    if len(parts) < 2:
        raise DagError(path, lineno, f"TASK record has no task id: {show(line)}")
    name = parts[1]
    if name[0] == "-":
        raise DagError(
            path, lineno, f"TASK record has no task id (found option {name!r}): {show(line)}"
        )
    rest = parts[2] if len(parts) > 2 else ""
    starts: list[int] | None = None
    if has_quoting(rest):
        words, starts = _checked_words(path, lineno, line, rest)
    else:
        words = split_words(rest)
    where = (path, lineno, line)
    values, i = _read_options(where, words)
    if "ranks_per_host" in values:
        _check_ranks(where, values)
    if i >= len(words):
        raise DagError(path, lineno, f"TASK {name} has no executable: {show(line)}")
    if not words[i]:
        raise DagError(path, lineno, f"TASK {name} has an empty executable: {show(line)}")
    command = _command(rest, words, starts, i)
    sweep = [values.pop(field) for field in _SWEEPS if field in values]
    if sweep:
        if len(sweep) > 1:
            raise _error(where, "a task array takes one of --array, --each-line and "
                                f"--from-json (pmc extensions): {show(line)}")
        text, found = sweep[0]
        return ArrayDef(name, command, TaskOptions(**values), found, text, lineno)
    return Task(tid, name, command, line=lineno, **values)


_Where = tuple[str, int, str]  # the file, line number and line an option is read from


def _error(where: _Where, message: str) -> DagError:
    return DagError(where[0], where[1], message)


def _read_options(where: _Where, words: list[str]) -> tuple[dict[str, Any], int]:
    """The options before the executable, as Task's keywords, and the executable's word."""
    values: dict[str, Any] = {}
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
        option = _OPTIONS.get(opt)
        if option is None:
            raise _error(where, f"unknown task option {show(word)}: {show(where[2])}")
        if not inline:
            if i >= n:
                raise _error(where, f"task option {opt} needs a value: {show(where[2])}")
            value = words[i]
            i += 1
        field, read, want, least = option
        if field in _LISTS:
            values[field] = (*values.get(field, ()), read(where, opt, value, want, least))
        elif field in _PATHS:
            values[field] = (*values.get(field, ()), *read(where, opt, value, want, least))
        else:
            values[field] = read(where, opt, value, want, least)
    return values, i


def _check_ranks(where: _Where, values: dict[str, Any]) -> None:
    per_host = values["ranks_per_host"]
    if "ranks" not in values:
        raise _error(where, f"task option --ranks-per-host needs --ranks: {show(where[2])}")
    if values["ranks"] % per_host:
        raise _error(where, f"task option --ranks {values['ranks']} is not a multiple of "
                            f"--ranks-per-host {per_host}: {show(where[2])}")


def _command(rest: str, words: list[str], starts: list[int] | None, i: int) -> str:
    """The command as written, from the executable (word ``i``) on; ``starts``: where
    each word starts in ``rest``, when it quotes."""
    if starts is not None:
        command = rest[starts[i] :].lstrip(SPACE)
        trimmed = command.rstrip(SPACE)
        # "a\\ " ends in an escaped space: trimming it would leave a lone backslash.
        return command if trimmed.endswith("\\") else trimmed
    if i == len(words) - 1:
        return words[i]
    if i == 0:  # (re.split's maxsplit 0 would split every word)
        return rest.strip(SPACE)
    return SPACE_RUN.split(rest.lstrip(SPACE), i)[i].rstrip(SPACE)


def _pair(where: _Where, opt: str, value: str, want: str, least: int) -> tuple[str, str]:
    """-f VAR=FILE and -F SRC=DEST."""
    left, eq, right = value.partition("=")
    if not (eq and left and right) or (opt in ("-f", "--pipe-forward")
                                       and not _ENV_NAME.fullmatch(left)):
        raise _error(where, f"task option {opt} needs {want}, got {show(value)}")
    return left, right


def _checked_words(path: str, lineno: int, line: str, text: str) -> tuple[list[str], list[int]]:
    try:
        return shell_words(text)
    except ValueError as e:
        raise DagError(path, lineno, f"{e}: {show(line)}") from None


def _integer(where: _Where, opt: str, value: str, want: str, least: int) -> int:
    # Not int() alone: it also takes " 5", "5_0" and non-ASCII digits.
    if _INTEGER.fullmatch(value) and len(value) <= 40:
        number = int(value)
        if least <= number <= _INT64:
            return number
    raise _error(where, f"task option {opt} needs {want}, got {show(value)}")


def _rounded_up(where: _Where, opt: str, value: str, want: str, least: int) -> int:
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
    raise _error(where, f"task option {opt} needs {want}, got {show(value)}")


def _seconds(where: _Where, opt: str, value: str, want: str, least: int) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise _error(where, f"task option {opt} needs {want}, got {show(value)}")
    return seconds


def _paths(where: _Where, opt: str, value: str, want: str, least: int) -> tuple[str, ...]:
    """--inputs and --outputs: paths separated by commas, none empty."""
    paths = tuple(value.split(","))
    if not all(paths):
        raise _error(where, f"task option {opt} (a pmc extension) needs {want}, "
                            f"got {show(value)}")
    return paths


def _sweep_range(where: _Where, opt: str, value: str, want: str,
                 least: int) -> tuple[str, sweeps.Values]:
    try:
        return f"{opt} {value}", sweeps.parse_range(value)
    except sweeps.SweepError:
        raise _error(where, f"task option {opt} (a pmc extension) needs {want}, "
                            f"got {show(value)}") from None


def _sweep_file(where: _Where, opt: str, value: str, want: str,
                least: int) -> tuple[str, sweeps.Values]:
    """--each-line FILE, --from-json FILE: read now, relative to the DAG's directory."""
    try:
        data = read_sweep_file(where[0], value)
    except OSError as e:
        raise _error(where, f"task option {opt} (a pmc extension): cannot read {value}: "
                            f"{reason(e)}") from None
    try:
        found = sweeps.read_lines(data) if opt == "--each-line" else sweeps.read_json(data)
    except sweeps.SweepError as e:
        raise _error(where, f"task option {opt} (a pmc extension) needs {want}: {value}: "
                            f"{e}") from None
    return f"{opt} {value}", found


class _Option(NamedTuple):
    """A task option: the Task keyword it sets, the reader of its value, what it wants
    (said when the value is bad) and the least value a whole number may have."""

    field: str
    read: Callable[[_Where, str, str, str, int], Any]
    want: str
    least: int = 0


_MEMORY = _Option("memory", _rounded_up, "a number of MB >= 0")
_CPUS = _Option("cpus", _rounded_up, "a number of cpus >= 0")
_TRIES = _Option("tries", _integer, "a whole number >= 0")
_PRIORITY = _Option("priority", _integer, "a whole number", -_INT64)
_PIPE = _Option("pipe_forwards", _pair, "VAR=FILE, VAR an environment variable name")
_FILE = _Option("file_forwards", _pair, "SRC=DEST")
_RANKS = _Option("ranks", _integer, "a whole number of ranks >= 1", 1)
_OPTIONS = {
    "-m": _MEMORY, "--request-memory": _MEMORY,
    "-c": _CPUS, "--request-cpus": _CPUS,
    "-t": _TRIES, "--tries": _TRIES,
    "-p": _PRIORITY, "--priority": _PRIORITY,
    "-f": _PIPE, "--pipe-forward": _PIPE,
    "-F": _FILE, "--file-forward": _FILE,
    # The extensions
    "--expected-runtime": _Option("expected_runtime", _seconds, "a number of seconds >= 0"),
    "--request-gpus": _Option("gpus", _integer, "a whole number of GPUs >= 0"),
    "--ranks": _RANKS,
    "--ranks-per-host": _RANKS._replace(field="ranks_per_host"),
    "--inputs": _Option("inputs", _paths, "paths separated by commas"),
    "--outputs": _Option("outputs", _paths, "paths separated by commas"),
    "--array": _Option("array", _sweep_range,
                       "FIRST-LAST[:STEP] (whole numbers >= 0, FIRST <= LAST, STEP >= 1)"),
    "--each-line": _Option("each_line", _sweep_file, "a file of values, one a line"),
    "--from-json": _Option("from_json", _sweep_file, "a file holding a JSON list"),
}
_LISTS = frozenset({"pipe_forwards", "file_forwards"})  # given again, added to
_PATHS = frozenset({"inputs", "outputs"})  # given again, added to
_SWEEPS = ("array", "each_line", "from_json")  # the line is a task array
