"""Observability of a run: log set-up, the structured task events, and the run's tally.

- ``setup_logging`` (called by the command-line entry, never at import) picks the log
  format and destination: text keeps PMC's ``[LEVEL] message`` lines; JSON turns them and
  every task event into one JSON object per line, rendered by structlog.
- ``EventLog`` is the observer that writes one event per task state transition (ready,
  dispatched, started, finished / failed, retried, held) and the workflow start and end
  events with the run's totals. In text mode these are DEBUG lines, in JSON mode all of
  them are written.
- ``Tally`` is the observer that counts: a few attribute updates per event, read by the
  Prometheus collector (``pmc.metrics``) and the status snapshot (``pmc.status``), so the
  master's hot loop pays for counting once however many outputs are on.
- ``observers(opts)`` builds the list the master gets.

The event names and fields are documented in docs/observability.md.
"""

from __future__ import annotations

import json
import os
import sys
import time
from bisect import bisect_left
from collections.abc import MutableMapping
from dataclasses import asdict
from typing import IO, Any

import structlog

from pmc import log
from pmc.dag import Task
from pmc.events import Observer, RunInfo, Summary
from pmc.options import RunOptions
from pmc.protocol import TaskResult
from pmc.resources import Host

# Upper bounds (seconds) of the task duration histogram: milliseconds to hours.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 300.0, 900.0, 3600.0, 14400.0)

# pmc.log level -> (structlog method, the "level" value written)
_METHODS = ("critical", "error", "warning", "info", "debug", "debug")
_LEVEL_NAMES = ("fatal", "error", "warn", "info", "debug", "trace")
_FLUSH_EVERY = 0.25  # seconds between flushes of buffered task events


