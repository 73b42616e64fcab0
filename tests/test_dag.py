"""parse_dag, Task, DAG and split_command: the DAG format as the manual and FORMATS.md
describe it, and an error naming file, line and problem for every bad input."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pmctest import pmc, tasks_of

from pmc.dag import DAG, DagError, Task, parse_dag, split_command
from pmc.dag.model import options_of


def write(tmp_path: Path, text: str | bytes, name: str = "w.dag") -> str:
    path = tmp_path / name
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    return str(path)


def parse(tmp_path: Path, text: str | bytes) -> DAG:
    return parse_dag(write(tmp_path, text))


def error(tmp_path: Path, text: str | bytes, line: int | None, *fragments: str) -> DagError:
    """Parse text that must fail; check the message names file, line and problem."""
    path = write(tmp_path, text)
    with pytest.raises(DagError) as info:
        parse_dag(path)
    e = info.value
    message = str(e)
    assert e.path == path
    assert e.line == line
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert message.startswith(where), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return e


def edges(dag: DAG) -> list[tuple[str, str]]:
    return [
        (dag.task(p).name, dag.task(c).name) for p in range(len(dag)) for c in dag.children(p)
    ]


# --- records -----------------------------------------------------------------------------

DIAMOND = """\
# diamond.dag
TASK A /bin/echo "I am A"
TASK B /bin/echo "I am B"
TASK C /bin/echo "I am C"
TASK D /bin/echo "I am D"

