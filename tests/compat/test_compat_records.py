"""Records, summary, rescue file, jobstate.log, dagman.out and the task-failure log lines:
the same DAG through the reference and through pmc (under mpiexec and embedded).

Normalised as compatkit's docstring says: times, pids, hostnames, slots and the run's
directory are dropped or replaced; every other byte of the merged stdout is compared,
in order (one worker, so the order is the reference's)."""

from __future__ import annotations

import pytest
from compatkit import (
    Pair,
    Run,
    assert_same,
    blocks,
    dagman_lines,
    jobstate_lines,
    log_lines,
    records,
    rescue_lines,
    stdout_lines,
)

pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]

CHAIN = """\
#@ 1 xform::echo:1.0 ID000001
TASK A /bin/sh -c "echo A-out; echo A-err >&2"
TASK B /bin/echo "I am B"
TASK C /bin/sh -c "echo C-out"
EDGE A B
EDGE B C
"""

# A succeeds; B fails twice (exit 2: raw wait status 512); C, B's child, never runs.
FAILING = """\
#@ 1 xform::a:1.0 ID000001
TASK A /bin/sh -c "echo A-out; echo A-err >&2"
#@ 2 xform::b:1.0 ID000002
TASK B -t 2 /bin/sh -c "echo B-out; echo B-err >&2; exit 2"
TASK C /bin/echo never
EDGE A B
EDGE B C
"""

KILLED = """\
TASK K /bin/sh -c "echo K-out; kill -9 $$"
"""

# The task-failure texts, and the workflow's own outcome lines.
FAILURE_LINES = [
    r"\[\w+\] Task \S+ failed with exitcode -?\d+",
    r"\[\w+\] Task \S+ failed due to collective I/O errors",
]
OUTCOME_LINES = [
    r"\[\w+\] Workflow (finished|failed|succeeded)",
    r"\[\w+\] Aborting workflow",
    r"\[\w+\] Max failures reached: DAG prematurely aborted",
]


def exit_kind(run: Run) -> list[str]:
    return ["exit 0" if run.rc == 0 else "exit non-zero"]


def test_chain_stdout_rescue_and_exit(pair: Pair, mode: str) -> None:
    """A successful chain: summary first, then each task's output followed by its record
    (stdout), the task's stderr on stderr, the rescue file, exit 0."""
    ref = pair.reference(CHAIN)
    got = pair.pmc(mode, CHAIN)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(stdout_lines(ref.stdout, ref), stdout_lines(got.stdout, got), "stdout", ctx)
    assert_same(log_lines(ref, [r"A-err"]), log_lines(got, [r"A-err"]), "task stderr", ctx)
    assert_same(rescue_lines(ref.text("w.dag.rescue")), rescue_lines(got.text("w.dag.rescue")),
                "rescue file", ctx)
    assert_same(log_lines(ref, OUTCOME_LINES), log_lines(got, OUTCOME_LINES), "log lines", ctx)


@pytest.mark.parametrize("outputs", ["default", "files"])
def test_failed_task_outputs_merged(pair: Pair, mode: str, outputs: str) -> None:
    """After a failed task every try's output and record is merged into the run's stdout
    (or -o), every task stderr into its stderr (or -e); the summary counts tries
    (submitted=3, failed=2, extra=0) and goes to stdout before the merged outputs."""
    args = ["-o", "out.txt", "-e", "err.txt"] if outputs == "files" else []
    ref = pair.reference(FAILING, args)
    got = pair.pmc(mode, FAILING, args)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(stdout_lines(ref.stdout, ref), stdout_lines(got.stdout, got), "stdout", ctx)
    if outputs == "files":
        for name in ("out.txt", "err.txt"):
            assert_same(stdout_lines(ref.text(name) or "<missing>", ref),
                        stdout_lines(got.text(name) or "<missing>", got), name, ctx)
    else:
        task_err = [r"[AB]-err"]
        assert_same(log_lines(ref, task_err), log_lines(got, task_err), "task stderr", ctx)
    assert_same(rescue_lines(ref.text("w.dag.rescue")), rescue_lines(got.text("w.dag.rescue")),
                "rescue file", ctx)
    patterns = FAILURE_LINES + OUTCOME_LINES
    assert_same(log_lines(ref, patterns), log_lines(got, patterns), "log lines", ctx)


def test_retry_sequence_and_status_in_jobstate_and_dagman(pair: Pair, mode: str) -> None:
    """jobstate.log and DAG.dagman.out: a retry is a new submit sequence number (B 2.0,
    then 3.0), JOB_FAILURE and 'failed with status' carry the raw wait status (512);
    --monitord-hack writes each try to TASK.out.NNN / TASK.err.NNN (A.000, B.000, B.001)
    with the record at the end of the .out file."""
    args = ["--jobstate-log", "--monitord-hack"]
    ref = pair.reference(FAILING, args)
    got = pair.pmc(mode, FAILING, args)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(jobstate_lines(ref.text("jobstate.log")), jobstate_lines(got.text("jobstate.log")),
                "jobstate.log", ctx)
    assert_same(dagman_lines(ref.text("w.dag.dagman.out")),
                dagman_lines(got.text("w.dag.dagman.out")), "w.dag.dagman.out", ctx)
    names = ["A.out.000", "A.err.000", "B.out.000", "B.err.000", "B.out.001", "B.err.001",
             "C.out.000"]
    for name in names:
        assert_same(stdout_lines(ref.text(name) or "<missing>", ref),
                    stdout_lines(got.text(name) or "<missing>", got), name, ctx)
    assert_same(stdout_lines(ref.stdout, ref), stdout_lines(got.stdout, got), "stdout", ctx)


