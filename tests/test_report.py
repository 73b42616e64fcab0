"""``pmc report``: figures of a hand-written event log checked against hand-computed values,
a real run's log against its summary, the PNG plot, and usage errors."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from pmctest import clean_env, pmc, write_dag

START = 1000.0


def ev(event: str, **fields: object) -> str:
    return json.dumps({"timestamp": START, "level": "info", "event": event, **fields})


def end(task: str, attempt: int, host: str, start: float, duration: float, outcome: str,
        status: int = 0, error: str | None = None, cpus: int = 1) -> str:
    return ev("task.finished" if outcome == "succeeded" else "task.failed", task=task,
              **{"try": attempt}, rank=1 if host == "h1" else 2, host=host, cpus=cpus,
              memory=0, outcome=outcome, status=status, start=START + start,
              duration=duration, cpu_time=0.0, max_rss_kb=100, error=error)


HAND_LOG = "\n".join([
    "[INFO] rank 1: a worker's text line is skipped",
    ev("workflow.started", dag="hand.dag", tasks=4, recovered=1, slots=2, cpus=4,
       start=START),
    ev("host", host="h1", slots=1, cpus=2),
    ev("host", host="h2", slots=1, cpus=2),
    ev("task.ready", task="A"),
    # h1: A [0, 2) ok, C [2, 3) failed for good, each on 2 cpus.  h2: B [0, 1) failed, B
    # again [1, 4) ok, on 1 cpu.
    end("A", 1, "h1", 0.0, 2.0, "succeeded", cpus=2),
    end("B", 1, "h2", 0.0, 1.0, "retry", status=1 << 8),
    ev("task.retried", task="B", **{"try": 2}),
    end("B", 2, "h2", 1.0, 3.0, "succeeded"),
    end("C", 1, "h1", 2.0, 1.0, "failed", status=9, error="boom", cpus=2),
    ev("workflow.finished", outcome="failed", wall=5.0, slots=2, cpus=4, runtime=7.0),
    '{"torn": ',
]) + "\n"


def test_hand_computed_figures(tmp_path: Path) -> None:
    log = tmp_path / "hand.jsonl"
    log.write_text(HAND_LOG)
    r = pmc(["report", "--bin", "1", log.name], tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    # TTX = wall = 5 s; runtime 2 + 1 + 3 + 1 = 7 s; RU = (2x2 + 1 + 3 + 1x2) / (5 x 4
    # cpus), beside the slots' 7 / (5 x 2).
    assert "TTX (time to execution): 5.000 s" in out
    assert "Summed task runtime: 7.000 s" in out
    assert "Slots: 2, cpus: 4" in out
    assert "RU (resource utilisation): 0.500 of the cpus' time (0.700 of the slots')" in out
    assert "Throughput: 0.800 tasks/s" in out  # 4 tries in 5 s
    assert "Concurrency: max 2, mean 1.400" in out
    assert "Task tries: 4 (2 succeeded, 1 retried, 1 failed)" in out
    assert "Tasks in DAG: 4 (1 done before this run)" in out
    assert "Outcome: failed" in out
    # Bins of 1 s: a try ending on a bin edge counts in the bin that starts there.
    rows = re.findall(r"^\s+(\d+\.\d{3})\s+(\d+)\s+(\d+\.\d{3})\s+(\d+\.\d{3})$", out, re.M)
    assert rows == [
        ("0.000", "0", "0.000", "2.000"),
        ("1.000", "1", "1.000", "2.000"),
        ("2.000", "1", "1.000", "2.000"),
        ("3.000", "1", "1.000", "1.000"),
        ("4.000", "1", "1.000", "0.000"),
    ]
    hosts = re.findall(r"^\s+(h\d)\s+(\d+)\s+(\d+\.\d{3})\s+(\d+)\s+(\d+\.\d{3})\s+(\d+)"
                       r"\s+(\d+\.\d{3})$", out, re.M)
    # h1: 3 s of 1 slot, 6 cpu-seconds of 2 cpus; h2: 4 s of 1 slot, 4 of 2 cpus.
    assert hosts == [("h1", "2", "3.000", "1", "0.600", "2", "0.600"),
                     ("h2", "2", "4.000", "1", "0.800", "2", "0.400")]
    slow = re.findall(r"^  (\w) try (\d): (\d+\.\d{3}) s on (h\d)", out, re.M)
    assert slow[:2] == [("B", "2", "3.000", "h2"), ("A", "1", "2.000", "h1")]
    assert "Tries that did not succeed: 2" in out
    # Statuses are raw wait statuses, shown with what they mean.
    assert "  B try 1: status 256 (exit code 1), retried" in out
    assert "  C try 1: status 9 (signal 9), failed: boom" in out


def test_top_limits_the_slowest_list(tmp_path: Path) -> None:
    log = tmp_path / "hand.jsonl"
    log.write_text(HAND_LOG)
    r = pmc(["report", "--top", "1", log.name], tmp_path)
    assert r.returncode == 0
    assert "Slowest tries (top 1):\n  B try 2: 3.000 s on h2" in r.stdout
    assert "A try 1: 2.000 s" not in r.stdout


def test_unfinished_run_uses_the_last_task_end(tmp_path: Path) -> None:
    lines = HAND_LOG.splitlines()
    log = tmp_path / "cut.jsonl"
    log.write_text("\n".join(line for line in lines if "workflow.finished" not in line))
    r = pmc(["report", log.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Outcome: did not finish" in r.stdout
    assert "TTX (time to execution): 4.000 s" in r.stdout  # B's second try ends at 4 s
    assert "RU (resource utilisation): 0.625" in r.stdout  # 10 / (4 x 4)


def test_several_runs_in_one_log(tmp_path: Path) -> None:
    second = "\n".join([
        ev("workflow.started", dag="hand.dag", tasks=4, recovered=3, slots=1, cpus=1,
           start=2000.0),
        json.dumps({"event": "task.finished", "level": "info", "timestamp": 2000.0,
                    "task": "C", "try": 1, "host": "h1", "rank": 1, "start": 2000.0,
                    "duration": 0.5, "status": 0, "outcome": "succeeded"}),
        ev("workflow.finished", outcome="succeeded", wall=1.0, slots=1),
    ]) + "\n"
    log = tmp_path / "two.jsonl"
    log.write_text(HAND_LOG + second)
    r = pmc(["report", log.name], tmp_path)
    assert r.returncode == 0
    assert r.stdout.startswith("Run 2 of 2 in two.jsonl")
    assert "RU (resource utilisation): 0.500" in r.stdout
    r = pmc(["report", "--run", "1", log.name], tmp_path)
    assert "RU (resource utilisation): 0.500" in r.stdout
    r = pmc(["report", "--run", "3", log.name], tmp_path)
    assert r.returncode == 2
    assert "holds 2 run(s), no run 3" in r.stderr


def test_report_of_a_real_run_agrees_with_its_summary(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "real.dag", "".join(
        f"TASK t{i} /bin/sh -c 'sleep 0.05'\n" for i in range(6)) + "TASK bad /bin/false\n")
    run = pmc(["run", "--workers", "2", "--log-format", "json", "--log-file", "ev.jsonl",
               dag.name], tmp_path)
    assert run.returncode == 1, run.stderr
    end_event = next(json.loads(line) for line in
                     (tmp_path / "ev.jsonl").read_text().splitlines()
                     if '"workflow.finished"' in line)
    r = pmc(["report", "ev.jsonl"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"TTX (time to execution): {end_event['wall']:.3f} s" in r.stdout
    assert (f"RU (resource utilisation): {end_event['cpu_utilization']:.3f} of the cpus' "
            f"time ({end_event['utilization']:.3f} of the slots')") in r.stdout
    assert "Task tries: 7 (6 succeeded, 1 failed)" in r.stdout
    assert "  bad try 1: status 256 (exit code 1), failed" in r.stdout


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="matplotlib not installed (pip install '.[plot]')")
def test_plot_writes_a_png(tmp_path: Path) -> None:
    log = tmp_path / "hand.jsonl"
    log.write_text(HAND_LOG)
    r = pmc(["report", "--plot", "out.png", log.name], tmp_path)
    assert r.returncode == 0, r.stderr
    data = (tmp_path / "out.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    assert "Plot written to out.png" in r.stdout


def test_plot_without_matplotlib_says_so(tmp_path: Path) -> None:
    # A package that fails to import stands in for a missing matplotlib.
    fake = tmp_path / "fake" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    log = tmp_path / "hand.jsonl"
    log.write_text(HAND_LOG)
    r = pmc(["report", "--plot", "out.png", log.name], tmp_path,
            env=clean_env(PYTHONPATH=str(tmp_path / "fake")))
    assert r.returncode == 2
    assert "--plot needs matplotlib" in r.stderr
    assert not (tmp_path / "out.png").exists()


def test_usage_errors(tmp_path: Path) -> None:
    r = pmc(["report", "nope.jsonl"], tmp_path)
    assert r.returncode == 2
    assert "nope.jsonl" in r.stderr
    (tmp_path / "text.log").write_text("[INFO] Host vm: 1 worker(s)\n")
    r = pmc(["report", "text.log"], tmp_path)
    assert r.returncode == 2
    assert "no workflow.started event" in r.stderr
    (tmp_path / "bad.jsonl").write_text(ev("workflow.started", slots=1, start=START) + "\n"
                                        + ev("task.finished", task="A") + "\n")
    r = pmc(["report", "bad.jsonl"], tmp_path)
    assert r.returncode == 2
    assert "bad.jsonl:2: task.finished event without a usable 'start'" in r.stderr


def test_retries_and_stops_are_not_failures(tmp_path: Path) -> None:
    """A run stopped at its wall time after a retry: each try counted, and binned for the
    plot, as what it was."""
    from pmc.commands.report import compute, read_runs

    log = tmp_path / "stop.jsonl"
    log.write_text("\n".join([
        ev("workflow.started", dag="stop.dag", tasks=3, slots=2, start=START),
        end("A", 1, "h1", 0.0, 1.0, "succeeded"),
        end("B", 1, "h2", 0.0, 1.0, "retry", status=1 << 8),
        end("B", 2, "h2", 1.0, 1.0, "failed", status=1 << 8),
        end("C", 1, "h1", 1.0, 2.0, "stopped", status=15, error="wall time"),
        ev("workflow.finished", outcome="incomplete", wall=3.0, slots=2, runtime=5.0),
    ]) + "\n")
    r = pmc(["report", "--bin", "1", log.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Task tries: 4 (1 succeeded, 1 retried, 1 failed, 1 stopped)" in r.stdout
    assert "  C try 1: status 15 (signal 15), stopped: wall time" in r.stdout
    fig = compute(read_runs(str(log))[0], 1.0)
    assert fig.ended_by_outcome == {"succeeded": [0, 1, 0], "retry": [0, 1, 0],
                                    "failed": [0, 0, 1], "stopped": [0, 0, 1]}
