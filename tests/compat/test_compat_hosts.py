"""Hosts and files: the host script, PMC_HOST_RANK, --per-task-stdio across a restart,
the DAG lock (a POSIX fcntl lock), pipe forwarding above 16 MiB.

Normalised as compatkit's docstring says; exits compared as zero/non-zero."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from compatkit import (
    DAG_NAME,
    Pair,
    Run,
    abort_text,
    assert_same,
    execute,
    exit_kind,
    log_lines,
    ompi_env,
    pmc_argv,
    prepare,
    reference_argv,
    stdout_lines,
)
from pmctest import clean_env

pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]


HOST_SCRIPT = "#!/bin/sh\necho HS-stdout\necho HS-stderr >&2\n"
FAILING_HOST_SCRIPT = "#!/bin/sh\necho HS-failing\nexit 3\n"
ONE = 'TASK A /bin/echo A-out\n'
HOST_SCRIPT_LINES = [
    r"\[\w+\] Worker \d+: Launching host script .*",
    r"\[\w+\] Worker \d+: Host script exited .*",
    r"\[\w+\] Worker \d+: Terminating host script process group with SIGTERM",
]


def test_host_script_stdout_goes_to_stderr(pair: Pair, mode: str) -> None:
    """The host script's stdout and stderr both go to the run's stderr, never among the
    records on stdout; at -v the worker logs launching it and how it exited."""
    files = {"hs.sh": HOST_SCRIPT}
    args = ["-v", "--host-script", "./hs.sh"]
    ref = pair.reference(ONE, args, files=files)
    got = pair.pmc(mode, ONE, args, files=files)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(stdout_lines(ref.stdout, ref), stdout_lines(got.stdout, got), "stdout", ctx)
    hs = [r"HS-stdout", r"HS-stderr"]
    assert_same(sorted(log_lines(ref, hs)), sorted(log_lines(got, hs)),
                "host script output on stderr", ctx)
    assert_same(log_lines(ref, HOST_SCRIPT_LINES), log_lines(got, HOST_SCRIPT_LINES),
                "host script log lines", ctx)


def test_failing_host_script(pair: Pair, mode: str) -> None:
    """A host script that exits 3: no task runs, abort with 'Worker 1: Host script failed
    with status 768' (the raw wait status), non-zero; at -v the exit is logged first."""
    files = {"hs.sh": FAILING_HOST_SCRIPT}
    args = ["-v", "--host-script", "./hs.sh"]
    ref = pair.reference(ONE, args, files=files)
    got = pair.pmc(mode, ONE, args, files=files)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    recs = [x for x in stdout_lines(ref.stdout, ref) if x.startswith("[cluster-task")]
    assert_same(recs, [x for x in stdout_lines(got.stdout, got) if x.startswith("[cluster-task")],
                "records", ctx)
    assert_same(log_lines(ref, HOST_SCRIPT_LINES[:2]), log_lines(got, HOST_SCRIPT_LINES[:2]),
                "host script log lines", ctx)
    wanted = abort_text(ref)
    assert wanted, ref.describe()
    if wanted[0] not in got.stderr:
        pytest.fail(f"pmc's stderr lacks {wanted[0]!r}\n\n{ref.describe()}\n{got.describe()}",
                    pytrace=False)


RANKS = """\
TASK A /bin/sh -c "sleep 1; echo rank=$PMC_RANK host_rank=$PMC_HOST_RANK"
TASK B /bin/sh -c "sleep 1; echo rank=$PMC_RANK host_rank=$PMC_HOST_RANK"
"""


def test_host_rank(pair: Pair, mode: str) -> None:
    """Two workers on one host: the lower rank is host rank 0, the next host rank 1
    (each task sleeps 1 s so that both workers get one)."""
    ref = pair.reference(RANKS, workers=2)
    got = pair.pmc(mode, RANKS, workers=2)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)

    def seen(run: Run) -> list[str]:
        return sorted(x for x in stdout_lines(run.stdout, run) if x.startswith("rank="))
    assert_same(seen(ref), seen(got), "PMC_RANK / PMC_HOST_RANK", ctx)


RERUN = 'TASK A /bin/sh -c "echo A-run; echo A-err >&2; exit 1"\n'


def per_task_files(run: Run) -> list[str]:
    out = []
    for path in sorted(run.dir.iterdir()):
        if path.name.startswith("A."):
            body = stdout_lines(path.read_text(), run)
            out.append(f"{path.name}: " + " | ".join(body))
    return out


@pytest.mark.slow
def test_per_task_stdio_restart_takes_next_number(pair: Pair, mode: str) -> None:
    """--per-task-stdio, run twice in one directory (A fails, so it runs again): the
    second run writes A.out.001 / A.err.001 and leaves the first run's .000 alone."""
    args = ["--per-task-stdio"]
    ref_dir, got_dir = pair.fresh("reference-restart"), pair.fresh(f"pmc-{mode}-restart")
    for _ in range(2):
        ref = pair.reference(RERUN, args, where=ref_dir)
        got = pair.pmc(mode, RERUN, args, where=got_dir)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(per_task_files(ref), per_task_files(got), "A.out.NNN / A.err.NNN", ctx)


