"""What a task sees of the cpus and memory it asked for: PMC_AFFINITY (the cpus the master
found for a multi-core task, exported whether or not --set-affinity binds the task to
them) and --strict-limits (an allocation past -m fails in the task: RLIMIT_AS).

Normalised as compatkit's docstring says; exits compared as zero/non-zero."""

from __future__ import annotations

import sys

import pytest
from compatkit import Pair, assert_same, blocks, exit_kind, rescue_lines, stdout_lines

pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]

SHOW = '/bin/sh -c "echo {name} affinity=${{PMC_AFFINITY-unset}}"'


def test_pmc_affinity_without_set_affinity(pair: Pair, mode: str) -> None:
    """Multi-core tasks learn their cpus, one-cpu tasks none; with one worker each task
    finds the same cpus free (a task queued behind another takes over its cpus)."""
    dag = "".join(f"TASK {n} -c {c} {SHOW.format(name=n)}\n"
                  for n, c in (("a", 2), ("b", 2), ("c", 3), ("d", 1)))
    args = ["--host-cpus", "4"]  # cpu ids 0-3 on one socket, whatever this host has
    ref = pair.reference(dag, args)
    got = pair.pmc(mode, dag, args)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(blocks(stdout_lines(ref.stdout, ref)), blocks(stdout_lines(got.stdout, got)),
                "stdout", ctx)
    assert "a affinity=0,1" in got.stdout and "d affinity=unset" in got.stdout


def test_pmc_affinity_of_tasks_running_together(pair: Pair, mode: str) -> None:
    """Two -c 2 tasks running at once on a host of 4 cpus: one is given cpus 0,1, the
    other 2,3."""
    dag = "".join(f'TASK {n} -c 2 /bin/sh -c "sleep 1; echo {n} $PMC_AFFINITY"\n'
                  for n in ("a", "b"))
    args = ["--host-cpus", "4"]
    ref = pair.reference(dag, args, workers=2)
    got = pair.pmc(mode, dag, args, workers=2)
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    seen = sorted(line.split()[1] for line in got.stdout.splitlines()
                  if line[:2] in ("a ", "b "))
    wanted = sorted(line.split()[1] for line in ref.stdout.splitlines()
                    if line[:2] in ("a ", "b "))
    assert_same(wanted, seen, "the cpus of the two tasks", ctx)
    assert seen == ["0,1", "2,3"]


def test_strict_limits_fail_an_allocation_past_the_request(pair: Pair, mode: str) -> None:
    """--strict-limits: a task that allocates more than its -m sees the allocation fail
    (Python: MemoryError, exit code 1), one within it runs; the same records and rescue
    log in both."""
    alloc = f"{sys.executable} -c \"b = bytes(1) * (300 << 20)\""
    dag = f"TASK greedy -m 100 {alloc}\nTASK modest -m 600 {alloc}\n"
    ref = pair.reference(dag, ["--strict-limits"])
    got = pair.pmc(mode, dag, ["--strict-limits"])
    ctx = (ref, got)
    assert_same(exit_kind(ref), exit_kind(got), "exit", ctx)
    assert_same(blocks(stdout_lines(ref.stdout, ref)), blocks(stdout_lines(got.stdout, got)),
                "stdout", ctx)
    assert_same(rescue_lines(ref.text("w.dag.rescue")), rescue_lines(got.text("w.dag.rescue")),
                "rescue file", ctx)
    assert "MemoryError" in got.stderr
