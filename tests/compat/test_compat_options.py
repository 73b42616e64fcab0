"""DAGs and options: what the reference accepts (and how it reads it), what it refuses,
its error paths (a missing directory for -o, -r; --max-wall-time running out).

Normalised as compatkit's docstring says. Exit statuses are compared as zero/non-zero
(the reference aborts through MPI_Abort, whose status is the launcher's). An abort
message is compared by its text: the reference prints ``ABORT: failure.cpp(NN): TEXT``,
and pmc's stderr must have a line containing TEXT's first line."""

from __future__ import annotations

import re

import pytest
from compatkit import (
    Pair,
    Run,
    abort_text,
    assert_same,
    blocks,
    exit_kind,
    log_lines,
    rescue_lines,
    stdout_lines,
    summaries,
)

pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]


def assert_abort_reported(ref: Run, got: Run) -> None:
    """The reference aborted with a message; pmc printed the same text on stderr."""
    texts = abort_text(ref)
    assert texts, f"the reference did not abort with a message:\n{ref.describe()}"
    wanted = texts[0]
    if wanted not in got.stderr:
        pytest.fail(f"pmc's stderr lacks the reference's message {wanted!r}\n"
                    f"(reference: {texts[0]!r})\n\n{ref.describe()}\n{got.describe()}",
                    pytrace=False)


SHOW = '/bin/sh -c "echo cpus=$PMC_CPUS memory=$PMC_MEMORY"'

