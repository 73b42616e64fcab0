"""The engine alone: readiness, priorities, tries, max failures, descendants of failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from pmc.core.engine import Engine, Outcome, State
from pmc.dag import DAG, parse_dag


def make(tmp_path: Path, text: str) -> DAG:
    p = tmp_path / "w.dag"
    p.write_text(text)
    return parse_dag(str(p))


def names(dag: DAG, ids: list[int]) -> list[str]:
    return [dag.task(i).name for i in ids]


def drain(engine: Engine) -> list[int]:
    """Pop every ready task in the engine's order (best class head first)."""
    out = []
    while engine.nready:
        _key, cls = engine.ready_heads()[0]
        out.append(engine.pop(cls))
    return out


def test_roots_ready_in_dag_order_then_children(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK A /bin/true\nTASK B /bin/true\nTASK C /bin/true\nEDGE A C\n")
    e = Engine(dag)
    assert names(dag, drain(e)) == ["A", "B"]
    assert e.state[dag.index["C"]] == State.WAITING
    outcome, newly = e.complete(dag.index["A"], ok=True)
    assert outcome is Outcome.SUCCEEDED and names(dag, newly) == ["C"]
    assert not e.finished()
    e.complete(dag.index["B"], ok=True)
    e.complete(drain(e)[0], ok=True)
    assert e.finished() and e.succeeded()


@pytest.mark.parametrize("parents", [1, 255, 256, 257, 65536])
def test_a_task_waits_for_every_parent_however_many(tmp_path: Path, parents: int) -> None:
    # The start reads the counts of parents in bytes: 256 and 65,536 have a low byte of 0.
    tasks = "".join(f"TASK p{i} /bin/true\n" for i in range(parents))
    edges = "".join(f"EDGE p{i} join\n" for i in range(parents))
    dag = make(tmp_path, f"{tasks}TASK join /bin/true\nTASK alone /bin/true\n{edges}")
    e = Engine(dag)
    ready = drain(e)
    assert names(dag, ready) == [*(f"p{i}" for i in range(parents)), "alone"]
    for task in ready[:-1]:
        assert names(dag, e.complete(task, ok=True)[1]) == ([] if task != ready[-2] else ["join"])


def test_higher_priority_first_then_dag_order(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK a /bin/true\nTASK b -p 5 /bin/true\nTASK c -p -1 /bin/true\n"
                         "TASK d -p 5 /bin/true\nTASK e /bin/true\n")
    assert names(dag, drain(Engine(dag))) == ["b", "d", "a", "e", "c"]


def test_child_that_becomes_ready_later_keeps_dag_order(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK p /bin/true\nTASK x /bin/true\nTASK y /bin/true\nEDGE p x\n")
    e = Engine(dag)
    p = e.pop((1, 0))
    e.complete(p, ok=True)
    assert names(dag, drain(e)) == ["x", "y"]


def test_classes_are_separate_but_priority_decides_which_head(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK small /bin/true\nTASK big -c 4 -p 3 /bin/true\n")
    e = Engine(dag)
    heads = e.ready_heads()
    assert [cls for _k, cls in heads] == [(4, 0), (1, 0)]


def test_tries_retry_then_fail_permanently(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK A -t 3 /bin/false\nTASK B /bin/false\n")
    e = Engine(dag, tries=1)
    a, b = dag.index["A"], dag.index["B"]
    assert e.tries_of(a) == 3 and e.tries_of(b) == 1
    for attempt in (1, 2):
        assert e.pop((1, 0)) == a
        assert e.attempts[a] == attempt
        assert e.complete(a, ok=False)[0] is Outcome.RETRY
    assert e.pop((1, 0)) == a
    assert e.complete(a, ok=False)[0] is Outcome.FAILED
    assert e.pop((1, 0)) == b
    assert e.complete(b, ok=False)[0] is Outcome.FAILED
    assert e.nfailed == 2 and e.nretries == 2 and e.finished() and not e.succeeded()


def test_global_tries_apply_to_tasks_without_their_own(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK A /bin/false\n")
    e = Engine(dag, tries=2)
    e.pop((1, 0))
    assert e.complete(0, ok=False)[0] is Outcome.RETRY
    e.pop((1, 0))
    assert e.complete(0, ok=False)[0] is Outcome.FAILED


def test_descendants_of_a_failed_task_never_become_ready(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK A /bin/false\nTASK B /bin/true\nTASK C /bin/true\n"
                         "TASK D /bin/true\nEDGE A B\nEDGE B C\nEDGE D C\n")
    e = Engine(dag)
    ready = drain(e)
    assert names(dag, ready) == ["A", "D"]
    e.complete(dag.index["A"], ok=False)
    e.complete(dag.index["D"], ok=True)
    assert e.nready == 0 and e.finished()
    assert e.state[dag.index["B"]] == State.WAITING
    assert e.state[dag.index["C"]] == State.WAITING


def test_max_failures_stops_new_submissions(tmp_path: Path) -> None:
    dag = make(tmp_path, "".join(f"TASK t{i} /bin/false\n" for i in range(5)))
    e = Engine(dag, max_failures=2)
    first, second = e.pop((1, 0)), e.pop((1, 0))
    e.complete(first, ok=False)
    assert e.accepting()
    e.complete(second, ok=False)
    assert not e.accepting()
    assert e.nready == 3
    assert e.finished()  # nothing running, nothing more will start


def test_max_failures_lets_running_tasks_finish(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK a /bin/false\nTASK b /bin/true\n")
    e = Engine(dag, max_failures=1)
    a, b = e.pop((1, 0)), e.pop((1, 0))
    e.complete(a, ok=False)
    assert not e.finished()  # b still runs
    e.complete(b, ok=True)
    assert e.finished() and e.ndone == 1


def test_rescued_tasks_are_done_and_release_children(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK A /bin/true\nTASK B /bin/true\nTASK C /bin/true\n"
                         "EDGE A B\nEDGE B C\n")
    e = Engine(dag, done={dag.index["A"]})
    assert e.recovered == 1 and e.ndone == 1
    assert names(dag, drain(e)) == ["B"]


def test_requeue_does_not_count_a_try(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK A /bin/true\n")
    e = Engine(dag, tries=1)
    a = e.pop((1, 0))
    e.requeue(a)
    assert e.state[a] == State.READY and e.attempts[a] == 0
    e.pop((1, 0))
    assert e.complete(a, ok=False)[0] is Outcome.FAILED


def test_hold_leaves_the_task_undone(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK A --expected-runtime 100 /bin/true\n")
    e = Engine(dag)
    e.hold(e.pop((1, 0)))
    assert e.nheld == 1 and e.finished() and not e.succeeded()


def test_invalid_tries(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Engine(make(tmp_path, "TASK A /bin/true\n"), tries=0)


def test_a_long_chain_runs_in_process(tmp_path: Path) -> None:
    n = 200_000
    lines = [f"TASK t{i} /bin/true\n" for i in range(n)]
    lines += [f"EDGE t{i} t{i + 1}\n" for i in range(n - 1)]
    dag = make(tmp_path, "".join(lines))
    e = Engine(dag)
    count = 0
    while e.nready:
        t = e.pop((1, 0))
        e.complete(t, ok=True)
        count += 1
    assert count == n and e.succeeded()


def test_ids_in_a_state_in_dag_order(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK A /bin/true\nTASK B /bin/true\nTASK C /bin/true\n"
               "EDGE A C\n")
    engine = Engine(dag, done=[1])
    assert list(engine.ids_in(State.READY)) == [0]
    assert list(engine.ids_in(State.DONE)) == [1]
    assert list(engine.ids_in(State.WAITING)) == [2]
    assert list(engine.ids_in(State.FAILED)) == []


def test_tasks_asking_for_gpus_or_ranks_have_classes_of_their_own(tmp_path: Path) -> None:
    dag = make(tmp_path, "TASK plain -c 2 /bin/true\nTASK gpu -c 2 --request-gpus 1 /bin/true\n"
                         "TASK mr -c 2 --ranks 4 --ranks-per-host 2 /bin/true\n"
                         "TASK gpu2 -c 2 --request-gpus 1 -p 5 /bin/true\n")
    e = Engine(dag)
    heads = e.ready_heads()
    # The best head first (gpu2, priority 5); each request a class: (cpus, memory) for
    # the usual task, (cpus, memory, gpus, ranks, ranks per host) for the others.
    assert [cls for _k, cls in heads] == [(2, 0, 1, 1, 0), (2, 0), (2, 0, 0, 4, 2)]
    assert e.pop((2, 0, 1, 1, 0)) == dag.index["gpu2"]
    assert e.pop((2, 0, 1, 1, 0)) == dag.index["gpu"]
    # A retry goes back to its own class.
    assert e.complete(dag.index["gpu"], ok=False)[0] is Outcome.FAILED
    mr = e.pop((2, 0, 0, 4, 2))
    e.requeue(mr)
    assert (2, 0, 0, 4, 2) in e.classes


@pytest.mark.parametrize("rescued", [False, True])
def test_ready_tasks_at_start_cost_a_list_slot_each(tmp_path: Path, rescued: bool) -> None:
    """A big DAG's master holds its roots twice at start (the list to announce, the ready
    heap) and a few bytes of state per task: ~20 bytes a task here, not the ~70 that an
    int object per root and a second list took."""
    import tracemalloc

    n = 100_000
    lines = [f"TASK t{i} -m 1 -c 1 /bin/true arg{i}" for i in range(n)]
    lines += [f"EDGE t{i} t{i + 1}" for i in range(0, n, 4)]  # 3/4 of the tasks are roots
    dag = make(tmp_path, "\n".join(lines) + "\n")
    done = {0} if rescued else set()  # a rescue log takes the other path: t1 ready
    tracemalloc.start()
    try:
        engine = Engine(dag, done=done)
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    initial = list(engine.take_initial())  # a copy: the list announced is the ready heap
    assert len(initial) == engine.nready == 3 * n // 4
    assert names(dag, initial[:3]) == (["t1", "t2", "t3"] if rescued else ["t0", "t2", "t3"])
    assert held < 24 * n
    assert drain(engine) == initial  # in DAG order
