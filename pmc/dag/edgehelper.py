"""The edge helper: a second process that resolves the last part of a big DAG's EDGE lines.

Parsing a million-edge DAG is bound by memory latency: every EDGE line looks up two
task names in a dict far bigger than the CPU's caches. The parser (``pmc.dag.reader``) starts
this helper when a DAG file is big, and the two share the work. The helper reads the
same file in the same runs of lines (``pmc.dag.lines.read_runs``), indexes every TASK
line's name (the parser leaves its own index until it needs one), resolves EDGE lines
run by run from the end of the file back, and then checks that no two names are alike.
When the parser reaches its first run holding the text "EDGE", it asks where to split
(``EdgeHelper.split_offset``), telling how many tasks it would have to index first.
The helper answers with a byte offset: the EDGE lines from it on are the helper's,
those before it the parser's. It shares what neither has done so that both end
together, the parser's indexing counted at twice what the helper's own took, and when
that is not clearly worth it (a big DAG, whose index alone costs seconds) the parser
gets no share: it takes the helper's edges once they come. The parser does not read the
helper's share, but for the runs the helper maps for it: those holding a TASK line or a
comment (anything else but an EDGE record there fails the helper).

The helper checks its lines as the parser would, but any problem (a bad line, a name
given twice, an EDGE line naming a task defined below it, an unreadable file, a file
that changed) makes it exit without a result:
if it had not answered yet the parser reads on alone; if it had, the parser parses the
whole file again alone. So does any error the parser finds itself: every error is
reported by the one serial parser, at the first bad line in file order, and the
helper's edges need no line numbers. Repeated edges are passed on as they come: the
parser's ``build_dag`` counts each edge once, whichever process read it.

On its stdin the helper gets the question (``QUESTION``: the offset of the parser's
first run holding "EDGE", the tasks it has not indexed); on its stdout it writes (in the
formats of ``pmc.dag.helperwire``) the answer (an ``OFFSET``), once it has read the
whole file the map (``MAP``: a count of runs, then each run of its share the parser
must read as an ``ENTRY``: offset, bytes, lines before it), then what it has counted
of its edges for ``build_dag``
(``pmc.dag.graph.EdgeTally``) while it waited for the question (``_TALLY``: TASK
records, the runs and edges counted, the tally's flags, and where it counted any, each
task's parents and children as native unsigned 32-bit arrays), then each run's edges
as a frame (``_FRAME``: a count, then the parents and the children as such arrays),
from the end of the file back, the counted first, and last an ``_END`` frame and a
header (``HEADER``: TASK records seen, edges, whether any edge points backward), and
once it has checked that no name is in two blocks of its index, ``UNIQUE``. The
frames go as far as the pipe takes them while the helper works, never waiting for the
parser: the parser counts those not counted as they come, rather than idle until the
last. The check of the names comes last, and takes ~2 s at ten million tasks: a
question that comes meanwhile is answered, and the frames and header written from a
thread, while it goes on; the parser builds its DAG before it waits for ``UNIQUE``.
"""

from __future__ import annotations

import fcntl
import gc
import os
import sys
import time
from array import array
from collections.abc import Mapping

from pmc.dag.graph import EdgeTally
from pmc.dag.helperindex import NameIndex, edges_of, index_names, names_in_last_edges
from pmc.dag.helperwire import (
    ENTRY,
    HEADER,
    MAP,
    OFFSET,
    QUESTION,
    UNIQUE,
    Asked,
    Sent,
    read_edges,
)
from pmc.dag.lines import holds_edge, read_runs
from pmc.dag.model import DagError
from pmc.errors import ExitCode
from pmc.pychild import python_command

# DAG files at least this big get a helper: starting one takes ~30 ms, and for 100,000
# tasks and as many edges (6.8 MB) it saved no more than that.
MIN_BYTES = 8 << 20
# Names in each dict of the helper's index (NameIndex): 100,000 took ~2.5 s at ten million
# tasks for names and edges, 500,000 ~3.2 s and 50,000 as 100,000.
BLOCK = 100_000

_PIPE_BYTES = 1 << 20  # the helper's stdout, where the system allows (the default is 64 KiB)
# The helper's name index is a dict far bigger than the TLB reaches with 4 KiB pages.
# Where transparent huge pages are given only on request (the "madvise" setting), glibc
# (2.35 on) asks for them for what it allocates when told so: at ten million tasks the
# lookups then take 0.5-1 s less. Elsewhere the tunable is unknown and ignored.
_HUGE_PAGES = "glibc.malloc.hugetlb=1"


