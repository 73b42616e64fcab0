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

On its stdin the helper gets the question (``_QUESTION``: the offset of the parser's
first run holding "EDGE", the tasks it has not indexed); on its stdout it writes the
answer (an ``_OFFSET``), once it has read the whole file the map (``_MAP``: a count of
runs, then each run of its share the parser must read as an ``_ENTRY``: offset, bytes,
lines before it), then what it has counted of its edges for ``build_dag``
(``pmc.dag.graph.EdgeTally``) while it waited for the question (``_TALLY``: TASK
records, the runs and edges counted, the tally's flags, and where it counted any, each
task's parents and children as native unsigned 32-bit arrays), then each run's edges
as a frame (``_FRAME``: a count, then the parents and the children as such arrays),
from the end of the file back, the counted first, and last an ``_END`` frame and a
header (``_HEADER``: TASK records seen, edges, whether any edge points backward), and
once it has checked that no name is in two blocks of its index, ``_UNIQUE``. The
frames go as far as the pipe takes them while the helper works, never waiting for the
parser: the parser counts those not counted as they come, rather than idle until the
last. The check of the names comes last, and takes ~2 s at ten million tasks: a
question that comes meanwhile is answered, and the frames and header written from a
thread, while it goes on; the parser builds its DAG before it waits for ``_UNIQUE``.
"""

from __future__ import annotations

import fcntl
import gc
import os
import select
import struct
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Mapping
from typing import IO

from pmc.dag.graph import EdgeTally
from pmc.dag.helperindex import NameIndex, edges_of, index_names, names_in_last_edges
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

_QUESTION = struct.Struct("=QQ")
_OFFSET = struct.Struct("=Q")
_MAP = struct.Struct("=Q")
_ENTRY = struct.Struct("=QQQ")
_FRAME = struct.Struct("=Q")
_END = (1 << 64) - 1  # the frame count that ends the frames
_HEADER = struct.Struct("=QQB")
_TALLY = struct.Struct("=QQQBBq")
_UNIQUE = b"U"  # the last byte: no task name is given twice
_PIPE_BYTES = 1 << 20  # the helper's stdout, where the system allows (the default is 64 KiB)
# The helper's name index is a dict far bigger than the TLB reaches with 4 KiB pages.
# Where transparent huge pages are given only on request (the "madvise" setting), glibc
# (2.35 on) asks for them for what it allocates when told so: at ten million tasks the
# lookups then take 0.5-1 s less. Elsewhere the tunable is unknown and ignored.
_HUGE_PAGES = "glibc.malloc.hugetlb=1"
_IOV_MAX = os.sysconf("SC_IOV_MAX")  # the parts of one write


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
            asks.write(_QUESTION.pack(first_edges, unindexed))
            asks.flush()
            answer = out.read(_OFFSET.size)
        except OSError:
            return -1
        return _OFFSET.unpack(answer)[0] if len(answer) == _OFFSET.size else -1

    def runs_to_read(self) -> list[tuple[int, int, int]] | None:
        """The runs of its share the parser must read (offset, bytes, lines before it);
        None when the helper has gone. Waits for the helper to have read the whole file."""
        out = self.proc.stdout
        assert out is not None
        try:
            head = out.read(_MAP.size)
            if len(head) < _MAP.size:
                return None
            (count,) = _MAP.unpack(head)
            entries = out.read(count * _ENTRY.size)
        except OSError:
            return None
        if len(entries) < count * _ENTRY.size:
            return None
        return list(_ENTRY.iter_unpack(entries))

    def result(self, tasks: int, parents: array[int], children: array[int],
               tally: EdgeTally) -> bool | None:
        """Append the helper's edges to ``parents`` and ``children``, counted into
        ``tally`` (what the helper counted, the rest as they come), and say whether one
        points backward; None when it has no edges for a file of ``tasks`` TASK records
        as the parser read it (the arrays and the tally are then spoilt)."""
        out = self.proc.stdout
        assert out is not None
        return _read(out, tasks, parents, children, tally)

    def names_unique(self) -> bool:
        """Whether the helper found every task name once (after ``result``); False
        when it has gone without saying so."""
        out = self.proc.stdout
        assert out is not None
        with out:
            said = out.read(len(_UNIQUE) + 1)
        return self.proc.wait() == 0 and said == _UNIQUE

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


def _read(out: IO[bytes], tasks: int, parents: array[int], children: array[int],
          tally: EdgeTally) -> bool | None:
    runs: list[tuple[array[int], array[int]]] = []  # from the end of the file back
    try:
        if len(head := out.read(_TALLY.size)) < _TALLY.size:
            return None  # cut short
        ntasks, counted, tally.edges, ascending, ordered, tally.next_key = _TALLY.unpack(head)
        if ntasks != tasks:
            return None
        tally.ascending, tally.ordered = bool(ascending), bool(ordered)
        if counted:  # (build_dag copies the counts from an array as from a list)
            counts, ends = array("I"), array("I")
            counts.fromfile(out, ntasks)
            ends.fromfile(out, ntasks)
            tally.counts, tally.ends = counts, ends
        while True:
            if len(head := out.read(_FRAME.size)) < _FRAME.size:
                return None  # cut short
            (n,) = _FRAME.unpack(head)
            if n == _END:
                break
            run = array("I"), array("I")
            run[0].fromfile(out, n)
            run[1].fromfile(out, n)
            if counted:
                counted -= 1
            else:
                tally.add_before(*run)
            runs.append(run)
    except (EOFError, IndexError):  # cut short, or a task id beyond this parse's tasks
        return None
    header = out.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    ntasks, nedges, backward = _HEADER.unpack(header)
    if (ntasks, nedges) != (tasks, tally.edges):
        return None
    while runs:  # in file order, each let go once copied
        run_parents, run_children = runs.pop()
        parents.extend(run_parents)
        children.extend(run_children)
    return bool(backward)


class _Asked:
    """The parser's question on fd ``fd``, and the helper's answer on ``out``."""

    def __init__(self, fd: int, out: IO[bytes]) -> None:
        self.fd = fd
        self.out = out
        self.first_edges = -1  # the offset of the first block holding "EDGE", once read
        self.split = -1  # the answer, once given
        # Once the file is read: (offset, bytes, lines before it) of each run from the
        # first "EDGE" that holds what the parser must read (the map).
        self.theirs: list[tuple[int, int, int]] | None = None
        self.mapped = False
        self.rate = 0.0  # EDGE section bytes resolved per second, once measured
        # Seconds per task the parser's index will cost: twice what the helper's took.
        # The parser's is one dict, which outgrows the caches where the helper's blocks
        # do not (270 ns a task at a million tasks against the helper's 250 here; at ten
        # million 553 against ~280): too much time given to it would leave the helper
        # idle while the parser indexes.
        self.index_cost = 0.0

    def waiting(self) -> bool:
        """Whether the question has come and waits for its answer."""
        return self.split < 0 and bool(select.select([self.fd], [], [], 0)[0])

    def poll(self, done: int, wait: bool = False) -> None:
        """Answer the question if it has come (``wait``: once it comes), the EDGE lines
        of the blocks from ``done`` on being resolved already."""
        if self.split >= 0 or not (wait or self.waiting()):
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
        ahead = unindexed * self.index_cost * self.rate
        left = done - first
        # A share only where the parser's index saves it well more than it costs, else
        # the helper ends alone: the parser is idle, but spares the index's memory.
        self.split = first + (int(left - ahead) // 2 if left > 1.5 * ahead else 0)
        self.out.write(_OFFSET.pack(self.split))
        self.out.flush()
        self.send_map()

    def send_map(self) -> None:
        """Once the answer is given and the file read: the runs of the helper's share
        the parser must read."""
        if self.split < 0 or self.theirs is None or self.mapped:
            return
        runs = [run for run in self.theirs if run[0] >= self.split]
        self.out.write(b"".join([_MAP.pack(len(runs)),
                                 *(_ENTRY.pack(*run) for run in runs)]))
        self.out.flush()
        self.mapped = True


class _Frames:
    """The helper's stdout after the answer: ``first`` (the ``_TALLY``), then the
    frames, each written as far as the pipe takes it while the helper works (it never
    waits for the parser), the rest at the end."""

    def __init__(self, fd: int, first: bytes) -> None:
        self.fd = fd
        self.pending: deque[memoryview] = deque([memoryview(first)])
        self.writer: threading.Thread | None = None
        self.failed: OSError | None = None  # the writer's, raised at the end
        os.set_blocking(fd, False)
        self.pump()

    def add(self, parents: array[int], children: array[int]) -> None:
        assert self.writer is None, "no frame is added after the end"
        self.pending.append(memoryview(b"".join((_FRAME.pack(len(parents)), parents,
                                                 children))))
        self.pump()

    def pump(self) -> None:
        pending = self.pending
        while pending:
            try:
                written = os.write(self.fd, pending[0])
            except BlockingIOError:
                return
            if written < len(pending[0]):
                pending[0] = pending[0][written:]
                return
            pending.popleft()

    def end(self, header: bytes, background: bool = False) -> None:
        """The last frames, the end and the header, waiting for the parser to take them;
        with ``background`` from a thread, while the helper goes on (a blocking write
        waits in the kernel, without the interpreter's lock): see ``ended``."""
        os.set_blocking(self.fd, True)
        self.pending.append(memoryview(_FRAME.pack(_END) + header))
        if not background:
            _write_all(self.fd, self.pending)
            return
        self.writer = threading.Thread(target=self._write_pending, daemon=True)
        self.writer.start()

    def _write_pending(self) -> None:
        try:
            _write_all(self.fd, self.pending)
        except OSError as e:  # the parser has gone
            self.failed = e

    def ended(self) -> None:
        """Wait for the thread of ``end(background=True)`` to have written all."""
        if self.writer is not None:
            self.writer.join()
            if self.failed is not None:
                raise self.failed


def _write_all(fd: int, pending: deque[memoryview]) -> None:
    """Write ``pending`` to ``fd`` (blocking), as few calls as the system's limit on the
    parts of one write allows."""
    while pending:
        parts = [pending.popleft() for _ in range(min(len(pending), _IOV_MAX))]
        written = os.writev(fd, parts)
        while parts and written >= len(parts[0]):  # (cut short only by a signal)
            written -= len(parts.pop(0))
        if parts:
            parts[0] = parts[0][written:]
            pending.extendleft(reversed(parts))


def resolve(path: str, size: int, chunk: int, asked: _Asked, block: int = BLOCK) -> None:
    """Read the task names, resolve EDGE lines from the end back until the answer given
    to the parser, and write them out; raise DagError (or OSError, KeyError) for
    anything the parser would report. ``block``: names in each dict of the index."""
    ntasks = 0
    nlines = 0
    # Offset, bytes, lines and the tasks defined before it, of each run from the first
    # "EDGE"
    blocks: list[tuple[int, int, int, int]] = []
    theirs: list[tuple[int, int, int]] = []  # (the map: see _Asked)
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
        sent = _Sent(asked, ntasks)
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
        header = _HEADER.pack(ntasks, nedges, backward)
        if not index.unique(lambda: sent.answer(done, header)):
            raise DagError(path, None, "duplicate task id")  # the parser reports it
    sent.end(done, header)
    asked.out.write(_UNIQUE)
    asked.out.flush()


class _Sent:
    """The helper's edges on their way to the parser: held until it is answered, then
    frames, each run as it is resolved."""

    def __init__(self, asked: _Asked, ntasks: int) -> None:
        self.asked = asked
        self.ntasks = ntasks
        self.held: list[tuple[array[int], array[int]]] = []  # resolved before the answer
        self.frames: _Frames | None = None

    def add(self, parents: array[int], children: array[int]) -> None:
        self.held.append((parents, children))
        if self.asked.split >= 0:  # answered: from now on each run goes as it is resolved
            self._send_held()

    def _send_held(self) -> None:
        frames = self.frames = self.frames or _Frames(self.asked.out.fileno(),
                                                      _uncounted(self.ntasks))
        for run in self.held:
            frames.add(*run)
        self.held.clear()

    def answer(self, done: int, header: bytes) -> None:
        """Between two blocks of the check of the names (the EDGE lines from ``done`` on
        resolved): the parser answered if it has asked, and the edges and ``header``
        sent from a thread while the check goes on, the parser counting them as they
        come."""
        if self.frames is None and (self.asked.split >= 0 or self.asked.waiting()):
            self.asked.poll(done)
            self._send_held()
        if self.frames is not None and self.frames.writer is None:
            self.frames.end(header, background=True)

    def end(self, done: int, header: bytes) -> None:
        """The rest, and ``header``: the edges counted until the question comes where it
        has not come yet."""
        if self.frames is None:
            self.frames = _count_until_asked(self.held, self.ntasks, self.asked, done)
            for run in self.held:
                self.frames.add(*run)
        if self.frames.writer is None:
            self.frames.end(header)
        self.frames.ended()


def _count_until_asked(held: list[tuple[array[int], array[int]]], ntasks: int,
                       asked: _Asked, done: int) -> _Frames:
    """Not asked yet: count the edges ``held`` meanwhile, run by run until the question
    comes, as the parser would have counted them after it; answer it, and start the
    frames with what was counted."""
    tally = EdgeTally(ntasks)
    counted = 0
    for run in held:
        if asked.waiting():
            break
        tally.add_before(*run)
        counted += 1
    # The counts made ready to send while the parser still reads, unless it is already
    # waiting: at ten million tasks, 80 MB it waited 0.4-0.5 s for.
    first = None if asked.waiting() else _counted(tally, counted)
    asked.poll(done, wait=True)
    return _Frames(asked.out.fileno(), first or _counted(tally, counted))


def _uncounted(ntasks: int) -> bytes:
    """The ``_TALLY`` of a helper that counted none of its edges."""
    return _TALLY.pack(ntasks, 0, 0, True, True, -1)


def _counted(tally: EdgeTally, runs: int) -> bytes:
    """The ``_TALLY`` of the first ``runs`` runs sent, counted into ``tally``."""
    if not runs:
        return _uncounted(len(tally.counts))
    return b"".join((_TALLY.pack(len(tally.counts), runs, tally.edges, tally.ascending,
                                 tally.ordered, tally.next_key),
                     array("I", tally.counts), array("I", tally.ends)))


def main(argv: list[str]) -> int:
    """``PATH SIZE CHUNK BLOCK``: exit 0 with the edges on stdout, 1 without them."""
    gc.disable()  # nothing here makes reference cycles
    try:
        fcntl.fcntl(sys.stdout.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:
        pass  # not a pipe, or over the system's limit: the default size
    try:
        path, size, chunk, block = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
        resolve(path, size, chunk, _Asked(sys.stdin.fileno(), sys.stdout.buffer), block)
        sys.stdout.flush()
    except (DagError, OSError, ValueError, KeyError, EOFError):
        return ExitCode.FAILED
    return ExitCode.OK
