"""The edge helper: a big DAG parsed with a second process gives the very DAG, and the
very error, that parsing it alone gives.

Every test here makes the helper run on small files (any size, 64-byte blocks, so a
file of a few hundred bytes has many blocks and a split somewhere in its EDGE lines)
and checks that the helper really did resolve some of the edges.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pmctest import tasks_of

from pmc.dag import DAG, DagError, edgehelper, helperindex, helperwire, parse_dag
from pmc.dag import reader as dagmod
from pmc.dag.graph import EdgeTally


class Helped:
    """Counts the helper's results (edges it gave, runs that gave none) and the parses
    that ran again alone."""

    def __init__(self) -> None:
        self.edges = 0
        self.failed = 0
        self.alone = 0


@pytest.fixture
def helped(monkeypatch: pytest.MonkeyPatch) -> Helped:
    counts = Helped()
    monkeypatch.setattr(edgehelper, "MIN_BYTES", 0)
    monkeypatch.setattr(dagmod, "_CHUNK", 64)
    # Names in many of the helper's blocks: EDGE runs across them, and far ones.
    monkeypatch.setattr(edgehelper, "BLOCK", 16)
    result = edgehelper.EdgeHelper.result

    def counted(self: edgehelper.EdgeHelper, tasks: int, parents: array[int],
                children: array[int], tally: EdgeTally) -> bool | None:
        before = len(parents)
        got = result(self, tasks, parents, children, tally)
        if got is None:
            counts.failed += 1
        else:
            counts.edges += len(parents) - before
        return got

    monkeypatch.setattr(edgehelper.EdgeHelper, "result", counted)
    runs_to_read = edgehelper.EdgeHelper.runs_to_read

    def mapped(self: edgehelper.EdgeHelper) -> list[tuple[int, int, int]] | None:
        got = runs_to_read(self)
        counts.failed += got is None  # (gone before its map: it gives no result either)
        return got

    monkeypatch.setattr(edgehelper.EdgeHelper, "runs_to_read", mapped)
    parse = dagmod._parse

    def parse_counted(path: str, f: BinaryIO, helper: object = None) -> DAG:
        if helper is None:
            counts.alone += 1
        return parse(path, f, helper)  # type: ignore[arg-type]

    monkeypatch.setattr(dagmod, "_parse", parse_counted)
    return counts


def alone(path: str) -> DAG:
    saved = edgehelper.MIN_BYTES
    edgehelper.MIN_BYTES = 1 << 62
    try:
        return parse_dag(path)
    finally:
        edgehelper.MIN_BYTES = saved


def error_alone(path: str) -> str:
    with pytest.raises(DagError) as info:
        alone(path)
    return str(info.value)


def shape(d: DAG) -> tuple[object, ...]:
    tasks = [(t.id, t.name, t.command, t.line, t.memory, t.cpus, t.tries, t.priority,
              t.pipe_forwards, t.file_forwards, t.pegasus_id, t.expected_runtime)
             for t in tasks_of(d)]
    return (tasks, d.index, list(d.child_start), list(d.child_list), list(d.nparents))


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "h.dag"
    path.write_text(text, encoding="utf-8")
    return str(path)


def fan(n: int) -> str:
    """n tasks, then edges from each task to a few later ones, in no parent order."""
    text = "".join(f"TASK t{i} /bin/true {i}\n" for i in range(n))
    pairs = [(i, j) for j in range(1, n) for i in {j // 2, j // 3, max(0, j - 5)}]
    pairs.sort(key=lambda e: (e[1] * 7919) % n)
    return text + "".join(f"EDGE t{p} t{c}\n" for p, c in pairs)


def test_helper_gives_the_same_dag(tmp_path: Path, helped: Helped) -> None:
    text = "".join(f"TASK o{i} -m {i % 3} -p {i % 2} /bin/true\n" for i in range(50))
    path = write(tmp_path, text + fan(300))
    got = parse_dag(path)
    assert shape(got) == shape(alone(path))
    assert helped.edges > 100 and not helped.failed
    assert helped.alone == 1  # alone() only: the helped parse did not start again
    # The tasks' distinct options (gathered as the TASK lines are read) as parsed alone.
    assert got.option_kinds() == alone(path).option_kinds() and len(got.option_kinds()) == 6


MIXED = """\
# a DAG whose sections are not in order
TASK a /bin/echo "EDGE a b"
TASK b -m 5 -c 2 /bin/true
EDGE a b
#@ 7 transformation dax
TASK c /bin/true 'x y'
EDGE b c
\r
TASK d --priority=3 -- /bin/true
EDGE\ta d
EDGE d c
  EDGE c   e_later_is_fine_below
