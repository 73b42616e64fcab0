"""Structured logs: the JSON event log of real runs (one terminal event per try, totals equal
to the summary record), the text format kept as PMC's ``[LEVEL] message`` lines, and
logging configured only by the command-line entry."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pmctest import clean_env, pmc, pmc_mpi, write_dag

from pmc import log
from pmc.core.protocol import describe
from pmc.logsetup import LogOutput, setup_logging
from pmc.options import RunOptions

TASK_FIELDS = {"task", "try", "rank", "host", "cpus", "memory"}
END_FIELDS = TASK_FIELDS | {"status", "duration", "cpu_time", "max_rss_kb", "start",
                            "outcome"}


def summary_record(stdout: str) -> dict[str, str]:
    m = re.search(r"^\[cluster-summary (.*)\]$", stdout, re.M)
    assert m, stdout
    return dict(re.findall(r'(\w+)="?([^",]*)"?', m.group(1)))


def read_events(path: Path) -> list[dict]:  # type: ignore[type-arg]
    events = []
    for line in path.read_text().splitlines():
        ev = json.loads(line)  # every line is one JSON object
        assert isinstance(ev, dict)
        assert isinstance(ev["level"], str) and isinstance(ev["event"], str)
        assert isinstance(ev["timestamp"], float)
        events.append(ev)
    return events


@pytest.fixture
def mixed_dag(tmp_path: Path) -> Path:
    """One success, one task that fails once then succeeds, one that always fails (its
    child never runs), and a multi-cpu task."""
    flaky = tmp_path / "flaky.sh"
    flaky.write_text("#!/bin/sh\nif [ -e seen ]; then exit 0; fi\ntouch seen\nexit 3\n")
    flaky.chmod(0o755)
    return write_dag(tmp_path / "mixed.dag", f"""\
