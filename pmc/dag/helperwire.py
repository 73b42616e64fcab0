"""The edge helper's pipes (``pmc.dag.edgehelper``): what goes over them and how.

The question and its answer, the map of runs the parser must read (``Asked``, the
helper's side), the helper's edges as frames with their count, end and header, and the
verdict on the names (``Sent``, ``Frames``: the helper writes them; ``read_edges``: the
parser reads them). The order of it all is in ``pmc.dag.edgehelper``'s docstring.
"""

from __future__ import annotations

import os
import select
import struct
import threading
from array import array
from collections import deque
from typing import IO

from pmc.dag.graph import EdgeTally

QUESTION = struct.Struct("=QQ")
OFFSET = struct.Struct("=Q")
MAP = struct.Struct("=Q")
ENTRY = struct.Struct("=QQQ")
_FRAME = struct.Struct("=Q")
_END = (1 << 64) - 1  # the frame count that ends the frames
HEADER = struct.Struct("=QQB")
_TALLY = struct.Struct("=QQQBBq")
UNIQUE = b"U"  # the last byte: no task name is given twice
_IOV_MAX = os.sysconf("SC_IOV_MAX")  # the parts of one write


def read_edges(out: IO[bytes], tasks: int, parents: array[int], children: array[int],
               tally: EdgeTally) -> bool | None:
    """The parser's side: the helper's edges appended to ``parents`` and ``children``,
    counted into ``tally``, up to the header; whether one points backward, or None for
    a stream cut short or not of ``tasks`` TASK records."""
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
    header = out.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    ntasks, nedges, backward = HEADER.unpack(header)
    if (ntasks, nedges) != (tasks, tally.edges):
        return None
    while runs:  # in file order, each let go once copied
        run_parents, run_children = runs.pop()
        parents.extend(run_parents)
        children.extend(run_children)
    return bool(backward)


class Asked:
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
        while len(asked) < QUESTION.size:
            got = os.read(self.fd, QUESTION.size - len(asked))
            if not got:
                raise EOFError("the parser has gone")
            asked += got
        first, unindexed = QUESTION.unpack(asked)
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
        self.out.write(OFFSET.pack(self.split))
        self.out.flush()
        self.send_map()

    def send_map(self) -> None:
        """Once the answer is given and the file read: the runs of the helper's share
        the parser must read."""
        if self.split < 0 or self.theirs is None or self.mapped:
            return
        runs = [run for run in self.theirs if run[0] >= self.split]
        self.out.write(b"".join([MAP.pack(len(runs)),
                                 *(ENTRY.pack(*run) for run in runs)]))
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


class Sent:
    """The helper's edges on their way to the parser: held until it is answered, then
    frames, each run as it is resolved."""

    def __init__(self, asked: Asked, ntasks: int) -> None:
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
                       asked: Asked, done: int) -> _Frames:
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