""".replace("  EDGE c   e_later_is_fine_below\n", "")


def test_interleaved_sections_options_and_comments(tmp_path: Path, helped: Helped) -> None:
    # Past the split the parser still reads TASK, comment and #@ lines itself; only
    # the EDGE lines are the helper's.
    more = "".join(f"TASK x{i} /bin/true\nEDGE a x{i}\n# note {i}\n" for i in range(40))
    more += "".join(f"#@ {i} tr dax\nTASK y{i} -t 2 /bin/echo '{i}'\nEDGE y{i} d\n"
                    for i in range(40))
    path = write(tmp_path, MIXED + more + "EDGE\tb\td  \r\n")
    got = parse_dag(path)
    assert shape(got) == shape(alone(path))
    assert got.task(got.index["y39"]).pegasus_id == "39"
    assert helped.edges > 20 and not helped.failed
    assert helped.alone == 1


def test_backward_edges_and_cycles(tmp_path: Path, helped: Helped) -> None:
    n = 200
    text = "".join(f"TASK t{i} /bin/true\n" for i in range(n))
    text += "".join(f"EDGE t{i + 1} t{i}\n" for i in range(n - 1))  # all backward
    path = write(tmp_path, text)
    assert shape(parse_dag(path)) == shape(alone(path))
    assert helped.alone == 1
    cyclic = write(tmp_path, text + "EDGE t0 t150\n")
    with pytest.raises(DagError) as info:
        parse_dag(cyclic)
    assert str(info.value) == error_alone(cyclic)
    assert "cycle of 151 tasks" in str(info.value)
    assert helped.edges > 50


@pytest.mark.parametrize(
    "bad",
    [
        "EDGE t3 nosuchtask\n",
        "EDGE t4 t4\n",
        "EDGE t1\n",
        "EDGE t1 t2 t3\n",
        "BOGUS line\n",
        "\x0b\n",  # a field to the parser, no blank
        "\x00\n",
        "EDGE t1 t\xff\n",  # a name of no task, not ASCII
        "TASK t5 /bin/true\n",  # a duplicate task id past the split
        "TASK t900 --tries -1 x\n",
    ],
)
def test_errors_in_the_helpers_share(tmp_path: Path, helped: Helped, bad: str) -> None:
    lines = fan(300).splitlines(keepends=True)
    lines.insert(len(lines) - 30, bad)  # well past the split
    lines.insert(len(lines) - 10, "EDGE t2 nosuchtask_later\n")  # a later error loses
    path = write(tmp_path, "".join(lines))
    with pytest.raises(DagError) as info:
        parse_dag(path)
    assert str(info.value) == error_alone(path)
    assert "nosuchtask_later" not in str(info.value)


def test_a_task_named_edge(tmp_path: Path, helped: Helped) -> None:
    # Its name may stand where "EDGE" begins a line: with such a task, a run whose fields
    # line up three by three is not taken for three a line unseen.
    lines = ("TASK EDGE /bin/true\n" + fan(300)).splitlines(keepends=True)
    lines.insert(len(lines) - 60, "EDGE EDGE t7\n")
    path = write(tmp_path, "".join(lines))
    assert shape(parse_dag(path)) == shape(alone(path))
    assert helped.edges > 100 and not helped.failed
    # A run of six fields on two lines, each beginning "EDGE ", the fields at 0 and 3
    # "EDGE": one name too few on the first line, one too many on the second.
    run = b"EDGE t1\nEDGE EDGE t2 t3\n"
    for names, error in (([b"EDGE", b"t1", b"t2", b"t3"], "EDGE needs a parent and a child"),
                         ([b"t0", b"t1", b"t2", b"t3"], None)):
        index = helperindex.NameIndex(100, set())
        index.add(names, range(4))
        index.sealed()
        with pytest.raises(KeyError if error is None else DagError, match=error):
            helperindex.edges_of("h.dag", run, 2, index)


def test_what_the_parser_reads_in_the_helpers_share(tmp_path: Path, helped: Helped) -> None:
    # Of the helper's share the parser reads only the runs with TASK lines or comments;
    # a Pegasus id many runs of EDGE lines above its TASK line is still that task's, and
    # blank lines are no records.
    lines = fan(300).splitlines(keepends=True)
    lines.insert(len(lines) - 200, "#@ 7 transform ID7\n")
    lines.insert(len(lines) - 100, "\n  \t\n")
    lines.insert(len(lines) - 10, "TASK late /bin/true\n# a comment\nEDGE t1 late\n")
    text = "".join(lines)
    path = write(tmp_path, text)
    got = parse_dag(path)
    assert shape(got) == shape(alone(path))
    late = got.task(got.index["late"])
    assert late.pegasus_id == "7"
    assert late.line == text.splitlines().index("TASK late /bin/true") + 1
    assert helped.edges > 100 and not helped.failed


@pytest.fixture(params=["parser first", "helper first"])
def late(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether the parser asks where to split only once the helper has had time to
    resolve every EDGE line (then it indexes no name itself)."""
    if request.param == "helper first":
        ask = edgehelper.EdgeHelper.split_offset

        def later(self: edgehelper.EdgeHelper, first_edges: int, unindexed: int) -> int:
            time.sleep(1)
            return ask(self, first_edges, unindexed)

        monkeypatch.setattr(edgehelper.EdgeHelper, "split_offset", later)
    return request.param == "helper first"