class EdgeHelper:
    """The parser's handle on a running helper."""

    def __init__(self, path: str, size: int, chunk: int) -> None:
        import subprocess  # here: a DAG too small for a helper (most) never needs it

        self.proc = subprocess.Popen(
            python_command("pmc.dag.edgehelper", path, str(size), str(chunk), str(BLOCK)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_environment(os.environ),
        )

    def split_offset(self, first_edges: int, unindexed: int) -> int:
        """The byte offset from which EDGE lines are the helper's, given the offset of
        the parser's first block holding "EDGE" and the tasks it would have to index
        before it could resolve one; -1 when the helper has gone (the parser then reads
        on alone). Waits for the helper to finish the block in hand."""
        asks, out = self.proc.stdin, self.proc.stdout
        assert asks is not None and out is not None
        try:
            asks.write(QUESTION.pack(first_edges, unindexed))
            asks.flush()
            answer = out.read(OFFSET.size)
        except OSError:
            return -1
        return OFFSET.unpack(answer)[0] if len(answer) == OFFSET.size else -1

    def runs_to_read(self) -> list[tuple[int, int, int]] | None:
        """The runs of its share the parser must read (offset, bytes, lines before it);
        None when the helper has gone. Waits for the helper to have read the whole file."""
        out = self.proc.stdout
        assert out is not None
        try:
            head = out.read(MAP.size)
            if len(head) < MAP.size:
                return None
            (count,) = MAP.unpack(head)
            entries = out.read(count * ENTRY.size)
        except OSError:
            return None
        if len(entries) < count * ENTRY.size:
            return None
        return list(ENTRY.iter_unpack(entries))

    def result(self, tasks: int, parents: array[int], children: array[int],
               tally: EdgeTally) -> bool | None:
        """Append the helper's edges to ``parents`` and ``children``, counted into
        ``tally`` (what the helper counted, the rest as they come), and say whether one
        points backward; None when it has no edges for a file of ``tasks`` TASK records
        as the parser read it (the arrays and the tally are then spoilt)."""
        out = self.proc.stdout
        assert out is not None
        return read_edges(out, tasks, parents, children, tally)

    def names_unique(self) -> bool:
        """Whether the helper found every task name once (after ``result``); False
        when it has gone without saying so."""
        out = self.proc.stdout
        assert out is not None
        with out:
            said = out.read(len(UNIQUE) + 1)
        return self.proc.wait() == 0 and said == UNIQUE

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


def _environment(env: Mapping[str, str]) -> dict[str, str]:
    """The helper's environment: the parser's, with huge pages asked of glibc unless
    the user's own tunables say otherwise."""
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" in tunables:
        return dict(env)
    return {**env, "GLIBC_TUNABLES": f"{tunables}:{_HUGE_PAGES}" if tunables else _HUGE_PAGES}


def resolve(path: str, size: int, chunk: int, asked: Asked, block: int = BLOCK) -> None:
    """Read the task names, resolve EDGE lines from the end back until the answer given
    to the parser, and write them out; raise DagError (or OSError, KeyError) for
    anything the parser would report. ``block``: names in each dict of the index."""
    ntasks = 0
    nlines = 0
    # Offset, bytes, lines and the tasks defined before it, of each run from the first
    # "EDGE"
    blocks: list[tuple[int, int, int, int]] = []
    theirs: list[tuple[int, int, int]] = []  # (the map: see Asked)
    indexing = 0.0
    with open(path, "rb") as f:
        index = NameIndex(block, names_in_last_edges(f, size, chunk))
        for offset, data in read_runs(path, f, chunk):
            lines = data.count(b"\n") + (not data.endswith(b"\n"))
            if asked.first_edges < 0 and holds_edge(data):
                asked.first_edges = offset
            tasks = b"TASK" in data
            if asked.first_edges >= 0:
                blocks.append((offset, len(data), lines, ntasks))
                if tasks or b"#" in data:
                    theirs.append((offset, len(data), nlines))
            nlines += lines
            if tasks:
                started = time.perf_counter()
                ntasks = index_names(path, data, lines, index, ntasks)
                indexing += time.perf_counter() - started
            asked.poll(size)
        asked.index_cost = 2 * indexing / max(1, ntasks)
        asked.theirs = theirs
        asked.send_map()
        done = size  # the EDGE lines from here on are resolved
        backward = False
        nedges = 0
        sent = Sent(asked, ntasks)
        started = time.perf_counter()
        index.sealed()
        for offset, length, lines, before in reversed(blocks):
            if done < size:
                asked.rate = (size - done) / (time.perf_counter() - started)
            asked.poll(done)
            if offset < asked.split:
                break
            data = os.pread(f.fileno(), length, offset)
            if len(data) != length:
                raise DagError(path, None, "the DAG file changed")
            # (An EDGE line may name only tasks defined above it: a look where any is
            # defined below.)
            parents, children, back = edges_of(path, data, lines, index,
                                             before if before < ntasks else -1)
            done = offset
            if not parents:
                continue
            backward = backward or back
            nedges += len(parents)
            sent.add(parents, children)
        header = HEADER.pack(ntasks, nedges, backward)
        if not index.unique(lambda: sent.answer(done, header)):
            raise DagError(path, None, "duplicate task id")  # the parser reports it
    sent.end(done, header)
    asked.out.write(UNIQUE)
    asked.out.flush()


def main(argv: list[str]) -> int:
    """``PATH SIZE CHUNK BLOCK``: exit 0 with the edges on stdout, 1 without them."""
    gc.disable()  # nothing here makes reference cycles
    try:
        fcntl.fcntl(sys.stdout.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:
        pass  # not a pipe, or over the system's limit: the default size
    try:
        path, size, chunk, block = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
        resolve(path, size, chunk, Asked(sys.stdin.fileno(), sys.stdout.buffer), block)
        sys.stdout.flush()
    except (DagError, OSError, ValueError, KeyError, EOFError):
        return ExitCode.FAILED
    return ExitCode.OK
