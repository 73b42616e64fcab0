"""The lines and fields of a DAG file, as the reader and the edge helper both scan them.

Owns how a file becomes lines (read in blocks of whole lines, UTF-8 without NUL bytes,
DOS line ends taken) and how a line becomes fields (split at space, tab and CR, the
record blanks), the slow path of an EDGE line, and how offending text is quoted in a
message. The reader (``pmc.dag.reader``) and the edge helper (``pmc.dag.edgehelper``)
must split alike, so both take these.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

from pmc.dag.model import DagError

# Where the fields of a record end (TASK, id, command; EDGE, parent, child): the
# reference splits records at space, tab and CR (and LF, which never is inside a line),
# so a vertical tab or form feed belongs to the field it is in.
BLANKS = " \t\r"
_BLANK_RUN = re.compile("[" + BLANKS + "]+")
# Bytes str.split() takes for blanks that BLANKS does not hold, in ASCII text.
_ODD_BYTES = (b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\x1f")


def is_plain(data: bytes) -> bool:
    """Whether str.split() splits the lines of ``data`` at exactly the record blanks
    (space, tab, CR): true for ASCII text without vertical tab, form feed or
    \x1c-\x1f. Byte searches, a few microseconds per block."""
    return data.isascii() and all(odd not in data for odd in _ODD_BYTES)


def split_fields(line: str) -> list[str]:
    """``line.split(None, 2)`` at the record blanks only (the rest keeps no trailing
    blank): for lines ``is_plain`` does not vouch for."""
    text = line.strip(BLANKS)
    return _BLANK_RUN.split(text, 2) if text else []


def all_fields(line: str) -> list[str]:
    text = line.strip(BLANKS)
    return _BLANK_RUN.split(text) if text else []


_SHOW = 80  # characters of offending text quoted in a message


def show(text: str) -> str:
    text = text.strip(BLANKS)
    if len(text) > _SHOW:
        text = text[:_SHOW] + "..."
    return repr(text)


def reason(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def edge_ids(path: str, lineno: int, line: str, index: dict[str, int]) -> tuple[int, int]:
    """An EDGE line the fast path could not take: trailing blanks, or an error."""
    fields = all_fields(line)
    if len(fields) != 3:
        raise DagError(
            path,
            lineno,
            f"EDGE needs a parent and a child, got {len(fields) - 1} field(s): {show(line)}",
        )
    for name in fields[1:]:
        if name not in index:
            raise DagError(
                path,
                lineno,
                f"EDGE names unknown task {name!r} (an EDGE may only name tasks defined "
                f"above it): {show(line)}",
            )
    return index[fields[1]], index[fields[2]]


def holds_edge(data: bytes) -> bool:
    """Whether a run holds the text "EDGE" anywhere: where the parser asks the edge helper
    for its split, and where the helper expects the question, so both must ask this.
    A memchr for a capital G first (a few GB/s faster than a search for the text): a run
    of TASK lines without one needs no other look."""
    return b"G" in data and b"EDGE" in data


def read_runs(path: str, f: BinaryIO, chunk: int) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, data) for runs of complete lines, read ``chunk`` bytes at a time
    (a line longer than that whole in one run; the last line's newline may be missing).
    The same file and chunk always give the same runs: the parser and the edge helper
    split the file alike."""
    offset = 0
    pending: list[bytes] = []
    while True:
        try:
            block = f.read(chunk)
        except OSError as e:
            raise DagError(path, None, f"cannot read DAG file: {reason(e)}") from None
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
        yield offset, data
        offset += len(data)
        if not block:
            return


def decode_block(path: str, before: int, data: bytes) -> tuple[list[str], DagError | None]:
    """The lines of ``data`` (a run of whole lines, ``before`` lines into the file) up to
    the first bad one, and the error for that one (None: none is bad)."""
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
    shown = show(raw.decode("utf-8", "backslashreplace"))
    lineno = before + len(lines) + 1
    return lines, DagError(path, lineno, f"{problem} at column {bad - start + 1}: {shown}")
