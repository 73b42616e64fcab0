"""The edge helper: a second process that resolves the last part of a big DAG's EDGE lines.

Parsing a million-edge DAG is bound by memory latency: every EDGE line looks up two
task names in a dict far bigger than the CPU's caches. The parser (``pmc.dag.reader``) starts
this helper when a DAG file is big, and the two share the EDGE section. The helper reads
the same file in the same blocks (``pmc.dag.lines.read_blocks``), builds its own name
index from the TASK lines (cheaper than the parser's Task objects, so it is done first),
and then resolves EDGE lines block by block from the end of the file back. When the
parser reaches its first block holding the text "EDGE", it asks where to split
(``EdgeHelper.split_offset``): the helper answers with a byte offset halfway between
that block and the last block it has done, goes on back to that offset, and the
parser resolves the EDGE lines before it, skipping those from it on. So the split
follows how far each has got: on a DAG whose Task objects outgrow the caches the
helper has resolved every EDGE line by the time the parser gets there, and on a small
one they share what is left.

The helper checks its lines as the parser would, but any problem (a bad line, an
unreadable file, a file that changed) makes it exit without a result: if it had not
answered yet the parser reads on alone; if it had, the parser parses the whole file
again alone. So does any error the parser finds itself: every error is reported by
the one serial parser, at the first bad line in file order, and the helper's edges
need no line numbers. Repeated edges are passed on as they come: the parser's
``build_dag`` counts each edge once, whichever process read it.

On its stdin the helper gets the question (the offset of the parser's first block
holding "EDGE", ``_OFFSET``); on its stdout it writes the answer (an ``_OFFSET``), then
a header (``_HEADER``: lines read, TASK records seen, edges, whether any edge points
backward) and the edges' parents and children in file order, as native unsigned 32-bit
arrays.
"""

from __future__ import annotations

import gc
import os
import select
import struct
import sys
import time
from array import array
from typing import IO

from pmc.dag.lines import decode_block, edge_ids, is_plain, read_blocks, split_fields
from pmc.dag.model import DagError
from pmc.errors import ExitCode
from pmc.pychild import python_command

# DAG files at least this big get a helper: starting one takes ~30 ms, and for 100,000
# tasks and as many edges (6.8 MB) it saved no more than that.
MIN_BYTES = 8 << 20
# What indexing a task's name costs the parser, in seconds: measured 0.6 µs a task at a
# million tasks, 1.5 µs at ten million (the index outgrows the caches). The larger: a
# parser that stops to index its tasks while the helper could have ended alone is the
# costlier mistake.
INDEX_COST = 1.5e-6

_QUESTION = struct.Struct("=QQ")
_OFFSET = struct.Struct("=Q")
_HEADER = struct.Struct("=QQQB")


