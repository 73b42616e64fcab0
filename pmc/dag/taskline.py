"""A TASK line's options and command, and a ``#@`` line's Pegasus id: the slow path.

The reader (``pmc.dag.reader``) takes the common TASK lines itself, with
``option_values`` for options as planners write them (``-m 1 -c 1 -p 7``, whole numbers);
every line with quoting, other options or values, or something wrong comes to
``parse_task``. Owns the task options of the format and the checks of their values.

Extensions to the reference format: the task options ``--expected-runtime SECONDS`` (a
non-negative number, ``Task.expected_runtime``), ``--request-gpus N`` (GPUs per rank,
N >= 0), ``--ranks N`` (an N-rank MPI task, N >= 1) and ``--ranks-per-host M`` (M >= 1,
dividing N; only with ``--ranks``). The reference rejects them as unknown options, so
DAGs that use them only run here.
"""

from __future__ import annotations

import math
import re
import struct

from pmc.dag.lines import all_fields, show
from pmc.dag.model import DagError, Task, TaskOptions
from pmc.dag.words import SPACE, SPACE_RUN, has_quoting, shell_words, split_words

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
    "--request-gpus": "gpus",
    "--ranks": "ranks",
    "--ranks-per-host": "ranks_per_host",
}
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
        what = _OPTIONS[words[i]]
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


def parse_task(path: str, lineno: int, line: str, parts: list[str], tid: int) -> Task:
    """A TASK line with options, quotes, or something missing."""
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

    memory = 0
    cpus = 1
    tries: int | None = None
    priority = 0
    runtime: float | None = None
    gpus = 0
    ranks = 1
    per_host = 0
    ranks_given = False
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
            raise DagError(path, lineno, f"unknown task option {show(word)}: {show(line)}")
        if not inline:
            if i >= n:
                raise DagError(path, lineno, f"task option {opt} needs a value: {show(line)}")
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
        elif what == "gpus":
            gpus = _integer(path, lineno, opt, value, 0, "a whole number of GPUs >= 0")
        elif what == "ranks":
            ranks = _integer(path, lineno, opt, value, 1, "a whole number of ranks >= 1")
            ranks_given = True
        elif what == "ranks_per_host":
            per_host = _integer(path, lineno, opt, value, 1, "a whole number of ranks >= 1")
        else:
            left, eq, right = value.partition("=")
            if what == "pipe":
                if not (eq and right and _ENV_NAME.fullmatch(left)):
                    raise DagError(
                        path,
                        lineno,
                        f"task option {opt} needs VAR=FILE, VAR an environment variable name, "
                        f"got {show(value)}",
                    )
                pipes.append((left, right))
            else:
                if not (eq and left and right):
                    raise DagError(
                        path, lineno, f"task option {opt} needs SRC=DEST, got {show(value)}"
                    )
                files.append((left, right))

    if per_host:
        if not ranks_given:
            raise DagError(path, lineno, f"task option --ranks-per-host needs --ranks: "
                           f"{show(line)}")
        if ranks % per_host:
            raise DagError(path, lineno, f"task option --ranks {ranks} is not a multiple of "
                           f"--ranks-per-host {per_host}: {show(line)}")
    if i >= n:
        raise DagError(path, lineno, f"TASK {name} has no executable: {show(line)}")
    if not words[i]:
        raise DagError(path, lineno, f"TASK {name} has an empty executable: {show(line)}")
    if starts is not None:
        command = rest[starts[i] :].lstrip(SPACE)
        trimmed = command.rstrip(SPACE)
        # "a\ " ends in an escaped space: trimming it would leave a lone backslash.
        if not trimmed.endswith("\\"):
            command = trimmed
    elif i == n - 1:
        command = words[i]
    elif i == 0:  # (re.split's maxsplit 0 would split every word)
        command = rest.strip(SPACE)
    else:
        command = SPACE_RUN.split(rest.lstrip(SPACE), i)[i].rstrip(SPACE)
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
        gpus=gpus,
        ranks=ranks,
        ranks_per_host=per_host,
    )


def _checked_words(path: str, lineno: int, line: str, text: str) -> tuple[list[str], list[int]]:
    try:
        return shell_words(text)
    except ValueError as e:
        raise DagError(path, lineno, f"{e}: {show(line)}") from None


def _integer(path: str, lineno: int, opt: str, value: str, least: int, want: str) -> int:
    # Not int() alone: it also takes " 5", "5_0" and non-ASCII digits.
    if _INTEGER.fullmatch(value) and len(value) <= 40:
        number = int(value)
        if least <= number <= _INT64:
            return number
    raise DagError(path, lineno, f"task option {opt} needs {want}, got {show(value)}")


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
    raise DagError(path, lineno, f"task option {opt} needs {want}, got {show(value)}")


def _seconds(path: str, lineno: int, opt: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise DagError(
            path, lineno, f"task option {opt} needs a number of seconds >= 0, got {show(value)}"
        )
    return seconds
