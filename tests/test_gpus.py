"""GPUs as a scheduled resource (``--request-gpus``, ``--host-gpus``: pmc extensions),
with real runs and a declared inventory (no GPU needed): each task gets its own device
ids, no two running tasks share one, the job's own set is what is handed out, and a
task asking for more than any host has stops the run at the start."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pmctest import clean_env, pmc, pmc_mpi, write_dag
from prometheus_client.parser import text_string_to_metric_families

# Each task writes, to its own file: its start time, the three variables, its end time.
# "date +%s.%N" is the shell's clock: the same one for every task of a host.
RECORD = ("sh -c 'echo S $(date +%s.%N) [$CUDA_VISIBLE_DEVICES] [$ROCR_VISIBLE_DEVICES] "
          "[$PMC_GPUS] > {out}; sleep 0.3; echo E $(date +%s.%N) >> {out}'")


def gpu_dag(path: Path, n: int, gpus: int) -> Path:
    lines = [f"TASK t{i} --request-gpus {gpus} {RECORD.format(out=f'rec.{i}')}"
             for i in range(n)]
    lines.append("TASK plain sh -c 'echo [${CUDA_VISIBLE_DEVICES-unset}] "
                 "[${ROCR_VISIBLE_DEVICES-unset}] [${PMC_GPUS-unset}] > plain.txt'")
    return write_dag(path, "\n".join(lines) + "\n")


def records(cwd: Path, n: int) -> list[tuple[float, float, list[str], list[str], list[str]]]:
    """(start, end, CUDA ids, ROCR ids, PMC_GPUS ids) of each task."""
    out = []
    for i in range(n):
        first, last = (cwd / f"rec.{i}").read_text().splitlines()
        _s, start, cuda, rocr, pmc_gpus = first.split()
        ids = [v.strip("[]").split(",") if v != "[]" else [] for v in (cuda, rocr, pmc_gpus)]
        out.append((float(start), float(last.split()[1]), *ids))
    return out


def check_exclusive(recs: list[tuple[float, float, list[str], list[str], list[str]]],
                    gpus: int, allowed: set[str], most: int) -> None:
    for _start, _end, cuda, rocr, pmc_gpus in recs:
        assert cuda == rocr == pmc_gpus, "the three variables name the same devices"
        assert len(cuda) == len(set(cuda)) == gpus
        assert set(cuda) <= allowed
    # At each task's start: the tasks running then, and their devices.
    for start, _end, cuda, _r, _p in recs:
        now = [r for r in recs if r[0] <= start < r[1]]
        assert len(now) <= most, f"{len(now)} tasks ran at once"
        held = [g for r in now for g in r[2]]
        assert len(held) == len(set(held)), f"a device shared by running tasks: {held}"
        assert set(cuda) <= set(held)


def test_eight_tasks_of_two_gpus_on_a_four_gpu_host(tmp_path: Path) -> None:
    dag = gpu_dag(tmp_path / "g.dag", 8, 2)
    r = pmc(["run", "--local", "--workers", "4", "--host-gpus", "4", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    recs = records(tmp_path, 8)
    check_exclusive(recs, 2, {"0", "1", "2", "3"}, most=2)
    # With four slots the devices, not the slots, held it to two at once: some pair ran
    # together (both device pairs used).
    assert {tuple(r[2]) for r in recs} == {("0", "1"), ("2", "3")}
    # A task asking for no GPU, on a host that has some, sees none.
    assert (tmp_path / "plain.txt").read_text() == "[] [] []\n"


def test_gpus_under_mpiexec(tmp_path: Path) -> None:
    dag = gpu_dag(tmp_path / "g.dag", 8, 2)
    r = pmc_mpi(3, ["run", "--mpi", "--worker-slots", "2", "--host-gpus", "4", dag.name],
                tmp_path)
    assert r.returncode == 0, r.stderr
    check_exclusive(records(tmp_path, 8), 2, {"0", "1", "2", "3"}, most=2)
    assert (tmp_path / "plain.txt").read_text() == "[] [] []\n"


def test_the_jobs_own_set_is_what_tasks_get(tmp_path: Path) -> None:
    dag = gpu_dag(tmp_path / "g.dag", 4, 1)
    env = clean_env(CUDA_VISIBLE_DEVICES="2,3")
    r = pmc(["run", "--local", "--workers", "4", "--host-gpus", "2", dag.name], tmp_path,
            env=env)
    assert r.returncode == 0, r.stderr
    recs = records(tmp_path, 4)
    check_exclusive(recs, 1, {"2", "3"}, most=2)
    assert {r[2][0] for r in recs} == {"2", "3"}


def test_a_declared_count_the_job_set_contradicts_stops_the_run(tmp_path: Path) -> None:
    dag = gpu_dag(tmp_path / "g.dag", 1, 1)
    r = pmc(["run", "--local", "--workers", "1", "--host-gpus", "4", dag.name], tmp_path,
            env=clean_env(CUDA_VISIBLE_DEVICES="2,3"))
    assert r.returncode == 1
    assert "--host-gpus 4" in r.stderr and "CUDA_VISIBLE_DEVICES" in r.stderr
    assert "lost" not in r.stderr, "a worker that said why it cannot start is not lost"
    assert not (tmp_path / "rec.0").exists()


@pytest.mark.parametrize("mode", ["local", "mpi"])
def test_a_task_asking_for_more_gpus_than_a_host_has_is_refused_at_start(
        tmp_path: Path, mode: str) -> None:
    dag = write_dag(tmp_path / "o.dag",
                    "TASK fits --request-gpus 4 touch ran\nTASK big --request-gpus 5 touch ran\n")
    args = ["run", f"--{mode}", "--host-gpus", "4", dag.name]
    r = (pmc([*args[:2], "--workers", "2", *args[2:]], tmp_path) if mode == "local"
         else pmc_mpi(3, args, tmp_path))
    assert r.returncode == 1
    assert "FATAL ERROR: No host is capable of running task big" in r.stderr
    assert not (tmp_path / "ran").exists()
    assert not (tmp_path / "o.dag.rescue").exists()


def test_no_gpus_on_the_host_refuses_a_gpu_task(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "o.dag", "TASK g --request-gpus 1 touch ran\n")
    r = pmc(["run", "--local", "--workers", "1", "--host-gpus", "0", dag.name], tmp_path)
    assert r.returncode == 1
    assert "FATAL ERROR: No host is capable of running task g" in r.stderr


def test_status_metrics_and_report_show_gpus_and_a_multi_rank_tasks_hosts(
        tmp_path: Path) -> None:
    # The launcher template "env PMC_LAUNCHED={ranks}" starts the 2-rank task's program
    # once: what is looked at here is what pmc says of it, not MPI.
    gate = tmp_path / "gate"
    wait = f"sh -c 'while [ ! -e {gate} ]; do sleep 0.05; done'"
    dag = write_dag(tmp_path / "w.dag", f"TASK g --request-gpus 2 {wait}\n"
                                        f"TASK mr --ranks 2 --request-gpus 1 {wait}\n")
    host = socket.gethostname()
    run = subprocess.Popen(
        [sys.executable, "-m", "pmc", "run", "--local", "--workers", "2", "--host-cpus", "4",
         "--host-gpus", "4", "--task-launcher", "env PMC_LAUNCHED={ranks}",
         "--log-format", "json", "--log-file", "ev.jsonl", "--metrics-textfile", "m.prom",
         dag.name], cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            snap = json.loads(pmc(["status", "--json", dag.name], tmp_path).stdout)
            if snap["running"] == 2:
                break
            time.sleep(0.1)
        assert snap["gpus"] == {host: [4, 4]}, "2 for g, 1 per rank for mr"
        assert snap["multirank_tasks"] == {"mr": [host]}
        text = pmc(["status", dag.name], tmp_path).stdout
        assert f"multi-rank task mr on: {host}\n" in text
        assert f"gpus busy/total: {host} 4/4\n" in text
    finally:
        gate.touch()
        _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    prom = (tmp_path / "m.prom").read_text()
    families = {f.name: f for f in text_string_to_metric_families(prom)}
    assert [(s.labels["host"], s.value) for s in families["pmc_gpus"].samples] == \
        [(host, 4.0)]
    assert [(s.labels["host"], s.value) for s in families["pmc_gpus_busy"].samples] == \
        [(host, 0.0)]  # all ended
    report = pmc(["report", "ev.jsonl"], tmp_path)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    at = lines.index("GPUs per host (busy: GPU-seconds of tries / (TTX x GPUs)):")
    row = lines[at + 2].split()
    assert row[:2] == [host, "4"] and float(row[2]) > 0
    ends = [json.loads(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()]
    mr = next(e for e in ends if e["event"] == "task.finished" and e["task"] == "mr")
    assert (mr["gpus"], mr["ranks"], mr["host"]) == (1, 2, host)


def test_an_oversize_task_done_in_an_earlier_run_does_not_stop_the_next(
        tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "o.dag", "TASK big --request-gpus 5 touch big\n"
                                        "TASK next --request-gpus 1 touch next\nEDGE big next\n")
    (tmp_path / "o.dag.rescue").write_text("DONE big\n")
    r = pmc(["run", "--local", "--workers", "1", "--host-gpus", "4", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "next").exists() and not (tmp_path / "big").exists()


def test_a_lost_workers_gpus_go_back_to_its_host(tmp_path: Path) -> None:
    # The first try kills its worker (kill -9 of its parent): the task runs again on
    # another worker, which it can only if the lost try's 2 GPUs (all the host has) came
    # back. "after" then needs them too.
    first = ("sh -c 'if [ ! -e once ]; then touch once; kill -9 $PPID; sleep 30; fi; "
             "echo $PMC_GPUS >> gpus.log'")
    dag = write_dag(tmp_path / "l.dag", f"TASK lose --request-gpus 2 {first}\n"
                                        f"TASK after --request-gpus 2 {first}\n"
                                        "EDGE lose after\n")
    r = pmc(["run", "--local", "--workers", "2", "--host-gpus", "2", dag.name], tmp_path,
            timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Worker" in r.stderr and "was lost" in r.stderr
    assert (tmp_path / "gpus.log").read_text() == "0,1\n0,1\n"