def test_killed_task_raw_status(pair: Pair, mode: str) -> None:
    """A task killed by SIGKILL: status=9 (the raw wait status) in its record, in
    jobstate.log's JOB_FAILURE, in dagman.out, and '[error] Task K failed with exitcode 9'."""
    args = ["--jobstate-log", "--monitord-hack"]
    ref = pair.reference(KILLED, args)
    got = pair.pmc(mode, KILLED, args)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(stdout_lines(ref.text("K.out.000") or "<missing>", ref),
                stdout_lines(got.text("K.out.000") or "<missing>", got), "K.out.000", ctx)
    assert_same(jobstate_lines(ref.text("jobstate.log")), jobstate_lines(got.text("jobstate.log")),
                "jobstate.log", ctx)
    assert_same(dagman_lines(ref.text("w.dag.dagman.out")),
                dagman_lines(got.text("w.dag.dagman.out")), "w.dag.dagman.out", ctx)
    assert_same(log_lines(ref, FAILURE_LINES), log_lines(got, FAILURE_LINES), "log lines", ctx)


UNSTARTABLE = """\
TASK A ./no-such-program one
TASK B no-such-command-pmc-compat two
"""


def test_unstartable_program(pair: Pair, mode: str) -> None:
    """A program that cannot be started still gets a record (status 256: the child's
    exit 1 after the failed exec) and 'Unable to exec command PROG for task T: No such
    file or directory' in the task's stderr. (Tasks compared as a set: A and B are
    independent.)"""
    args = ["-o", "out.txt", "-e", "err.txt"]
    ref = pair.reference(UNSTARTABLE, args)
    got = pair.pmc(mode, UNSTARTABLE, args)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(blocks(stdout_lines(ref.text("out.txt") or "<missing>", ref)),
                blocks(stdout_lines(got.text("out.txt") or "<missing>", got)),
                "out.txt (per task)", ctx)
    assert_same(sorted(stdout_lines(ref.text("err.txt") or "<missing>", ref)),
                sorted(stdout_lines(got.text("err.txt") or "<missing>", got)),
                "err.txt (sorted)", ctx)
    assert_same(sorted(log_lines(ref, FAILURE_LINES)), sorted(log_lines(got, FAILURE_LINES)),
                "log lines (sorted)", ctx)


# Between the words: NO-BREAK SPACE, IDEOGRAPHIC SPACE, \x1c..\x1f (part of a word, as in
# a shell), then a vertical tab and a form feed (ASCII whitespace: separators).
WORDS = ("TASK A /bin/echo a\u00a0b c\u3000d e\x1cf\x1dg\x1eh\x1fi"
         " j\x0bk l\x0cm\n")


def test_words_split_at_ascii_whitespace_only(pair: Pair, mode: str) -> None:
    """A task's words are split at ASCII whitespace only: echo prints its arguments
    joined by single spaces, so the line shows where the words were split."""
    ref = pair.reference(WORDS)
    got = pair.pmc(mode, WORDS)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same([ascii(x) for x in stdout_lines(ref.stdout, ref)],
                [ascii(x) for x in stdout_lines(got.stdout, got)], "stdout (ascii())", ctx)


def test_scheduling_trace_lines(pair: Pair, mode: str) -> None:
    """At -v -v (trace) the master logs '[trace] Scheduling task X' for each task it
    considers, in order."""
    pattern = [r"\[trace\] Scheduling task \S+"]
    ref = pair.reference(CHAIN, ["-v", "-v"])
    got = pair.pmc(mode, CHAIN, ["-v", "-v"])
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(log_lines(ref, pattern), log_lines(got, pattern), "trace lines", ctx)


NOT_A_FILE = """\
TASK A -F ./x=forwarded /bin/mkdir -p x
"""


def test_file_forward_of_a_directory(pair: Pair, mode: str) -> None:
    """A -F source that is a directory fails the task after it ran: the worker logs
    '[error] Task A: ./x is not a file', then the master the failure, with status 256 in
    its record. (The two lines come from different ranks: under mpiexec their order in
    its stderr is the launcher's, for the reference as for pmc, so each rank's lines are
    compared apart; in embedded mode every process writes to the one stderr, in order.)"""
    ref = pair.reference(NOT_A_FILE)
    got = pair.pmc(mode, NOT_A_FILE)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(records(stdout_lines(ref.stdout, ref)), records(stdout_lines(got.stdout, got)),
                "records", ctx)
    worker = [r"\[\w+\] Task \S+: .* is not a file"]
    assert_same(log_lines(ref, worker), log_lines(got, worker), "the worker's log line", ctx)
    assert_same(log_lines(ref, FAILURE_LINES), log_lines(got, FAILURE_LINES),
                "the master's log lines", ctx)
    if mode == "embedded":
        assert log_lines(got, worker + FAILURE_LINES) == [
            "[error] Task A: ./x is not a file", "[error] Task A failed with exitcode 256"
        ], got.describe()
