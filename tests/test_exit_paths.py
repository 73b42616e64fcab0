"""The run's edges: task output merged into -o/-e on every exit, files that cannot be
written refused before any task runs, and the DAG lock PMC takes (POSIX fcntl)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faults.faultkit import all_pids, environ
from pmctest import clean_env, pmc, write_dag


def record_names(text: str) -> list[str]:
    return [line.split("name=")[1].split(",")[0] for line in text.splitlines()
            if line.startswith("[cluster-task ")]


def test_a_failed_run_merges_output_and_records_after_the_summary(launch,
                                                                  tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag",
                    'TASK ok /bin/sh -c "echo out-ok; echo err-ok >&2"\n'
                    'TASK bad /bin/sh -c "echo out-bad; echo err-bad >&2; exit 3"\n'
                    "TASK never /bin/true\nEDGE bad never\n")
    r = launch([dag.name], tmp_path)
    assert r.returncode == 1, r.stderr
    out = r.stdout
    # PMC writes the summary first, then each worker's task output with its records.
    assert out.startswith('[cluster-summary stat="failed", tasks=3,'), out
    assert sorted(record_names(out)) == ["bad", "ok"]
    assert out.index("out-ok\n") < out.index("[cluster-task name=ok,")
    assert out.index("out-bad\n") < out.index("[cluster-task name=bad,")
    assert "status=768," in out.split("[cluster-task name=bad,")[1].splitlines()[0]
    assert "err-ok\n" in r.stderr and "err-bad\n" in r.stderr
    assert not [p.name for p in tmp_path.iterdir() if ".out." in p.name or ".err." in p.name]
    assert r.stderr.index("[info] Merging task stdio from workers...") > r.stderr.index(
        "[info] Workflow finished")


def test_failure_limit_merges_into_the_o_and_e_files(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "".join(
        f'TASK f{i} /bin/sh -c "echo out{i}; echo err{i} >&2; exit 1"\n' for i in range(4)))
    r = pmc(["run", "--workers", "1", "-m", "2", "-o", "o.txt", "-e", "e.txt", dag.name],
            tmp_path)
    assert r.returncode == 1, r.stderr
    assert "[error] Max failures reached: DAG prematurely aborted\n" in r.stderr
    out = (tmp_path / "o.txt").read_text()
    assert sorted(record_names(out)) == ["f0", "f1"]
    assert "out0\n" in out and "out1\n" in out
    assert (tmp_path / "e.txt").read_text() == "err0\nerr1\n"
    # The summary stays on stdout, as PMC's.
    assert r.stdout.startswith('[cluster-summary stat="failed"') and "out0" not in r.stdout
    assert not list(tmp_path.glob("w.dag.out.*")) and not list(tmp_path.glob("w.dag.err.*"))


def test_same_file_for_o_and_e_gets_each_workers_output_then_its_errors(
        tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", 'TASK a /bin/sh -c "echo to-out; echo to-err >&2"\n')
    r = pmc(["run", "--workers", "1", "-o", "both.txt", "-e", "both.txt", dag.name],
            tmp_path)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "both.txt").read_text().splitlines()
    assert lines[0] == "to-out" and lines[1].startswith("[cluster-task name=a,")
    assert lines[2:] == ["to-err"]


def test_signal_merges_the_output_of_killed_tasks(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag",
                    'TASK slow /bin/sh -c "echo begun; touch started; sleep 60"\n'
                    "TASK later /bin/true\nEDGE slow later\n")
    proc = subprocess.Popen([sys.executable, "-m", "pmc", "run", "--workers", "1", "-o",
                             "o.txt", dag.name], cwd=tmp_path, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if (tmp_path / "started").exists():
                break
            time.sleep(0.05)
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, err
    assert "[fatal] Caught signal 15\n" in err and "[error] Aborting workflow\n" in err
    merged = (tmp_path / "o.txt").read_text()
    assert merged.startswith("begun\n") and record_names(merged) == ["slow"]
    assert out.startswith('[cluster-summary stat="failed"')


@pytest.mark.parametrize(("option", "message"), [
    (["-o", "/nonexistent/x"], "Unable to open stdout file: /nonexistent/x"),
    (["-e", "/nonexistent/x"], "Unable to open stderr file: /nonexistent/x"),
    (["-r", "/nonexistent/x"], "Unable to open rescue file: /nonexistent/x"),
    (["--log-file", "/nonexistent/x"], "Unable to open log file: /nonexistent/x"),
])
def test_unwritable_paths_stop_the_run_before_any_task(option: list[str], message: str,
                                                       tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", f"TASK a /bin/sh -c 'touch {tmp_path}/ran'\n")
    before = set(os.listdir(tmp_path))
    r = pmc(["run", "--workers", "1", *option, dag.name], tmp_path)
    assert r.returncode == 1
    assert r.stderr == f"[fatal] {message}: No such file or directory\n"
    assert r.stdout == ""
    assert set(os.listdir(tmp_path)) == before, "nothing written, no task run"


# Over the edge helper's size (pmc.dag.edgehelper.MIN_BYTES), where the workers start
# once the DAG is read: comment lines, one task.
BIG = "TASK a /bin/true\n" + ("# " + "x" * 1021 + "\n") * 8201  # 8,201 KiB of comments


@pytest.mark.parametrize(("dag_text", "option", "code", "message"), [
    ("TASK a /bin/true\nEDGE a b\n", [], 2, "w.dag:2: EDGE names unknown task 'b'"),
    ("TASK a /bin/true\n", ["-o", "/nonexistent/x"], 1, "Unable to open stdout file"),
    (BIG, ["-o", "/nonexistent/x"], 1, "Unable to open stdout file"),
    (BIG + "EDGE a b\n", [], 2, "w.dag:8203: EDGE names unknown task 'b'"),
], ids=["bad-dag", "unwritable-o", "big-dag-unwritable-o", "big-bad-dag"])
def test_workers_started_for_a_run_that_cannot_start_are_gone_when_it_returns(
        dag_text: str, option: list[str], code: int, message: str, tmp_path: Path) -> None:
    # The embedded workers start before the DAG is read (their start-up overlaps the
    # master's): a run that stops before its hand-shake tells them so, and waits for them.
    dag = write_dag(tmp_path / "w.dag", dag_text)
    mark = f"{os.getpid()}.{time.monotonic_ns()}"
    r = pmc(["run", "--workers", "2", *option, dag.name], tmp_path,
            env=clean_env(PMC_TEST_MARK=mark))
    assert r.returncode == code, r.stderr
    assert message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert [p for p in all_pids() if environ(p).get("PMC_TEST_MARK") == mark] == []
    assert not [p for p in os.listdir(tmp_path) if p != "w.dag"]


def test_a_big_dag_runs_embedded_with_its_workers_started_after_it_is_read(
        tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", BIG.replace("/bin/true", "/bin/echo ran"))
    r = pmc(["run", "--workers", "2", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith('[cluster-summary stat="ok", tasks=1,'), r.stdout
    assert "\nran\n[cluster-task name=a," in r.stdout, r.stdout
    assert "[info] Workflow succeeded" in r.stderr


def test_unwritable_paths_stop_an_mpi_run_too(tmp_path: Path) -> None:
    from pmctest import pmc_mpi

    dag = write_dag(tmp_path / "w.dag", f"TASK a /bin/sh -c 'touch {tmp_path}/ran'\n")
    r = pmc_mpi(3, ["run", "-o", "/nonexistent/x", dag.name], tmp_path, timeout=60)
    assert r.returncode != 0
    assert "[fatal] Unable to open stdout file: /nonexistent/x: No such file or directory" \
        in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "ran").exists()


def test_the_dag_lock_is_a_posix_lock_held_for_the_whole_run(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag",
                    "TASK wait /bin/sh -c 'touch started; while [ ! -e release ]; do "
                    "sleep 0.05; done'\n")
    proc = subprocess.Popen([sys.executable, "-m", "pmc", "run", "--workers", "1", dag.name],
                            cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if (tmp_path / "started").exists():
                break
            time.sleep(0.05)
        assert (tmp_path / "started").exists()
        # PMC's own lock call (fcntl F_SETLK, F_WRLCK) from another process fails while
        # the run holds the DAG, however far it is past parsing.
        with open(dag, "r+") as f:
            with pytest.raises(OSError) as held:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert held.value.errno in (11, 13)  # EAGAIN, EACCES
        second = pmc(["run", "--workers", "1", dag.name], tmp_path)
        assert second.returncode == 1
        assert second.stderr == (
            f"[fatal] DAG file is already locked by another process: {dag.name}: Resource "
            "temporarily unavailable (another run of this workflow holds it; use -n/--nolock "
            "to skip locking)\n")
    finally:
        (tmp_path / "release").touch()
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    with open(dag, "r+") as f:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released at the end


def test_a_read_only_dag_needs_nolock_as_in_pmc(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root opens a read-only file for writing")
    dag = write_dag(tmp_path / "w.dag", "TASK a /bin/true\n")
    dag.chmod(0o444)
    r = pmc(["run", "--workers", "1", dag.name], tmp_path)
    assert r.returncode == 1
    assert r.stderr == (f"[fatal] Unable to open DAG file: {dag.name}: Permission denied "
                        "(use -n/--nolock to run without the lock)\n")
    assert pmc(["run", "--workers", "1", "-n", dag.name], tmp_path).returncode == 0
