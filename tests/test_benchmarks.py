"""Smoke runs of the benchmarks at tiny sizes: they run and print a summary (no timings
are asserted; figures belong in benchmarks/RESULTS.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

from _common import write_big, write_independent, write_layered  # noqa: E402


def run(script: str, *args: str, tmp_path: Path) -> str:
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("SUMMARY "), proc.stdout
    return proc.stdout


def test_layered_dag_shape(tmp_path: Path) -> None:
    path = tmp_path / "l.dag"
    tasks, edges = write_layered(path, (1, 7, 14, 7, 2, 1))
    assert tasks == 32
    text = path.read_text()
    assert text.count("TASK ") == 32 and text.count("EDGE ") == edges
    # the 2 -> 1 tail: each of the two depends on all 7 before, the last on both
    assert "EDGE L3_6 L4_1" in text and "EDGE L4_0 L5_0" in text and "EDGE L4_1 L5_0" in text


@pytest.mark.parametrize("style", ["plain", "options", "pegasus"])
def test_independent_dags_as_planners_write_them(tmp_path: Path, style: str) -> None:
    from pmc.dag import parse_dag

    path = tmp_path / "i.dag"
    assert write_independent(path, 3, "/bin/true", style) == 3
    dag = parse_dag(str(path))
    task = dag.task(2)
    assert task.name == "t2" and dag.edge_count() == 0
    assert task.command == "/bin/true"  # as the floor runs it
    assert (task.memory, task.cpus) == ((0, 1) if style == "plain" else (1, 1))
    assert task.pegasus_id == ("3" if style == "pegasus" else None)  # the #@ SEQ


@pytest.mark.parametrize("local", [True, False])
def test_big_dag_parses(tmp_path: Path, local: bool) -> None:
    from pmc.dag import parse_dag

    path = tmp_path / "b.dag"
    write_big(path, 500, 500, local=local)
    dag = parse_dag(str(path))
    assert len(dag) == 500 and dag.edge_count() == 500


@pytest.mark.slow
def test_throughput_smoke(tmp_path: Path) -> None:
    modes = "local,dropin,mpi,mpi-bound,mpi-nosock" if shutil.which("mpiexec") else "local"
    out = run("throughput.py", "--tasks", "40", "--rounds", "1", "--modes", modes,
              "--shapes", "independent,options,pegasus,layered,layered-scaled",
              "--layers", "1,4,8,4,2,1", "--keep", str(tmp_path), tmp_path=tmp_path)
    assert "independent/local" in out and "layered/local" in out
    assert "options/local" in out and "pegasus/local" in out
    assert "layered-scaled DAG: 1+9+18+9+2+1 = 40 tasks" in out  # --tasks 40
    assert "layered-scaled/local" in out
    assert "local+json+metrics" in out and "floor" in out
    if "mpi" in modes:
        assert "independent/mpi-nosock" in out and "layered/mpi " in out
        assert "independent/mpi-bound" in out and "layered/dropin" in out
        # MPI's start and stop alone, each round, and each MPI case's ceiling from it
        assert out.count("MPI start and stop alone") == 2  # the round, the median
        assert "layered/dropin 0." in out and "of ceiling 0." in out
    assert "end to end" in out


def test_scale_smoke(tmp_path: Path) -> None:
    out = run("scale.py", "--sizes", "200,400", "--keep", str(tmp_path), tmp_path=tmp_path)
    assert "local" in out and "random" in out


def test_scale_parse_only_smoke(tmp_path: Path) -> None:
    out = run("scale.py", "--sizes", "200,400", "--edges", "options", "--parse-only", "--keep",
              str(tmp_path), tmp_path=tmp_path)
    assert "parse B/task" in out
    assert "per task, parse cpu" in out and "parse memory" in out and "of 200 tasks" in out


def test_firsttask_window_counts_the_tasks_started(tmp_path: Path) -> None:
    out = run("firsttask.py", "--size", "300", "--rounds", "1", "--shapes", "options",
              "--window", "1", "--keep", str(tmp_path), tmp_path=tmp_path)
    assert "tasks/s in the first 1 s" in out
    # Every task started adds a byte to the count file next to the stamp script.
    assert (tmp_path / "stamp.sh.count").stat().st_size >= 1


def test_firsttask_sizes_by_turns(tmp_path: Path) -> None:
    """Two sizes in one run: each in its own directory, every round both, and the ratio
    of the medians."""
    out = run("firsttask.py", "--size", "200,400", "--rounds", "2", "--shapes", "options",
              "--keep", str(tmp_path), tmp_path=tmp_path)
    assert re.search(r"options pmc: first task 400 / 200: \d+\.\dx", out), out
    rounds = re.findall(r"^round (\d) +(\d+) options", out, re.M)
    assert rounds == [("1", "200"), ("1", "400"), ("2", "200"), ("2", "400")], out
    for size in (200, 400):
        dag = (tmp_path / str(size) / f"first-options-{size}.dag").read_text()
        assert dag.count("\nTASK ") + 1 == size
        assert f"{tmp_path / str(size) / 'stamp.sh'} arg" in dag


def test_owncpu_checkouts_by_turns(tmp_path: Path) -> None:
    """Each round runs every checkout, in the reverse order of the round before; the
    summary compares them."""
    repo = BENCH.parent
    out = run("owncpu.py", "--tasks", "40", "--rounds", "2", "--trees",
              f"one={repo},two={repo}", "--keep", str(tmp_path), tmp_path=tmp_path)
    rounds = re.findall(r"^round (\d): +(\w+) own cpu +\d+ µs/task \(master \d+, "
                        r"workers \d+, guards \d+\) +\d+ tasks/s$", out, re.M)
    assert rounds == [("1", "one"), ("1", "two"), ("2", "two"), ("2", "one")], out
    assert re.search(r"two \d+ µs \(.*\), less than one in [012] of 2 rounds$", out), out


def test_idle_smoke(tmp_path: Path) -> None:
    out = run("idle.py", "--tasks", "6", "--sleep", "3", "--window", "0.5", "--modes",
              "local", "--keep", str(tmp_path), tmp_path=tmp_path)
    assert "local 6 tasks" in out


def test_firsttask_smoke(tmp_path: Path) -> None:
    mpi = ["--mpi"] if shutil.which("mpiexec") else []
    out = run("firsttask.py", "--size", "300", "--rounds", "1", "--keep", str(tmp_path), *mpi,
              tmp_path=tmp_path)
    for shape in ("plain", "options", "pegasus"):
        assert f"{shape} pmc: first task median" in out
        if mpi:
            assert f"{shape} pmc-mpi: first task median" in out
            # Under the launcher too, the master (rank 0) was found and its peak read.
            peak = re.search(rf"{shape} pmc-mpi: .*?peak master (\d+) MB", out)
            assert peak is not None and int(peak.group(1)) > 0, out
    assert "cpu median" in out and "peak master" in out
    # The '#@' DAG: a '#@' line before every TASK, the stamp script in place of /bin/true.
    text = (tmp_path / "first-pegasus-300.dag").read_text()
    assert text.count("\n#@ ") + text.startswith("#@ ") == 300 == text.count("stamp.sh arg")


def test_edges_grouped_by_parent_are_the_same_edges(tmp_path: Path) -> None:
    """``--edge-order by-parent``: the same edges as the random order, each parent's
    together in task order, as Pegasus writes them."""
    random_order, by_parent = tmp_path / "r.dag", tmp_path / "p.dag"
    write_big(random_order, 500, 500, local=True)
    write_big(by_parent, 500, 500, local=True, by_parent=True)
    def edges(path: Path) -> list[str]:
        return [line for line in path.read_text().splitlines() if line.startswith("EDGE")]

    grouped, drawn = edges(by_parent), edges(random_order)
    assert len(grouped) == 500 and sorted(grouped) == sorted(drawn)
    # (Names padded with zeros: text order is task order.)
    assert grouped == sorted(grouped) and drawn != grouped


def test_arrays_smoke(tmp_path: Path) -> None:
    out = run("arrays.py", "--size", "300", "--rounds", "1", "--keep", str(tmp_path),
              tmp_path=tmp_path)
    assert "array pmc: first task median" in out and "plain pmc: first task median" in out
    assert (tmp_path / "array-300.dag").read_text() == "TASK t --array 0-299 /bin/true\n"
    plain = (tmp_path / "plain-300.dag").read_text().splitlines()
    assert len(plain) == 300 and plain[299] == "TASK t299 /bin/true"


def test_startup_smoke(tmp_path: Path) -> None:
    mpi = "dropin,mpi4py," if shutil.which("mpiexec") else ""
    out = run("startup.py", "--rounds", "1", "--modes", f"{mpi}local", "--trees",
              f"a={BENCH.parent},b={BENCH.parent}", "--keep", str(tmp_path), tmp_path=tmp_path)
    assert "local a cpu" in out and "local b cpu" in out
    if mpi:
        assert "dropin b cpu" in out and "mpi4py a cpu" in out
    assert (tmp_path / "one.dag").read_text() == "TASK t1 /bin/true\n"


def test_shapes_list_schedule_by_hand() -> None:
    from shapes import Shape, ideals, list_schedule

    # a (1 s) -> b (3 s), c (1 s), d (1 s); c -> e (1 s); one slot free at a time after a.
    shape = Shape("hand", ["a", "b", "c", "d", "e"], ["x", "y", "x", "x", "x"],
                  [1.0, 3.0, 1.0, 1.0, 1.0], [(0, 1), (0, 2), (0, 3), (2, 4)])
    assert shape.levels() == [1, 2, 2, 2, 3]
    assert shape.bottom_levels() == [4.0, 3.0, 2.0, 1.0, 1.0]
    # By DAG order on 2 slots: a; b and c; d at 2 beside b; e at 3 beside b: ends at 4.
    assert list_schedule(shape, 2, lambda t: t) == 4.0
    # Last first: d and c (1-2), then e before b: b runs 2-5.
    assert list_schedule(shape, 2, lambda t: -t) == 5.0
    # One slot: the sum of the runtimes, whatever the order.
    assert list_schedule(shape, 1, lambda t: t) == 7.0
    by_priority, by_path = ideals(shape, 2)
    assert by_path <= by_priority


def test_shapes_longest_path_beats_levels() -> None:
    from shapes import Shape, ideals

    # Three roots at level 1; the long chain hangs off the last in DAG order.
    wide = Shape("hand", ["s", "t", "l", "l1"], ["x"] * 4, [2.0, 2.0, 1.0, 4.0], [(2, 3)])
    # By level the roots go in DAG order (s, t, then l: l1 runs 3-7); by path l first.
    assert ideals(wide, 2) == (7.0, 5.0)
    assert ideals(wide, 1) == (9.0, 9.0)  # one slot: all of it, whatever the order


def test_shapes_learned_schedule_starts_blind() -> None:
    from shapes import Shape, ideals, learned_schedule

    # Roots p and q (kind k, 1 s each) and r (kind m, 6 s); q before q1 (kind c, 4 s).
    blind = Shape("hand", ["p", "q", "q1", "r"], ["k", "k", "c", "m"], [1.0, 1.0, 4.0, 6.0],
                  [(1, 2)])
    # Knowing the runtimes, on 2 slots: r and q at 0, q1 1-5, p 5-6 beside r: 6 s.
    assert ideals(blind, 2)[1] == 6.0
    # Learning them: every task is 1 s at the start, so q (a path of two) and p (first
    # in DAG order) start; at 1 only k is known, q1 and r look alike and both start:
    # r ends at 7.
    assert learned_schedule(blind, 2) == 7.0


def test_shapes_given_dag_carries_each_transformations_mean(tmp_path: Path) -> None:
    from shapes import Shape, given_dag, write_dag

    from pmc.dag import parse_dag

    # Kind k: 0.1, 0.25 and 0.4 s (mean 0.25); kind m: 1/3 s alone, a mean of many digits.
    shape = Shape("hand", ["a", "b", "c", "d"], ["k", "m", "k", "k"],
                  [0.1, 1 / 3, 0.25, 0.4], [(0, 1), (1, 2)])
    shared = tmp_path / "hand.dag"
    write_dag(shared, shape)
    write_dag(given_dag(shared), shape, shape.kind_means())
    assert given_dag(shared) == tmp_path / "hand.given.dag"
    assert "--expected-runtime" not in shared.read_text()
    lines = [ln for ln in given_dag(shared).read_text().splitlines() if ln.startswith("TASK")]
    assert len(lines) == 4 and all("--expected-runtime" in ln for ln in lines)
    # pmc reads back the means as written, fractions of a second to the last digit.
    dag = parse_dag(str(given_dag(shared)))
    means = [(0.1 + 0.25 + 0.4) / 3, 1 / 3, (0.1 + 0.25 + 0.4) / 3, (0.1 + 0.25 + 0.4) / 3]
    assert [dag.task(i).expected_runtime for i in range(4)] == means
    assert [dag.task(i).priority for i in range(4)] == [1, 2, 3, 1]  # the levels, as before
    assert all(parse_dag(str(shared)).task(i).expected_runtime is None for i in range(4))


def test_shapes_given_schedule_weighs_paths_by_the_means() -> None:
    from shapes import Shape, given_schedule, ideals

    # Roots x (kind k, 1 s), y (kind k, 5 s) and z (kind m, 4 s), on 2 slots.
    roots = Shape("hand", ["x", "y", "z"], ["k", "k", "m"], [1.0, 5.0, 4.0], [])
    assert roots.kind_means() == [3.0, 3.0, 4.0]
    assert roots.bottom_levels(roots.kind_means()) == [3.0, 3.0, 4.0]
    # Knowing each runtime: y and z at 0, x 4-5: 5 s.
    assert ideals(roots, 2)[1] == 5.0
    # Told k's mean, x and y look alike (3 s, below z's 4): z and x (first in DAG order)
    # start, y at 1 ends at 6.
    assert given_schedule(roots, 2) == 6.0
    # With an edge, the means add up along the path: x's chain (3 + 4) goes first.
    chain = Shape("hand", ["x", "y", "z"], ["k", "k", "m"], [1.0, 5.0, 4.0], [(0, 2)])
    assert chain.bottom_levels(chain.kind_means()) == [7.0, 3.0, 4.0]
    assert chain.bottom_levels() == [5.0, 5.0, 4.0]
    # x and y at 0, z 1-5 beside y: 5 s, as knowing every runtime.
    assert given_schedule(chain, 2) == 5.0 == ideals(chain, 2)[1]


def test_shapes_critical_given_runs_its_dag(tmp_path: Path) -> None:
    from shapes import Shape, command, given_dag, run_once, write_dag

    # Embedded pmc, ordering by the longest path, runs the DAG with fractional
    # --expected-runtime to the end (run_once raises on a failure).
    shape = Shape("hand", ["a", "b", "c"], ["k", "k", "m"], [0.05, 0.15, 0.1], [(0, 2)])
    dag = given_dag(tmp_path / "hand.dag")
    write_dag(dag, shape, shape.kind_means())
    cmd = command("critical-given", dag, 2, None)
    assert cmd[-3:] == ["--schedule", "critical-path", str(dag)] and "--workers" in cmd
    run_once("critical-given", dag, 2, None)
    done = (tmp_path / "hand.given.dag.rescue").read_text().split("\n")
    assert sorted(done) == ["", "DONE a", "DONE b", "DONE c"]


def test_shapes_reference_heap_takes_equal_priorities_out_of_dag_order() -> None:
    from shapes import PriorityHeap, Shape, ideals, reference_schedule

    # Four of equal priority: the top leaves; the hole walks down by the right child of
    # two equal ones and the last task fills it: 0, 2, 1, 3.
    heap = PriorityHeap([0, 0, 0, 0])
    for t in range(4):
        heap.push(t)
    assert [heap.pop() for _ in range(4)] == [0, 2, 1, 3]
    # A higher priority leaves first; the rest as the heap has them then.
    heap = PriorityHeap([0, 0, 5, 0, 0])
    for t in range(5):
        heap.push(t)
    assert [heap.pop() for _ in range(5)] == [2, 0, 4, 1, 3]
    # Roots a-d (1 s), c -> e (3 s), on 2 slots. In DAG order a and b go first, e starts
    # at 2 and ends at 5; the heap gives a and c, e starts at 1 and ends at 4.
    shape = Shape("hand", ["a", "b", "c", "d", "e"], ["k"] * 5, [1.0, 1.0, 1.0, 1.0, 3.0],
                  [(2, 4)])
    assert ideals(shape, 2)[0] == 5.0
    assert reference_schedule(shape, 2) == 4.0
