"""The run's order of ready tasks by path (``--schedule``, pmc.core.pathorder): made from
the DAG and its file, and computed again as runtimes are learned, within a time budget.

A computation walks every task and edge (about a second for a million of each): it is
done again when what was learned could change the order, and only while the time spent
on it stays under a twentieth of the run's so far, so that a big DAG pays little and a
small one, whose computations are quick, follows what it learns closely.
"""

from __future__ import annotations

import time

from pmc.core.engine import Engine
from pmc.core.pathorder import PathOrder
from pmc.dag import DAG
from pmc.dag.kinds import task_kinds

_SHARE = 0.05  # of the run's time, at most, spent computing paths again


def path_order(dag: DAG, schedule: str) -> PathOrder | None:
    """The order for ``--schedule``; None for "priority" (the engine's own order)."""
    if schedule == "priority":
        return None
    kinds, names = task_kinds(dag)
    return PathOrder(dag, kinds, len(names), path_first=schedule == "critical-path")


class Reorder:
    """Called after results are counted: computes the paths again when due."""

    __slots__ = ("engine", "spent", "t0")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.spent = 0.0
        self.t0 = time.monotonic()

    def __call__(self) -> None:
        order = self.engine.order
        if order is None or not order.stale:
            return
        now = time.monotonic()
        if self.spent > _SHARE * (now - self.t0):
            return
        self.engine.reorder()
        self.spent += time.monotonic() - now
