"""The values of a task array's members (a pmc extension): a range of numbers, the lines
of a file, or the items of a JSON list.

Kept compact, a million values in a few megabytes: a range is three numbers; a file's
lines are its bytes and an offset per line; a JSON list is its text and two offsets per
item. A member's value, as text, is made when the member is (``value``). Files are read
once, when the DAG is: a change to them during the run changes nothing.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable
from itertools import accumulate, islice
from typing import Protocol

_LINES_AT_ONCE = 1 << 20  # bytes of a file split into lines at a time (a bounded peak)
_JSON_BLANKS = re.compile(r"[ \t\n\r]*")


class SweepError(ValueError):
    """A sweep that cannot be read; ``str()`` says why (the reader adds file:line)."""


class Values(Protocol):
    """The members' values, by index from 0."""

    def __len__(self) -> int: ...

    def value(self, index: int) -> str: ...


class RangeValues:
    """``--array FIRST-LAST[:STEP]``: FIRST, FIRST+STEP, ... up to LAST."""

    __slots__ = ("first", "n", "step")

    def __init__(self, first: int, last: int, step: int) -> None:
        self.first = first
        self.step = step
        self.n = (last - first) // step + 1

    def __len__(self) -> int:
        return self.n

    def value(self, index: int) -> str:
        return str(self.first + index * self.step)


def parse_range(text: str) -> RangeValues:
    """``FIRST-LAST[:STEP]`` or ``N`` (whole numbers >= 0, FIRST <= LAST, STEP >= 1)."""
    span, colon, step_text = text.partition(":")
    first_text, dash, last_text = span.partition("-")
    if not dash:
        last_text = first_text
    numbers = (first_text, last_text, step_text if colon else "1")
    if not all(t.isdigit() and t.isascii() and len(t) <= 18 for t in numbers):
        raise SweepError("FIRST-LAST[:STEP], whole numbers >= 0")
    first, last, step = map(int, numbers)
    if first > last or step < 1:
        raise SweepError("FIRST <= LAST and STEP >= 1")
    return RangeValues(first, last, step)


class LineValues:
    """``--each-line FILE``: each line of the file, without its line end ("\\n" or
    "\\r\\n"), empty lines included (member i is line i + 1); a last line without a
    line end counts."""

    __slots__ = ("data", "starts")

    def __init__(self, data: bytes, starts: array[int]) -> None:
        self.data = data
        self.starts = starts  # n + 1 offsets: line i is data[starts[i]:starts[i + 1]]

    def __len__(self) -> int:
        return len(self.starts) - 1

    def value(self, index: int) -> str:
        line = self.data[self.starts[index] : self.starts[index + 1]]
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        return line.decode()


def read_lines(data: bytes) -> LineValues:
    """The lines of a file's bytes: UTF-8 without NUL bytes (a value is an
    environment variable's)."""
    bad = data.find(b"\0")
    try:
        data.decode()
    except UnicodeDecodeError as e:
        bad = e.start if bad < 0 else min(bad, e.start)
    if bad >= 0:
        what = "a NUL byte" if data[bad:bad + 1] == b"\0" else "invalid UTF-8"
        line = data.count(b"\n", 0, bad) + 1
        raise SweepError(f"{what} on line {line}")
    starts = array("I" if len(data) < 1 << 32 else "Q", [0])
    pos = 0
    size = len(data)
    while pos < size:
        # Whole lines a block at a time: their lengths, and one past each line end.
        cut = data.rfind(b"\n", pos, pos + _LINES_AT_ONCE) + 1
        if cut <= pos:
            cut = data.find(b"\n", pos + _LINES_AT_ONCE) + 1 or size
        lines = data[pos:cut].split(b"\n")
        if not lines[-1]:
            lines.pop()  # the end of the last line
        ends = accumulate(map((1).__add__, map(len, lines)), initial=pos)
        starts.extend(islice(ends, 1, None))
        pos = cut
    if size and not data.endswith(b"\n"):
        starts[-1] = size  # the last line had no line end to count
    if len(starts) == 1:
        raise SweepError("no lines")
    return LineValues(data, starts)


class JsonValues:
    """``--from-json FILE``: the items of a JSON list; a string item's value is its text,
    any other item's its JSON, compact (``{"a":1}``, ``2.5``, ``true``)."""

    __slots__ = ("spans", "text")

    def __init__(self, text: str, spans: array[int]) -> None:
        self.text = text
        self.spans = spans  # start and end of each item in text

    def __len__(self) -> int:
        return len(self.spans) // 2

    def value(self, index: int) -> str:
        import json  # only for arrays over JSON lists: not on every master's start

        item = json.loads(self.text[self.spans[2 * index] : self.spans[2 * index + 1]])
        if isinstance(item, str):
            return item
        return json.dumps(item, separators=(",", ":"), ensure_ascii=False)


def read_json(data: bytes) -> JsonValues:
    """The items of a JSON list, each read once to find where it ends (and kept as its
    place in the text, not as an object)."""
    import json
    from json.scanner import make_scanner

    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise SweepError(f"invalid UTF-8 at byte {e.start}") from None
    blanks = _skip
    scan: Callable[[str, int], tuple[object, int]] = make_scanner(
        json.JSONDecoder())  # type: ignore[arg-type]  # typeshed has it as a class
    spans = array("I" if len(text) < 1 << 32 else "Q")
    pos = blanks(text, 0)
    if text[pos : pos + 1] != "[":
        raise SweepError("not a JSON list")
    pos = blanks(text, pos + 1)
    if text[pos : pos + 1] == "]":
        raise SweepError("an empty list")
    while True:
        try:
            item, end = scan(text, pos)
        except StopIteration:
            raise _json_error("a value expected", text, pos) from None
        except json.JSONDecodeError as e:
            raise _json_error(e.msg, text, e.pos) from None
        if isinstance(item, str) and "\0" in item:
            raise _json_error("a NUL character in a string", text, pos)
        spans.append(pos)
        spans.append(end)
        at = blanks(text, end)
        after = text[at : at + 1]
        pos = blanks(text, at + 1)
        if after == "]":
            if pos < len(text):
                raise _json_error("text after the list", text, pos)
            return JsonValues(text, spans)
        if after != ",":
            raise _json_error("',' or ']' expected", text, at)


def _skip(text: str, pos: int) -> int:
    """Past the JSON blanks at ``pos``."""
    m = _JSON_BLANKS.match(text, pos)
    return m.end() if m else pos


def _json_error(what: str, text: str, pos: int) -> SweepError:
    line = text.count("\n", 0, pos) + 1
    column = pos - text.rfind("\n", 0, pos)
    return SweepError(f"{what} at line {line} column {column}")
