"""Per-task accounting (pmc.accounting) seen in the JSON event log of real runs: the
task's own peak memory and cpu, its children's included; unknown rather than the
worker's figure without cgroups; --strict-limits through the cgroup memory limit.

The cgroup tests run where pmc may create v1 memory/cpuacct groups (root on a v1 or
hybrid host, as CI) and skip elsewhere, saying why."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pmctest import clean_env, pmc, write_dag

from pmc.accounting import Accounting


def _cgroups() -> str:
    acc = Accounting(1, False)
    try:
        return acc.why
    finally:
        acc.close()


CGROUP_WHY = _cgroups()
needs_cgroups = pytest.mark.skipif(bool(CGROUP_WHY),
                                   reason=f"no cgroup accounting here: {CGROUP_WHY}")
PY = sys.executable
TOUCH = "b = b'x' * ({mb} << 20)"


def run(tmp_path: Path, dag_text: str, *args: str,
        env: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]]]:
    dag = write_dag(tmp_path / "a.dag", dag_text)
    r = pmc(["run", "--workers", "1", "--log-format", "json", "--log-file", "ev.jsonl",
             *args, dag.name], tmp_path, env=env)
    evs = [json.loads(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()]
    return r.returncode, evs


def ended(evs: list[dict[str, Any]], task: str) -> dict[str, Any]:
    return next(ev for ev in evs if ev["event"] in ("task.finished", "task.failed")
                and ev["task"] == task)


@needs_cgroups
def test_peak_memory_and_cpu_of_the_task_itself(tmp_path: Path) -> None:
    code, evs = run(tmp_path, f'TASK big {PY} -c "{TOUCH.format(mb=200)}"\n'
                              "TASK small /bin/true\n"
                              "EDGE big small\n")
    assert code == 0
    assert next(ev for ev in evs if ev["event"] == "workflow.started")["accounting"] \
        == "cgroup-v1"
    big = ended(evs, "big")
    assert 200 * 1024 <= big["max_rss_kb"] <= 220 * 1024  # 200 MB, within 10 %
    assert big["user_cpu"] is not None and big["system_cpu"] is not None
    # After a 200 MB task in the same slot: its own, not the worker's or the last task's.
    assert 0 < ended(evs, "small")["max_rss_kb"] < 4 * 1024


@needs_cgroups
def test_a_forking_task_counts_its_children(tmp_path: Path) -> None:
    # The parent holds 100 MB while its child touches another 100 MB: the tree's peak is
    # 200 MB, where any one process's RSS is about 100 MB.
    (tmp_path / "child.py").write_text(TOUCH.format(mb=100) + "\n")
    (tmp_path / "tree.py").write_text(
        f"import subprocess, sys\n{TOUCH.format(mb=100)}\n"
        "subprocess.run([sys.executable, 'child.py'], check=True)\n")
    code, evs = run(tmp_path, f"TASK tree {PY} tree.py\n")
    assert code == 0
    assert ended(evs, "tree")["max_rss_kb"] >= 200 * 1024


@needs_cgroups
def test_strict_limits_kill_through_the_cgroup(tmp_path: Path) -> None:
    # Address space is not memory: 1 GiB reserved untouched runs under -m 50 (RLIMIT_AS
    # would refuse it, as it breaks JVMs and Go); touching 200 MB is an OOM kill.
    reserve = "import mmap; m = mmap.mmap(-1, 1 << 30); m[0:1] = b'x'"
    code, evs = run(tmp_path, f'TASK reserve -m 50 {PY} -c "{reserve}"\n'
                              f'TASK hog -m 50 {PY} -c "{TOUCH.format(mb=200)}"\n',
                    "--strict-limits")
    assert code == 1
    assert next(ev for ev in evs if ev["event"] == "workflow.started")["memory_limits"] \
        == "cgroup"
    assert ended(evs, "reserve")["event"] == "task.finished"
    hog = ended(evs, "hog")
    assert hog["event"] == "task.failed" and hog["oom_killed"] is True
    assert "memory limit" in hog["error"]
    assert hog["status"] == 9


def test_without_cgroups_the_peak_is_unknown_not_the_workers(tmp_path: Path) -> None:
    code, evs = run(tmp_path, "TASK t /bin/true\n",
                    env=clean_env(PMC_NO_CGROUPS="1"))
    assert code == 0
    assert next(ev for ev in evs if ev["event"] == "workflow.started")["accounting"] \
        == "rusage"
    t = ended(evs, "t")
    assert t["max_rss_kb"] is None  # /bin/true's inherited high-water mark is the worker's
    assert t["user_cpu"] is None


def test_failed_task_names_its_stderr_and_last_lines(tmp_path: Path) -> None:
    script = "for i in $(seq 1 30); do echo line$i >&2; done; exit 3"
    code, evs = run(tmp_path, f"TASK bad /bin/sh -c '{script}'\n")
    assert code == 1
    bad = ended(evs, "bad")
    assert bad["error"] == "exit code 3"
    assert bad["stderr"] == str(tmp_path / "a.dag.err.1")
    assert bad["stderr_tail"].splitlines() == [f"line{i}" for i in range(21, 31)]


@needs_cgroups
def test_groups_of_a_killed_worker_are_removed(tmp_path: Path) -> None:
    """A worker killed with SIGKILL cannot remove its cgroups: its guard does."""
    import os
    import signal
    import subprocess
    import time

    from pmc.accounting import CGROUP_ROOT, _own_groups

    dag = write_dag(tmp_path / "k.dag", "TASK k /bin/sh -c 'echo $PPID > worker.pid; "
                                        "exec sleep 60'\n")
    proc = subprocess.Popen([PY, "-m", "pmc", "run", "--workers", "1", dag.name],
                            cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        pid_file = tmp_path / "worker.pid"
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        groups = _own_groups()
        dirs = [f"{CGROUP_ROOT}/memory{groups['memory'].rstrip('/')}/pmc-{worker}",
                f"{CGROUP_ROOT}/cpuacct{groups['cpuacct'].rstrip('/')}/pmc-{worker}"]
        assert all(os.path.isdir(d) for d in dirs)
        os.kill(worker, signal.SIGKILL)
        proc.wait(60)
        deadline = time.monotonic() + 60
        while any(os.path.exists(d) for d in dirs):
            assert time.monotonic() < deadline, dirs
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