def test_helper_first_resolves_every_edge(tmp_path: Path, helped: Helped, late: bool) -> None:
    path = write(tmp_path, fan(300))
    got = parse_dag(path)
    assert shape(got) == shape(alone(path))
    assert helped.edges == got.edge_count() if late else helped.edges > 100


@pytest.mark.parametrize("where", [1, 150, 299])
def test_duplicate_task_ids_before_the_edges(tmp_path: Path, helped: Helped, late: bool,
                                             where: int) -> None:
    # Helped, the parser indexes names only once an EDGE line of its own needs them, and
    # the helper checks them meanwhile: a name given twice is still the error a parse
    # alone reports, at the same line.
    lines = fan(300).splitlines(keepends=True)
    lines.insert(where, "TASK t0 /bin/false\n")
    path = write(tmp_path, "".join(lines))
    with pytest.raises(DagError) as info:
        parse_dag(path)
    assert str(info.value) == error_alone(path)
    assert f":{where + 1}: duplicate task id 't0'" in str(info.value)


def test_dos_lines_blanks_and_record_words_in_names(tmp_path: Path, helped: Helped) -> None:
    # The helper reads bytes: CR LF line ends, blanks around fields, and "TASK" or "EDGE"
    # inside names and commands read as the parser reads them.
    names = [f"EDGE{i}" if i % 5 == 0 else f"t{i}TASK" if i % 7 == 0 else f"t{i}"
             for i in range(300)]
    text = "".join(f"{' ' * (i % 2)}TASK\t{name} /bin/echo TASK{i}\r\n"
                   for i, name in enumerate(names))
    text += "".join(f"EDGE {names[i // 2]}\t {names[i]} \r\n" for i in range(1, 300))
    path = write(tmp_path, text)
    got = parse_dag(path)
    assert shape(got) == shape(alone(path))
    assert got.edge_count() == 299 and got.index["EDGE5"] == 5
    assert helped.edges > 100 and not helped.failed


@pytest.mark.parametrize("every", [1, 9, 300])
def test_a_name_after_more_than_one_space(tmp_path: Path, helped: Helped, every: int) -> None:
    # Most runs have "TASK" and the name one space apart, and the helper looks for that
    # first: a run with other blanks there (one line in ``every``; with 300 the first
    # line alone, which is matched on its own) is searched again.
    seps = ["  ", "\t", " \t "]
    text = "".join(f"TASK{seps[(i // every) % 3] if i % every == 0 else ' '}t{i} /bin/true\n"
                   for i in range(300))
    path = write(tmp_path, text + "".join(f"EDGE t{i // 2} t{i}\n" for i in range(1, 300)))
    got = parse_dag(path)
    assert shape(got) == shape(alone(path))
    assert got.edge_count() == 299 and len(got) == 300
    assert helped.edges > 100 and not helped.failed


