"""The edge helper: a second process that resolves the last part of a big DAG's EDGE lines.

Parsing a million-edge DAG is bound by memory latency: every EDGE line looks up two
task names in a dict far bigger than the CPU's caches. The parser (``pmc.dag.reader``) starts
this helper when a DAG file is big, and the two share the EDGE section: the helper
reads the same file, builds its own name index from the TASK lines (cheaper than the
parser's Task objects, so it is ready first), and resolves every EDGE line from a byte
offset on (``split_offset``); the parser skips those lines and takes the helper's
arrays when it is done with its own part.

The split depends only on the file's size and on the offset of the first block holding
the text "EDGE", which both processes see alike, so no message is needed to agree on
it. The helper checks its lines as the parser would, but any problem (a bad line, an
unreadable file, a file that changed) makes it exit without a result, and the parser
then parses the whole file alone. So does any error the parser finds itself: every
error is reported by the one serial parser, at the first bad line in file order, and
the helper's edges need no line numbers. Repeated edges are passed on as they come:
the parser's ``build_dag`` counts each edge once, whichever process read it.

Output on stdout: a header (``_HEADER``: lines read, TASK records seen, edges, whether
any edge points backward) and the edges' parents and children as native unsigned
32-bit arrays.
"""

from __future__ import annotations

import gc
import struct
import sys
from array import array
from typing import IO

from pmc.dag.lines import edge_ids, is_plain, read_blocks, split_fields
from pmc.dag.model import DagError
from pmc.errors import ExitCode
from pmc.pychild import python_command

# DAG files at least this big get a helper: starting one takes ~30 ms, and for 100,000
# tasks and as many edges (6.8 MB) it saved no more than that.
MIN_BYTES = 8 << 20
# The share of the EDGE section's bytes the helper resolves: SHARE_BASE, plus SHARE_SLOPE
# for every byte before the EDGE section per byte in it, at most SHARE_MOST. The helper
# reaches the EDGE section well before the parser, which has built a Task per TASK line
# on the way, and the more TASK text per EDGE line (options, a "#@" line per task) the
# longer that takes. Best shares measured on 1M tasks + 1M edges (TASK section bytes
# per EDGE section byte in brackets): 0.65 plain (1.2), ~0.70 with "-m 1 -c 1" on every
# TASK line (1.5), ~0.78 with a "#@" line before every TASK line (3.1).
SHARE_BASE = 0.55
SHARE_SLOPE = 0.08
SHARE_MOST = 0.85

_HEADER = struct.Struct("=QQQB")


def split_offset(first_edges: int, size: int) -> int:
    """The byte offset from which EDGE lines are the helper's, given the offset of the
    first block holding "EDGE" and the file's size. Always past that first block's
    start, so the parser resolves at least the lines of that block."""
    edges = size - first_edges
    share = min(SHARE_MOST, SHARE_BASE + SHARE_SLOPE * first_edges / max(1, edges))
    return first_edges + max(1, int(edges * (1 - share)))


class EdgeHelper:
    """The parser's handle on a running helper."""

    def __init__(self, path: str, size: int, chunk: int) -> None:
        import subprocess  # here: a DAG too small for a helper (most) never needs it

        self.size = size
        self.proc = subprocess.Popen(
            python_command("pmc.dag.edgehelper", path, str(size), str(chunk)),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def split_offset(self, first_edges: int) -> int:
        return split_offset(first_edges, self.size)

    def result(self, lines: int, tasks: int, parents: array[int],
               children: array[int]) -> bool | None:
        """Append the helper's edges to ``parents`` and ``children`` and say whether one
        points backward; None when it has no edges for a file of ``lines`` lines and
        ``tasks`` TASK records as the parser read it (the arrays are then spoilt)."""
        out = self.proc.stdout
        assert out is not None
        with out:
            backward = _read(out, lines, tasks, parents, children)
        return backward if self.proc.wait() == 0 else None

    def stop(self) -> None:
        """Stop the helper without its result."""
        if self.proc.returncode is None:
            self.proc.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc.wait()


def _read(out: IO[bytes], lines: int, tasks: int, parents: array[int],
          children: array[int]) -> bool | None:
    header = out.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    nlines, ntasks, nedges, backward = _HEADER.unpack(header)
    if (nlines, ntasks) != (lines, tasks):
        return None
    try:
        # Straight into the arrays: no copy of a few megabytes at the parse's peak.
        parents.fromfile(out, nedges)
        children.fromfile(out, nedges)
    except EOFError:
        return None
    return None if out.read(1) else bool(backward)


def resolve(path: str, size: int, chunk: int, out: IO[bytes]) -> None:
    """Resolve the EDGE lines from ``split_offset`` on and write them to ``out``; raise
    DagError (or OSError) for anything the parser would report."""
    index: dict[str, int] = {}
    setdefault = index.setdefault
    ntasks = 0
    parents = array("I")
    children = array("I")
    add_parent = parents.append
    add_child = children.append
    backward = False
    split = -1
    nlines = 0
    with open(path, "rb") as f:
        for offset, before, data, lines in read_blocks(path, f, chunk):
            nlines = before + len(lines)
            if split < 0 and b"EDGE" in data:
                split = split_offset(offset, size)
            # Fields split as the parser splits them (pmc.dag.lines): the same names.
            plain = is_plain(data)
            if split < 0 or offset < split:
                # The parser's part: only the task names matter here.
                if b"TASK" in data:
                    for line in lines:
                        parts = line.split(None, 2) if plain else split_fields(line)
                        if parts and parts[0] == "TASK":
                            if len(parts) > 1:
                                setdefault(parts[1], ntasks)
                            ntasks += 1
                continue
            # The parser's EDGE branch (pmc.dag.reader._parse), inlined rather than shared: a
            # call per edge would cost ~0.1 s at a million edges. Its messages are not
            # needed: any error makes the parser parse again alone.
            for lineno, line in enumerate(lines, before + 1):
                parts = line.split(None, 2) if plain else split_fields(line)
                if not parts:
                    continue
                kind = parts[0]
                if kind == "EDGE":
                    try:
                        p = index[parts[1]]
                        c = index[parts[2]]
                    except (KeyError, IndexError):
                        p, c = edge_ids(path, lineno, line, index)
                    if p >= c:
                        if p == c:
                            raise DagError(path, lineno, "self edge")
                        backward = True
                    add_parent(p)
                    add_child(c)
                elif kind == "TASK":
                    if len(parts) > 1:
                        setdefault(parts[1], ntasks)
                    ntasks += 1
    out.write(_HEADER.pack(nlines, ntasks, len(parents), backward))
    out.write(parents.tobytes())
    out.write(children.tobytes())


def main(argv: list[str]) -> int:
    """``PATH SIZE CHUNK``: exit 0 with the edges on stdout, 1 without them."""
    gc.disable()  # nothing here makes reference cycles
    try:
        path, size, chunk = argv[0], int(argv[1]), int(argv[2])
        resolve(path, size, chunk, sys.stdout.buffer)
        sys.stdout.flush()
    except (DagError, OSError, ValueError, IndexError):
        return ExitCode.FAILED
    return ExitCode.OK
