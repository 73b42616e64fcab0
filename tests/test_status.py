"""``pmc status``: counts and exit codes of finished, failed, stopped, running and never-run
workflows, from the status snapshot, the rescue log and jobstate.log."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

from pmctest import clean_env, pmc, write_dag


def status(dag: Path) -> subprocess.CompletedProcess[str]:
    return pmc(["status", dag.name], dag.parent)


def fields(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^(\w[\w ]*): (\S+)", stdout, re.M))


def test_finished_ok(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "ok.dag", "TASK a /bin/true\nTASK b /bin/true\nEDGE a b\n")
    assert pmc(["run", "--workers", "1", dag.name], tmp_path).returncode == 0
    r = status(dag)
    assert r.returncode == 0, r.stdout + r.stderr
    f = fields(r.stdout)
    assert (f["tasks"], f["done"], f["running"], f["failed"], f["remaining"]) == \
        ("2", "2", "0", "0", "0")
    assert r.stdout.startswith("ok.dag: succeeded")


def test_names_each_host_with_its_cpus_memory_and_tasks(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "h.dag", "TASK a /bin/true\nTASK b /bin/true\n")
    assert pmc(["run", "--workers", "1", "--host-cpus", "3", "--host-memory", "700",
                dag.name], tmp_path).returncode == 0
    r = status(dag)
    assert r.returncode == 0, r.stdout + r.stderr
    host = os.uname().nodename
    assert re.search(rf"^host {re.escape(host)}: 3 cpus, 700 MB memory, ran 2 tasks "
                     r"\(\d+\.\d s\)$", r.stdout, re.M), r.stdout


def test_failed_task(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "f.dag", "TASK a /bin/true\nTASK b /bin/false\n"
                    "TASK c /bin/true\nTASK d /bin/true\nEDGE b c\nEDGE c d\n")
    assert pmc(["run", "--workers", "1", dag.name], tmp_path).returncode == 1
    r = status(dag)
    assert r.returncode == 1, r.stdout + r.stderr
    f = fields(r.stdout)
    assert (f["tasks"], f["done"], f["running"], f["failed"], f["remaining"]) == \
        ("4", "1", "0", "1", "2")
    assert "failed tasks: b" in r.stdout


def test_stopped_by_max_wall_time(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK a /bin/true\nTASK b /bin/true\n"
                    "TASK slow /bin/sleep 60\nTASK after /bin/true\nEDGE slow after\n")
    # 0.02 minutes: the slow task is killed when the limit is reached.
    run = pmc(["run", "--workers", "1", "--max-wall-time", "0.02", dag.name], tmp_path)
    assert run.returncode == 3, run.stderr
    r = status(dag)
    assert r.returncode == 3, r.stdout + r.stderr
    f = fields(r.stdout)
    assert (f["tasks"], f["done"], f["running"], f["failed"], f["remaining"]) == \
        ("4", "2", "0", "0", "2")
    assert r.stdout.startswith("w.dag: incomplete (maximum wall time")
    # Resuming finishes it; status follows.
    dag.write_text("TASK a /bin/true\nTASK b /bin/true\nTASK slow /bin/true\n"
                   "TASK after /bin/true\nEDGE slow after\n")
    assert pmc(["run", "--workers", "1", dag.name], tmp_path).returncode == 0
    r = status(dag)
    assert r.returncode == 0
    assert "done: 4 (2 from earlier runs)" in r.stdout


def test_running_workflow(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    waiter = f"/bin/sh -c 'while [ ! -e {gate} ]; do sleep 0.05; done'"
    dag = write_dag(tmp_path / "live.dag", f"TASK a /bin/true\nTASK w1 {waiter}\n"
                    f"TASK w2 {waiter}\nTASK last /bin/true\nEDGE w1 last\nEDGE w2 last\n")
    proc = subprocess.Popen([sys.executable, "-m", "pmc", "run", "--workers", "2", dag.name],
                            cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        # The snapshot is refreshed about once a second: poll until both waiters show.
        seen = None
        for _ in range(600):
            r = status(dag)
            f = fields(r.stdout)
            if f.get("running") == "2" and f.get("done") == "1":
                seen = r
                break
            time.sleep(0.1)
        assert seen is not None, r.stdout
        assert seen.returncode == 3
        assert seen.stdout.startswith(f"live.dag: running (pid {proc.pid} on ")
        assert fields(seen.stdout)["remaining"] == "1"
        assert re.search(r"^running tasks: (w1 w2|w2 w1)$", seen.stdout, re.M)
        gate.touch()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    r = status(dag)
    assert r.returncode == 0
    assert fields(r.stdout)["done"] == "4"


def test_killed_master_is_incomplete(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "k.dag", "TASK a /bin/true\nTASK b /bin/sleep 60\n")
    proc = subprocess.Popen([sys.executable, "-m", "pmc", "run", "--workers", "1", dag.name],
                            cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(600):
            if fields(status(dag).stdout).get("running") == "1":
                break
            time.sleep(0.1)
        os.killpg(proc.pid, 9)  # master, workers and the task: nothing finishes
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    r = status(dag)
    assert r.returncode == 3
    assert f"interrupted (the master (pid {proc.pid}) is gone" in r.stdout
    f = fields(r.stdout)
    assert (f["done"], f["running"], f["remaining"]) == ("1", "0", "1")


def test_never_run(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "n.dag", "TASK a /bin/true\nTASK b /bin/true\n")
    r = status(dag)
    assert r.returncode == 3
    f = fields(r.stdout)
    assert (f["done"], f["remaining"]) == ("0", "2")
    assert r.stdout.startswith("n.dag: not started")


def test_jobstate_log_without_snapshot(tmp_path: Path) -> None:
    """A run that left no snapshot (another PMC): jobstate.log tells running and failed."""
    dag = write_dag(tmp_path / "j.dag", "TASK a /bin/true\nTASK b /bin/true\n"
                    "TASK c /bin/true\nTASK d /bin/true\n")
    (tmp_path / "j.dag.rescue").write_text("\nDONE a")
    (tmp_path / "jobstate.log").write_text(
        "1.000000 INTERNAL *** PMC_STARTED ***\n"
        "1.000000 a SUBMIT 1.0 - - 1\n1.000000 b SUBMIT 2.0 - - 2\n"
        "1.000000 c SUBMIT 3.0 - - 3\n"
        "1.100000 a EXECUTE 1.0 - - 1\n1.100000 b EXECUTE 2.0 - - 2\n"
        "1.200000 a JOB_TERMINATED 1.0 - - 1\n1.200000 a JOB_SUCCESS 0 - - 1\n"
        "1.300000 b JOB_TERMINATED 2.0 - - 2\n1.300000 b JOB_FAILURE 1 - - 2\n"
        "1.400000 c EXECUTE 3.0 - - 3\n")
    r = status(dag)
    assert r.returncode == 3
    f = fields(r.stdout)
    assert (f["done"], f["running"], f["failed"], f["remaining"]) == ("1", "1", "1", "1")
    with (tmp_path / "jobstate.log").open("a") as log:
        log.write("1.500000 c JOB_TERMINATED 3.0 - - 3\n1.500000 c JOB_FAILURE 2 - - 3\n"
                  "1.600000 INTERNAL *** PMC_FINISHED 1 ***\n")
    r = status(dag)
    assert r.returncode == 1
    f = fields(r.stdout)
    assert (f["done"], f["running"], f["failed"], f["remaining"]) == ("1", "0", "2", "1")


def test_snapshot_is_valid_json_after_a_run(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "s.dag", "TASK a /bin/true\n")
    assert pmc(["run", "--workers", "1", dag.name], tmp_path).returncode == 0
    snap = json.loads((tmp_path / "s.dag.status.json").read_text())
    assert (snap["state"], snap["tasks"], snap["succeeded"], snap["failed"]) == \
        ("succeeded", 1, 1, 0)
    assert not list(tmp_path.glob("*.tmp.*")), "no temporary snapshot left"


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "t.dag", "TASK a /bin/true\nTASK b /bin/false\n")
    assert pmc(["run", "--workers", "1", dag.name], tmp_path).returncode == 1
    master, slave = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "pmc", "status", dag.name],
                              cwd=tmp_path, env=clean_env(), stdout=slave,
                              stderr=subprocess.PIPE, timeout=60)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
    text = out.decode()
    assert proc.returncode == 1
    assert re.search(r"\[#+\.+\]\s+50\.0%\s+1/2", text), text
    assert "1 done, 0 running, 1 failed, 0 remaining" in text


def test_usage_errors(tmp_path: Path) -> None:
    r = pmc(["status", "missing.dag"], tmp_path)
    assert r.returncode == 2
    assert "missing.dag" in r.stderr
    r = pmc(["status"], tmp_path)
    assert r.returncode == 2


def test_json_and_watch_follow_a_run_to_its_end(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    waiter = f"/bin/sh -c 'while [ ! -e {gate} ]; do sleep 0.05; done'"
    dag = write_dag(tmp_path / "w.dag", f"TASK a /bin/true\nTASK w {waiter}\nEDGE a w\n")
    run = subprocess.Popen([sys.executable, "-m", "pmc", "run", "--workers", "1", dag.name],
                           cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    watch = None
    try:
        for _ in range(600):  # until the snapshot shows the run
            snap = json.loads(pmc(["status", "--json", dag.name], tmp_path).stdout)
            if snap["state"] == "running" and snap["running"] == 1:
                break
            time.sleep(0.1)
        assert (snap["live"], snap["done"], snap["tasks"], snap["exit_code"]) == \
            (True, 1, 2, 3)
        assert snap["running_tasks"] == ["w"]
        watch = subprocess.Popen(
            [sys.executable, "-m", "pmc", "status", "--watch", "0.2", "--json", dag.name],
            cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, text=True)
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())
        assert first["state"] == "running"
        gate.touch()
        assert run.wait(timeout=60) == 0
        rest = [json.loads(line) for line in watch.stdout]
        # It stops by itself once the run has ended, with the run's exit code.
        assert watch.wait(timeout=60) == 0
    finally:
        for p in (run, watch):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert rest, "no status after the run ended"
    assert (rest[-1]["state"], rest[-1]["done"], rest[-1]["live"]) == ("succeeded", 2, False)
    assert all(s["state"] == "running" for s in rest[:-1])
