"""Critical-path order (--schedule): the paths, what is learned, the engine's order by
them, and a run that starts its tasks in that order."""

from __future__ import annotations

from pathlib import Path

from pmctest import pmc, rescue_done, write_dag

from pmc.core.engine import Engine
from pmc.core.pathorder import PathOrder
from pmc.dag import DAG, parse_dag
from pmc.dag.kinds import task_kinds
from pmc.runtime.ordering import path_order


def make(tmp_path: Path, text: str) -> DAG:
    p = tmp_path / "w.dag"
    p.write_text(text)
    return parse_dag(str(p))


def names(dag: DAG, ids: list[int]) -> list[str]:
    return [dag.task(i).name for i in ids]


def drain(engine: Engine) -> list[int]:
    out = []
    while engine.nready:
        _key, cls = engine.ready_heads()[0]
        out.append(engine.pop(cls))
    return out


# Three short roots, then a root with a long chain below it (its runtimes given).
CHAIN = ("TASK s1 /bin/true a\nTASK s2 /bin/true b\nTASK s3 -p 5 /bin/true c\n"
         "TASK l --expected-runtime 5 /bin/sleep 0\n"
         "TASK l1 --expected-runtime 5 /bin/sleep 0\nEDGE l l1\n")


def test_paths_from_given_and_unknown_runtimes(tmp_path: Path) -> None:
    dag = make(tmp_path, CHAIN)
    kinds, kind_names = task_kinds(dag)
    assert kind_names == ["/bin/true", "/bin/sleep"]
    order = PathOrder(dag, kinds, len(kind_names), path_first=True)
    # Nothing has ended: every unknown runtime counts 1 s.
    assert list(order.bottom) == [1.0, 1.0, 1.0, 10.0, 5.0]


def test_critical_path_first_then_priority(tmp_path: Path) -> None:
    dag = make(tmp_path, CHAIN)
    assert names(dag, drain(Engine(dag))) == ["s3", "s1", "s2", "l"]  # the reference's order
    e = Engine(dag, order=path_order(dag, "critical-path"))
    assert names(dag, drain(e)) == ["l", "s3", "s1", "s2"]
    e = Engine(dag, order=path_order(dag, "priority-path"))
    assert names(dag, drain(e)) == ["s3", "l", "s1", "s2"]


def test_learned_runtimes_reorder_the_ready_tasks(tmp_path: Path) -> None:
    # Chains of three "fast" tasks and of two "slow" ones, their runtimes unknown.
    text = "".join(f"TASK f{i} /bin/fast\nTASK g{i} /bin/fast\nTASK h{i} /bin/fast\n"
                   f"EDGE f{i} g{i}\nEDGE g{i} h{i}\n" for i in range(2))
    text += "".join(f"TASK s{i} /bin/slow\nTASK t{i} /bin/slow\nEDGE s{i} t{i}\n"
                    for i in range(2))
    dag = make(tmp_path, text)
    order = path_order(dag, "critical-path")
    assert order is not None
    e = Engine(dag, order=order)
    # Unknown runtimes count alike: the longer chains first.
    f0, f1, s0 = (e.pop(e.ready_heads()[0][1]) for _ in range(3))
    assert names(dag, [f0, f1, s0]) == ["f0", "f1", "s0"]
    e.complete(s0, True, 30.0)
    assert order.stale
    e.complete(f0, True, 0.01)
    e.complete(f1, True, 0.01)
    e.reorder()
    assert not order.stale
    # Slow is slow: its chain (60 s) and what is left of the one started (30 s) first.
    assert names(dag, drain(e)) == ["s1", "t0", "g0", "g1"]


def test_a_learned_mean_that_stays_put_leaves_the_order(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK a /bin/x\nTASK b /bin/x\nTASK c /bin/x\n")
    order = path_order(dag, "critical-path")
    assert order is not None
    order.learn(0, 2.0)
    assert order.stale
    order.compute()
    order.learn(1, 2.1)  # within a fifth
    assert not order.stale
    order.learn(2, 9.0)
    assert order.stale


def test_pegasus_transformations_are_kinds(tmp_path: Path) -> None:
    dag = make(tmp_path, "#@ 1 pegasus::mProject:1.0 ID1\nTASK a /bin/kickstart -n x\n"
                         "# a comment\n#@ 2 pegasus::mDiff:1.0 ID2\nTASK b /bin/kickstart\n"
                         "TASK c /bin/kickstart\n")
    kinds, kind_names = task_kinds(dag)
    assert [kind_names[k] for k in kinds] == [
        "pegasus::pegasus::mProject:1.0", "pegasus::pegasus::mDiff:1.0", "/bin/kickstart"]


def test_a_run_starts_the_long_chain_first(tmp_path: Path) -> None:
    write_dag(tmp_path / "w.dag", CHAIN)
    # One slot, nothing queued behind a running task: the order tasks start in is the
    # order they were taken in.
    one = ["run", "--workers", "1", "--no-prefetch", "w.dag"]
    proc = pmc([*one, "--schedule", "critical-path"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    # (l1 becomes ready once l's record is durable: a slot free meanwhile takes another.)
    assert rescue_done(tmp_path / "w.dag.rescue", in_order=True)[0] == "l"
    (tmp_path / "w.dag.rescue").unlink()
    proc = pmc(one, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert rescue_done(tmp_path / "w.dag.rescue", in_order=True) == [
        "s3", "s1", "s2", "l", "l1"]