EDGE A B
EDGE A C
EDGE B D
EDGE C D
"""


def test_manual_diamond(tmp_path: Path) -> None:
    dag = parse(tmp_path, DIAMOND)
    assert len(dag) == 4
    assert [t.name for t in tasks_of(dag)] == ["A", "B", "C", "D"]
    assert [t.id for t in tasks_of(dag)] == [0, 1, 2, 3]
    assert dag.index == {"A": 0, "B": 1, "C": 2, "D": 3}
    assert [t.line for t in tasks_of(dag)] == [2, 3, 4, 5]
    assert dag.task(0).command == '/bin/echo "I am A"'
    assert split_command(dag.task(0).command) == ["/bin/echo", "I am A"]
    assert edges(dag) == [("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")]
    assert dag.edge_count() == 4
    assert list(dag.nparents) == [0, 1, 1, 2]
    assert dag.path.endswith("w.dag")


def test_csr_layout(tmp_path: Path) -> None:
    # Edges out of parent order: the CSR groups them by parent, file order within one.
    dag = parse(
        tmp_path,
        "TASK A a\nTASK B b\nTASK C c\nTASK D d\n"
        "EDGE C D\nEDGE A D\nEDGE A B\nEDGE B D\nEDGE A C\n",
    )
    assert len(dag.child_start) == len(dag) + 1
    assert list(dag.child_start) == [0, 3, 4, 5, 5]
    assert list(dag.child_list) == [3, 1, 2, 3, 3]
    assert [list(dag.children(i)) for i in range(4)] == [[3, 1, 2], [3], [3], []]
    assert list(dag.nparents) == [0, 1, 1, 3]
    assert dag.edge_count() == 5


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=12).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(
                st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(
                    lambda e: e[0] != e[1]
                ),
                unique=True,
                max_size=30,
            ),
        )
    )
)
def test_csr_matches_the_edges_in_file_order(case: tuple[int, list[tuple[int, int]]]) -> None:
    # Any edge order, forward or backward in DAG order: the CSR lists each parent's
    # children in file order, and nparents counts each child's parents.
    n, edge_list = case
    text = "".join(f"TASK t{i} prog\n" for i in range(n))
    text += "".join(f"EDGE t{p} t{c}\n" for p, c in edge_list)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            dag = parse(Path(tmp), text)
        except DagError as e:
            assert e.message.startswith("cycle")
            return
    assert [list(dag.children(p)) for p in range(n)] == [
        [c for q, c in edge_list if q == p] for p in range(n)
    ]
    assert list(dag.nparents) == [sum(c == i for _, c in edge_list) for i in range(n)]
    # The arrays the engine reads keep their C int type.
    assert (dag.child_start.typecode, dag.child_list.typecode, dag.nparents.typecode) == (
        "i",
        "i",
        "i",
    )


def test_back_edges_in_dag_order_are_fine(tmp_path: Path) -> None:
    # A child defined before its parent is no cycle.
    dag = parse(tmp_path, "TASK C c\nTASK B b\nTASK A a\nEDGE A B\nEDGE B C\n")
    assert edges(dag) == [("B", "C"), ("A", "B")]
    assert list(dag.nparents) == [1, 1, 0]


def test_no_tasks_is_an_empty_dag(tmp_path: Path) -> None:
    dag = parse(tmp_path, "# nothing\n\n   \n")
    assert len(dag) == 0
    assert dag.edge_count() == 0
    assert list(dag.child_start) == [0]


def test_empty_file(tmp_path: Path) -> None:
    assert len(parse(tmp_path, "")) == 0


def test_blank_lines_comments_and_whitespace(tmp_path: Path) -> None:
    dag = parse(
        tmp_path,
        "\n \t \n# a comment\n   # indented comment\n#TASK X x\n"
        "  TASK\tA   /bin/true   \nTASK B b\nEDGE\tA\tB   \n",
    )
    assert [t.name for t in tasks_of(dag)] == ["A", "B"]
    assert dag.task(0).command == "/bin/true"
    assert dag.task(0).line == 6
    assert edges(dag) == [("A", "B")]


def test_crlf_line_ends(tmp_path: Path) -> None:
    dag = parse(tmp_path, "TASK A /bin/echo a\r\nTASK B b\r\nEDGE A B\r\n")
    assert dag.task(0).command == "/bin/echo a"
    assert edges(dag) == [("A", "B")]


def test_last_line_without_newline(tmp_path: Path) -> None:
    dag = parse(tmp_path, "TASK A a\nTASK B b\nEDGE A B")
    assert edges(dag) == [("A", "B")]


def test_task_defaults(tmp_path: Path) -> None:
    task = parse(tmp_path, "TASK t01 /bin/program -a -b\n").task(0)
    assert task.name == "t01"
    assert task.command == "/bin/program -a -b"
    assert task.memory == 0
    assert task.cpus == 1
    assert task.tries is None
    assert task.priority == 0
    assert task.pipe_forwards is None
    assert task.file_forwards is None
    assert task.pegasus_id is None
    assert task.expected_runtime is None
    assert task.line == 1


def test_tasks_share_no_options(tmp_path: Path) -> None:
    # Tasks share one set of default options until one of them changes; a parsed task's
    # Task, made when asked, changes nothing in its DAG.
    a, b = Task(0, "A", "a"), Task(1, "B", "b")
    a.tries = 3
    assert (a.tries, b.tries) == (3, None)
    dag = parse(tmp_path, "TASK A a\nTASK B b\n")
    dag.task(0).tries = 3
    assert dag.task(0).tries is None and dag.task(1).tries is None


def test_option_kinds_count_every_task_as_it_stands(tmp_path: Path) -> None:
    # The distinct options of every task: shared ones once (in a run of tasks or not),
    # a task added later counted when asked again, an option set since counted again.
    dag = parse(tmp_path, "TASK A -m 5 a\nTASK B -m 5 b\nTASK C c\nTASK D -p 2 d\n"
                          "TASK F -m 5 f\n")
    assert sorted((o.memory, o.priority) for o in dag.option_kinds()) == [
        (0, 0), (0, 2), (5, 0)]
    dag.tasks.append(Task(5, "E", "e", cpus=3))
    assert sorted(o.cpus for o in dag.option_kinds()) == [1, 1, 1, 3]
    dag.task(5).memory = 9
    assert sorted(o.memory for o in dag.option_kinds()) == [0, 0, 5, 9]


def test_option_kinds_are_gathered_by_every_kind_of_line(tmp_path: Path) -> None:
    # The parse gathers the distinct options as it reads: the same set a count of every
    # task gives, whatever path a line takes (plain, options repeated or not, quoted,
    # Pegasus ids, a task array's members and joins).
    dag = parse(tmp_path, "TASK a a\nTASK b -m 5 b\nTASK c -m 5 c\n#@ 1 t ID1\n"
                          "TASK d -c 2 'd x'\nTASK e --array 0-3 -p 4 e\nTASK f -m 5 f\n"
                          "TASK g -p 7 \"g\"\nEDGE a b\n")
    assert dag.option_kinds() == set(map(options_of, dag.tasks))
    assert len(dag.option_kinds()) == 6  # none, -m 5, -c 2, the array's, its joins, -p 7


def test_task_constructor_and_assignment() -> None:
    task = Task(3, "x", "prog", memory=5, priority=-1, line=9)
    assert (task.id, task.name, task.command, task.line) == (3, "x", "prog", 9)
    assert (task.memory, task.cpus, task.priority, task.tries) == (5, 1, -1, None)
    other = Task(4, "y", "prog")
    other.tries = 2
    other.pipe_forwards = (("A", "/tmp/a"),)
    # Assigning an option to one task never changes another.
    plain = Task(5, "z", "prog")
    assert plain.tries is None and plain.pipe_forwards is None
    assert other.tries == 2 and other.pipe_forwards == (("A", "/tmp/a"),)
    assert repr(task) == "Task(3, 'x', 'prog')"


# --- task options ------------------------------------------------------------------------


def test_manual_example_options(tmp_path: Path) -> None:
    task = parse(tmp_path, "TASK t01 -m 10 -c 2 /bin/program -a -b\n").task(0)
    assert task.memory == 10
    assert task.cpus == 2
    # Options after the executable belong to the program.
    assert task.command == "/bin/program -a -b"


@pytest.mark.parametrize(
    ("options", "attribute", "value"),
    [
        ("-m 10", "memory", 10),
        ("--request-memory 10", "memory", 10),
        ("--request-memory=10", "memory", 10),
        ("-m10", "memory", 10),
        ("-m 0", "memory", 0),
        ("-c 4", "cpus", 4),
        ("--request-cpus 4", "cpus", 4),
        ("--request-cpus=4", "cpus", 4),
        ("-t 3", "tries", 3),
        ("--tries 3", "tries", 3),
        ("--tries=1", "tries", 1),
        ("-p 7", "priority", 7),
        ("-p -7", "priority", -7),
        ("--priority -7", "priority", -7),
        ("--priority=+2", "priority", 2),
        ("-f A=/tmp/a", "pipe_forwards", (("A", "/tmp/a"),)),
        ("--pipe-forward _x1=/tmp/a=b", "pipe_forwards", (("_x1", "/tmp/a=b"),)),
        (
            "-f A=/tmp/a --pipe-forward=B=/tmp/b",
            "pipe_forwards",
            (("A", "/tmp/a"), ("B", "/tmp/b")),
        ),
        ("-F /tmp/foo.0=/scratch/foo", "file_forwards", (("/tmp/foo.0", "/scratch/foo"),)),
        (
            "--file-forward a=b -F c=d",
            "file_forwards",
            (("a", "b"), ("c", "d")),
        ),
        ("--expected-runtime 2.5", "expected_runtime", 2.5),
        ("--expected-runtime=0", "expected_runtime", 0.0),
        ("--expected-runtime 1e3", "expected_runtime", 1000.0),
        ("-m 1 -m 2", "memory", 2),
        # As the reference: -m and -c are read as numbers and rounded up; 0 cpus, and
        # 0 tries (one try, as 1), are allowed.
        ("-m 99.1", "memory", 100),
        ("-m 1.5", "memory", 2),
        ("-m .5", "memory", 1),
        ("-m 1e3", "memory", 1000),
        ("-m -0", "memory", 0),
        ("-m 12345678", "memory", 12345678),
        ("-c 1.1", "cpus", 2),
        ("--request-cpus=2.0", "cpus", 2),
        ("-c 0", "cpus", 0),
        ("-c 0.0", "cpus", 0),
        # A C float, as the reference reads it: 1.00000001 is 1.0 there.
        ("-c 1.00000001", "cpus", 1),
        ("-t 0", "tries", 0),
    ],
)
def test_task_option(tmp_path: Path, options: str, attribute: str, value: object) -> None:
    task = parse(tmp_path, f"TASK A {options} /bin/prog -x 1\n").task(0)
    assert getattr(task, attribute) == value
    assert task.command == "/bin/prog -x 1"


def test_all_options_together(tmp_path: Path) -> None:
    task = parse(
        tmp_path,
        "TASK mytask -m 10 -c 2 -t 3 -p -5 -f A=/tmp/myfile.a -f B=/tmp/myfile.b "
        "-F /tmp/foo.0=/scratch/foo --expected-runtime 60 "
        "/bin/pegasus-kickstart /bin/mytask -o /proc/self/fd/$A\n",
    ).task(0)
    assert (task.memory, task.cpus, task.tries, task.priority) == (10, 2, 3, -5)
    assert task.pipe_forwards == (("A", "/tmp/myfile.a"), ("B", "/tmp/myfile.b"))
    assert task.file_forwards == (("/tmp/foo.0", "/scratch/foo"),)
    assert task.expected_runtime == 60.0
    assert task.command == "/bin/pegasus-kickstart /bin/mytask -o /proc/self/fd/$A"
    assert split_command(task.command)[-1] == "/proc/self/fd/$A"


def test_double_dash_ends_options(tmp_path: Path) -> None:
    dag = parse(tmp_path, "TASK A -m 5 -- -weird-name arg\nTASK B -- prog\n")
    assert dag.task(0).memory == 5
    assert dag.task(0).command == "-weird-name arg"
    assert dag.task(1).command == "prog"


def test_quoted_option_values(tmp_path: Path) -> None:
    task = parse(tmp_path, "TASK A -f 'OUT=/tmp/my file' prog 'x y'\n").task(0)
    assert task.pipe_forwards == (("OUT", "/tmp/my file"),)
    assert task.command == "prog 'x y'"


# --- quoting -----------------------------------------------------------------------------


def test_quoted_arguments_reach_the_program_literally(tmp_path: Path) -> None:
    task = parse(tmp_path, "TASK A prog 'a < b || c > d' foo 'bar baz'\n").task(0)
    assert task.command == "prog 'a < b || c > d' foo 'bar baz'"
    assert split_command(task.command) == ["prog", "a < b || c > d", "foo", "bar baz"]


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ('prog "double quoted" x', ["prog", "double quoted", "x"]),
        ("prog 'it''s' x", ["prog", "its", "x"]),
        ('prog "say \\"hi\\""', ["prog", 'say "hi"']),
        ("prog a\\ b", ["prog", "a b"]),
        ("prog '' x", ["prog", "", "x"]),
        ("prog $HOME '$HOME' \"$HOME\"", ["prog", "$HOME", "$HOME", "$HOME"]),
        ("prog a#b '#c' #d", ["prog", "a#b", "#c", "#d"]),
        ("prog 'a\tb'\tc", ["prog", "a\tb", "c"]),
        ("'/opt/my prog/bin' -v", ["/opt/my prog/bin", "-v"]),
    ],
)
def test_quoting_forms(tmp_path: Path, command: str, argv: list[str]) -> None:
    task = parse(tmp_path, f"TASK A {command}\n").task(0)
    assert task.command == command
    assert split_command(task.command) == argv


def test_escaped_trailing_space_is_kept(tmp_path: Path) -> None:
    task = parse(tmp_path, "TASK A prog a\\ \n").task(0)
    assert split_command(task.command) == ["prog", "a "]


def test_split_command_without_quotes() -> None:
    assert split_command("/bin/echo  a\tb   c") == ["/bin/echo", "a", "b", "c"]
    assert split_command("") == []


ASCII_SPACE = " \t\n\r\x0b\x0c"  # C's isspace() in the C locale


def test_split_command_splits_at_ascii_whitespace_only() -> None:
    # As the reference (and a shell): Unicode spaces, NBSP, U+3000 and \x1c-\x1f are
    # part of a word. A quote elsewhere on the line must not change where words end.
    spaces = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())
    for space in spaces:
        if space in ASCII_SPACE:
            assert split_command(f"a{space}b") == ["a", "b"], repr(space)
            assert split_command(f"a{space}'b c'") == ["a", "b c"], repr(space)
        else:
            assert split_command(f"a{space}b") == [f"a{space}b"], repr(space)
            assert split_command(f"a{space}'b c'") == [f"a{space}b c"], repr(space)
    assert split_command("a\u00a0b \u3000") == ["a\u00a0b", "\u3000"]


def test_unicode_spaces_are_part_of_names_and_arguments(tmp_path: Path) -> None:
    dag = parse(
        tmp_path,
        "TASK A\u00a0B /bin/echo x\u00a0y \u3000\x1c z\u00a0\n"
        "TASK C -m 2 /bin/echo \x1d\x1e\x1f\u2003\n"
        "TASK D\x0bE /bin/echo \x0bq\x0c\n"
        "EDGE A\u00a0B C\n"
        "EDGE\tC D\x0bE \n",
    )
    assert [t.name for t in tasks_of(dag)] == ["A\u00a0B", "C", "D\x0bE"]
    assert dag.task(0).command == "/bin/echo x\u00a0y \u3000\x1c z\u00a0"
    assert split_command(dag.task(0).command) == [
        "/bin/echo", "x\u00a0y", "\u3000\x1c", "z\u00a0"]
    assert dag.task(1).memory == 2
    assert split_command(dag.task(1).command) == ["/bin/echo", "\x1d\x1e\x1f\u2003"]
    # A vertical tab or form feed separates a command's words, not a record's fields.
    assert split_command(dag.task(2).command) == ["/bin/echo", "q"]
    assert edges(dag) == [("A\u00a0B", "C"), ("C", "D\x0bE")]


def test_command_after_an_odd_blank_is_read_as_words_are(tmp_path: Path) -> None:
    # A vertical tab or form feed is inside a record's field but splits a command's
    # words: a command of nothing else has no executable, and an option after one is
    # an option, as on a line without it.
    error(tmp_path, "TASK A \x0b\n", 1, "no executable")
    error(tmp_path, "TASK A \x0c\x0b\x0c\n", 1, "no executable")
    dag = parse(tmp_path, "TASK A \x0b-m 5 /bin/true x\n")
    assert dag.task(0).memory == 5
    assert split_command(dag.task(0).command) == ["/bin/true", "x"]


def test_unicode_space_does_not_separate_fields(tmp_path: Path) -> None:
    error(tmp_path, "TASK A a\nTASK B b\nEDGE A\u00a0B\n", 3, "EDGE needs")
    error(tmp_path, "TASK\u3000A a\n", 1, "unknown record type")
    error(tmp_path, "TASK A\u00a0/bin/true\n", 1, "no executable")


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="ab'\"\\ \t\x0c\u00a0\x1c#$<|", max_size=16))
def test_split_command_follows_posix_shlex(command: str) -> None:
    reference = shlex.shlex(command, posix=True)
    reference.whitespace = ASCII_SPACE
    reference.whitespace_split = True
    reference.commenters = ""
    try:
        expected: list[str] | None = list(reference)
    except ValueError:
        expected = None
    try:
        got: list[str] | None = split_command(command)
    except ValueError:
        got = None
    assert got == expected


def test_split_command_long_quoted_argument() -> None:
    big = "x" * (1 << 20)
    assert split_command(f"prog '{big}' \"{big}\"") == ["prog", big, big]


# --- Pegasus #@ lines ----------------------------------------------------------------------


def test_pegasus_line_applies_to_next_task_only(tmp_path: Path) -> None:
    dag = parse(
        tmp_path,
        "#@ 1 preprocess ID000001\n"
        "TASK A a\n"
        "TASK B b\n"
        "#@ 2 findrange ID000002 extra fields\n"
        "# a comment between\n"
        "\n"
        "TASK C -m 3 c\n"
        "#@ 9 x ID9\n"
        "EDGE A C\n"
        "TASK D d\n",
    )
    assert [t.pegasus_id for t in tasks_of(dag)] == ["1", None, "2", "9"]
    assert dag.task(2).memory == 3


def test_pegasus_line_without_space(tmp_path: Path) -> None:
    # The reference reads the field after "#@7" as SEQ ("t" here); refused, not guessed.
    error(tmp_path, "#@7 t d x\nTASK A a\n", 1, "'#@' must be followed by a blank")
    error(tmp_path, "#@7 t d\nTASK A a\n", 1, "'#@' must be followed by a blank")
    assert parse(tmp_path, "#@\t7 t d\nTASK A a\n").task(0).pegasus_id == "7"


def test_pegasus_line_with_too_few_fields(tmp_path: Path) -> None:
    error(tmp_path, "TASK A a\n#@ 1 preprocess\nTASK B b\n", 2, "#@", "'#@ 1 preprocess'")
    error(tmp_path, "#@\n", 1, "#@")


def test_hash_comment_is_not_a_pegasus_line(tmp_path: Path) -> None:
    dag = parse(tmp_path, "# @ 1\n## x\nTASK A a\n")
    assert dag.task(0).pegasus_id is None


# --- errors --------------------------------------------------------------------------------


def test_unknown_record_type(tmp_path: Path) -> None:
    error(tmp_path, "TASK A a\nJOB B b\n", 2, "unknown record type", "'JOB'")
    error(tmp_path, "task A a\n", 1, "unknown record type", "'task'")


def test_unknown_task_option(tmp_path: Path) -> None:
    error(tmp_path, "TASK A --bogus 1 prog\n", 1, "unknown task option", "'--bogus'")
    error(tmp_path, "TASK A -x prog\n", 1, "unknown task option", "'-x'")
    error(tmp_path, "TASK A - prog\n", 1, "unknown task option", "'-'")


@pytest.mark.parametrize("option", ["-m", "--request-memory", "-c", "-t", "-p", "-f", "-F"])
def test_option_missing_its_value(tmp_path: Path, option: str) -> None:
    error(tmp_path, f"TASK A {option}\n", 1, "needs a value", option)


def test_option_followed_by_executable_only(tmp_path: Path) -> None:
    error(tmp_path, "TASK A -m /bin/true\n", 1, "-m", "'/bin/true'")


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        ("-m -1", ["-m", "'-1'"]),
        ("-m ten", ["-m", "'ten'"]),
        ("-m 1G", ["-m", "'1G'"]),
        ("-m 1e", ["-m", "'1e'"]),
        ("-m nan", ["-m", "'nan'"]),
        ("-m inf", ["-m", "'inf'"]),
        ("-m 1e30", ["-m", "'1e30'"]),
        ("-m 0x10", ["-m", "'0x10'"]),
        ("-m .", ["-m", "'.'"]),
        ("--request-memory=", ["--request-memory", "''"]),
        ("-m 1_000", ["-m", "'1_000'"]),
        ("-m \uff11", ["-m"]),
        ("-m 99999999999999999999999", ["-m", "'99999999999999999999999'"]),
        ("-c -2", ["-c", "'-2'"]),
        ("-c -0.5", ["-c", "'-0.5'"]),
        ("-c 2cpus", ["-c", "'2cpus'"]),
        ("-c two", ["-c", "'two'"]),
        ("--tries=-1", ["--tries", "'-1'"]),
        ("-t 1.5", ["-t", "'1.5'"]),
        ("-p high", ["-p", "'high'"]),
        ("-f noequals", ["-f", "'noequals'"]),
        ("-f 1A=/tmp/a", ["-f", "'1A=/tmp/a'"]),
        ("-f A-B=/tmp/a", ["-f", "'A-B=/tmp/a'"]),
        ("-f A=", ["-f", "'A='"]),
        ("-f =x", ["-f", "'=x'"]),
        ("-F src", ["-F", "'src'"]),
        ("-F =dest", ["-F", "'=dest'"]),
        ("-F src=", ["-F", "'src='"]),
        ("--expected-runtime -1", ["--expected-runtime", "'-1'"]),
        ("--expected-runtime soon", ["--expected-runtime", "'soon'"]),
        ("--expected-runtime nan", ["--expected-runtime", "'nan'"]),
        ("--expected-runtime inf", ["--expected-runtime", "'inf'"]),
    ],
)
def test_bad_option_values(tmp_path: Path, options: str, fragments: list[str]) -> None:
    error(tmp_path, f"TASK A a\nTASK B {options} prog\n", 2, *fragments)


def test_missing_task_id(tmp_path: Path) -> None:
    error(tmp_path, "TASK\n", 1, "no task id", "'TASK'")
    error(tmp_path, "TASK -m 5 prog\n", 1, "no task id", "'-m'")


def test_missing_executable(tmp_path: Path) -> None:
    error(tmp_path, "TASK A\n", 1, "no executable", "'TASK A'")
    error(tmp_path, "TASK A -m 5 -c 2\n", 1, "no executable")
    error(tmp_path, "TASK A -m 5 --\n", 1, "no executable")
    error(tmp_path, "TASK A '' arg\n", 1, "empty executable")


def test_unterminated_quote(tmp_path: Path) -> None:
    error(tmp_path, "TASK A a\nTASK B prog 'oops\n", 2, "unterminated quote", "prog 'oops")
    error(tmp_path, 'TASK B prog "oops\n', 1, "unterminated quote")
    error(tmp_path, "TASK B prog oops\\", 1, "backslash at end of line")


def test_duplicate_task_id(tmp_path: Path) -> None:
    error(tmp_path, "TASK A a\n\nTASK B b\nTASK A c\n", 4, "duplicate task id 'A'", "line 1")


@pytest.mark.parametrize("line", ["EDGE A", "EDGE", "EDGE A B C"])
def test_edge_with_wrong_field_count(tmp_path: Path, line: str) -> None:
    error(tmp_path, f"TASK A a\nTASK B b\nTASK C c\n{line}\n", 4, "EDGE needs", repr(line))


def test_edge_naming_unknown_task(tmp_path: Path) -> None:
    error(tmp_path, "TASK A a\nEDGE A X\n", 2, "unknown task 'X'")
    error(tmp_path, "TASK A a\nEDGE X A\n", 2, "unknown task 'X'")


def test_edge_before_its_task_is_an_error(tmp_path: Path) -> None:
    error(tmp_path, "TASK A a\nEDGE A B\nTASK B b\n", 2, "unknown task 'B'", "defined above")


def test_duplicate_edge_counts_once(tmp_path: Path) -> None:
    # The reference accepts a repeated EDGE line; here it is one edge: B waits for A
    # once (and so runs once).
    dag = parse(tmp_path, "TASK A a\nTASK B b\nTASK C c\nEDGE A B\nEDGE A C\nEDGE A B\n")
    assert edges(dag) == [("A", "B"), ("A", "C")]
    assert list(dag.nparents) == [0, 1, 1]
    assert dag.edge_count() == 2


def test_duplicate_edges_keep_first_order(tmp_path: Path) -> None:
    dag = parse(
        tmp_path,
        "TASK A a\nTASK B b\nTASK C c\nEDGE B C\nEDGE A C\nEDGE A B\nEDGE B C\n"
        "EDGE A C\nEDGE A C\n",
    )
    assert edges(dag) == [("A", "C"), ("A", "B"), ("B", "C")]
    assert list(dag.nparents) == [0, 1, 2]
    assert list(dag.child_start) == [0, 2, 3, 3]


def test_duplicate_edge_in_a_cycle(tmp_path: Path) -> None:
    error(
        tmp_path,
        "TASK A a\nTASK B b\nEDGE A B\nEDGE B A\nEDGE A B\nEDGE B A\n",
        6,
        "cycle: A -> B -> A",
    )


def test_self_edge(tmp_path: Path) -> None:
    error(tmp_path, "TASK A a\nEDGE A A\n", 2, "self edge", "'A'")


def test_cycle(tmp_path: Path) -> None:
    error(
        tmp_path,
        "TASK A a\nTASK B b\nTASK C c\nTASK D d\nEDGE D A\nEDGE A B\nEDGE B C\nEDGE C A\n",
        8,
        "cycle: A -> B -> C -> A",
    )


def test_two_task_cycle(tmp_path: Path) -> None:
    error(tmp_path, "TASK A a\nTASK B b\nEDGE B A\nEDGE A B\n", 4, "cycle: A -> B -> A")


def test_long_cycle_is_shortened(tmp_path: Path) -> None:
    n = 50
    text = "".join(f"TASK T{i} t\n" for i in range(n))
    text += "".join(f"EDGE T{i} T{i + 1}\n" for i in range(n - 1)) + f"EDGE T{n - 1} T0\n"
    e = error(tmp_path, text, 2 * n, "cycle of 50 tasks", "T0 -> T1 ->", "-> T49 -> T0")
    assert len(str(e)) < 300


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.dag")
    with pytest.raises(DagError) as info:
        parse_dag(path)
    assert str(info.value).startswith(f"{path}: ")
    assert "No such file" in str(info.value)
    assert info.value.line is None


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(DagError) as info:
        parse_dag(str(tmp_path))
    assert str(tmp_path) in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path) -> None:
    path = write(tmp_path, "TASK A a\n")
    os.chmod(path, 0)
    with pytest.raises(DagError) as info:
        parse_dag(path)
    assert "Permission denied" in str(info.value)


def test_read_error_after_open() -> None:
    # Reading /proc/self/mem from offset 0 fails with EIO once the file is open.
    with pytest.raises(DagError) as info:
        parse_dag("/proc/self/mem")
    assert str(info.value).startswith("/proc/self/mem: cannot read DAG file: ")


def test_path_with_nul_byte() -> None:
    with pytest.raises(DagError) as info:
        parse_dag("bad\x00name.dag")
    assert "cannot read DAG file" in str(info.value)


def test_invalid_utf8_names_its_line(tmp_path: Path) -> None:
    e = error(tmp_path, b"TASK A a\nTASK B /bin/echo \xff\xfe\n", 2, "invalid UTF-8", "column 18")
    assert "\\xff" in str(e)


def test_truncated_utf8_at_end(tmp_path: Path) -> None:
    error(tmp_path, b"TASK A a\nTASK B \xe2\x82", 2, "invalid UTF-8")


def test_utf8_names_and_arguments(tmp_path: Path) -> None:
    dag = parse(tmp_path, "TASK t\u00e9 /bin/echo '\u65e5\u672c'\nTASK b b\nEDGE t\u00e9 b\n")
    assert dag.task(0).name == "t\u00e9"
    assert split_command(dag.task(0).command) == ["/bin/echo", "\u65e5\u672c"]


def test_nul_byte_names_its_line(tmp_path: Path) -> None:
    error(tmp_path, b"TASK A a\n\nTASK B b\x00c\n", 3, "NUL byte", "column 9")


def test_earlier_line_error_wins_over_later_bad_bytes(tmp_path: Path) -> None:
    error(tmp_path, b"TASK A a\nBOGUS\nTASK B \xff\n", 2, "unknown record type")


def test_bad_bytes_after_a_megabyte(tmp_path: Path) -> None:
    # The bad line is past the first block read: its number must still be exact.
    lines = [f"TASK T{i} /bin/echo {'x' * 40}\n".encode() for i in range(40_000)]
    data = b"".join(lines) + b"TASK bad \xc3\x28\n"
    error(tmp_path, data, 40_001, "invalid UTF-8")


def test_long_lines(tmp_path: Path) -> None:
    arg = "y" * 3_000_000
    dag = parse(tmp_path, f"TASK A /bin/echo {arg}\nTASK B b\nEDGE A B\n")
    assert dag.task(0).command == f"/bin/echo {arg}"
    assert dag.task(1).line == 2


def test_long_offending_text_is_shortened(tmp_path: Path) -> None:
    e = error(tmp_path, "NOPE " + "z" * 100_000 + "\n", 1, "unknown record type")
    assert len(str(e)) < 400


def test_error_is_a_single_line_message(tmp_path: Path) -> None:
    e = error(tmp_path, "TASK A a\nTASK B 'x\n", 2)
    assert "\n" not in str(e)
    assert e.message == 'unterminated quote: "TASK B \'x"'


def test_line_numbers_count_every_line(tmp_path: Path) -> None:
    dag = parse(tmp_path, "\n# c\n\nTASK A a\n\r\n \t\nTASK B b\n")
    assert [t.line for t in tasks_of(dag)] == [4, 7]


def test_form_feed_line_is_not_blank(tmp_path: Path) -> None:
    # The reference trims only space, tab, CR and LF from a line: a form feed or
    # vertical tab is text, and no record starts with it.
    error(tmp_path, "TASK A a\n\x0c\nTASK B b\n", 2, "unknown record type", "'\\x0c'")
    error(tmp_path, "\x0bTASK A a\n", 1, "unknown record type")


def test_many_tasks_and_edges(tmp_path: Path) -> None:
    n = 3000
    text = "".join(f"TASK t{i} /bin/true {i}\n" for i in range(n))
    text += "".join(f"EDGE t{i // 2} t{i}\n" for i in range(1, n))
    dag = parse(tmp_path, text)
    assert len(dag) == n
    assert dag.edge_count() == n - 1
    assert list(dag.children(0)) == [1]
    assert list(dag.children(1)) == [2, 3]
    assert all(dag.nparents[i] == 1 for i in range(1, n))
    assert dag.task(n - 1).command == f"/bin/true {n - 1}"


def test_repeated_commands_are_equal_strings(tmp_path: Path) -> None:
    dag = parse(tmp_path, "TASK A /bin/true\nTASK B /bin/true\nTASK C /bin/false\n")
    assert [t.command for t in tasks_of(dag)] == ["/bin/true", "/bin/true", "/bin/false"]


# --- what a run does with it ---------------------------------------------------------------
# The same behaviours seen from outside, as a user of the reference would see them.


def run_dag(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "w.dag").write_text(text, encoding="utf-8")
    return pmc(["run", "--workers", "2", *args, "w.dag"], tmp_path)


def records(text: str) -> dict[str, str]:
    return {m.group(1): m.group(0) for m in re.finditer(r"^\[cluster-task name=(\S+), .*$",
                                                         text, re.M)}


def test_run_repeated_edge_runs_the_child_once(tmp_path: Path) -> None:
    r = run_dag(tmp_path, "TASK A /bin/true\nTASK B /bin/sh -c 'echo ran >> b.log'\n"
                          "TASK C /bin/true\nEDGE A B\nEDGE A C\nEDGE A B\nEDGE C B\n")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "b.log").read_text() == "ran\n"
    assert sorted(records(r.stdout)) == ["A", "B", "C"]


def test_run_rounds_requests_up_and_takes_zero(tmp_path: Path) -> None:
    r = run_dag(tmp_path, "TASK A -m 99.1 -c 1.1 /bin/true\nTASK B -c 0 -m 0.5 /bin/true\n",
                "--host-cpus", "2", "--host-memory", "1000")
    assert r.returncode == 0, r.stderr
    got = records(r.stdout)
    assert "cpus=2, memory=100]" in got["A"]
    assert "cpus=0, memory=1]" in got["B"]


def test_run_zero_tries_is_one_try(tmp_path: Path) -> None:
    # The reference retries while failures < tries: 0 tries give one try, as 1 does,
    # whatever the run's --tries.
    r = run_dag(tmp_path, "TASK A -t 0 /bin/sh -c 'echo try >> a.log; exit 1'\n"
                          "TASK B -t 2 /bin/sh -c 'echo try >> b.log; exit 1'\n", "-t", "5")
    assert r.returncode != 0
    assert (tmp_path / "a.log").read_text() == "try\n"
    assert (tmp_path / "b.log").read_text() == "try\ntry\n"


def test_run_unicode_spaces_reach_the_program_inside_words(tmp_path: Path) -> None:
    r = run_dag(tmp_path, "TASK A /bin/echo a\u00a0b c\u3000d\x1ce\n")
    assert r.returncode == 0, r.stderr
    assert "a\u00a0b c\u3000d\x1ce\n" in r.stdout


# --- the fast paths agree with the slow one --------------------------------------------------
# Lines with options as planners write them, and "#@" lines, take shortcuts in the
# parse loop; each must give what the general per-line code (_task, _pegasus_seq) gives.

OPTION_WORDS = st.sampled_from([
    "-m", "-c", "-t", "-p", "--request-memory", "--request-cpus", "--tries", "--priority",
    "--expected-runtime", "-f", "--", "1", "0", "2.5", "-1", "x", "1e3", "A=/tmp/a", "10",
    "0007", "1234567", "12345678", "+3", "9999999999999999999999",
])


def slow_tasks(path: str, text: str) -> list[tuple[object, ...]] | str:
    from pmc.dag import taskline

    out: list[tuple[object, ...]] = []
    pegasus: str | None = None
    for lineno, line in enumerate(text.split("\n"), 1):
        parts = line.split(None, 2)
        if not parts:
            continue
        try:
            if parts[0] == "TASK":
                t = taskline.parse_task(path, lineno, line, parts, len(out))
                out.append((t.name, t.command, t.line, t.memory, t.cpus, t.tries, t.priority,
                             t.pipe_forwards, t.expected_runtime, pegasus))
                pegasus = None
            elif parts[0].startswith("#@"):
                pegasus = taskline.pegasus_seq(path, lineno, line)
        except DagError as e:
            return str(e)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(OPTION_WORDS, max_size=6),
                          st.sampled_from(["", "#@ 7 tr dax\n", "#@ 007 tr dax x\n",
                                           "#@ 12 tr\n", "#@\t3\ttr\tdax\n", "#@x 1 2 3\n"]),
                          st.sampled_from(["/bin/true a", "prog", "-x", "p\t", "p 'q r'"])),
                max_size=8))
def test_fast_paths_agree_with_the_slow_one(
        lines: list[tuple[list[str], str, str]]) -> None:
    text = "".join(f"{peg}TASK t{i} {' '.join(words)} {cmd}\n"
                   for i, (words, peg, cmd) in enumerate(lines))
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), text)
        expected = slow_tasks(path, text)
        try:
            got: object = [(t.name, t.command, t.line, t.memory, t.cpus, t.tries, t.priority,
                            t.pipe_forwards, t.expected_runtime, t.pegasus_id)
                           for t in tasks_of(parse_dag(path))]
        except DagError as e:
            got = str(e)
    assert got == expected


PEGASUS_SEQ = st.one_of(st.integers(0, 2_000_000).map(str), st.sampled_from(
    ["0", "00", "007", "1" * 30, "x1", "+1", "\u0661", "1e3", "-1"]))
BLANK_RUN = st.sampled_from([" ", "\t", "  ", " \t", "\r"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(
    st.booleans(), PEGASUS_SEQ, BLANK_RUN,
    st.lists(st.sampled_from(["tr", "dax", "pegasus::t:1.0", "ID0000001"]), max_size=3),
    st.sampled_from(["", " ", "\t", "\r", " \r", "  "]),
    st.sampled_from(["", "-m 1 -c 1 ", "-t 2 -p -3 "]),
    st.sampled_from(["\n", "\r\n"])), max_size=10))
def test_pegasus_lines_fast_and_slow_agree(
        lines: list[tuple[bool, str, str, list[str], str, str, str]]) -> None:
    """The "#@" shortcut (its SEQ kept as a distance from the task's id) gives the
    Pegasus ids, lines and messages of the general code, numbered in order or not."""
    text = ""
    for i, (pegasus, seq, blank, fields, trail, options, end) in enumerate(lines):
        if pegasus:
            text += "#@" + blank + seq + "".join(blank + f for f in fields) + trail + end
        text += f"TASK t{i} {options}/bin/true {i}{end}"
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), text)
        expected = slow_tasks(path, text.replace("\r\n", "\n"))
        try:
            got: object = [(t.name, t.command, t.line, t.memory, t.cpus, t.tries, t.priority,
                            t.pipe_forwards, t.expected_runtime, t.pegasus_id)
                           for t in tasks_of(parse_dag(path))]
        except DagError as e:
            got = str(e)
    assert got == expected


def test_repeated_option_text_shares_one_options_object(tmp_path: Path) -> None:
    dag = parse(tmp_path, "".join(f"TASK t{i} -m 1 -c 1 /bin/true {i}\n" for i in range(5))
                + "TASK u -m 2 /bin/true\nTASK v -m 1 -c 1 /bin/true\n"
                + "TASK w -m 1  -c 1 /bin/true\n#@ 9 tr dax\nTASK x -m 1 -c 1 -- -y\n")
    opts = {id(options_of(t)) for t in tasks_of(dag)[:-1]}
    assert len(opts) == 2  # "-m 1 -c 1" (however written) and "-m 2"
    last = dag.task(len(dag) - 1)
    assert last._options == dag.task(0)._options
    assert [t.command for t in tasks_of(dag)][-5:] == [
        "/bin/true 4", "/bin/true", "/bin/true", "/bin/true", "-y"]
    assert last.pegasus_id == "9" and last.line == 10


def test_pegasus_ids_read_back_as_written(tmp_path: Path) -> None:
    dag = parse(tmp_path, "#@ 12 tr dax\nTASK a p\n#@ 012 tr dax\nTASK b p\n"
                          "#@ 0 tr dax\nTASK c p\n#@ 99999999999999999999999 tr dax\nTASK d p\n"
                          "#@ \u0661 tr dax\nTASK e p\nTASK f p\n")
    assert [t.pegasus_id for t in tasks_of(dag)] == [
        "12", "012", "0", "99999999999999999999999", "\u0661", None]
    assert [t.line for t in tasks_of(dag)] == [2, 4, 6, 8, 10, 11]
    task = dag.task(4)
    task.pegasus_id = "5"
    assert (task.pegasus_id, task.line) == ("5", 10)
    task.pegasus_id = None
    assert (task.pegasus_id, task.line) == (None, 10)
    plain = dag.task(5)
    assert plain.pegasus_id is None and not hasattr(plain, "_pegasus")
    made = Task(0, "a", "p", pegasus_id="3", line=7)
    assert (made.pegasus_id, made.line) == ("3", 7)


def test_a_parsed_task_is_no_object_of_its_own(tmp_path: Path) -> None:
    """DAG.tasks holds one placeholder for every task of the same options; a task's Task
    is made when asked (and kept by none), its name, command, line and Pegasus id read
    back as written."""
    text = ("TASK a -m 1 /bin/true 1\n# note\nTASK b /bin/true\nEDGE a b\n#@ 3 tr d\nTASK c p\n"
            "TASK d -m 1 q\n")
    dag = parse(tmp_path, text)
    assert len(set(map(id, dag.tasks))) == 2 and dag.tasks[0] is dag.tasks[3]
    assert not any(isinstance(t, Task) for t in dag.tasks)
    assert dag.task(1) is not dag.task(1)
    assert [t.line for t in tasks_of(dag)] == [1, 3, 6, 7]
    assert [t.pegasus_id for t in tasks_of(dag)] == [None, None, "3", None]
    assert [t.id for t in tasks_of(dag)] == [0, 1, 2, 3]
    echo = "/bin/echo \u00e9t\u00e9 \U0001f600"
    dag = parse(tmp_path, f"TASK a {echo}\nTASK \u00e9\U0001f600 {echo}\n")
    assert [(t.name, t.command) for t in tasks_of(dag)] == [("a", echo), ("\u00e9\U0001f600", echo)]
    assert [(dag.name_of(i), dag.command_of(i)) for i in range(2)] == [
        ("a", echo), ("\u00e9\U0001f600", echo)]
    # After a task array (a pmc extension), whose ids have no text, as before it.
    dag = parse(tmp_path, "TASK a p\nTASK b --array 0-2 q {}\n#@ 4 tr d\nTASK c -m 1 r\n"
                          "TASK d p\nEDGE a c\n")
    assert [(t.name, t.command, t.line, t.pegasus_id) for t in map(dag.task, (0, 6, 7))] == [
        ("a", "p", 1, None), ("c", "r", 4, "4"), ("d", "p", 5, None)]
    assert (dag.name_of(2), dag.task(2).command, dag.id_of("d")) == ("b[0]", "q 0", 7)


# -- GPUs and ranks (pmc extensions) ------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "want"),
    [
        ("--request-gpus 2", (2, 1, 0)),
        ("--request-gpus=0", (0, 1, 0)),
        ("--ranks 4", (0, 4, 0)),
        ("--ranks 4 --ranks-per-host 2", (0, 4, 2)),
        ("--ranks-per-host 2 --ranks 6 --request-gpus 1", (1, 6, 2)),
    ],
)
def test_gpu_and_rank_options(tmp_path: Path, options: str, want: tuple[int, int, int]) -> None:
    task = parse(tmp_path, f"TASK A -c 2 {options} /bin/prog -x 1\n").task(0)
    assert (task.gpus, task.ranks, task.ranks_per_host) == want
    assert task.cpus == 2 and task.command == "/bin/prog -x 1"


def test_tasks_without_gpus_or_ranks_share_the_default_options(tmp_path: Path) -> None:
    dag = parse(tmp_path, "TASK A /bin/a\nTASK B --request-gpus 0 /bin/b\n")
    assert dag.task(0).gpus == 0 and dag.task(0).ranks == 1
    assert options_of(dag.task(0)) is options_of(dag.task(1))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("--request-gpus -1", "task option --request-gpus needs a whole number of GPUs >= 0, "
                              "got '-1'"),
        ("--request-gpus 1.5", "needs a whole number of GPUs >= 0, got '1.5'"),
        ("--ranks 0", "task option --ranks needs a whole number of ranks >= 1, got '0'"),
        ("--ranks two", "got 'two'"),
        ("--ranks-per-host 0 --ranks 2", "--ranks-per-host needs a whole number of ranks >= 1"),
        ("--ranks-per-host 2", "task option --ranks-per-host needs --ranks"),
        ("--ranks 3 --ranks-per-host 2",
         "task option --ranks 3 is not a multiple of --ranks-per-host 2"),
        ("--ranks", "--ranks needs a whole number of ranks >= 1, got '/bin/prog'"),
    ],
)
def test_bad_gpu_and_rank_options(tmp_path: Path, options: str, message: str) -> None:
    with pytest.raises(DagError) as info:
        parse(tmp_path, f"# comment\nTASK A {options} /bin/prog\n")
    assert str(info.value).startswith(f"{tmp_path / 'w.dag'}:2: ")
    assert message in str(info.value)