def test_duplicate_edge_across_the_split(tmp_path: Path, helped: Helped) -> None:
    # A repeated edge, one copy read by each process, counts once, as when alone.
    text = fan(300)
    path = write(tmp_path, text + "EDGE t1 t2\n")
    got = parse_dag(path)
    assert shape(got) == shape(alone(path)) == shape(alone(write(tmp_path, text)))
    assert list(got.children(1)).count(2) == 1
    assert helped.edges > 100 and not helped.failed


def test_names_with_unicode_spaces_across_the_split(tmp_path: Path, helped: Helped) -> None:
    # NBSP, U+3000 and vertical tab are part of a name, in the helper's share too.
    names = [f"t{i}\u00a0x" if i % 3 == 0 else f"t{i}\u3000" if i % 3 == 1 else f"t{i}\x0by"
             for i in range(300)]
    text = "".join(f"TASK {name} /bin/true\n" for name in names)
    text += "".join(f"EDGE {names[i // 2]} {names[i]}\n" for i in range(1, 300))
    path = write(tmp_path, text)
    got = parse_dag(path)
    assert shape(got) == shape(alone(path))
    assert got.edge_count() == 299 and got.task(0).name == "t0\u00a0x"
    assert helped.edges > 100 and not helped.failed


def test_error_before_the_split(tmp_path: Path, helped: Helped) -> None:
    text = fan(300)
    path = write(tmp_path, text.replace("EDGE ", "EDGE t1 nope\nEDGE ", 1))
    with pytest.raises(DagError) as info:
        parse_dag(path)
    assert str(info.value) == error_alone(path)
    assert "'nope'" in str(info.value)


# A helper that exits before it answers, and one that answers (the split at the first
# EDGE block: every EDGE line its own) and then exits without a result.
_GONE = "import sys; sys.exit(3)"
_ANSWERS = "import os, sys; os.write(1, os.read(0, 8)); sys.exit(3)"


@pytest.mark.parametrize(("helper", "failed"), [(_GONE, 0), (_ANSWERS, 1)])
def test_a_failing_helper_costs_only_time(tmp_path: Path, helped: Helped,
                                          monkeypatch: pytest.MonkeyPatch, helper: str,
                                          failed: int) -> None:
    # Gone before its answer, the parser reads on alone; gone after, it parses again.
    monkeypatch.setattr(edgehelper, "python_command",
                        lambda *args: [sys.executable, "-c", helper])
    path = write(tmp_path, fan(100))
    assert shape(parse_dag(path)) == shape(alone(path))
    assert helped.failed == failed
    assert helped.alone == failed + 1  # a second parse, alone, and alone()


def test_no_edges_no_wait(tmp_path: Path, helped: Helped) -> None:
    path = write(tmp_path, "".join(f"TASK t{i} /bin/true\n" for i in range(200)))
    assert len(parse_dag(path)) == 200
    assert helped.edges == helped.failed == helped.alone == 0  # stopped, never asked


