"""Console output as PMC writes it: lower-case level tags, PMC's texts, PMC's order, and
the effect of each -v / -q."""

from __future__ import annotations

import re
from pathlib import Path

from pmctest import DIAMOND, pmc, write_dag

NUMBER = re.compile(r"\d+\.\d+")


def lines(text: str) -> list[str]:
    """Log lines with their figures replaced by N (times vary from run to run)."""
    return [NUMBER.sub("N", line) for line in text.splitlines()]


def test_default_level_lines_of_a_successful_run(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = pmc(["run", "--workers", "2", "--maxfds", "64", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert lines(r.stderr) == [
        "[info] Setting max cached files = 64",
        "[info] Master starting with 2 workers",
        "[info] Starting workflow",
        "[info] Workflow finished",
        "[info] Resource utilization (with master): N",
        "[info] Resource utilization (without master): N",
        "[info] Total runtime of tasks: N seconds (N minutes)",
        "[info] Wall time: N seconds (N minutes)",
        "[info] Makespan: N seconds (N minutes)",
        "[info] Throughput: N tasks/second",
        "[info] File descriptor cache hit rate: N",
        "[info] Merging task stdio from workers...",
        "[info] Sending workers shutdown messages...",
        "[info] Workflow succeeded",
    ]


def test_failed_tries_and_a_failed_run(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", 'TASK A /bin/sh -c "exit 3"\nTASK B /bin/true\n'
                    "EDGE B A\n")
    r = pmc(["run", "--workers", "1", "-t", "2", "--max-wall-time", "10", dag.name],
            tmp_path)
    assert r.returncode == 1
    got = lines(r.stderr)
    assert got[0].startswith("[info] Setting max cached files = ")
    assert got[:5] == [
        got[0],  # the cache size depends on RLIMIT_NOFILE
        "[info] Master starting with 1 workers",
        "[info] Setting max walltime to N minutes",
        "[info] Starting workflow",
        "[error] Task A failed with exitcode 768",
    ]
    assert got[5] == "[error] Task A failed with exitcode 768"
    assert got[6] == "[info] Workflow finished"
    assert got[-1] == "[error] Workflow failed"


def test_quiet_levels(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", 'TASK A /bin/sh -c "exit 3"\n')
    r = pmc(["run", "--workers", "1", "-q", dag.name], tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == ["[error] Task A failed with exitcode 768",
                                     "[error] Workflow failed"]
    r = pmc(["run", "--workers", "1", "-qq", dag.name], tmp_path)
    assert r.stderr.splitlines() == ["[error] Task A failed with exitcode 768",
                                     "[error] Workflow failed"]
    r = pmc(["run", "--workers", "1", "-qqq", dag.name], tmp_path)
    assert r.returncode == 1 and r.stderr == ""
    # Fatal lines show down to -qqq; -qqqq silences them too, as in PMC.
    bad = write_dag(tmp_path / "bad.dag", "TASK A\n")
    assert "[fatal] " in pmc(["run", "-qqq", bad.name], tmp_path).stderr
    r = pmc(["run", "-qqqq", bad.name], tmp_path)
    assert r.returncode == 2 and r.stderr == ""


def test_debug_and_trace_lines_of_the_master_and_workers(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK A /bin/true\nTASK B /bin/sh -c 'kill -9 $$'\n"
                    "EDGE A B\n")
    r = pmc(["run", "--workers", "1", "-vv", "--no-prefetch", dag.name], tmp_path)
    assert r.returncode == 1
    err = r.stderr
    for line in ("[debug] Using old rescue file: w.dag.rescue",
                 "[debug] Using new rescue file: w.dag.rescue",
                 "[debug] Locking DAG file...",
                 "[debug] Worker 1: Using task stdout file: w.dag.out.1",
                 "[debug] Worker 1: Starting...",
                 "[trace] Worker 1: Host rank: 0",
                 "[debug] Slot 1 on host ",
                 "[debug] Host rank of worker 1 is 0",
                 "[debug] Queueing task A",
                 "[debug] Scheduling 1 tasks on 1 slots...",
                 "[trace] Scheduling task A",
                 "[trace] Matched task A to slot 1 on host ",
                 "[debug] Submitting task A to slot 1",
                 "[debug] Scheduled 1 tasks and deferred 0 tasks",
                 "[trace] Running task A",
                 "[debug] Task A exited with status 0 (0) in ",
                 "[debug] Task A finished with exitcode 0",
                 "[debug] Task B exited on signal 9 (9) in ",
                 "[error] Task B failed with exitcode 9",
                 "[trace] Merging stdout file: w.dag.out.1",
                 "[debug] Sending shutdown message to worker 1",
                 "[trace] Worker 1: Got shutdown message",
                 "[debug] Worker 1: Exiting...",
                 "[debug] Unlocking DAG file..."):
        assert "\n" + line in "\n" + err, line
    order = [err.index(s) for s in ("[debug] Queueing task A", "[trace] Scheduling task A",
                                    "[debug] Submitting task A to slot 1",
                                    "[debug] Task A finished with exitcode 0",
                                    "[debug] Queueing task B",
                                    "[error] Task B failed with exitcode 9",
                                    "[info] Workflow finished")]
    assert order == sorted(order)
    assert "Traceback" not in err


def test_host_script_lines(tmp_path: Path) -> None:
    script = tmp_path / "host.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    dag = write_dag(tmp_path / "w.dag", "TASK A /bin/true\n")
    r = pmc(["run", "--workers", "1", "-v", "--host-script", str(script), dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"[debug] Worker 1: Launching host script {script}\n" in r.stderr
    assert "[debug] Worker 1: Host script exited with status 0 (0)\n" in r.stderr
    script.write_text("#!/bin/sh\nexit 3\n")
    r = pmc(["run", "--workers", "1", "--host-script", str(script), dag.name], tmp_path)
    assert r.returncode == 1
    assert "[fatal] Worker 1: Host script failed with status 768\n" in r.stderr
    script.write_text("#!/bin/sh\nsleep 30\n")
    r = pmc(["run", "--workers", "1", "--host-script", str(script), "--host-script-timeout",
             "0.5", dag.name], tmp_path)
    assert r.returncode == 1
    assert "[fatal] Worker 1: Host script timed out after 0.5 seconds\n" in r.stderr


def test_file_forward_that_is_not_a_file(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    dag = write_dag(tmp_path / "w.dag", "TASK A -F ./x=dest /bin/true\n")
    r = pmc(["run", "--workers", "1", dag.name], tmp_path)
    assert r.returncode == 1
    got = r.stderr.splitlines()
    i = got.index("[error] Task A: ./x is not a file")
    assert got[i + 1] == "[error] Task A failed with exitcode 256"