# -- the DAG lock -------------------------------------------------------------------------

@contextmanager
def fcntl_lock(path: Path) -> Iterator[None]:
    """Hold a POSIX record lock (fcntl F_SETLK, F_WRLCK) on the whole file."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


LOCKED_MESSAGE = "DAG file is already locked by another process: " + DAG_NAME


def assert_refused_for_lock(run: Run, *context: Run) -> None:
    """Refused (non-zero, no task run), and with the reference's message."""
    details = "\n\n" + "\n".join(r.describe() for r in (run, *context))
    if run.rc == 0 or "[cluster-task " in run.stdout:
        pytest.fail(f"{run.who} ran a DAG locked by another process{details}", pytrace=False)
    if LOCKED_MESSAGE not in run.stderr:
        pytest.fail(f"{run.who} refused the locked DAG, but without the reference's message "
                    f"{LOCKED_MESSAGE!r}{details}", pytrace=False)


def test_dag_lock_held_by_fcntl(pair: Pair, mode: str) -> None:
    """A POSIX fcntl lock on the DAG, taken here: both refuse to run it, non-zero, with
    'DAG file is already locked by another process: w.dag'."""
    dag = "TASK A /bin/echo a\n"
    ref_dir = prepare(pair.fresh("reference-locked"), dag)
    got_dir = prepare(pair.fresh(f"pmc-{mode}-locked"), dag)
    # (Not through pair.reference/pmc: they read the DAG, and closing any descriptor of
    # a file drops this process's POSIX locks on it.)
    with fcntl_lock(ref_dir / DAG_NAME), fcntl_lock(got_dir / DAG_NAME):
        ref = execute("reference", reference_argv(pair.binary, 1, [DAG_NAME]), ref_dir,
                      ompi_env())
        got = execute(f"pmc ({mode})", pmc_argv(mode, 1, [DAG_NAME]), got_dir, clean_env())
    ctx = (ref, got)
    assert_same(abort_text(ref)[:1], [LOCKED_MESSAGE + ": Resource temporarily unavailable"],
                "the reference's message", ctx)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_refused_for_lock(got, ref)


HOLD = """\
TASK A /bin/sh -c "touch started; sleep 3"
"""


def test_reference_refuses_a_dag_pmc_runs(pair: Pair, mode: str) -> None:
    """While pmc runs a DAG, the reference started on the same DAG refuses it (non-zero,
    'DAG file is already locked by another process: w.dag'): pmc's lock is the POSIX
    fcntl lock the reference tests.

    (Not the other way round: the reference drops its own lock as soon as it has read
    the DAG, by closing the stream it read it with; a POSIX lock goes with any close of
    the file by its process. Held through a run, its lock is only shown by
    test_dag_lock_held_by_fcntl.)"""
    where = prepare(pair.fresh(f"lock-{mode}"), HOLD)
    first = subprocess.Popen(pmc_argv(mode, 1, [DAG_NAME]), cwd=where, env=clean_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (where / "started").exists():
            if first.poll() is not None or time.monotonic() > deadline:
                out, err = first.communicate()
                pytest.fail(f"pmc did not start the task:\n{out}\n{err}")
            time.sleep(0.05)
        second = execute("reference", reference_argv(
            pair.binary, 1, ["-o", "second.out", "-e", "second.err", DAG_NAME]), where,
            ompi_env())
    finally:
        out, err = first.communicate(timeout=60)
    held = Run(f"pmc ({mode})", where, first.returncode, out, err)
    assert held.rc == 0, held.describe()
    assert_refused_for_lock(second, held)


# -- pipe forwarding ----------------------------------------------------------------------

SIZE = 17 * 1024 * 1024 + 1
BIG = f'TASK A -f FOO=./big.dat /bin/sh -c "head -c {SIZE} /dev/zero > /dev/fd/$FOO"\n'


def test_pipe_forward_above_16_mib(pair: Pair, mode: str) -> None:
    """A task writes 17 MiB + 1 byte into its -f pipe: the whole of it lands in the file,
    the task succeeds."""
    ref = pair.reference(BIG)
    got = pair.pmc(mode, BIG)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)

    def size(run: Run) -> list[str]:
        path = run.dir / "big.dat"
        return [f"big.dat: {path.stat().st_size if path.exists() else 'missing'} bytes"]
    assert_same(size(ref), size(got), "forwarded file", ctx)
    assert_same(stdout_lines(ref.stdout, ref), stdout_lines(got.stdout, got), "stdout", ctx)