# id -> (DAG, options, environment): each accepted by the reference, run to the end.
ACCEPTED = {
    # -m is rounded up to the next whole MB
    "task-memory-99.1": (f"TASK A -m 99.1 {SHOW}\n", [], {}),
    # -c is rounded up to the next whole cpu
    "task-cpus-1.1": (f"TASK A -c 1.1 {SHOW}\n", ["--host-cpus", "4"], {}),
    # a task that needs no cpu
    "task-cpus-0": (f"TASK A -c 0 {SHOW}\n", [], {}),
    # tries 0: the task is tried once
    "task-tries-0": ('TASK A -t 0 /bin/sh -c "echo try; exit 1"\n', [], {}),
    # the same EDGE twice: the child runs once
    "duplicate-edge": ("TASK A /bin/echo a\nTASK B /bin/echo b\nEDGE A B\nEDGE A B\n", [], {}),
    # 0 means no limit
    "max-wall-time-0": ("TASK A /bin/echo a\n", ["--max-wall-time", "0"], {}),
    "PMC_MAX_WALL_TIME-0": ("TASK A /bin/echo a\n", [], {"PMC_MAX_WALL_TIME": "0"}),
    # 0 means the host's own count
    "host-cpus-0": ("TASK A /bin/echo a\n", ["--host-cpus", "0"], {}),
    # the run's -m (max failures) reads the leading integer: 99
    "max-failures-99.1": ("TASK A /bin/echo a\n", ["-m", "99.1"], {}),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_accepted(pair: Pair, mode: str, case: str) -> None:
    """Accepted, run to the end: the same exit, stdout (records with the rounded cpus and
    memory; the task sees them as PMC_CPUS, PMC_MEMORY) and rescue file."""
    dag, args, env = ACCEPTED[case]
    ref = pair.reference(dag, args, env=env)
    got = pair.pmc(mode, dag, args, env=env)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(stdout_lines(ref.stdout, ref), stdout_lines(got.stdout, got), "stdout", ctx)
    assert_same(rescue_lines(ref.text("w.dag.rescue")), rescue_lines(got.text("w.dag.rescue")),
                "rescue file", ctx)


def test_host_cpus_with_set_affinity_refused(pair: Pair, mode: str) -> None:
    """--host-cpus with --set-affinity: refused before anything runs, non-zero, with
    '--host-cpus is not compatible with --set-affinity' on stderr."""
    dag = "TASK A /bin/echo a\n"
    args = ["--host-cpus", "2", "--set-affinity"]
    ref = pair.reference(dag, args)
    got = pair.pmc(mode, dag, args)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    text = "--host-cpus is not compatible with --set-affinity"
    line = [r".*" + re.escape(text) + r".*"]
    assert log_lines(ref, line), ref.describe()
    assert_same([text], [text for x in log_lines(got, line)][:1], "message (in a line)", ctx)
    assert_same(records(ref), records(got), "records", ctx)


def records(run: Run) -> list[str]:
    return [x for x in stdout_lines(run.stdout, run) if x.startswith("[cluster-task ")]


def test_stdout_in_missing_directory(pair: Pair, mode: str) -> None:
    """-o in a missing directory: abort with 'Unable to open stdout file: PATH',
    non-zero. (The reference runs every task first, prints the summary on stdout and
    aborts when its merge opens the file; when pmc finds out is not compared.)"""
    dag = "TASK A /bin/echo a\n"
    args = ["-o", "/nonexistent/pmc-compat/x"]
    ref = pair.reference(dag, args)
    got = pair.pmc(mode, dag, args)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_abort_reported(ref, got)


def test_rescue_in_missing_directory(pair: Pair, mode: str) -> None:
    """-r in a missing directory: abort before any task with 'Unable to open rescue
    file: PATH', non-zero, no record."""
    dag = "TASK A /bin/echo a\n"
    args = ["-r", "/nonexistent/pmc-compat/w.rescue"]
    ref = pair.reference(dag, args)
    got = pair.pmc(mode, dag, args)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(records(ref), records(got), "records", ctx)
    assert_abort_reported(ref, got)
    assert "Traceback" not in got.stderr, got.describe()


def test_log_file_in_missing_directory(pair: Pair, mode: str) -> None:
    """--log-file is pmc's own (the reference refuses it: 'Unrecognized argument:
    --log-file', non-zero). In a missing directory both stop before any task, non-zero,
    and pmc says which path it could not open."""
    dag = "TASK A /bin/echo a\n"
    path = "/nonexistent/pmc-compat/log"
    ref = pair.reference(dag, ["--log-file", path])
    got = pair.pmc(mode, dag, ["--log-file", path])
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(records(ref), records(got), "records", ctx)
    assert path in got.stderr, got.describe()
    assert "Traceback" not in got.stderr, got.describe()


WALL = """\
TASK A /bin/sh -c "echo A-out"
TASK B /bin/sh -c "echo B-started; exec sleep 8"
EDGE A B
"""


def test_max_wall_time_stop_merges_outputs(pair: Pair, mode: str) -> None:
    """--max-wall-time running out while B runs: '[fatal] Workflow wall time exceeded!',
    '[error] Aborting workflow'; the summary (failed; B submitted, neither succeeded nor
    failed) and then every output so far, B's included, are on stdout; A is in the
    rescue file; abort 'Workflow aborted', non-zero.

    Two differences, documented in docs/reliability.md: the reference leaves B running,
    orphaned, and writes no record for it, where pmc kills B and records what happened
    (status=15, its SIGTERM); and the reference's alarm() logs '[fatal] Caught signal 14'
    where pmc, whose master keeps the deadline itself, catches no signal to log."""
    args = ["--max-wall-time", "0.02"]
    ref = pair.reference(WALL, args)
    got = pair.pmc(mode, WALL, args)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    ref_blocks = blocks(stdout_lines(ref.stdout, ref))
    killed = ' | [cluster-task name=B, status=15, app="/bin/sh", cpus=1, memory=0]'
    assert "B-started" in ref_blocks, ref_blocks
    expected = [b + killed if b == "B-started" else b for b in ref_blocks]
    assert_same(expected, blocks(stdout_lines(got.stdout, got)), "stdout (per task)", ctx)
    assert_same(summaries(stdout_lines(ref.stdout, ref)),
                summaries(stdout_lines(got.stdout, got)), "summary", ctx)
    assert_same(rescue_lines(ref.text("w.dag.rescue")), rescue_lines(got.text("w.dag.rescue")),
                "rescue file", ctx)
    patterns = [r"\[\w+\] Workflow wall time exceeded!",
                r"\[\w+\] Aborting workflow", r"\[\w+\] Workflow (finished|failed|succeeded)"]
    # As a set: in the reference the order depends on timing. Its master stops waiting
    # at the deadline (1.2 s: '[error] Aborting workflow', then the abort), while the
    # alarm(), rounded up to whole seconds, logs its lines when it fires (here during
    # the second the abort sleeps before MPI_Abort).
    assert_same(sorted(log_lines(ref, patterns)), sorted(log_lines(got, patterns)),
                "log lines (sorted)", ctx)
    assert log_lines(ref, [r"\[fatal\] Caught signal 14"]), ref.stderr
    assert not log_lines(got, [r"\[\w+\] Caught signal \d+"]), got.stderr
    assert_abort_reported(ref, got)


# The extensions of the DAG format for sweeps and declared files: the reference refuses
# each as an unknown task option (which is why the docs name them pmc extensions); pmc
# runs them.
EXTENSIONS = {
    "array": "TASK A --array 0-2 /bin/echo {}\n",
    "each-line": "TASK A --each-line values.txt /bin/echo {}\n",
    "from-json": "TASK A --from-json values.json /bin/echo {}\n",
    "inputs": "TASK A --inputs values.txt /bin/echo a\n",
    "outputs": "TASK A --outputs values.txt /bin/echo a\n",
}


@pytest.mark.parametrize("case", list(EXTENSIONS))
def test_sweep_and_file_options_are_extensions(pair: Pair, mode: str, case: str) -> None:
    files = {"values.txt": "x\ny\n", "values.json": '["x", "y"]'}
    ref = pair.reference(EXTENSIONS[case], files=files)
    got = pair.pmc(mode, EXTENSIONS[case], files=files)
    assert ref.rc != 0, ref.describe()
    assert re.search(rf"--{case}", ref.stderr + ref.stdout), ref.describe()
    assert got.rc == 0, got.describe()