TASK ok /bin/echo hello
TASK flaky {flaky}
TASK bad /bin/sh -c "exit 7"
TASK child /bin/true
TASK wide -c 2 /bin/true
EDGE bad child
""")


def check_log_against_summary(events: list[dict], stdout: str) -> None:  # type: ignore[type-arg]
    names = [e["event"] for e in events]
    assert names.count("workflow.started") == 1
    assert names.count("workflow.finished") == 1
    terminal = [e for e in events if e["event"] in ("task.finished", "task.failed")]
    tries = Counter((e["task"], e["try"]) for e in terminal)
    assert tries and all(n == 1 for n in tries.values()), "one end event per try"
    # Every try that was dispatched ended exactly once, and "started" came with it.
    dispatched = Counter((e["task"], e["try"]) for e in events
                         if e["event"] == "task.dispatched")
    started = Counter((e["task"], e["try"]) for e in events if e["event"] == "task.started")
    assert dispatched == tries == started
    for e in terminal:
        assert set(e) >= END_FIELDS, e
        assert e["rank"] >= 1 and e["host"]
    for e in events:
        if e["event"] in ("task.dispatched", "task.started"):
            assert set(e) >= TASK_FIELDS, e

    rec = summary_record(stdout)
    end = next(e for e in events if e["event"] == "workflow.finished")
    # The totals of the end event are the summary record's; the record counts tries
    # where it says submitted and failed (as the reference), and its extra is always 0.
    for key in ("tasks", "succeeded", "slots", "cpus"):
        assert str(end[key]) == rec[key], key
    assert str(end["tries_submitted"]) == rec["submitted"]
    assert str(end["tries_failed"]) == rec["failed"]
    assert rec["extra"] == "0"
    assert len(terminal) == end["tries_submitted"]
    assert sum(1 for e in terminal if e["outcome"] != "succeeded") == end["tries_failed"]
    assert f"{end['runtime']:.3f}" == rec["runtime"]
    assert f"{end['wall']:.3f}" == rec["duration"]
    assert ("ok" if end["ok"] else "failed") == rec["stat"]
    # ... and they add up from the task events.
    assert sum(1 for e in terminal if e["outcome"] == "succeeded") == end["succeeded"]
    assert sum(1 for e in terminal if e["outcome"] == "failed") == end["failed"]
    assert sum(1 for e in terminal if e["outcome"] == "retry") == end["extra"]
    assert names.count("task.retried") == end["extra"]
    assert sum(e["duration"] for e in terminal) == pytest.approx(end["runtime"], abs=1e-6)
    assert sum(e["cpu_time"] for e in terminal) == pytest.approx(end["cpu_time"], abs=1e-6)
    assert end["utilization"] == pytest.approx(end["runtime"] / (end["wall"] * end["slots"]))


def test_json_log_of_a_run_matches_the_summary(tmp_path: Path, mixed_dag: Path) -> None:
    r = pmc(["run", "--workers", "2", "-t", "2", "--log-format", "json", "--log-file",
             "events.jsonl", mixed_dag.name], tmp_path)
    assert r.returncode == 1, r.stderr
    events = read_events(tmp_path / "events.jsonl")
    check_log_against_summary(events, r.stdout)
    by_task = {(e["task"], e["event"]): e for e in events if "task" in e}
    assert by_task[("bad", "task.failed")]["status"] == 7 << 8  # the raw wait status
    assert by_task[("bad", "task.failed")]["outcome"] == "failed"
    assert by_task[("wide", "task.finished")]["cpus"] == 2
    rss = by_task[("ok", "task.finished")]["max_rss_kb"]
    started = next(e for e in events if e["event"] == "workflow.started")
    if started["accounting"].startswith("cgroup"):
        assert rss > 0
    else:  # rusage: a task below the worker's own high-water mark is unknown, not guessed
        assert rss is None or rss > 0
    assert ("child", "task.dispatched") not in by_task
    assert [e["try"] for e in events
            if e.get("task") == "flaky" and e["event"] == "task.failed"] == [1]
    # The PMC log lines are JSON objects too, with their usual text as the event.
    messages = {e["event"]: e["level"] for e in events}
    assert messages["Workflow failed"] == "error"
    assert messages["Task bad failed with exitcode 1792"] == "error"
    assert any(m.startswith("Resource utilization (without master):") for m in messages)
    hosts = [e for e in events if e["event"] == "host"]
    assert sum(h["slots"] for h in hosts) == 2
    # Nothing of the master's log went to stderr.
    assert "[info]" not in r.stderr and "[error]" not in r.stderr


def test_json_log_to_stderr(tmp_path: Path, mixed_dag: Path) -> None:
    r = pmc(["run", "--workers", "1", "--log-format", "json", mixed_dag.name], tmp_path)
    assert r.returncode == 1
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]
    assert {"workflow.started", "workflow.finished", "task.ready"} <= {e["event"]
                                                                        for e in events}


@pytest.mark.mpi
def test_json_log_under_mpiexec(tmp_path: Path, mixed_dag: Path) -> None:
    r = pmc_mpi(3, ["run", "-t", "2", "--log-format", "json", "--log-file", "ev.jsonl",
                    mixed_dag.name], tmp_path)
    assert r.returncode == 1, r.stderr
    events = read_events(tmp_path / "ev.jsonl")
    check_log_against_summary(events, r.stdout)
    assert next(e for e in events if e["event"] == "workflow.started")["mode"] == "mpi"


def test_a_resumed_run_appends_to_the_log(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "r.dag", "TASK a /bin/true\nTASK b /bin/false\n")
    args = ["run", "--workers", "1", "--log-format", "json", "--log-file", "ev.jsonl",
            dag.name]
    assert pmc(args, tmp_path).returncode == 1
    dag.write_text("TASK a /bin/true\nTASK b /bin/true\n")
    r = pmc(args, tmp_path)
    assert r.returncode == 0, r.stderr
    events = read_events(tmp_path / "ev.jsonl")
    starts = [e for e in events if e["event"] == "workflow.started"]
    assert [s["recovered"] for s in starts] == [0, 1]


def test_text_format_is_unchanged_by_default(tmp_path: Path, mixed_dag: Path) -> None:
    r = pmc(["run", "--workers", "1", mixed_dag.name], tmp_path)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert all(re.match(r"\[(fatal|error|warn|info)\] ", line) for line in lines), lines
    assert "[error] Task bad failed with exitcode 1792" in lines
    assert not any("task." in line for line in lines)
    assert not (tmp_path / "events.jsonl").exists()


def test_text_format_shows_task_events_at_debug(tmp_path: Path, mixed_dag: Path) -> None:
    r = pmc(["run", "--workers", "1", "-v", "--log-file", "pmc.log", mixed_dag.name],
            tmp_path)
    assert r.returncode == 1
    text = (tmp_path / "pmc.log").read_text()
    date = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+ "
    # The peak is there where cgroups measure it; with rusage a small task's is unknown,
    # and an unknown figure is left out of the line.
    rss = r" .*max_rss_kb=\d+" if "accounting=cgroup" in text else ""
    assert re.search(date + r"\[debug\] task\.finished task=ok seq=\d+ try=1 rank=1 host=\S+ "
                     r"cpus=1 memory=0 outcome=succeeded status=0 .*duration=\d+\.\d{3} "
                     r"cpu_time=\d+\.\d{3}" + rss, text, re.M), text
    assert re.search(date + r"\[debug\] task\.failed task=bad .*status=1792 ", text)
    assert "[info] Workflow succeeded" not in text
    assert re.search("^" + date + r"\[error\] Workflow failed$", text, re.M), text
    # Every line in the file carries the date, as PMC's lines in a log file do.
    assert all(re.match(date + r"\[(fatal|error|warn|info|debug|trace)\] ", line)
               for line in text.splitlines()), text
    # The log went to the file, not stderr (workers' own lines aside).
    assert "[error] Workflow failed" not in r.stderr


def test_log_lines_keep_their_exact_text() -> None:
    buf = io.StringIO()
    try:
        log.setup(log.INFO, stream=buf)
        log.info("Wall time: 1.000 seconds")
        log.debug("hidden")
        log.error("boom")
        log.setup(log.DEBUG, stream=buf, prefix="rank 2: ")
        log.debug("shown")
    finally:
        log.setup()
    assert buf.getvalue() == ("[info] Wall time: 1.000 seconds\n[error] boom\n"
                              "[debug] rank 2: shown\n")


def test_json_mode_turns_log_lines_into_objects(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    opts = RunOptions(dag="x.dag", log_format="json", log_file=str(path))
    try:
        out = setup_logging(opts)
        # Opened lazily: a rank that never logs through it never creates the file.
        assert not path.exists()
        log.warn("careful")
        log.debug("not at INFO")
        out.close()
    finally:
        log.setup()
    [ev] = [json.loads(line) for line in path.read_text().splitlines()]
    assert (ev["level"], ev["event"]) == ("warn", "careful")


def test_importing_configures_nothing() -> None:
    # No exit hook either (the event log's is registered when it first holds events).
    code = ("import atexit, structlog, prometheus_client\n"
            "hooks = atexit._ncallbacks()\n"
            "import pmc.log, pmc.outputs.assemble, pmc.outputs.metrics, "
            "pmc.outputs.status, pmc.commands.status, pmc.commands.report, "
            "pmc.commands.cli\n"
            "assert atexit._ncallbacks() == hooks, atexit._ncallbacks()\n"
            "assert not structlog.is_configured()\n"
            "assert pmc.log._sink is None and pmc.log._stream is None\n"
            "import logging\n"
            "assert not logging.getLogger().handlers\n")
    r = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def test_log_output_rejects_unknown_format() -> None:
    with pytest.raises(ValueError):
        LogOutput("xml")


@pytest.mark.parametrize("mode", ["local", "mpi"])
def test_worker_messages_follow_the_log_format(mode: str, tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    dag = write_dag(tmp_path / "w.dag", "TASK gone -F adir=dest /bin/true\n")
    args = ["run", "--log-format", "json", dag.name]
    r = pmc(args, tmp_path) if mode == "local" else pmc_mpi(3, args, tmp_path)
    assert r.returncode == 1
    lines = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
    assert not [line for line in r.stderr.splitlines() if line.startswith("[")], r.stderr
    worker = [e for e in lines if "rank" in e and e["event"] == "Task gone: adir is not a file"]
    assert len(worker) == 1 and worker[0]["level"] == "error" and worker[0]["rank"] >= 1


class _Clock:
    """A stand-in for the ``time`` of pmc.outputs.eventlog and logsetup: the same
    timestamp for every event."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return 0.0