class _LazyFile:
    """``--log-file``, opened for append at the first write.

    Under MPI every rank runs the command-line entry, but only the master writes this
    file (workers switch to their own text logging before they log anything), so the
    file must not be opened — let alone truncated — just because a rank started."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.f: IO[str] | None = None

    def write(self, text: str, /) -> int:
        if self.f is None:
            self.f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        return self.f.write(text)

    def flush(self) -> None:
        if self.f is not None:
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


class _Writer:
    """The structlog "logger" at the end of the chain: appends the rendered line."""

    def __init__(self, out: LogOutput) -> None:
        self.out = out

    def msg(self, line: str) -> None:
        try:
            self.out.stream().write(line + "\n")
        except (OSError, ValueError):
            pass  # a closed stderr must not take the run down

    debug = info = warning = error = critical = msg


_ENCODE = json.JSONEncoder(separators=(",", ":"), default=str, ensure_ascii=False).encode


def _render_json(_logger: Any, method: str, ed: MutableMapping[str, Any]) -> str:
    ts = ed.pop("timestamp", None)
    lvl = ed.pop("level", None)
    event = ed.pop("event")
    return _ENCODE({"timestamp": time.time() if ts is None else ts,
                    "level": lvl or ("warn" if method == "warning" else method),
                    "event": event, **ed})


def _render_text(_logger: Any, method: str, ed: MutableMapping[str, Any]) -> str:
    lvl = ed.pop("level", None) or ("warn" if method == "warning" else method)
    event = ed.pop("event")
    ed.pop("timestamp", None)
    fields = " ".join(f"{k}={_text_value(v)}" for k, v in ed.items() if v is not None)
    return f"[{lvl.upper()}] {event} {fields}" if fields else f"[{lvl.upper()}] {event}"


def _text_value(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, str) and (" " in v or not v):
        return json.dumps(v)
    return str(v)


class LogOutput:
    """Where log lines and task events go (``--log-file`` or stderr) and how they look."""

    def __init__(self, fmt: str = "text", path: str | None = None,
                 level: int = log.INFO) -> None:
        if fmt not in ("text", "json"):
            raise ValueError(f"unknown log format {fmt!r}")
        self.fmt = fmt
        self.level = level
        self.file = _LazyFile(path) if path else None
        renderer = _render_json if fmt == "json" else _render_text
        self.logger: Any = structlog.wrap_logger(
            _Writer(self), processors=[renderer],
            wrapper_class=structlog.make_filtering_bound_logger(0),
        )

    @property
    def json(self) -> bool:
        return self.fmt == "json"

    def stream(self) -> log.Stream:
        # sys.stderr looked up at each write: tests and callers may swap it.
        return self.file if self.file is not None else sys.stderr

    def message(self, lvl: int, msg: str) -> None:
        """A pmc.log message in JSON mode."""
        getattr(self.logger, _METHODS[lvl])(msg, level=_LEVEL_NAMES[lvl])
        self.flush()

    def flush(self) -> None:
        try:
            self.stream().flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


_output: LogOutput | None = None


def setup_logging(opts: RunOptions) -> LogOutput:
    """Configure pmc.log from ``--log-format``, ``--log-file`` and -v/-q (CLI entry only)."""
    global _output
    out = LogOutput(opts.log_format, opts.log_file, opts.log_level)
    log.setup(opts.log_level, stream=out.file, sink=out.message if out.json else None)
    _output = out
    return out


def log_output(opts: RunOptions) -> LogOutput:
    """The output set up by ``setup_logging``, or one made from ``opts`` (library use)."""
    if _output is not None:
        return _output
    return LogOutput(opts.log_format, opts.log_file, opts.log_level)


class EventLog(Observer):
    """One structured event per task state transition, plus workflow start and end."""

    def __init__(self, out: LogOutput) -> None:
        self.out = out
        # JSON mode writes every task event; text mode shows them only with -v (DEBUG).
        self.emit = out.logger.info if out.json else out.logger.debug
        self.where: dict[int, tuple[int, str]] = {}  # task id -> (rank, host) while running
        self.hosts: set[str] = set()
        self.dag = ""
        self.next_flush = 0.0

    def started(self, info: RunInfo) -> None:
        self.dag = info.dag_path
        self.emit(
            "workflow.started", dag=info.dag_path, tasks=info.tasks,
            recovered=info.recovered, workers=info.workers, slots=info.slots, cpus=info.cpus,
            hosts=info.hosts, mode=info.mode, site=info.site, start=info.start,
            max_wall_time=info.max_wall_time, pid=os.getpid())
        self.out.flush()

    def host_changed(self, host: Host) -> None:
        if host.name not in self.hosts:
            self.hosts.add(host.name)
            self.emit("host", host=host.name, slots=sum(w.slots for w in host.workers),
                      workers=len(host.workers), cpus=host.cpus, memory=host.memory)

    def ready(self, task: Task, seq: int) -> None:
        self.emit("task.ready", task=task.name, seq=seq, cpus=task.cpus, memory=task.memory)

    def dispatched(self, task: Task, seq: int, attempt: int, rank: int, host: str) -> None:
        self.where[task.id] = (rank, host)
        self.emit("task.dispatched", task=task.name, seq=seq, **{"try": attempt}, rank=rank,
                  host=host, cpus=task.cpus, memory=task.memory)

    def result(self, task: Task, seq: int, res: TaskResult, outcome: str) -> None:
        rank, host = self.where.pop(task.id, (-1, ""))
        emit = self.emit
        # Workers report start and end together: "started" carries the real start time.
        emit("task.started", timestamp=res.start, task=task.name, seq=seq,
             **{"try": res.attempt}, rank=rank, host=host, cpus=task.cpus,
             memory=task.memory)
        emit("task.finished" if outcome == "succeeded" else "task.failed",
             task=task.name, seq=seq, **{"try": res.attempt}, rank=rank, host=host,
             cpus=task.cpus, memory=task.memory, outcome=outcome, status=res.status,
             start=res.start, duration=res.duration, cpu_time=res.cpu_time,
             max_rss_kb=res.max_rss_kb, error=res.error)
        if outcome == "retry":
            emit("task.retried", task=task.name, seq=seq, **{"try": res.attempt + 1})

    def held(self, task: Task, reason: str) -> None:
        self.emit("task.held", task=task.name, reason=reason)

    def flush(self) -> None:
        now = time.monotonic()
        if now >= self.next_flush:
            self.next_flush = now + _FLUSH_EVERY
            self.out.flush()

    def finished(self, summary: Summary) -> None:
        fields = asdict(summary)
        fields.update(summary_figures(summary))
        self.emit("workflow.finished", dag=self.dag, **fields)
        self.out.flush()

    def close(self) -> None:
        self.out.flush()


def summary_figures(s: Summary) -> dict[str, float]:
    """The end-of-run figures, as the [INFO] lines of write_summary give them."""
    return {
        "utilization": s.utilization,
        "utilization_with_master": s.utilization_with_master,
        "throughput": s.throughput,
    }


class Tally(Observer):
    """The run's counts so far, for metrics and the status snapshot.

    Per event only attribute updates (and one bisect for the histogram): no formatting,
    no locks. Readers on other threads (the metrics endpoint) see plain ints and floats,
    each consistent on its own, which is all a scrape needs."""

    def __init__(self, dag: str, site: str = "") -> None:
        self.dag = dag
        self.site = site
        self.info: RunInfo | None = None
        self.summary: Summary | None = None
        self.start = time.time()
        self.ready_events = 0
        self.dispatched_n = 0
        self.held_n = 0
        self.succeeded = 0
        self.failed = 0
        self.retried = 0
        self.stopped = 0
        self.lost = 0
        self.running: dict[int, tuple[Task, int, str]] = {}  # id -> (task, rank, host)
        self.cpus_busy = 0
        self.memory_busy = 0
        self.runtime = 0.0
        self.cpu_time = 0.0
        self.forwarded = 0
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)  # last: above the top bound
        self.host_runtime: dict[str, float] = {}
        self.host_slots: dict[str, int] = {}
        self.failed_names: list[str] = []  # permanently failed, in order

    # -- hooks -----------------------------------------------------------------------------

    def started(self, info: RunInfo) -> None:
        self.info = info
        self.start = info.start

    def host_changed(self, host: Host) -> None:
        if host.name not in self.host_slots:
            self.host_slots[host.name] = sum(w.slots for w in host.workers)

    def ready(self, task: Task, seq: int) -> None:
        self.ready_events += 1
        lost = self.running.pop(task.id, None)
        if lost is not None:
            # Ready again without a result: its worker was lost and it will run again.
            self.lost += 1
            self.cpus_busy -= task.cpus
            self.memory_busy -= task.memory

    def dispatched(self, task: Task, seq: int, attempt: int, rank: int, host: str) -> None:
        self.dispatched_n += 1
        self.running[task.id] = (task, rank, host)
        self.cpus_busy += task.cpus
        self.memory_busy += task.memory

    def result(self, task: Task, seq: int, res: TaskResult, outcome: str) -> None:
        d = res.duration
        entry = self.running.pop(task.id, None)
        if entry is not None:
            self.cpus_busy -= task.cpus
            self.memory_busy -= task.memory
            host = entry[2]
            self.host_runtime[host] = self.host_runtime.get(host, 0.0) + d
        self.runtime += d
        self.cpu_time += res.cpu_time
        self.buckets[bisect_left(DURATION_BUCKETS, d)] += 1
        if outcome == "succeeded":
            self.succeeded += 1
            if res.forwards:
                self.forwarded += sum(len(data) for _dest, data in res.forwards)
        elif outcome == "retry":
            self.retried += 1
        elif outcome == "failed":
            self.failed += 1
            self.failed_names.append(task.name)
        else:
            self.stopped += 1

    def held(self, task: Task, reason: str) -> None:
        self.held_n += 1

    def finished(self, summary: Summary) -> None:
        self.summary = summary
        self.running.clear()
        self.cpus_busy = self.memory_busy = 0

    # -- derived figures -------------------------------------------------------------------

    @property
    def ready_now(self) -> int:
        return max(0, self.ready_events - self.dispatched_n - self.held_n)

    @property
    def slots(self) -> int:
        return self.info.slots if self.info is not None else 0

    def wall(self) -> float:
        if self.summary is not None:
            return self.summary.wall
        if self.info is None:
            return 0.0
        return max(0.0, time.time() - self.info.start)

    def utilization(self) -> float:
        """Summed task runtime / (wall x slots): the end-of-run figure, so far."""
        wall = self.wall()
        if wall <= 0 or self.slots <= 0:
            return 0.0
        return self.runtime / (wall * self.slots)


def observers(opts: RunOptions) -> list[Observer]:
    """The observability observers for one run, counting first so others can read it.

    Starts the metrics endpoint if asked (and logs its URL); a failure to do so is a
    ``FatalError`` raised before anything runs."""
    from pmc.status import StatusFile

    tally = Tally(opts.dag, opts.site)
    out: list[Observer] = [tally]
    output = log_output(opts)
    if output.json or opts.log_level >= log.DEBUG:
        out.append(EventLog(output))
    out.append(StatusFile(opts.dag, tally))
    if (opts.metrics_port is not None or opts.metrics_textfile
            or opts.metrics_pushgateway):
        from pmc.metrics import MetricsExport

        out.append(MetricsExport(opts, tally))
    return out
