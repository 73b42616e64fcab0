"""parse_dag against random and adversarial input: whatever the bytes, the result is a
valid DAG or a DagError naming the file, never another exception."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pmctest import tasks_of

from pmc.dag import DAG, DagError, parse_dag, split_command

pytestmark = pytest.mark.faults

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # One file rewritten per example: hypothesis runs many examples per test.
    yield tmp_path_factory.mktemp("hostile") / "h.dag"


def check_dag(dag: DAG) -> None:
    """Everything a runner relies on holds for a DAG that parsed."""
    n = len(dag)
    assert len(dag.tasks) == n == len(dag.index) == len(dag.nparents)
    assert len(dag.child_start) == n + 1
    assert dag.child_start[0] == 0
    assert dag.child_start[n] == len(dag.child_list) == dag.edge_count()
    for i, task in enumerate(tasks_of(dag)):
        assert task.id == i
        assert dag.index[task.name] == i
        # Record fields end at space, tab and CR (as the reference's); other blanks,
        # NBSP or a vertical tab, can be part of a name.
        assert task.name and not any(c in " \t\r\n" for c in task.name)
        assert dag.child_start[i] <= dag.child_start[i + 1]
        children = list(dag.children(i))
        assert len(set(children)) == len(children)  # no duplicate edges
        assert i not in children  # no self edges
        assert all(0 <= c < n for c in children)
        assert task.cpus >= 0 and task.memory >= 0
        assert task.tries is None or task.tries >= 0
        argv = split_command(task.command)  # the command always splits at launch
        assert argv and argv[0]
    parents = [0] * n
    for c in dag.child_list:
        parents[c] += 1
    assert parents == list(dag.nparents)
    # Acyclic: Kahn's algorithm reaches every task.
    waiting = list(parents)
    ready = [i for i in range(n) if not waiting[i]]
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        for v in dag.children(u):
            waiting[v] -= 1
            if not waiting[v]:
                ready.append(v)
    assert seen == n


def outcome(path: Path, data: bytes) -> DAG | DagError:
    path.write_bytes(data)
    try:
        dag = parse_dag(str(path))
    except DagError as e:
        message = str(e)
        assert message.startswith(f"{path}:"), message
        assert "\n" not in message
        assert len(message) < 1000
        return e
    check_dag(dag)
    return dag


# --- random text -------------------------------------------------------------------------

NAMES = st.sampled_from(["A", "B", "C", "D", "t1", "t2", "x\u00e9", "-m", "'q'", "#", "--"])
WORDS = st.one_of(
    NAMES,
    st.sampled_from(
        [
            "TASK",
            "EDGE",
            "#@",
            "#",
            "-m",
            "-c",
            "-t",
            "-p",
            "-f",
            "-F",
            "--",
            "--request-memory=5",
            "--expected-runtime",
            "--tries=0",
            "-c 0",
            "1.5",
            "\x0c",
            "\x1c",
            "\u3000",
            "-m10",
            "1",
            "0",
            "-1",
            "A=/tmp/a",
            "=",
            "/bin/true",
            "'",
            '"',
            "\\",
            "'a b'",
            '"c d"',
            "x\\ y",
            "$HOME",
            "<",
            "|",
            "\t",
            "\r",
            "\x0b",
            "\u00a0",
            "\u2028",
            "",
        ]
    ),
    st.text(min_size=1, max_size=8),
)
LINES = st.lists(WORDS, max_size=8).map(" ".join)


@SETTINGS
@given(st.lists(LINES, max_size=30))
def test_random_lines(scratch: Path, lines: list[str]) -> None:
    outcome(scratch, "\n".join(lines).encode("utf-8", "surrogatepass"))


@SETTINGS
@given(st.binary(max_size=400))
def test_random_bytes(scratch: Path, data: bytes) -> None:
    outcome(scratch, data)


@SETTINGS
@given(
    st.lists(LINES, min_size=1, max_size=10),
    st.integers(min_value=0, max_value=9),
    st.sampled_from([b"\x00", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"]),
)
def test_bad_bytes_anywhere(scratch: Path, lines: list[str], at: int, bad: bytes) -> None:
    at = min(at, len(lines) - 1)
    raw = [line.encode("utf-8", "surrogatepass") for line in lines]
    raw[at] += bad
    # A generated "line" may hold newlines itself: count where the bad byte really lands.
    bad_line = b"\n".join(raw[: at + 1]).count(b"\n") + 1
    result = outcome(scratch, b"\n".join(raw))
    # The bad line is never accepted; an earlier problem may be reported first.
    assert isinstance(result, DagError)
    assert result.line is not None and result.line <= bad_line


# --- a model of valid and invalid graphs ---------------------------------------------------


@st.composite
def graphs(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    n = draw(st.integers(min_value=1, max_value=12))
    pair = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))
    return n, draw(st.lists(pair, max_size=25))


def acyclic(n: int, edges: list[tuple[int, int]]) -> bool:
    children: dict[int, list[int]] = {i: [] for i in range(n)}
    waiting = [0] * n
    for p, c in edges:
        children[p].append(c)
        waiting[c] += 1
    ready = [i for i in range(n) if not waiting[i]]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        for v in children[u]:
            waiting[v] -= 1
            if not waiting[v]:
                ready.append(v)
    return done == n


@SETTINGS
@given(graphs())
def test_graph_model(scratch: Path, graph: tuple[int, list[tuple[int, int]]]) -> None:
    n, edges = graph
    text = "".join(f"TASK T{i} /bin/echo {i}\n" for i in range(n))
    text += "".join(f"EDGE T{p} T{c}\n" for p, c in edges)
    result = outcome(scratch, text.encode())
    self_edge = any(p == c for p, c in edges)
    unique = list(dict.fromkeys(edges))  # a repeated edge counts once
    if self_edge or not acyclic(n, unique):
        assert isinstance(result, DagError)
        if self_edge:  # found while reading, so before cycles
            first = next(i for i, (p, c) in enumerate(edges) if p == c)
            assert "self edge" in result.message
            assert result.line == n + first + 1
        else:
            assert result.message.startswith("cycle")
    else:
        assert isinstance(result, DAG)
        got = sorted((p, c) for p in range(n) for c in result.children(p))
        assert got == sorted(unique)
        for p in range(n):  # children keep their first file order
            assert list(result.children(p)) == [c for q, c in unique if q == p]
        assert list(result.nparents) == [sum(c == i for _, c in unique) for i in range(n)]


# --- size ------------------------------------------------------------------------------------


def test_one_megabyte_lines(scratch: Path) -> None:
    big = "a" * (1 << 20)
    dag = outcome(scratch, f"TASK A /bin/echo {big}\nTASK B /bin/echo '{big} b'\n".encode())
    assert isinstance(dag, DAG)
    assert split_command(dag.task(1).command) == ["/bin/echo", f"{big} b"]
    e = outcome(scratch, f"TASK A /bin/echo '{big}\n".encode())
    assert isinstance(e, DagError) and e.line == 1 and "unterminated quote" in e.message
    e = outcome(scratch, f"{big}\n".encode())
    assert isinstance(e, DagError) and "unknown record type" in e.message
    e = outcome(scratch, b"TASK A a\nTASK B " + b"b" * (1 << 20) + b"\x00\n")
    assert isinstance(e, DagError) and e.line == 2 and "NUL" in e.message


def test_hundred_thousand_parents_of_one_task(scratch: Path) -> None:
    n = 100_000
    lines = [f"TASK p{i} /bin/true\n" for i in range(n)]
    lines.append("TASK child /bin/true\n")
    lines += [f"EDGE p{i} child\n" for i in range(n)]
    dag = outcome(scratch, "".join(lines).encode())
    assert isinstance(dag, DAG)
    assert dag.nparents[n] == n
    assert dag.edge_count() == n
    # One more, repeated, edge counts once: the child still waits for n parents.
    lines.append(f"EDGE p{n // 2} child\n")
    again = outcome(scratch, "".join(lines).encode())
    assert isinstance(again, DAG)
    assert again.nparents[n] == n
    assert again.edge_count() == n


@pytest.mark.slow
def test_million_edge_chain(scratch: Path) -> None:
    # No recursion anywhere: a chain as long as this would overflow any stack.
    n = 1_000_001
    # Defined last to first, so every edge points backwards in DAG order and the
    # full cycle check runs.
    tasks = "".join(f"TASK c{i} /bin/true\n" for i in reversed(range(n)))
    chain = "".join(f"EDGE c{i} c{i + 1}\n" for i in range(n - 1))
    scratch.write_text(tasks + chain)
    dag = parse_dag(str(scratch))
    assert len(dag) == n
    assert dag.edge_count() == n - 1
    assert list(dag.children(n - 1)) == [n - 2]  # c0 -> c1
    assert dag.nparents[n - 1] == 0
    del dag
    # Closing the chain into one cycle of a million tasks.
    scratch.write_text(tasks + chain + f"EDGE c{n - 1} c0\n")
    with pytest.raises(DagError) as info:
        parse_dag(str(scratch))
    # Shown from the cycle's task that comes first in the file.
    assert f"cycle of {n} tasks: c{n - 1} -> c0 -> c1 -> " in str(info.value)
    assert info.value.line == 2 * n