@pytest.mark.parametrize("late", ["helper first"], indirect=True)
def test_edges_past_the_pipes_size_by_parent(tmp_path: Path, helped: Helped, late: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """More frames than the pipe holds (every edge the helper's), edges grouped by
    parent: the same DAG as parsed alone."""
    monkeypatch.setattr(dagmod, "_CHUNK", 1 << 16)
    n = 70_000
    text = "".join(f"TASK t{i} /bin/true\n" for i in range(n))
    path = write(tmp_path, text + "".join(f"EDGE t{i // 3} t{i}\nEDGE t{i // 2} t{i}\n"
                                          for i in range(4, n)))
    got = parse_dag(path)
    assert shape(got) == shape(alone(path))
    assert helped.edges == got.edge_count() and helped.edges * 8 > 1 << 20  # a MiB


@pytest.mark.parametrize("same_block", [False, True])
def test_an_edge_to_a_task_defined_below_it(tmp_path: Path, helped: Helped,
                                            late: bool, same_block: bool) -> None:
    # The helper indexes every name before it resolves an EDGE line, but an EDGE line may
    # name only tasks defined above it: the error a parse alone reports, wherever the
    # line falls (a run of EDGE lines, or one with the TASK line below it).
    text = fan(300) + "EDGE t5 late\n" + ("" if same_block else "EDGE t1 t7\n" * 8)
    path = write(tmp_path, text + "TASK late /bin/true\n")
    with pytest.raises(DagError) as info:
        parse_dag(path)
    assert str(info.value) == error_alone(path)
    assert "EDGE names unknown task 'late'" in str(info.value)


def test_a_big_parse_makes_no_object_per_task_but_its_text(tmp_path: Path,
                                                          helped: Helped) -> None:
    """With the helper, no name index is built, and a task is no object until the DAG
    hands it out (no Task, 64 bytes each, no int for its id, 32): the parse holds its
    name and command's bytes and little more, and every id read is the task's own."""
    import tracemalloc

    n = 20_000
    path = write(tmp_path, "".join(f"TASK t{i} /bin/true {i}\n" for i in range(n))
                 + "".join(f"EDGE t{i} t{i + 1}\n" for i in range(0, n, 2)))
    tracemalloc.start()
    try:
        dag = parse_dag(path)
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert helped.edges == n // 2 and not helped.failed
    # Its name and command's bytes (~56), two list slots, its line and its share of the
    # edges, and the modules imported: ~117 bytes; a Task each made it ~195.
    assert held < 140 * n
    assert [dag.task(i).id for i in (0, 1, n - 1)] == [0, 1, n - 1]
    assert dag.task(n // 2).id == n // 2 and dag.task(n // 2).line == n // 2 + 1
    assert dag.index["t7"] == 7 and len(dag.index) == n


def test_edges_by_parent_across_blocks(tmp_path: Path, helped: Helped) -> None:
    # EDGE lines grouped by parent, each naming tasks near each other, as generators
    # write them: each run is looked up in the block in hand or the one beside it. A
    # name given twice, in two blocks, is found once the edges are resolved; the error
    # is still the parse's alone.
    tasks = "".join(f"TASK t{i} /bin/true\n" for i in range(300))
    edges = "".join(f"EDGE t{i} t{i + d}\n" for i in range(300) for d in (1, 3, 40)
                    if i + d < 300)
    path = write(tmp_path, tasks + edges)
    got = parse_dag(path)
    assert shape(got) == shape(alone(path))
    assert helped.edges > 100 and not helped.failed
    path = write(tmp_path, tasks + "TASK t3 /bin/false\n" + edges)
    with pytest.raises(DagError) as info:
        parse_dag(path)
    assert str(info.value) == error_alone(path)
    assert ":301: duplicate task id 't3'" in str(info.value)


def test_the_helpers_index_in_blocks() -> None:
    # Blocks of about three names (two runs of two): a run's names in the block tried
    # first or the one beside it are looked up there, and the next run tries the block
    # of the first; a name further off merges the blocks into one dict.
    index = helperindex.NameIndex(3, set())
    for start in range(0, 10, 2):
        assert index.add([b"t%d" % i for i in range(start, start + 2)], range(start, start + 2))
    assert [sorted(block.values()) for block in index.blocks] == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    index.sealed()
    assert list(index.ids([b"t9", b"t8"])) == [9, 8] and index.at == 2
    assert list(index.ids([b"t5", b"t9"])) == [5, 9] and index.at == 1
    assert list(index.ids([b"t3", b"t4", b"t7"])) == [3, 4, 7] and index.at == 0
    assert index.whole is None and not index.named_edge
    assert list(index.ids([b"t0", b"t9"])) == [0, 9]
    assert index.whole is not None and not index.blocks
    assert list(index.ids([b"t6"])) == [6]
    with pytest.raises(KeyError):
        index.ids([b"t1", b"x"])
    assert index.unique()


def test_the_helpers_index_is_one_dict_where_the_last_edges_name_the_first_tasks(
        tmp_path: Path) -> None:
    # The EDGE lines resolved first (the file's last run) name a task of the first two
    # blocks: EDGE lines in no order, which would merge the blocks at the first lookup.
    # Merged at once; looked for no further than the first two blocks.
    for last, merged in ((b"t0", True), (b"t3", True), (b"t4", False), (b"x", False)):
        index = helperindex.NameIndex(2, {last, b"x"})
        for start in range(0, 10, 2):
            assert index.add([b"t%d" % i for i in range(start, start + 2)],
                             range(start, start + 2))
        assert (index.whole is not None) == merged, last
        assert len(index.blocks) == (0 if merged else 5)
        index.sealed()
        assert list(index.ids([b"t9", b"t0"])) == [9, 0] and index.unique()
    path = tmp_path / "last.dag"
    path.write_bytes(b"TASK a\nTASK b\nTASK c\nEDGE a b\n\t EDGE  b\tc \r\nEDGE a\n")
    with open(path, "rb") as f:
        size = path.stat().st_size
        assert helperindex.names_in_last_edges(f, size, 1 << 16) == {b"a", b"b", b"c"}
        # From "EDGE a b" (which might be cut), and from the line end before it.
        assert helperindex.names_in_last_edges(f, size, 30) == {b"b", b"c"}
        assert helperindex.names_in_last_edges(f, size, 31) == {b"a", b"b", b"c"}


@pytest.mark.parametrize("merged", [False, True])
def test_the_helpers_index_finds_a_name_given_twice(merged: bool) -> None:
    # In two blocks, merged or not, once the edges are resolved; in the block being
    # filled, at once.
    index = helperindex.NameIndex(2, set())
    for names in ([b"a", b"b"], [b"c", b"d"], [b"EDGE", b"a"]):
        assert index.add(names, range(len(names)))
    index.sealed()
    assert index.named_edge
    if merged:
        assert list(index.ids([b"b"])) == [1] and index.whole is not None
    assert not index.unique()
    index = helperindex.NameIndex(3, set())
    assert index.add([b"a", b"b"], [0, 1])
    assert not index.add([b"a"], [2])


@pytest.mark.parametrize("counted", [0, 1, 2])
def test_the_parser_counts_what_the_helper_did_not(counted: int) -> None:
    # The helper counts its first runs (from the end of the file back) while it waits
    # for the question; the parser counts the rest as they come: one tally of all.
    runs = [(array("I", [2, 3]), array("I", [4, 4])), (array("I", [0, 1]), array("I", [2, 3]))]
    theirs = EdgeTally(5)
    for run in runs[:counted]:
        theirs.add_before(*run)
    stream = io.BytesIO(b"".join((
        helperwire._counted(theirs, counted),
        *(b"".join((helperwire._FRAME.pack(2), *run)) for run in runs),
        helperwire._FRAME.pack(helperwire._END), helperwire.HEADER.pack(5, 4, False))))
    parents, children, tally = array("I"), array("I"), EdgeTally(5)
    assert helperwire.read_edges(stream, 5, parents, children, tally) is False
    whole = EdgeTally(5)
    for run in runs:
        whole.add_before(*run)
    assert [list(tally.counts), list(tally.ends), tally.edges, tally.next_key] == [
        [0, 0, 1, 1, 2], [1, 1, 1, 1, 0], 4, 2] == [
        whole.counts, whole.ends, whole.edges, whole.next_key]
    assert (tally.ascending, tally.ordered) == (whole.ascending, whole.ordered) == (True, True)
    assert (list(parents), list(children)) == ([0, 1, 2, 3], [2, 3, 4, 4])
    stream.seek(0)
    assert helperwire.read_edges(stream, 6, parents, children, EdgeTally(6)) is None


def test_a_question_during_the_check_of_the_names(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The check for a name in two blocks comes after the edges and takes seconds at
    # ten million tasks: a question that comes meanwhile is answered at the next block,
    # and the edges (more than the pipe holds) and the header go while the check goes
    # on; the verdict on the names comes last.
    n = 20_000
    tasks = "".join(f"TASK t{i} /bin/true\n" for i in range(n))
    pairs = [(i, i + d) for i in range(n) for d in (1, 3, 40) if i + d < n]
    path = write(tmp_path, tasks + "".join(f"EDGE t{p} t{c}\n" for p, c in pairs))
    question, ask = os.pipe()
    answers, answer = os.pipe()
    asked = helperwire.Asked(question, open(answer, "wb"))  # noqa: SIM115 (the helper's)
    answered: list[int] = []  # the answer as each block of the check is read
    headed = threading.Event()  # the parser has read the header
    header_before_the_last_block: list[bool] = []
    unique = helperindex.NameIndex.unique

    def asked_in_the_check(index: helperindex.NameIndex, between: Callable[[], object]
                           ) -> bool:
        def then() -> None:
            if not answered:
                os.write(ask, helperwire.QUESTION.pack(asked.first_edges, 0))
            between()
            answered.append(asked.split)
            if len(index.blocks) == 1:
                header_before_the_last_block.append(headed.wait(10))
        return unique(index, then)

    monkeypatch.setattr(helperindex.NameIndex, "unique", asked_in_the_check)

    def helper() -> None:
        with asked.out:
            edgehelper.resolve(path, Path(path).stat().st_size, 1 << 16, asked, 1000)

    thread = threading.Thread(target=helper)
    thread.start()
    parents, children, tally = array("I"), array("I"), EdgeTally(n)
    with open(answers, "rb") as out:
        assert helperwire.OFFSET.unpack(out.read(8))[0] >= 0
        (runs,) = helperwire.MAP.unpack(out.read(helperwire.MAP.size))
        out.read(runs * helperwire.ENTRY.size)
        assert helperwire.read_edges(out, n, parents, children, tally) is False
        headed.set()
        assert out.read() == helperwire.UNIQUE
    thread.join()
    assert len(answered) > 1 and answered[0] >= 0  # at the first of the blocks
    assert header_before_the_last_block == [True]
    assert sorted(zip(parents, children, strict=True)) == pairs and len(pairs) * 8 > 1 << 16


def test_ids_of_names() -> None:
    index = {b"a": 1, b"b": 2}
    assert [list(helperindex._ids(index, names)) for names in ([], [b"a"], [b"b", b"a", b"b"])
            ] == [[], [1], [2, 1, 2]]
    with pytest.raises(KeyError):
        helperindex._ids(index, [b"a", b"c"])


def test_the_helper_asks_for_huge_pages_unless_the_user_says_otherwise() -> None:
    env = edgehelper._environment
    assert env({"PATH": "/bin"}) == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})["GLIBC_TUNABLES"] == (
        "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
    assert env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})["GLIBC_TUNABLES"] == (
        "glibc.malloc.hugetlb=0")