class _StructlogEvents:
    """The task events as they were written before they bypassed structlog."""

    def __init__(self, out: LogOutput) -> None:
        self.emit = out.logger.info
        self.where: dict[int, tuple[int, str]] = {}

    def ready(self, task: Any, seq: int) -> None:
        self.emit("task.ready", task=task.name, seq=seq, cpus=task.cpus, memory=task.memory)

    def dispatched(self, task: Any, seq: int, attempt: int, rank: int, host: str) -> None:
        self.where[task.id] = (rank, host)
        self.emit("task.dispatched", task=task.name, seq=seq, **{"try": attempt}, rank=rank,
                  host=host, cpus=task.cpus, memory=task.memory)

    def task_started(self, task: Any, seq: int, attempt: int, rank: int, host: str,
                     start: float) -> None:
        self.emit("task.started", timestamp=start, task=task.name, seq=seq,
                  **{"try": attempt}, rank=rank, host=host, cpus=task.cpus,
                  memory=task.memory)

    def ended(self, task: Any, seq: int, res: Any, error: str | None) -> None:
        if res.status == 0 and error is None:
            self.result(task, seq, res, "succeeded", True)

    def result(self, task: Any, seq: int, res: Any, outcome: str, now: bool = False) -> None:
        if outcome == "succeeded" and not now:
            return
        rank, host = self.where.pop(task.id, (-1, ""))
        emit = self.emit
        ts = res.start + res.duration
        if not -float("inf") < ts < float("inf"):
            from pmc.outputs import eventlog
            ts = eventlog.time.time()  # the test's clock
        extra: dict[str, Any] = {}
        error = res.error
        if outcome != "succeeded":
            if error is None:
                error = ("killed by its memory limit (cgroup OOM kill)" if res.oom_killed
                         else describe(res.status))
            extra = {"oom_killed": res.oom_killed, "stderr": res.stderr_path,
                     "stderr_tail": res.stderr_tail}
        emit("task.finished" if outcome == "succeeded" else "task.failed", timestamp=ts,
             task=task.name, seq=seq, **{"try": res.attempt}, rank=rank, host=host,
             cpus=task.cpus, memory=task.memory, outcome=outcome, status=res.status,
             start=res.start, duration=res.duration, cpu_time=res.cpu_time,
             user_cpu=res.user_cpu, system_cpu=res.system_cpu,
             max_rss_kb=res.max_rss_kb, error=error, **extra)
        if outcome == "retry":
            emit("task.retried", timestamp=ts, task=task.name, seq=seq,
                 **{"try": res.attempt + 1})


