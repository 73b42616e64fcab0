"""What the edge helper (``pmc.dag.edgehelper``) reads and keeps: a run's TASK names and
EDGE records, read as bytes, and the index of the names, in blocks by id.
"""

from __future__ import annotations

import os
import re
from array import array
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import eq, ge, itemgetter
from typing import IO

from pmc.dag.model import DagError

# The helper reads bytes, not text: a name's bytes are as unique as its text, and the
# parser, which decodes every line, finds any that is not UTF-8. The record blanks
# (space, tab, CR) split bytes as they split the parser's text (pmc.dag.lines): in UTF-8
# they are never part of another character, and where str.split() would split at more
# (vertical tab, form feed...) is_plain has sent the parser to the record blanks too.
_BLANK_RUN = re.compile(rb"[ \t\r]+")
_BLANKS = b" \t\r"
_ODD_BLANKS = (b"\x0b", b"\x0c")  # blanks to bytes.split(), not to the parser
# A run's TASK records and each one's name in one search (the run's first line apart,
# matched alone), when each of its lines is one, or every "TASK" in it begins one (else
# the run is read line by line). A name ends at a record blank; where the run has none
# of _ODD_BLANKS that is where \S ends, which the search takes a fifth faster; and it is
# a sixth faster again where "TASK" and the name are one space apart, as generators
# write them (tried first: a run it misses a record of is searched for any blanks).
_TASK_SPACE = re.compile(rb"\nTASK (\S+)"), re.compile(rb"TASK (\S+)")
_TASK_BLANKS = re.compile(rb"\nTASK[ \t\r]+(\S+)"), re.compile(rb"TASK[ \t\r]+(\S+)")
_TASK_ODD = re.compile(rb"\nTASK[ \t\r]+([^ \t\r\n]+)"), re.compile(rb"TASK[ \t\r]+([^ \t\r\n]+)")


def _odd(data: bytes) -> bool:
    """Whether ``data`` holds a blank of _ODD_BLANKS."""
    return any(odd in data for odd in _ODD_BLANKS)


def _fields(line: bytes) -> list[bytes]:
    text = line.strip(_BLANKS)
    return _BLANK_RUN.split(text) if text else []


def index_names(path: str, data: bytes, lines: int, index: NameIndex, ntasks: int) -> int:
    """Index the names of a run's TASK records (``lines`` lines), the first being task
    ``ntasks``; the count of tasks after them. A name given twice in the index's block
    raises DagError (one in two blocks is found by ``NameIndex.unique``)."""
    ids: Sequence[int]
    for search, first_search in ((_TASK_ODD,) if _odd(data) else (_TASK_SPACE, _TASK_BLANKS)):
        names = search.findall(data)
        if first := first_search.match(data):
            names.insert(0, first[1])
        # (Each found at the start of a line of its own: as many as lines, none is
        # missed, and the look for "TASK" elsewhere, 0.4 s of ten million lines, is
        # spared.)
        if len(names) == lines or len(names) == data.count(b"TASK"):
            ids = range(ntasks, ntasks + len(names))
            ntasks += len(names)
            break
    else:  # a "TASK" within a line, or a record without a name: line by line
        names, ids = [], []
        for line in data.split(b"\n"):
            fields = _fields(line)
            if fields and fields[0] == b"TASK":
                if len(fields) > 1:
                    names.append(fields[1])
                    ids.append(ntasks)
                ntasks += 1
    if not index.add(names, ids):
        raise DagError(path, None, "duplicate task id")  # the parser reports it
    return ntasks


def edges_of(path: str, data: bytes, lines: int, index: NameIndex, defined: int = -1,
           ) -> tuple[array[int], array[int], bool]:
    """The EDGE records of a run of ``lines`` lines as (parents, children, whether one
    points backward); DagError (or KeyError) for a bad one: a self edge, an unknown name,
    a name defined below it, a line with more or fewer than two names. ``defined``: the
    tasks defined before the run where some are defined after it; -1 where none is."""
    fields = data.split() if not _odd(data) else []
    n = len(fields) // 3
    limits = None  # the tasks defined above each EDGE line, where TASK lines are among them
    # A run of nothing but EDGE records of two names each, split in one go: n lines, each
    # beginning "EDGE ", 3n fields, "EDGE" the field at 0, 3, 6... and at no other (each
    # other is looked up, and no task is named so): each line is one record's 3 fields.
    if (fields and len(fields) == 3 * n == 3 * lines and not index.named_edge
            and data.count(b"\nEDGE ") + data.startswith(b"EDGE ") == n
            and fields[::3].count(b"EDGE") == n):
        parents_named, children_named = fields[1::3], fields[2::3]
    else:
        parents_named, children_named = [], []
        limits = array("I") if defined >= 0 else None
        for line in data.split(b"\n"):
            fields = _fields(line)
            if not fields or fields[0].startswith(b"#"):
                continue  # (the parser reads a run with a comment: see _Asked)
            if fields[0] == b"TASK":
                if limits is not None:
                    defined += 1
            elif fields[0] == b"EDGE":
                if len(fields) != 3:
                    raise DagError(path, None, "EDGE needs a parent and a child")
                parents_named.append(fields[1])
                children_named.append(fields[2])
                if limits is not None:
                    limits.append(defined)
            else:  # the parser does not read the run: the parse alone reports it
                raise DagError(path, None, "unknown record type")
    parents = index.ids(parents_named)
    children = index.ids(children_named)
    if defined >= 0:
        above = repeat(defined) if limits is None else limits
        if any(map(ge, parents, above)) or any(map(ge, children, above)):
            raise DagError(path, None, "EDGE names a task defined below it")
    # A self edge points backward too: most DAGs have neither, and take one pass.
    backward = any(map(ge, parents, children))
    if backward and any(map(eq, parents, children)):
        raise DagError(path, None, "self edge")
    return array("I", parents), array("I", children), backward


