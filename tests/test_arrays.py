"""Task arrays (a pmc extension) as read from a DAG file and run by the engine: members'
names, values, commands and ids; EDGE lines naming arrays; the rules that keep names
apart; the engine's runs of ready members and its joins. No processes (the runs are in
test_run_arrays.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pmctest import write_dag

from pmc.core.engine import Engine, Outcome, State
from pmc.dag import DagError, parse_dag, split_command


def dag_of(tmp_path: Path, text: str, **files: str) -> object:
    for name, content in files.items():
        (tmp_path / name.replace("_", ".")).write_text(content)
    return parse_dag(str(write_dag(tmp_path / "w.dag", text)))


def error_of(tmp_path: Path, text: str, **files: str) -> str:
    with pytest.raises(DagError) as e:
        dag_of(tmp_path, text, **files)
    return str(e.value)


def argv(dag, name: str) -> list[str]:
    return split_command(dag.task(dag.id_of(name)).command)


def env(dag, name: str) -> dict[str, str]:
    return dict(dag.task(dag.id_of(name)).env)


# -- members: names, values, commands ---------------------------------------------------


def test_range_array_members_names_values_and_commands(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK prep /bin/true\n"
                           "TASK s --array 0-999 -c 2 -t 3 /bin/echo v={} i={#} {}{#}\n")
    assert dag.ntasks == 1001
    assert list(dag.arrays) == ["s"]
    assert argv(dag, "s[0]") == ["/bin/echo", "v=0", "i=0", "00"]
    assert argv(dag, "s[999]") == ["/bin/echo", "v=999", "i=999", "999999"]
    assert env(dag, "s[42]") == {"PMC_ARRAY_INDEX": "42", "PMC_ARRAY_VALUE": "42"}
    member = dag.task(dag.id_of("s[7]"))
    assert (member.name, member.cpus, member.tries, member.line) == ("s[7]", 2, 3, 2)
    assert dag.id_of("s[1000]") is None and dag.id_of("s[07]") is None
    assert dag.id_of("s") is None  # an array is not a task


def test_range_with_a_step_numbers_members_from_0(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK s --array 10-20:5 /bin/echo {} {#}\n")
    assert dag.ntasks == 3
    assert [argv(dag, f"s[{i}]") for i in range(3)] == [
        ["/bin/echo", "10", "0"], ["/bin/echo", "15", "1"], ["/bin/echo", "20", "2"]]
    assert dag.id_of("s[3]") is None


def test_each_line_values_are_one_word_whatever_they_hold(tmp_path: Path) -> None:
    lines = "plain\nwith space\n\nit's \"quoted\" \\ $HOME\n  lead\r\nlast"
    dag = dag_of(tmp_path, "TASK e --each-line vals.txt /bin/echo [{}] {#}\n", vals_txt=lines)
    assert dag.ntasks == 6
    got = [argv(dag, f"e[{i}]") for i in range(6)]
    assert got == [["/bin/echo", "[plain]", "0"], ["/bin/echo", "[with space]", "1"],
                   ["/bin/echo", "[]", "2"],
                   ["/bin/echo", "[it's \"quoted\" \\ $HOME]", "3"],
                   ["/bin/echo", "[  lead]", "4"], ["/bin/echo", "[last]", "5"]]
    assert env(dag, "e[3]")["PMC_ARRAY_VALUE"] == "it's \"quoted\" \\ $HOME"


def test_from_json_values(tmp_path: Path) -> None:
    items = ["a b", 7, 2.5, {"k": [1, "x"]}, True, None, "uni\u00e9"]
    dag = dag_of(tmp_path, "TASK j --from-json items.json /bin/echo {}\n",
                 items_json=json.dumps(items, indent=2))
    values = [env(dag, f"j[{i}]")["PMC_ARRAY_VALUE"] for i in range(len(items))]
    assert values == ["a b", "7", "2.5", '{"k":[1,"x"]}', "true", "null", "uni\u00e9"]


def test_placeholders_only_in_an_array_and_its_arguments(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK plain /bin/echo {} {#}\n"
                           "TASK a --array 0-1 --outputs out{#}.txt /bin/echo {}\n")
    assert split_command(dag.task(0).command) == ["/bin/echo", "{}", "{#}"]
    member = dag.task(dag.id_of("a[1]"))
    assert member.outputs == ("out1.txt",)
    assert dag.task(0).env is None


def test_a_member_costs_no_object_until_made(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK big --array 0-99999 /bin/true {}\nTASK t /bin/true\n")
    assert dag.ntasks == 100_001
    assert len(dag.index) == 1  # members are found by arithmetic
    assert len({id(t) for t in dag.tasks}) == 4  # a join, the members' one slot, a join, t
    assert dag.name_of(dag.id_of("big[99999]")) == "big[99999]"


# -- EDGE lines ---------------------------------------------------------------------------


def test_all_members_edges_go_through_joins(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK t /bin/true\n"
                           "TASK a --array 0-999 /bin/true\n"
                           "TASK b --array 0-1999 /bin/true\n"
                           "TASK u /bin/true\n"
                           "EDGE t a\nEDGE a b\nEDGE b u\nEDGE a u\n")
    a, b = dag.arrays["a"], dag.arrays["b"]
    # t -> a.start -> 1000 members -> a.end -> b.start -> 2000 members -> b.end -> u, and
    # a.end -> u: never 1000 x 2000 edges.
    assert dag.edge_count() == 1 + 1000 + 1000 + 1 + 2000 + 2000 + 1 + 1
    assert list(dag.children(dag.index["t"])) == [a.start]
    assert list(dag.children(a.first + 5)) == [a.end]
    assert sorted(dag.children(a.end)) == [b.start, dag.index["u"]]
    assert dag.nparents[dag.index["u"]] == 2


def test_member_by_member_edges(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK a --array 0-99 /bin/true\nTASK b --array 0-99 /bin/true\n"
                           "TASK c /bin/true\nEDGE a[i] b[i]\nEDGE a[3] c\n")
    a, b = dag.arrays["a"], dag.arrays["b"]
    assert dag.edge_count() == 101
    assert list(dag.children(a.first + 7)) == [b.first + 7]
    assert list(dag.children(a.first + 3)) == [b.first + 3, dag.index["c"]]


@pytest.mark.parametrize(("text", "message"), [
    ("TASK a --array 0-9 /bin/true\nTASK b --array 0-8 /bin/true\nEDGE a[i] b[i]\n",
     "w.dag:3: a member-by-member edge needs arrays of one size: a has 10 members, b 9"),
    ("TASK a --array 0-9 /bin/true\nTASK b --array 0-9 /bin/true\nEDGE a[i] b\n",
     "w.dag:3: a member-by-member edge (a pmc extension) names two arrays as NAME[i]"),
    ("TASK a --array 0-9 /bin/true\nEDGE a a\n",
     "w.dag:2: self edge: array 'a' cannot depend on itself"),
    ("TASK a --array 0-9 /bin/true\nEDGE a[i] a[i]\n",
     "w.dag:2: self edge: array 'a' cannot depend on itself"),
    ("TASK a --array 0-9 /bin/true\nTASK t /bin/true\nEDGE a[10] t\n",
     "w.dag:3: EDGE names unknown task 'a[10]'"),
    ("TASK a --array 0-9 /bin/true\nTASK t /bin/true\nEDGE t b\n",
     "w.dag:3: EDGE names unknown task 'b'"),
    ("TASK a --array 0-9 /bin/true\nTASK t /bin/true\nEDGE a[3] a\n",
     "cycle"),
])
def test_bad_array_edges(tmp_path: Path, text: str, message: str) -> None:
    assert message in error_of(tmp_path, text)


def test_a_cycle_through_arrays_names_them(tmp_path: Path) -> None:
    message = error_of(tmp_path, "TASK a --array 0-2 /bin/true\nTASK b --array 0-2 /bin/true\n"
                                 "EDGE a b\nEDGE b a\n")
    assert message.endswith("w.dag:4: cycle: a -> b -> a")


# -- bad array lines and names --------------------------------------------------------------


@pytest.mark.parametrize(("line", "message"), [
    ("--array 5-2", "task option --array (a pmc extension) needs FIRST-LAST[:STEP]"),
    ("--array 1-9:0", "task option --array (a pmc extension) needs FIRST-LAST[:STEP]"),
    ("--array x", "got 'x'"),
    ("--each-line none.txt", "task option --each-line (a pmc extension): cannot read "
                             "none.txt: No such file or directory"),
    ("--each-line empty.txt", "task option --each-line (a pmc extension) needs a file of "
                              "values, one a line: empty.txt: no lines"),
    ("--from-json bad.json", "bad.json: ',' or ']' expected at line 2 column 4"),
    ("--from-json obj.json", "obj.json: not a JSON list"),
    ("--array 0-3 --each-line obj.json", "a task array takes one of --array, --each-line "
                                         "and --from-json"),
    ("--inputs a,,b", "task option --inputs (a pmc extension) needs paths separated by "
                      "commas, got 'a,,b'"),
])
def test_bad_array_lines(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "bad.json").write_text('[1,\n 2 3]')
    (tmp_path / "obj.json").write_text('{"a": 1}')
    got = error_of(tmp_path, f"TASK t /bin/true\nTASK a {line} /bin/echo {{}}\n")
    assert got.startswith(f"{tmp_path / 'w.dag'}:2: ")
    assert message in got


@pytest.mark.parametrize(("text", "message"), [
    ("TASK a /bin/true\nTASK a --array 0-1 /bin/true\n",
     "w.dag:2: duplicate task id 'a' (first defined at line 1)"),
    ("TASK a --array 0-1 /bin/true\nTASK a /bin/true\n",
     "w.dag:2: task id 'a' is taken by the task array a defined at line 1"),
    ("TASK a[1] /bin/true\nTASK a --array 0-1 /bin/true\n",
     "w.dag:1: task id 'a[1]' is taken by the task array a defined at line 2"),
    ("TASK a --array 0-1 /bin/true\nTASK a[i] /bin/true\n",
     "w.dag:2: task id 'a[i]' is taken by the task array a"),
    ("TASK x[1] --array 0-1 /bin/true\n", "w.dag:1: an array's name cannot hold '['"),
])
def test_names_of_tasks_and_members_stay_apart(tmp_path: Path, text: str, message: str) -> None:
    assert message in error_of(tmp_path, text)


def test_a_task_named_like_a_member_of_no_array_is_fine(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK a[1] /bin/true\nTASK b --array 0-1 /bin/true\n"
                           "EDGE a[1] b\n")
    assert dag.id_of("a[1]") == 0 and dag.ntasks == 3


def test_big_dag_with_an_array_parses_without_the_edge_helper(tmp_path: Path) -> None:
    # Big enough for the edge helper, which cannot resolve array names: the reader
    # stops it and reads every EDGE line itself.
    lines = ["TASK s --array 0-9 /bin/true {}\n", "TASK z --array 0-9 /bin/true {}\n"]
    n = 120_000
    lines += [f"TASK task_{i:07d} /bin/true {'x' * 40}\n" for i in range(n)]
    lines += [f"EDGE task_{i:07d} task_{i + 1:07d}\n" for i in range(n - 1)]
    lines += ["EDGE s task_0000000\n", f"EDGE task_{n - 1:07d} z\n", "EDGE s[i] z[i]\n"]
    dag = dag_of(tmp_path, "".join(lines))
    s, z = dag.arrays["s"], dag.arrays["z"]
    assert (tmp_path / "w.dag").stat().st_size > 8 << 20
    assert dag.edge_count() == (n - 1) + (10 + 1) + (1 + 10) + 10
    assert list(dag.children(s.end)) == [dag.index["task_0000000"]]
    assert list(dag.children(dag.index[f"task_{n - 1:07d}"])) == [z.start]


def test_big_dag_with_an_array_after_many_tasks(tmp_path: Path) -> None:
    # A helped parse indexes no name until it needs to: the array's line, far into the
    # file, makes the reader index the tasks before it, and check every later name.
    n = 120_000
    lines = [f"TASK task_{i:07d} /bin/true {'x' * 40}\n" for i in range(n)]
    lines += ["TASK s --array 0-9 /bin/true {}\n", "TASK task_0000005 /bin/false\n"]
    lines += [f"EDGE task_{i:07d} task_{i + 1:07d}\n" for i in range(n - 1)]
    with pytest.raises(DagError) as info:
        dag_of(tmp_path, "".join(lines))
    assert f"w.dag:{n + 2}: duplicate task id 'task_0000005' (first defined at line 6)" in str(
        info.value)
    lines[n + 1] = "TASK t /bin/false\n"
    dag = dag_of(tmp_path, "".join(lines) + f"EDGE task_{n - 1:07d} s\n")
    assert dag.ntasks == n + 11 and dag.edge_count() == n - 1 + 1 + 10
    assert list(dag.children(dag.index[f"task_{n - 1:07d}"])) == [dag.arrays["s"].start]


# -- the engine -------------------------------------------------------------------------------


def run_all(engine: Engine, dag) -> list[str]:
    """Take ready tasks one at a time and let each succeed; their names in order."""
    order = []
    while not engine.finished():
        _key, cls = engine.ready_heads()[0]
        task_id = engine.pop(cls)
        order.append(dag.name_of(task_id))
        engine.complete(task_id, True)
    return order


def test_ready_members_are_one_run_taken_one_at_a_time(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK a --array 0-99999 /bin/true\n")
    engine = Engine(dag)
    assert engine.take_initial() == []
    assert engine.take_runs() == [(1, 100_001)]
    assert engine.nready == 100_000
    assert [len(h) for h in engine.classes.values()] == [1]  # one heap entry
    first = [dag.name_of(engine.pop((1, 0))) for _ in range(3)]
    assert first == ["a[0]", "a[1]", "a[2]"]
    assert engine.nready == 99_997
    assert engine.state[1:5] == bytes([State.RUNNING] * 3 + [State.READY])


def test_stages_linked_member_by_member_pipeline(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK a --array 0-2 /bin/true\nTASK b --array 0-2 /bin/true\n"
                           "TASK c /bin/true\nEDGE a[i] b[i]\nEDGE b c\n")
    engine = Engine(dag)
    assert run_all(engine, dag) == ["a[0]", "b[0]", "a[1]", "b[1]", "a[2]", "b[2]", "c"]
    assert engine.succeeded() and engine.ndone == 7 == engine.ntasks


def test_a_barrier_readies_the_next_array_as_one_run(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK a --array 0-2 /bin/true\nTASK b --array 0-3 /bin/true\n"
                           "EDGE a b\n")
    engine = Engine(dag)
    engine.take_runs()
    for _ in range(3):
        task_id = engine.pop((1, 0))
        outcome, newly = engine.complete(task_id, True)
        assert outcome is Outcome.SUCCEEDED and newly == []
    b = dag.arrays["b"]
    assert engine.take_runs() == [(b.first, b.end)]
    # a's and b's joins: a's first and b's last (no parents) at the start
    assert engine.npassed == 4 and engine.nready == 4


def test_a_rerun_readies_only_the_members_not_done(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK a --array 0-9 /bin/true\nTASK g /bin/true\nEDGE a g\n")
    a = dag.arrays["a"]
    done = {a.first + i for i in range(10) if i not in (3, 7, 8)}
    engine = Engine(dag, done=done)
    assert engine.recovered == 7
    assert engine.take_runs() == [(a.first + 3, a.first + 4), (a.first + 7, a.first + 9)]
    assert run_all(engine, dag) == ["a[3]", "a[7]", "a[8]", "g"]
    assert engine.succeeded()


def test_joins_of_a_finished_array_are_done_at_the_start(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK a --array 0-1 /bin/true\nTASK b --array 0-1 /bin/true\n"
                           "TASK g /bin/true\nEDGE a b\nEDGE b g\n")
    a = dag.arrays["a"]
    engine = Engine(dag, done={a.first, a.first + 1})
    assert engine.take_initial() == []
    assert engine.take_runs() == [(dag.arrays["b"].first, dag.arrays["b"].end)]
    assert run_all(engine, dag) == ["b[0]", "b[1]", "g"]


def test_a_failed_member_is_retried_alone(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK a --array 0-2 -t 2 /bin/true\n")
    engine = Engine(dag)
    task_id = engine.pop((1, 0))
    assert engine.complete(task_id, False) == (Outcome.RETRY, [task_id])
    assert run_all(engine, dag) == ["a[0]", "a[1]", "a[2]"]
    assert engine.nretries == 1 and engine.succeeded()


def test_priority_comes_before_the_member_index(tmp_path: Path) -> None:
    dag = dag_of(tmp_path, "TASK a --array 0-2 /bin/true\nTASK b --array 0-2 -p 5 /bin/true\n"
                           "TASK t -p 9 /bin/true\n")
    assert run_all(Engine(dag), dag) == ["t", "b[0]", "b[1]", "b[2]", "a[0]", "a[1]", "a[2]"]
