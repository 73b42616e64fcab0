"""Declared files and ``--reuse`` (pmc extensions): a missing declared output fails its
task with the file's name; with --reuse a task whose outputs are up to date is not run
(recorded as reused), Pegasus's cascade skips the producers only reused tasks need, and
touching one input re-runs exactly what is downstream of it. The rules on their own
(``pmc.core.reuse.plan``) and with real processes and files."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from pmctest import pmc, write_dag

from pmc.core import reuse
from pmc.dag import parse_dag

C, S, M, D = reuse.CURRENT, reuse.STALE, reuse.MISSING, reuse.DONE


def plan(tmp_path: Path, text: str, states: dict[str, int]) -> tuple[set[str], set[str]]:
    """(done, reused) names for the file states given by task name."""
    dag = parse_dag(str(write_dag(tmp_path / "p.dag", text)))
    status = bytearray(len(dag))
    for t in range(len(dag)):
        held = dag.tasks[t]
        status[t] = reuse.JOIN if held.__class__.__name__ == "JoinSlot" \
            else states[dag.name_of(t)]
    done, reused = reuse.plan(dag, status, reuse.parents_of(dag))
    return {dag.name_of(t) for t in done}, {dag.name_of(t) for t in reused}


CHAIN = "".join(f"TASK {n} /bin/true\n" for n in "abcd") + "EDGE a b\nEDGE b c\nEDGE c d\n"


@pytest.mark.parametrize(("states", "reused"), [
    ({"a": C, "b": C, "c": C, "d": C}, "abcd"),  # all up to date
    ({"a": C, "b": S, "c": C, "d": C}, "a"),  # b stale: b and all below run
    ({"a": C, "b": M, "c": C, "d": C}, "abcd"),  # b's output deleted: cascade
    ({"a": M, "b": M, "c": C, "d": C}, "abcd"),
    ({"a": C, "b": C, "c": C, "d": M}, "abc"),  # the last output missing: d runs
    ({"a": M, "b": C, "c": C, "d": M}, "abc"),  # d runs, needs c's output (there) only
    ({"a": M, "b": M, "c": M, "d": M}, ""),  # nothing declared: everything runs
])
def test_make_rule_and_cascade_on_a_chain(tmp_path: Path, states: dict[str, int],
                                          reused: str) -> None:
    assert plan(tmp_path, CHAIN, states) == (set(), set(reused))


def test_a_task_that_runs_makes_its_missing_parents_run(tmp_path: Path) -> None:
    text = ("TASK p /bin/true\nTASK q /bin/true\nTASK x /bin/true\nTASK y /bin/true\n"
            "EDGE p x\nEDGE p y\nEDGE q y\n")
    # y is stale: it runs and needs p's missing output, so p runs, and x (p's other
    # child) with it; q is up to date.
    assert plan(tmp_path, text, {"p": M, "q": C, "x": C, "y": S}) == (set(), {"q"})


def test_done_in_the_rescue_log_without_outputs(tmp_path: Path) -> None:
    # b declares nothing and is done: it stays done, unless a parent runs.
    assert plan(tmp_path, CHAIN, {"a": C, "b": D, "c": C, "d": C}) == ({"b"}, set("acd"))
    assert plan(tmp_path, CHAIN, {"a": S, "b": D, "c": C, "d": C}) == (set(), set())


def test_arrays_joins_are_walked_through(tmp_path: Path) -> None:
    text = "TASK a --array 0-2 /bin/true\nTASK g /bin/true\nTASK h /bin/true\nEDGE a g\nEDGE a h\n"
    states = {"a[0]": M, "a[1]": C, "a[2]": M, "g": C, "h": S}
    # h is stale: it runs and needs every member's outputs, so the missing ones run, and
    # g, below them, with them; a[1] is up to date.
    assert plan(tmp_path, text, states) == (set(), {"a[1]"})
    states["h"] = C
    assert plan(tmp_path, text, states) == (set(), {"a[0]", "a[1]", "a[2]", "g", "h"})


# -- with processes and files ----------------------------------------------------------------

# Three levels: two inputs, two producers, two transformers, one merge.
THREE = """\
TASK a1 --inputs in1.txt --outputs a1.out /bin/sh -c 'cat in1.txt > a1.out; echo a1 >> ran'
TASK a2 --inputs in2.txt --outputs a2.out /bin/sh -c 'cat in2.txt > a2.out; echo a2 >> ran'
TASK b1 --inputs a1.out --outputs b1.out /bin/sh -c 'tr a-z A-Z < a1.out > b1.out; echo b1 >> ran'
TASK b2 --inputs a2.out --outputs b2.out /bin/sh -c 'tr a-z A-Z < a2.out > b2.out; echo b2 >> ran'
TASK c --inputs b1.out,b2.out --outputs c.out /bin/sh -c 'cat b1.out b2.out > c.out; echo c >> ran'
EDGE a1 b1
EDGE a2 b2
EDGE b1 c
EDGE b2 c
"""


def run(tmp_path: Path, *args: str) -> tuple[Any, list[str], list[dict[str, Any]]]:
    """A run with --reuse and a JSON log: (result, tasks that ran, events)."""
    (tmp_path / "ran").unlink(missing_ok=True)
    (tmp_path / "ev.jsonl").unlink(missing_ok=True)
    r = pmc(["run", "--workers", "2", "--log-format", "json", "--log-file", "ev.jsonl",
             *args, "w.dag"], tmp_path)
    ran = sorted((tmp_path / "ran").read_text().split()) if (tmp_path / "ran").exists() else []
    evs = [json.loads(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()
           if line.startswith("{")]
    return r, ran, evs


def touch(path: Path) -> None:
    """Make ``path`` newer than every other file of its directory: those are set a
    minute back (never a time to come, which files written next would not reach)."""
    back = time.time() - 60
    for other in path.parent.iterdir():
        if other != path:
            os.utime(other, (back, back))
    os.utime(path)


@pytest.fixture
def three(tmp_path: Path) -> Path:
    (tmp_path / "in1.txt").write_text("one\n")
    (tmp_path / "in2.txt").write_text("two\n")
    write_dag(tmp_path / "w.dag", THREE)
    return tmp_path


def test_a_second_run_reuses_everything(three: Path) -> None:
    r, ran, _ = run(three, "--reuse")
    assert r.returncode == 0, r.stderr
    assert ran == ["a1", "a2", "b1", "b2", "c"]
    assert (three / "c.out").read_text() == "ONE\nTWO\n"
    r, ran, evs = run(three, "--reuse", "--metrics-textfile", "m.prom")
    assert r.returncode == 0, r.stderr
    assert ran == []
    prom = (three / "m.prom").read_text()
    assert re.search(r'^pmc_tasks_total\{[^}]*outcome="reused"[^}]*\} 5\.0$', prom, re.M)
    assert re.search(r'^pmc_tasks_total\{[^}]*outcome="succeeded"[^}]*\} 0\.0$', prom, re.M)
    assert "Reused 5 task(s): their declared outputs are up to date" in [e["event"] for e in evs]
    assert 'tasks=5, submitted=0, succeeded=0, failed=0' in r.stdout
    reused = {e["task"]: e["outputs"] for e in evs if e["event"] == "task.reused"}
    assert reused == {"a1": ["a1.out"], "a2": ["a2.out"], "b1": ["b1.out"],
                      "b2": ["b2.out"], "c": ["c.out"]}
    finished = next(e for e in evs if e["event"] == "workflow.finished")
    assert (finished["reused"], finished["succeeded"], finished["outcome"]) == (5, 0,
                                                                                 "succeeded")
    rescue = (three / "w.dag.rescue").read_text().split("\n")[1:]
    assert sorted(rescue) == ["REUSED a1", "REUSED a2", "REUSED b1", "REUSED b2", "REUSED c"]
    st = pmc(["status", "w.dag"], three)
    assert st.returncode == 0 and "done: 5 (5 reused)" in st.stdout
    report = pmc(["report", "ev.jsonl"], three)
    assert "Tasks in DAG: 5 (0 done before this run, 5 reused)" in report.stdout


def test_touching_one_input_reruns_only_its_downstream_tasks(three: Path) -> None:
    assert run(three, "--reuse")[0].returncode == 0
    (three / "in2.txt").write_text("deux\n")
    touch(three / "in2.txt")
    r, ran, evs = run(three, "--reuse")
    assert r.returncode == 0, r.stderr
    assert ran == ["a2", "b2", "c"]
    assert (three / "c.out").read_text() == "ONE\nDEUX\n"
    assert sorted(e["task"] for e in evs if e["event"] == "task.reused") == ["a1", "b1"]
    # And the rescue log's word does not hide the change: everything up to date again.
    assert run(three, "--reuse")[1] == []


def test_a_deleted_intermediate_file_is_not_made_again(three: Path) -> None:
    assert run(three, "--reuse")[0].returncode == 0
    (three / "a1.out").unlink()
    r, ran, _ = run(three, "--reuse")
    assert r.returncode == 0 and ran == []  # only reused tasks needed it
    (three / "c.out").unlink()
    r, ran, _ = run(three, "--reuse")
    assert r.returncode == 0, r.stderr
    assert ran == ["c"]  # it reads b1.out and b2.out, both there


def test_without_reuse_the_rescue_log_decides_as_before(three: Path) -> None:
    assert run(three)[0].returncode == 0
    touch(three / "in1.txt")
    r, ran, evs = run(three)
    assert r.returncode == 0 and ran == []
    assert "Recovered 5 finished task(s) from the rescue log" in [e["event"] for e in evs]
    r, ran, _ = run(three, "-s")
    assert ran == ["a1", "a2", "b1", "b2", "c"]


def test_a_missing_declared_output_fails_the_task_with_its_name(tmp_path: Path) -> None:
    write_dag(tmp_path / "w.dag",
              "TASK make --outputs out/made.txt,out/forgot.txt /bin/sh -c "
              "'mkdir -p out && echo x > out/made.txt'\n"
              "TASK after /bin/true\nEDGE make after\n")
    r, _ran, evs = run(tmp_path)
    assert r.returncode == 1
    (failed,) = [e for e in evs if e["event"] == "task.failed"]
    assert failed["task"] == "make" and failed["status"] == 256
    assert failed["error"].startswith("declared output out/forgot.txt is missing (no ")
    assert "Task make failed: declared output out/forgot.txt is missing" in r.stderr
    assert re.search(r"\[cluster-task name=make, .*status=256", r.stdout)
    assert "after" not in (tmp_path / "w.dag.rescue").read_text()


def test_declared_paths_are_read_from_the_dags_directory(tmp_path: Path) -> None:
    """pmc run --reuse sub/w.dag from the parent directory: the tasks run there (their
    commands name sub/...), their declared paths are sub/'s; files of the same names in
    the parent directory are not looked at."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "in.txt").write_text("one\n")
    write_dag(sub / "w.dag",
              "TASK a --inputs in.txt --outputs a.out "
              "/bin/sh -c 'cat sub/in.txt > sub/a.out; echo a >> ran'\n"
              "TASK b --inputs a.out --outputs b.out "
              "/bin/sh -c 'tr a-z A-Z < sub/a.out > sub/b.out; echo b >> ran'\n"
              "EDGE a b\n")
    # Decoys in the parent: resolved from there, b.out would look current and
    # forgot.txt (below) present.
    for name in ("in.txt", "a.out", "b.out", "forgot.txt"):
        (tmp_path / name).write_text("decoy\n")
    back = time.time() - 60
    os.utime(tmp_path / "in.txt", (back, back))

    def ran() -> list[str]:
        return sorted((tmp_path / "ran").read_text().split())

    r = pmc(["run", "--workers", "2", "--reuse", "sub/w.dag"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert ran() == ["a", "b"]
    assert (sub / "b.out").read_text() == "ONE\n"
    (tmp_path / "ran").unlink()
    r = pmc(["run", "--workers", "2", "--reuse", "sub/w.dag"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "ran").exists()
    assert "tasks=2, submitted=0, succeeded=0, failed=0" in r.stdout
    assert (sub / "w.dag.rescue").read_text().split("\n")[1:] == ["REUSED a", "REUSED b"]
    # A newer input in sub/ runs both again.
    (sub / "in.txt").write_text("two\n")
    for name in ("a.out", "b.out"):
        os.utime(sub / name, (back, back))
    r = pmc(["run", "--workers", "2", "--reuse", "sub/w.dag"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert ran() == ["a", "b"]
    assert (sub / "b.out").read_text() == "TWO\n"

    write_dag(sub / "m.dag", "TASK make --outputs made.txt,forgot.txt "
                             "/bin/sh -c 'echo x > sub/made.txt'\n")
    r = pmc(["run", "--workers", "1", "sub/m.dag"], tmp_path)
    assert r.returncode == 1
    full = sub / "forgot.txt"
    assert (f"Task make failed: declared output forgot.txt is missing (no {full}: "
            "No such file or directory)") in r.stderr, r.stderr


def test_array_members_declare_their_own_files(tmp_path: Path) -> None:
    (tmp_path / "values.txt").write_text("a\nb\nc\n")
    write_dag(tmp_path / "w.dag",
              "TASK m --each-line values.txt --outputs part{#}.txt /bin/sh -c "
              "'echo $1 > part$2.txt; echo m$2 >> ran' sh {} {#}\n"
              "TASK all --inputs part0.txt --outputs all.txt /bin/sh -c "
              "'cat part*.txt > all.txt; echo all >> ran'\n"
              "EDGE m all\n")
    r, ran, _ = run(tmp_path, "--reuse")
    assert r.returncode == 0, r.stderr
    assert ran == ["all", "m0", "m1", "m2"]
    touch(tmp_path / "part1.txt")
    r, ran, evs = run(tmp_path, "--reuse")
    assert ran == ["all"]  # a newer member's output: its child runs
    assert sorted(e["task"] for e in evs if e["event"] == "task.reused") == ["m[0]", "m[1]",
                                                                              "m[2]"]
    started = next(e for e in evs if e["event"] == "workflow.started")
    assert started["arrays"] == [{"name": "m", "members": 3, "recovered": 0, "reused": 3}]
    (tmp_path / "part2.txt").unlink()
    assert run(tmp_path, "--reuse")[1] == []  # only "all" read it, and it is reused