class NameIndex:
    """The task names' ids, in dicts of about ``block`` names each (a run's names go in
    one), by id: each is filled, and read by runs of EDGE lines that name tasks near
    each other (as generators write them), while it is in the caches, where one dict of
    ten million names is not (at 10M, the names indexed in 2.5-3.2 s where one dict took
    4.6-5.4, and the edges resolved in 2.6 where it took 4.4). A run that names a task
    beyond the block in hand and the two beside it merges the blocks into one dict, read
    from then on; so do the first blocks where the EDGE lines resolved first (the file's
    last run: ``named_last``) name tasks in them, as EDGE lines in no order do. A name in
    two blocks is found once the edges are resolved (``unique``), in a set: a set takes
    a name in a third of a dict's time (still ~2 s at ten million names, so the helper
    answers the parser and sends its edges between two blocks of the check)."""

    def __init__(self, block: int, named_last: set[bytes]) -> None:
        self.block = block
        self.blocks: list[dict[bytes, int]] = [{}]
        self.whole: dict[bytes, int] | None = None  # the blocks merged, once needed
        self.named = 0  # names added
        self.at = 0  # the block tried first
        self.named_edge = False  # a task is named "EDGE" (known once sealed)
        # Looked for in the first two blocks: a lookup far off merges them all later,
        # which took ~1 s more than one dict from the start, at ten million tasks.
        self.named_last: set[bytes] | None = named_last or None

    def add(self, names: list[bytes], ids: Sequence[int]) -> bool:
        """Add ``names`` with their ``ids`` (after every id added so far); False for a
        name given twice in the dict it goes in."""
        if self.whole is None and len(self.blocks[-1]) >= self.block:
            self.blocks.append({})
        if self.named_last is not None:
            if len(self.blocks) > 2:
                self.named_last = None
            elif not self.named_last.isdisjoint(names):
                self.named_last = None
                self._merge()
        index = self.blocks[-1] if self.whole is None else self.whole
        known = len(index)
        index.update(zip(names, ids, strict=True))
        self.named += len(names)
        return len(index) - known == len(names)

    def sealed(self) -> None:
        """Every name is added: look names up from the last block on."""
        self.named_edge = any(b"EDGE" in index for index in (self.whole, *self.blocks)
                              if index is not None)
        self.at = len(self.blocks) - 1

    def ids(self, names: list[bytes]) -> Sequence[int]:
        """The ids of ``names`` (see ``_ids``); KeyError for a name of no task."""
        if self.whole is None:
            try:
                return _ids(self.blocks[self.at], names)
            except KeyError:
                near = self._near(names)
            if near is not None:
                return near
            self._merge()
        assert self.whole is not None
        return _ids(self.whole, names)

    def _merge(self) -> None:
        self.whole = {}
        for block in self.blocks:
            self.whole.update(block)
        self.blocks = []

    def _near(self, names: list[bytes]) -> list[int] | None:
        """The ids of ``names`` where each is in the block tried first or one beside it
        (a run of EDGE lines across two blocks), else None; the block of the first name
        is then the one tried first."""
        at = self.at
        near = [(k, self.blocks[k]) for k in (at, at - 1, at + 1) if 0 <= k < len(self.blocks)]
        ids: list[int] = []
        for name in names:
            for k, block in near:
                if (found := block.get(name)) is not None:
                    if not ids:
                        self.at = k
                    ids.append(found)
                    break
            else:
                return None
        return ids

    def unique(self, between: Callable[[], object] = lambda: None) -> bool:
        """Whether no name was added twice; the blocks are let go as they are read (the
        index is then spent). ``between`` is called before each block is read."""
        if self.whole is not None:
            return len(self.whole) == self.named
        seen: set[bytes] = set()
        while self.blocks:
            between()
            seen.update(self.blocks.pop())
        return len(seen) == self.named


def names_in_last_edges(f: IO[bytes], size: int, chunk: int) -> set[bytes]:
    """The names in the EDGE lines of the file's last ``chunk`` bytes (its whole lines)."""
    tail = os.pread(f.fileno(), min(size, chunk), max(0, size - chunk)).split(b"\n")
    named: set[bytes] = set()
    for line in tail[size > chunk:]:  # (the first, which the read may have cut)
        fields = _fields(line)
        if len(fields) == 3 and fields[0] == b"EDGE":
            named.update(fields[1:])
    return named


def _ids(index: dict[bytes, int], names: list[bytes]) -> Sequence[int]:
    """The ids of ``names`` (the dict's own int objects, which compare twice as fast as
    an array's items, made anew at each read); KeyError for a name not in ``index``. An
    itemgetter looks them up in C, at ~200 ns a name where map over index.__getitem__
    takes ~280 (it gives a tuple for two names or more, for one the id alone)."""
    if len(names) > 1:
        ids: tuple[int, ...] = itemgetter(*names)(index)
        return ids
    return [index[name] for name in names]
