"""Workflow shapes: makespan of real workflow shapes against the best schedule possible.

    pip install wfcommons
    python benchmarks/shapes.py                                  # 8 recipes, 1,000 tasks
    python benchmarks/shapes.py --recipes montage,cycles --tasks 2000 --work 40 --slots 8
    python benchmarks/shapes.py --reference /path/to/pegasus-mpi-cluster --rounds 3

Each recipe of WfCommons (montage, epigenomics, seismology, cycles, soykb, genome — the
1000Genome workflow —, blast, bwa) makes a DAG of about ``--tasks`` tasks, the same one
for a given ``--seed``. Every task sleeps for its runtime in the recipe, scaled so that
the whole work is ``--work`` seconds on ``--slots`` slots (the sum of runtimes is work x
slots); each asks for one cpu, and its priority (``-p``) is its level in the DAG (roots
are level 1), as Pegasus assigns priorities by level: later tasks first, so that a
started branch is finished before new ones are opened.
Every TASK line has the ``#@ SEQ TRANSFORMATION DAX_ID`` line Pegasus writes before it,
the transformation being the recipe's task type: nothing else tells pmc's critical-path
order what a task will take (it learns one mean runtime per transformation as tasks end).

For each DAG the benchmark computes the zero-overhead list schedule: ``--slots`` slots,
no cost to start, end or hand over a task, and at every moment the free slots take the
ready tasks in the order pmc's engine takes them (higher priority first, then DAG order).
Each runner's makespan — the wall time of the whole command, start-up and shutdown
included — is then given as a ratio to that schedule; the reference's, to the same
schedule with tasks of equal priority taken as the reference's ready queue takes them
(``heap``: a heap on the priority alone, out of which they leave in an order set by when
each came in, neither DAG order nor first-in-first-out). With ``--schedule critical-path``
as a runner's flags, the ideal it is held against is the list schedule that orders by
the longest remaining path (the task's own runtime and the longest chain of runtimes
after it), which is also computed and shown; and beside it the same order with runtimes
learned as pmc learns them (``learned_schedule``): what any order that starts knowing
nothing of the runtimes can reach; and the same order with the paths weighed by each
transformation's mean runtime over the whole DAG, the tasks still taking their own
(``given_schedule``): what an order told one figure per transformation can reach, as a
catalog's runtime per transformation (Pegasus's ``runtime`` profile) would tell it.

Runners (``--runners``), in one round each by turns, rounds interleaved (each run's
makespan printed as it ends, a ``# round`` line; the table gives the medians):
- ``embedded``: ``pmc run --workers SLOTS --host-cpus SLOTS`` (no MPI);
- ``dropin``: ``mpiexec -n SLOTS+1 pegasus-mpi-cluster --host-cpus SLOTS`` (the pip MPI);
- ``reference``: the reference under ``/usr/bin/mpiexec.openmpi -n SLOTS+1`` (with
  ``--reference PATH``);
- ``critical``: embedded with ``--schedule critical-path``;
- ``critical-given``: the same on its own copy of the DAG (``RECIPE.given.dag``) in which
  every TASK line carries ``--expected-runtime S`` (a pmc extension the reference
  refuses), S the mean runtime of the task's transformation over the DAG; held against
  the longest-path schedule too. Not run by default (one more run of every recipe):
  ``--runners embedded,dropin,reference,critical,critical-given``.
The other runners all run the same DAG, which has no ``--expected-runtime``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from _common import PYTHON, machine, median, mpiexec, pmc_env, reference_launch, workdir

RECIPES = ("montage", "epigenomics", "seismology", "cycles", "soykb", "genome", "blast", "bwa")
RUNNERS = ("embedded", "dropin", "reference", "critical", "critical-given")
DEFAULT_RUNNERS = "embedded,dropin,reference,critical"
PATH_RUNNERS = ("critical", "critical-given")  # held against the longest-path schedule
HELD = ("ideal", "heap", "path")  # the zero-overhead schedules, as the table's columns
HELD_AGAINST = {"reference": "heap", **dict.fromkeys(PATH_RUNNERS, "path")}  # else ideal


@dataclass
class Shape:
    """A workflow's tasks in DAG order (a topological order), their transformations (what
    Pegasus names in a ``#@`` line), their runtimes in seconds and their edges (parent
    index, child index)."""

    recipe: str
    names: list[str]
    kinds: list[str]
    runtimes: list[float]
    edges: list[tuple[int, int]]

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.names]
        for p, c in self.edges:
            out[p].append(c)
        return out

    def parents(self) -> list[int]:
        count = [0] * len(self.names)
        for _, c in self.edges:
            count[c] += 1
        return count

    def levels(self) -> list[int]:
        """1 for a root, else one more than its deepest parent."""
        level = [1] * len(self.names)
        children = self.children()
        for p in range(len(self.names)):  # in topological order
            for c in children[p]:
                level[c] = max(level[c], level[p] + 1)
        return level

    def bottom_levels(self, weights: Sequence[float] | None = None) -> list[float]:
        """The longest path from each task to an end, its own runtime included; the paths
        weighed by ``weights`` (one per task) in place of the runtimes when given."""
        own = self.runtimes if weights is None else weights
        children = self.children()
        bottom = list(own)
        for p in reversed(range(len(self.names))):
            if children[p]:
                bottom[p] = own[p] + max(bottom[c] for c in children[p])
        return bottom

    def kind_means(self) -> list[float]:
        """Each task's transformation's mean runtime over the whole DAG."""
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for kind, runtime in zip(self.kinds, self.runtimes, strict=True):
            sums[kind] = sums.get(kind, 0.0) + runtime
            counts[kind] = counts.get(kind, 0) + 1
        return [sums[k] / counts[k] for k in self.kinds]

    def scaled(self, work: float, slots: int) -> Shape:
        total = sum(self.runtimes)
        k = work * slots / total if total > 0 else 0.0
        return Shape(self.recipe, self.names, self.kinds,
                     [round(r * k, 6) for r in self.runtimes], self.edges)


def make_shape(recipe: str, tasks: int, seed: int) -> Shape:
    """A WfCommons recipe's workflow of about ``tasks`` tasks, in a topological order that
    keeps the recipe's order where it can."""
    try:
        import numpy
        from wfcommons import WorkflowGenerator
        from wfcommons.wfchef import recipes
    except ImportError:
        sys.exit("shapes.py needs WfCommons: pip install wfcommons")
    cls = getattr(recipes, recipe.capitalize() + "Recipe")
    random.seed(seed)
    numpy.random.seed(seed)
    wf = WorkflowGenerator(cls.from_num_tasks(tasks)).build_workflow()
    given = list(wf.nodes)
    position = {n: i for i, n in enumerate(given)}
    pending = {n: 0 for n in given}
    for _, c in wf.edges:
        pending[c] += 1
    ready = [position[n] for n in given if pending[n] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        n = given[heapq.heappop(ready)]
        order.append(n)
        for c in wf.successors(n):
            pending[c] -= 1
            if pending[c] == 0:
                heapq.heappush(ready, position[c])
    index = {n: i for i, n in enumerate(order)}
    tasks = [wf.nodes[n]["task"] for n in order]
    edges = sorted((index[p], index[c]) for p, c in wf.edges)
    return Shape(recipe, [_name(n) for n in order], [_name(t.category or t.name) for t in tasks],
                 [float(t.runtime) for t in tasks], edges)


def _name(node: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in node)


def write_dag(path: Path, shape: Shape, expected: Sequence[float] | None = None) -> None:
    """The DAG as Pegasus writes one: a ``#@ SEQ TRANSFORMATION DAX_ID`` line before every
    TASK (what pmc's critical-path order learns runtimes by, one mean per transformation),
    the level as ``-p``; with ``expected`` (one per task), ``--expected-runtime S`` on
    every TASK line."""
    levels = shape.levels()
    given = [""] * len(levels) if expected is None else [
        f" --expected-runtime {s!r}" for s in expected]  # repr: read back the same float
    with open(path, "w") as f:
        for seq, (name, kind, runtime, level, option) in enumerate(
                zip(shape.names, shape.kinds, shape.runtimes, levels, given, strict=True), 1):
            f.write(f"#@ {seq} {kind} ID{seq:07d}\n"
                    f"TASK {name} -p {level}{option} /bin/sleep {runtime:.6f}\n")
        for p, c in shape.edges:
            f.write(f"EDGE {shape.names[p]} {shape.names[c]}\n")


class Keyed:
    """Ready tasks taken smallest ``key`` first (pmc's engine: priority, then DAG order)."""

    def __init__(self, key: Callable[[int], object]) -> None:
        self.key = key
        self.heap: list[tuple[object, int]] = []

    def __len__(self) -> int:
        return len(self.heap)

    def push(self, t: int) -> None:
        heapq.heappush(self.heap, (self.key(t), t))

    def pop(self) -> int:
        return heapq.heappop(self.heap)[1]

    def rekey(self) -> None:
        self.heap = [(self.key(t), t) for _, t in self.heap]
        heapq.heapify(self.heap)


class PriorityHeap:
    """Ready tasks as the reference's ready queue takes them: a binary max-heap on the
    priority alone (C++'s ``std::priority_queue`` with libstdc++'s ``push_heap`` and
    ``pop_heap``), so tasks of equal priority leave in an order set by when each came
    in, neither first-in-first-out nor DAG order."""

    def __init__(self, priority: Sequence[int]) -> None:
        self.priority = priority
        self.heap: list[int] = []

    def __len__(self) -> int:
        return len(self.heap)

    def _sift_up(self, hole: int, value: int) -> None:
        heap, p = self.heap, self.priority
        parent = (hole - 1) // 2
        while hole > 0 and p[heap[parent]] < p[value]:  # strictly: an equal one stays
            heap[hole] = heap[parent]
            hole, parent = parent, (parent - 1) // 2
        heap[hole] = value

    def push(self, t: int) -> None:
        self.heap.append(t)
        self._sift_up(len(self.heap) - 1, t)

    def pop(self) -> int:
        # The top goes; the hole it leaves walks down to a leaf by the greater child
        # (the right one of two equal), and the last element is sifted up from there.
        heap, p = self.heap, self.priority
        top, last = heap[0], heap.pop()
        n = len(heap)
        if not n:
            return top
        hole = child = 0
        while child < (n - 1) // 2:
            child = 2 * (child + 1)
            if p[heap[child]] < p[heap[child - 1]]:
                child -= 1
            heap[hole] = heap[child]
            hole = child
        if n % 2 == 0 and child == (n - 2) // 2:
            child = 2 * (child + 1)
            heap[hole] = heap[child - 1]
            hole = child - 1
        self._sift_up(hole, last)
        return top


def list_schedule(shape: Shape, slots: int, order: Callable[[int], object] | PriorityHeap,
                  learn: Callable[[list[int]], None] | None = None,
                  started: list[int] | None = None) -> float:
    """The makespan of the zero-overhead list schedule on ``slots`` slots, ready tasks
    taken smallest ``order`` first (a key), or as a ``PriorityHeap`` gives them. The tasks
    come in as the reference's engine readies them: the roots by name, then each ended
    task's children in EDGE order. ``learn``, when given, is told of the tasks that end
    at each moment, and the ready tasks are then keyed again (what it learned may change
    their keys). ``started``, when given, gets the tasks in the order they start."""
    children = shape.children()
    waiting = shape.parents()
    ready = order if isinstance(order, PriorityHeap) else Keyed(order)
    names = shape.names
    for t in sorted((t for t in range(len(names)) if waiting[t] == 0), key=names.__getitem__):
        ready.push(t)
    running: list[tuple[float, int]] = []  # (end, task)
    now = 0.0
    while ready or running:
        while ready and len(running) < slots:
            t = ready.pop()
            if started is not None:
                started.append(t)
            heapq.heappush(running, (now + shape.runtimes[t], t))
        now, t = heapq.heappop(running)
        ended = [t]
        while running and running[0][0] == now:
            ended.append(heapq.heappop(running)[1])
        if learn is not None:
            assert isinstance(ready, Keyed)  # a key learns; the heap's order is its own
            learn(ended)
            ready.rekey()
        for t in ended:
            for c in children[t]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    ready.push(c)
    return now


def learned_schedule(shape: Shape, slots: int) -> float:
    """The zero-overhead makespan of the longest-path order when runtimes are not given
    but learned as ``--schedule critical-path`` learns them: one mean per transformation
    of the tries ended so far (before any of a kind has ended, the mean of the kinds
    seen; before anything has ended, 1 s each), the paths computed again at every end.
    The best any order that learns this way can do: its first choices are made blind."""
    kinds, children, levels = shape.kinds, shape.children(), shape.levels()
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    bottom = [0.0] * len(kinds)

    def paths() -> None:
        known = [sums[k] / counts[k] for k in counts]
        default = sum(known) / len(known) if known else 1.0
        for p in reversed(range(len(kinds))):
            k = kinds[p]
            own = sums[k] / counts[k] if k in counts else default
            bottom[p] = own + max((bottom[c] for c in children[p]), default=0.0)

    def learn(ended: list[int]) -> None:
        for t in ended:
            sums[kinds[t]] = sums.get(kinds[t], 0.0) + shape.runtimes[t]
            counts[kinds[t]] = counts.get(kinds[t], 0) + 1
        paths()

    paths()
    return list_schedule(shape, slots, lambda t: (-bottom[t], -levels[t], t), learn)


def given_schedule(shape: Shape, slots: int) -> float:
    """The zero-overhead makespan of the longest-path order when every task's runtime is
    given as its transformation's mean (``critical-given``'s ``--expected-runtime``): the
    paths weighed by the means, the tasks taking their own runtimes."""
    levels = shape.levels()
    bottom = shape.bottom_levels(shape.kind_means())
    return list_schedule(shape, slots, lambda t: (-bottom[t], -levels[t], t))


def reference_schedule(shape: Shape, slots: int) -> float:
    """The zero-overhead makespan by priority, tasks of equal priority taken as the
    reference's heap takes them (``PriorityHeap``): what its runs are held against."""
    return list_schedule(shape, slots, PriorityHeap(shape.levels()))


def given_dag(dag: Path) -> Path:
    """``critical-given``'s copy of a recipe's DAG."""
    return dag.with_suffix(".given.dag")


def ideals(shape: Shape, slots: int) -> tuple[float, float]:
    """(priority-order makespan, longest-path-order makespan)."""
    levels = shape.levels()
    bottom = shape.bottom_levels()
    by_priority = list_schedule(shape, slots, lambda t: (-levels[t], t))
    by_path = list_schedule(shape, slots, lambda t: (-bottom[t], -levels[t], t))
    return by_priority, by_path


def command(runner: str, dag: Path, slots: int, reference: str | None) -> list[str]:
    quiet = ["-s", "-o", os.devnull, "-e", os.devnull]
    if runner in ("embedded", *PATH_RUNNERS):
        extra = ["--schedule", "critical-path"] if runner in PATH_RUNNERS else []
        return [PYTHON, "-m", "pmc", "run", "--local", "--workers", str(slots), "--host-cpus",
                str(slots), "-q", "-s", "-o", os.devnull, *extra, str(dag)]
    if runner == "dropin":
        return [mpiexec(), "-n", str(slots + 1),
                str(Path(PYTHON).parent / "pegasus-mpi-cluster"), "--host-cpus", str(slots),
                *quiet, str(dag)]
    assert reference is not None
    return [*reference_launch(slots + 1, reference)[0], "--host-cpus", str(slots), *quiet,
            str(dag)]


def run_once(runner: str, dag: Path, slots: int, reference: str | None) -> float:
    for suffix in (".rescue", ".resource", ".status.json"):
        Path(f"{dag}{suffix}").unlink(missing_ok=True)
    env = pmc_env()
    if runner == "reference":
        assert reference is not None
        env.update(reference_launch(slots + 1, reference)[1])
    cmd = command(runner, dag, slots, reference)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=dag.parent, env=env, capture_output=True, text=True,
                          timeout=3600, check=False)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{runner} failed ({proc.returncode}): {' '.join(cmd)}\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    return wall


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--work", type=float, default=40.0, help="seconds of work per slot")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--runners", default=DEFAULT_RUNNERS)
    ap.add_argument("--reference", help="a build of the reference pegasus-mpi-cluster")
    ap.add_argument("--keep", help="write the DAGs here (default: a new temporary folder)")
    ap.add_argument("--ideal-only", action="store_true",
                    help="compute the schedules, run nothing")
    args = ap.parse_args(argv)
    runners = [r for r in args.runners.split(",") if r]
    if "reference" in runners and not args.reference:
        runners.remove("reference")
    unknown = set(runners) - set(RUNNERS) or set(args.recipes.split(",")) - set(RECIPES)
    if unknown:
        ap.error(f"unknown: {', '.join(sorted(unknown))}")
    where = workdir(args.keep)
    print(f"# machine: {machine()}")
    print(f"# {args.tasks} tasks a recipe, {args.work:g} s of work on {args.slots} slots, "
          f"seed {args.seed}, rounds {args.rounds}")
    dags: dict[str, tuple[Path, dict[str, float], int]] = {}
    for recipe in args.recipes.split(","):
        shape = make_shape(recipe, args.tasks, args.seed).scaled(args.work, args.slots)
        path = where / f"{recipe}.dag"
        write_dag(path, shape)
        write_dag(given_dag(path), shape, shape.kind_means())
        best, best_path = ideals(shape, args.slots)
        heap = reference_schedule(shape, args.slots)
        held = {"ideal": best, "path": best_path, "heap": heap}
        dags[recipe] = (path, held, len(shape.names))
        learned = learned_schedule(shape, args.slots)
        given = given_schedule(shape, args.slots)
        print(f"# {recipe}: {len(shape.names)} tasks, {len(shape.edges)} edges, ideal "
              f"{best:.2f} s by priority ({heap:.2f} s with equal priorities taken as the "
              f"reference's heap takes them), {best_path:.2f} s by longest path, "
              f"{learned:.2f} s by longest path learned per transformation "
              f"({learned / best_path:.3f}x), {given:.2f} s by longest path of the "
              f"transformations' means ({given / best_path:.3f}x)", flush=True)
    walls: dict[tuple[str, str], list[float]] = {}
    if not args.ideal_only:
        for round_ in range(1, args.rounds + 1):
            for recipe, (path, *_rest) in dags.items():
                for runner in runners:
                    dag = given_dag(path) if runner == "critical-given" else path
                    wall = run_once(runner, dag, args.slots, args.reference)
                    walls.setdefault((recipe, runner), []).append(wall)
                    print(f"# round {round_}: {recipe} {runner} {wall:.2f} s", flush=True)
    print(f"{'recipe':<12}{'tasks':>6}{'ideal':>8}{'heap':>8}{'path':>8}"
          + "".join(f"{r:>20}" for r in runners))
    worst: dict[str, float] = {}
    for recipe, (_, held, ntasks) in dags.items():
        cells = []
        for runner in runners:
            got = walls.get((recipe, runner))
            if not got:
                cells.append(f"{'-':>20}")
                continue
            ideal = held[HELD_AGAINST.get(runner, "ideal")]
            m = median(got)
            ratio = m / ideal
            worst[runner] = max(worst.get(runner, 0.0), ratio)
            cells.append(f"{m:>11.2f} s {ratio:>5.3f}x")
        print(f"{recipe:<12}{ntasks:>6}" + "".join(f"{held[k]:>8.2f}" for k in HELD)
              + "".join(cells))
    print("SUMMARY " + json.dumps({"worst_ratio": worst, "dags": str(where)}))


if __name__ == "__main__":
    main()
