"""Tasks of equal priority: the reference takes its ready tasks out of a heap on the
priority alone, so those of equal priority start in an order set by when each became
ready; pmc starts them in DAG order (README, "Critical-path order"). benchmarks/shapes.py
holds the reference's runs against the zero-overhead schedule of that heap
(``PriorityHeap``): here the order it gives is the order the reference runs tasks in."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from compatkit import Pair, rescue_lines

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from shapes import PriorityHeap, Shape, list_schedule

pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]

# Eight roots of priority 0; r0's children come back in EDGE order (c3, c1, c2) into a
# heap that still holds seven roots; r1's child x outranks everything left.
NAMES = ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "c1", "c2", "c3", "x"]
PRIORITY = [0] * 11 + [1]
EDGES = [(0, 10), (0, 8), (0, 9), (1, 11)]
DAG = "".join(f"TASK {n} -p {p} /bin/true\n" for n, p in zip(NAMES, PRIORITY, strict=True)) \
    + "".join(f"EDGE {NAMES[a]} {NAMES[b]}\n" for a, b in EDGES)


def one_slot(order: PriorityHeap | None) -> list[str]:
    """The tasks in the order one slot starts them: as the heap gives them, or (None) by
    priority then DAG order."""
    shape = Shape("ties", NAMES, ["true"] * len(NAMES), [1.0] * len(NAMES), EDGES)
    started: list[int] = []
    list_schedule(shape, 1, order if order is not None else lambda t: (-PRIORITY[t], t),
                  started=started)
    return [NAMES[t] for t in started]


def test_equal_priorities_leave_the_references_heap_in_its_order(pair: Pair,
                                                                 mode: str) -> None:
    by_heap = one_slot(PriorityHeap(PRIORITY))
    in_dag_order = one_slot(None)
    assert by_heap != in_dag_order  # the DAG tells the two apart
    ref = pair.reference(DAG)
    assert ref.rc == 0, ref.stderr
    assert rescue_lines(ref.text("w.dag.rescue")) == [f"DONE {n}" for n in by_heap]
    # pmc: tasks of equal priority in DAG order. (x is left out: a child is readied
    # once its parent's end is in the rescue log, and tasks may start meanwhile.)
    got = pair.pmc(mode, DAG)
    assert got.rc == 0, got.stderr
    assert [ln for ln in rescue_lines(got.text("w.dag.rescue")) if ln != "DONE x"] == \
        [f"DONE {n}" for n in in_dag_order if n != "x"]