class EdgeHelper:
    """The parser's handle on a running helper."""

    def __init__(self, path: str, size: int, chunk: int) -> None:
        import subprocess  # here: a DAG too small for a helper (most) never needs it

        self.proc = subprocess.Popen(
            python_command("pmc.dag.edgehelper", path, str(size), str(chunk)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def split_offset(self, first_edges: int, unindexed: int) -> int:
        """The byte offset from which EDGE lines are the helper's, given the offset of
        the parser's first block holding "EDGE" and the tasks it would have to index
        before it could resolve one; -1 when the helper has gone (the parser then reads
        on alone). Waits for the helper to finish the block in hand."""
        asks, out = self.proc.stdin, self.proc.stdout
        assert asks is not None and out is not None
        try:
            asks.write(_QUESTION.pack(first_edges, unindexed))
            asks.flush()
            answer = out.read(_OFFSET.size)
        except OSError:
            return -1
        return _OFFSET.unpack(answer)[0] if len(answer) == _OFFSET.size else -1

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
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass  # the question not delivered: the helper is gone anyway
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


class _Asked:
    """The parser's question on fd ``fd``, and the helper's answer on ``out``."""

    def __init__(self, fd: int, out: IO[bytes]) -> None:
        self.fd = fd
        self.out = out
        self.first_edges = -1  # the offset of the first block holding "EDGE", once read
        self.split = -1  # the answer, once given
        self.rate = 0.0  # EDGE section bytes resolved per second, once measured

    def poll(self, done: int, wait: bool = False) -> None:
        """Answer the question if it has come (``wait``: once it comes), the EDGE lines
        of the blocks from ``done`` on being resolved already."""
        if self.split >= 0 or not (wait or select.select([self.fd], [], [], 0)[0]):
            return
        asked = b""
        while len(asked) < _QUESTION.size:
            got = os.read(self.fd, _QUESTION.size - len(asked))
            if not got:
                raise EOFError("the parser has gone")
            asked += got
        first, unindexed = _QUESTION.unpack(asked)
        if first != self.first_edges and self.first_edges >= 0:
            raise ValueError("the parser read other blocks")  # the file changed
        # What neither has done, shared so that both end together: the parser, once it
        # has indexed its tasks (meanwhile the helper goes on ``ahead``), reads EDGE lines
        # about as fast as the helper. Before the helper has timed a block, half each.
        ahead = unindexed * INDEX_COST * self.rate
        left = done - first
        # A share only where the parser's indexing is well spent (INDEX_COST is a guess
        # to a factor of two), else the helper ends alone: the parser is then idle, but
        # spares its index the memory too.
        self.split = first + (int(left - ahead) // 2 if left > 2 * ahead else 0)
        self.out.write(_OFFSET.pack(self.split))
        self.out.flush()


def resolve(path: str, size: int, chunk: int, asked: _Asked) -> None:
    """Read the task names, resolve EDGE lines from the end back until the answer given
    to the parser, and write them out; raise DagError (or OSError) for anything the
    parser would report."""
    index: dict[str, int] = {}
    setdefault = index.setdefault
    ntasks = 0
    nlines = 0
    blocks: list[tuple[int, int, int]] = []  # offset, lines before, bytes: from the first "EDGE"
    with open(path, "rb") as f:
        for offset, before, data, lines in read_blocks(path, f, chunk):
            nlines = before + len(lines)
            if asked.first_edges < 0 and b"EDGE" in data:
                asked.first_edges = offset
            if asked.first_edges >= 0:
                blocks.append((offset, before, len(data)))
            # Fields split as the parser splits them (pmc.dag.lines): the same names.
            if b"TASK" in data:
                plain = is_plain(data)
                for line in lines:
                    parts = line.split(None, 2) if plain else split_fields(line)
                    if parts and parts[0] == "TASK":
                        if len(parts) > 1 and setdefault(parts[1], ntasks) != ntasks:
                            raise DagError(path, None, "duplicate task id")  # the parser's
                        ntasks += 1
            asked.poll(size)
        done = size  # the EDGE lines from here on are resolved
        backward = False
        results: list[tuple[array[int], array[int]]] = []
        start = time.perf_counter()
        for offset, before, length in reversed(blocks):
            if done < size:
                asked.rate = (size - done) / (time.perf_counter() - start)
            asked.poll(done)
            if offset < asked.split:
                break
            data = os.pread(f.fileno(), length, offset)
            lines, error = decode_block(path, before, data)
            if error is not None or len(data) != length:
                raise error or DagError(path, None, "the DAG file changed")
            edges = (array("I"), array("I"))
            results.append(edges)
            backward = _edges(path, before, lines, is_plain(data), index, edges) or backward
            done = offset
    asked.poll(done, wait=True)
    results.reverse()  # in file order
    out = asked.out
    out.write(_HEADER.pack(nlines, ntasks, sum(len(p) for p, _ in results), backward))
    for which in (0, 1):
        for edges in results:
            out.write(edges[which])


def _edges(path: str, before: int, lines: list[str], plain: bool, index: dict[str, int],
           edges: tuple[array[int], array[int]]) -> bool:
    """Resolve a block's EDGE lines into ``edges`` (parents, children); whether one
    points backward."""
    # The parser's EDGE branch (pmc.dag.reader._Reader.take), inlined rather than shared:
    # a call per edge would cost ~0.1 s at a million edges. Its messages are not needed:
    # any error makes the parser parse again alone.
    add_parent, add_child = edges[0].append, edges[1].append
    backward = False
    for lineno, line in enumerate(lines, before + 1):
        parts = line.split(None, 2) if plain else split_fields(line)
        if not parts or parts[0] != "EDGE":
            continue  # TASK, comment and other lines are the parser's
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
    return backward


def main(argv: list[str]) -> int:
    """``PATH SIZE CHUNK``: exit 0 with the edges on stdout, 1 without them."""
    gc.disable()  # nothing here makes reference cycles
    try:
        path, size, chunk = argv[0], int(argv[1]), int(argv[2])
        resolve(path, size, chunk, _Asked(sys.stdin.fileno(), sys.stdout.buffer))
        sys.stdout.flush()
    except (DagError, OSError, ValueError, IndexError, EOFError):
        return ExitCode.FAILED
    return ExitCode.OK