@pytest.mark.parametrize("cut", [1, 4, 5, 9])
def test_tally_from_the_end_back_is_the_tally_of_all(cut: int) -> None:
    """Runs counted from the end of the file back count as the whole at once; edges in
    order within each run but not across a cut are not grouped by parent, nor ascending."""
    for parents, children in [
        ([0, 0, 1, 2, 2, 2, 3, 5, 5, 6], [1, 2, 3, 4, 5, 6, 7, 7, 8, 9]),  # ascending
        ([0, 0, 1, 2, 2, 2, 3, 5, 5, 6], [1, 2, 3, 4, 6, 5, 7, 7, 8, 9]),  # grouped
        ([0, 0, 1, 2, 2, 2, 3, 5, 5, 6], [1, 2, 3, 4, 5, 5, 7, 7, 8, 9]),  # a repeat
        ([0, 0, 1, 2, 2, 3, 5, 2, 5, 6], [1, 2, 3, 4, 5, 6, 7, 7, 8, 9]),  # neither
    ]:
        whole = EdgeTally(10)
        whole.add_before(array("I", parents), array("I", children))
        runs = EdgeTally(10)
        for a, b in [(cut, 10), (0, cut)]:
            runs.add_before(array("I", parents[a:b]), array("I", children[a:b]))
        assert runs.counts == whole.counts and runs.ends == whole.ends
        assert runs.ordered == whole.ordered == (parents == sorted(parents))
        edges = list(zip(parents, children, strict=True))
        assert runs.ascending == whole.ascending == (edges == sorted(set(edges)))
        assert runs.edges == whole.edges == 10


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 60), st.lists(st.tuples(st.integers(0, 59), st.integers(0, 59)),
                                    max_size=120), st.integers(0, 3))
def test_any_dag(n: int, pairs: list[tuple[int, int]], spread: int) -> None:
    # Random tasks, edges (any direction, repeats, self edges, unknown names, names
    # defined below) and TASK lines spread among the EDGE lines: the same DAG or the
    # same error.
    import tempfile

    lines = [f"TASK t{i} /bin/true {'x' * (i % 7)}\n" for i in range(n)]
    for k, (p, c) in enumerate(pairs):
        lines.append(f"EDGE t{p} t{c}\n")
        if spread and k % (spread + 3) == 0:
            lines.append(f"TASK late{k} /bin/true\n")
        if spread and p % 11 == 0:  # a late task, defined above or (an error) below
            lines.append(f"EDGE t{c} late{k - k % (spread + 3) + (spread + 3) * (p % 2)}\n")
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(edgehelper, "MIN_BYTES", 0)
        mp.setattr(dagmod, "_CHUNK", 64)
        path = write(Path(tmp), "".join(lines))
        try:
            expected: object = shape(alone(path))
        except DagError as e:
            expected = str(e)
        try:
            got: object = shape(parse_dag(path))
        except DagError as e:
            got = str(e)
    assert got == expected