@pytest.mark.parametrize("now", [1795332368.0253382, 1e9, 1795332368.5])
def test_direct_task_events_are_what_structlog_renders(
        now: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-task JSON lines are written without structlog: byte for byte what the
    structlog chain made of the same calls, values of unusual types included."""
    from pmc import logsetup
    from pmc.core.protocol import TaskResult
    from pmc.dag import Task
    from pmc.outputs import eventlog

    monkeypatch.setattr(eventlog, "time", _Clock(now))
    monkeypatch.setattr(logsetup, "time", _Clock(now))
    names = ["t0", 'we"ird\\name', "ünï\tcödé", "x" * 300]
    results = [
        ("succeeded", TaskResult(0, 1, 0, now - 1.5, 0.0012528309998, 0.000795, 25172,
                                 None, None)),
        ("succeeded", TaskResult(0, 1, 0, now - 1.5, 0.5, 0.25, None, None, None, 0.125,
                                 0.125)),
        ("failed", TaskResult(0, 1, 9, now, 0.5, 0.25, 204800, None, None, 0.125, 0.125,
                              True, "/x/t.err.000", "line 1\nline 2")),
        ("retry", TaskResult(0, 1, 3, now, 1e-7, 0.0, 0, None, None)),
        ("failed", TaskResult(0, 2, -9, now, 12345.678, 1.0, 1, 'exit "code" 1\n', None)),
        ("stopped", TaskResult(0, 1, 1, now, 0.5, 0.25, 99, "killé", None)),
        # Not what workers send, but must come out as before (rendered as structlog does).
        ("failed", TaskResult(0, 1, 1, now, float("nan"), float("inf"), 0, None, None)),
        ("succeeded", TaskResult(0, 1, 0, int(now), 0, 0, 0, None, None)),
        ("succeeded", TaskResult(0, True, 0, now, 0.5, 0.5, 0, None, None)),
        ("failed", TaskResult(0, 1, 1, now, 0.5, 0.5, 0, 42, None)),  # type: ignore[arg-type]
    ]
    outputs = []
    for make in (eventlog.EventLog, _StructlogEvents):
        path = tmp_path / f"{make.__name__}.jsonl"
        out = LogOutput("json", str(path))
        ev = make(out)
        for i, name in enumerate(names):
            task = Task(i, name, "/bin/true", cpus=1 + i, memory=100 * i)
            for seq, (outcome, res) in enumerate(results, 1):
                # Rendered one at a time: both write in call order (the held-back
                # events are sorted by time, which test_events_in_time_order covers).
                ev.ready(task, seq)
                out.flush()
                if seq != 3:  # a result without a dispatch: rank -1, host ""
                    ev.dispatched(task, seq, res.attempt, seq, f"host-{i}")
                    out.flush()
                    ev.task_started(task, seq, res.attempt, seq, f"host-{i}", res.start)
                    out.flush()
                ev.ended(task, seq, res._replace(id=i), res.error)
                out.flush()
                ev.result(task, seq, res._replace(id=i), outcome)
                out.flush()
        ev.ready(task, True)  # type: ignore[arg-type]
        ev.dispatched(task, True, 1, 1, "h")  # type: ignore[arg-type]
        out.flush()
        ev.ended(task, 1, results[0][1], None)
        ev.result(task, 1, results[0][1], "succeeded")
        out.close()
        outputs.append(path.read_text())
    fast, slow = outputs
    assert fast == slow
    assert len(fast.splitlines()) > 100
    assert '"timestamp":NaN' not in fast and '"duration":NaN' in fast


def test_held_back_task_events_keep_their_place(tmp_path: Path) -> None:
    """Task events are rendered later, together, but land where they happened: before a
    log message written after them, and at exit even without a close."""
    from pmc.dag import Task
    from pmc.outputs.eventlog import EventLog

    path = tmp_path / "ev.jsonl"
    out = LogOutput("json", str(path))
    ev = EventLog(out)
    task = Task(0, "a", "/bin/true")
    ev.ready(task, 1)
    ev.dispatched(task, 1, 1, 1, "h")
    out.message(log.WARN, "between")
    ev.held(task, "no time")
    out.close()
    assert [e["event"] for e in read_events(path)] == ["task.ready", "task.dispatched",
                                                       "between", "task.held"]

    code = ("import sys\n"
            "from pmc.dag import Task\n"
            "from pmc.outputs.eventlog import EventLog\n"
            "from pmc.logsetup import LogOutput\n"
            "ev = EventLog(LogOutput('json', sys.argv[1]))\n"
            "ev.ready(Task(0, 'a', '/bin/true'), 1)\n")
    exit_path = tmp_path / "exit.jsonl"
    r = subprocess.run([sys.executable, "-c", code, str(exit_path)], env=clean_env(),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert [e["event"] for e in read_events(exit_path)] == ["task.ready"]


def test_building_the_outputs_opens_nothing(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The observers of a run can be made before its master: no file appears until the
    run starts (``started``), none if it never does, and each then opens its own."""
    from pmc.core.events import RunInfo
    from pmc.outputs import assemble
    from pmc.outputs.eventlog import EventLog
    from pmc.outputs.exporters import MetricsExport
    from pmc.outputs.progress import Progress
    from pmc.outputs.recordfiles import DagmanOut, JobstateLog, ResourceLog
    from pmc.outputs.status import StatusFile
    from pmc.outputs.tally import Tally

    dag = tmp_path / "w.dag"
    opts = RunOptions(dag=str(dag), jobstate_log=True, monitord_hack=True,
                      log_format="json", log_file=str(tmp_path / "w.log"),
                      metrics_textfile=str(tmp_path / "m.prom"), progress_interval=60.0)
    made = assemble.outputs(opts)
    assert [type(o) for o in made.observers] == [
        JobstateLog, DagmanOut, ResourceLog, Tally, EventLog, StatusFile, MetricsExport,
        Progress]
    assert made.progress is made.observers[-1]
    for obs in made.observers:
        obs.close()
    assert list(tmp_path.iterdir()) == []

    made = assemble.outputs(opts)
    info = RunInfo(dag_path=str(dag), tasks=0, recovered=0, workers=1, slots=1, cpus=1,
                   hosts=[], start=0.0, mode="local")
    for obs in made.observers:
        obs.started(info)
    for obs in made.observers:
        obs.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "jobstate.log", "w.dag.dagman.out", "w.dag.resource", "w.dag.status.json", "w.log"]
    assert json.loads((tmp_path / "w.dag.status.json").read_text())["state"] == "aborted"


def test_a_metrics_address_that_cannot_be_used_stops_the_run_before_it_starts(
        tmp_path: Path) -> None:
    """A taken port is worked around (tests/test_metrics.py); an address that is not one
    is the user's to fix, before anything runs."""
    from pmc.errors import FatalError
    from pmc.outputs import assemble

    opts = RunOptions(dag=str(tmp_path / "w.dag"), metrics_port=0, metrics_bind="256.0.0.1")
    with pytest.raises(FatalError, match=r"Cannot serve metrics on 256\.0\.0\.1:0"):
        assemble.outputs(opts)
    assert list(tmp_path.iterdir()) == []
