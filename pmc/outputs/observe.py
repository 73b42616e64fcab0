"""Observability of a run: log set-up, the structured task events, and the run's tally.

- ``setup_logging`` (called by the command-line entry, never at import) picks the log
  format and destination: text keeps PMC's ``[level] message`` lines (dated in a log
  file, as the reference writes them); JSON turns them and
  every task event into one JSON object per line, as structlog renders them.
- ``EventLog`` is the observer that writes one event per task state transition (ready,
  dispatched, started, finished / failed, retried, held) and the workflow start and end
  events with the run's totals. In text mode these are DEBUG lines, in JSON mode all of
  them are written. The per-task JSON events (four or five a task) are the one hot path:
  on the master's loop they are only recorded (a tuple appended), and rendered together
  at the next write or flush, straight into the exact text the structlog chain would
  make of them — microseconds a task instead of tens. The rarer events (workflow start
  and end, hosts, held tasks, log messages) go through structlog.
- ``Tally`` is the observer that counts: a few attribute updates per event, read by the
  Prometheus collector (``pmc.outputs.metrics``) and the status snapshot
  (``pmc.outputs.status``), so the
  master's hot loop pays for counting once however many outputs are on.
- ``observers(opts)`` builds the list the master gets.

The event names and fields are documented in docs/observability.md.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Callable, MutableMapping
from dataclasses import asdict
from typing import IO, Any

import structlog

from pmc import log
from pmc.core.events import Observer, RunInfo, Summary
from pmc.core.protocol import TaskResult, describe
from pmc.core.resources import Host
from pmc.dag import Task
from pmc.options import RunOptions

# Upper bounds (seconds) of the task duration histogram: milliseconds to hours.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 300.0, 900.0, 3600.0, 14400.0)

# pmc.log level -> (structlog method, the "level" value written)
_METHODS = ("critical", "error", "warning", "info", "debug", "debug")
_LEVEL_NAMES = ("fatal", "error", "warn", "info", "debug", "trace")
_FLUSH_EVERY = 0.25  # seconds between flushes of buffered task events
_HOLD_MAX = 2048  # task events held back before they are rendered anyway
_RENDER_AT = 64  # ... or at the end of a turn of the master's loop


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
            self.open()
            assert self.f is not None
        return self.f.write(text)

    def open(self) -> None:
        """Open for append now (OSError if it cannot be): the master calls this before
        the run starts, so that a log file that cannot be written stops the run at once
        rather than losing every line."""
        if self.f is None:
            self.f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

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
        self.out.write(line + "\n")

    debug = info = warning = error = critical = msg


_ENCODE = json.JSONEncoder(separators=(",", ":"), default=str, ensure_ascii=False).encode
# What _ENCODE writes for a str (ensure_ascii=False). For an int it writes int.__repr__, for
# a finite float float.__repr__, for None null: the direct task event lines below rely on
# that, and check the types first (anything else takes the structlog path).
_jstr: Callable[[str], str] = json.encoder.encode_basestring
_INF = float("inf")


def _render_json(_logger: Any, method: str, ed: MutableMapping[str, Any]) -> str:
    ts = ed.pop("timestamp", None)
    lvl = ed.pop("level", None)
    event = ed.pop("event")
    return _ENCODE({"timestamp": time.time() if ts is None else ts,
                    "level": lvl or ("warn" if method == "warning" else method),
                    "event": event, **ed})


def _render_text(logger: Any, method: str, ed: MutableMapping[str, Any]) -> str:
    lvl = ed.pop("level", None) or ("warn" if method == "warning" else method)
    event = ed.pop("event")
    ed.pop("timestamp", None)
    fields = " ".join(f"{k}={_text_value(v)}" for k, v in ed.items() if v is not None)
    line = f"[{lvl}] {event} {fields}" if fields else f"[{lvl}] {event}"
    # The same date in front as pmc.log's lines in a log file.
    return f"{log.timestamp()} {line}" if logger.out.file is not None else line


def _text_value(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, str) and (" " in v or not v):
        return json.dumps(v)
    return str(v)


class LogOutput:
    """Where log lines and task events go (``--log-file`` or stderr) and how they look.

    JSON task events from ``EventLog`` are held back as tuples of their values in
    ``pending`` (a list append on the master's loop) and rendered together, in order, just
    before anything else is written and at each flush: the file gets exactly the lines it
    would have got one by one, for a fraction of the cost."""

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
        self.pending: list[tuple[Any, ...]] = []  # (line function, timestamp, values...)
        # Rendering takes the events in order: the master's loop and a thread that logs
        # (the metrics exporter's warnings) must not write two halves the wrong way round.
        self.lock = threading.RLock()

    @property
    def json(self) -> bool:
        return self.fmt == "json"

    def stream(self) -> log.Stream:
        # sys.stderr looked up at each write: tests and callers may swap it.
        return self.file if self.file is not None else sys.stderr

    def write(self, text: str) -> None:
        """Append rendered lines (each ending in a newline), after the held-back events."""
        with self.lock:
            if self.pending:
                self.render_pending()
            self._write(text)

    def _write(self, text: str) -> None:
        try:
            if self.file is not None:
                self.file.write(text)
            else:
                sys.stderr.write(text)
        except (OSError, ValueError):
            pass  # a closed stderr must not take the run down

    def render_pending(self) -> None:
        """Write the held-back task events (see the class docstring)."""
        with self.lock:
            pending = self.pending
            events = pending[:]
            del pending[:len(events)]  # appended meanwhile (by another thread): kept
            # In the order things happened: a worker's starts and ends reach the master
            # a little after they happened, beside events of the master's own.
            events.sort(key=_event_time)
            chunk: list[str] = []
            for ev in events:
                text = ev[0](ev)
                if text is None:  # a value of a type not written directly: as structlog does
                    chunk.extend(_render_json(None, "info", {"event": event, **fields}) + "\n"
                                 for event, fields in _held_events(ev))
                else:
                    chunk.append(text)
            self._write("".join(chunk))

    def message(self, lvl: int, msg: str) -> None:
        """A pmc.log message in JSON mode."""
        getattr(self.logger, _METHODS[lvl])(msg, level=_LEVEL_NAMES[lvl])
        self.flush()

    def flush(self) -> None:
        if self.pending:
            self.render_pending()
        try:
            self.stream().flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        if self.pending:
            self.render_pending()
        if self.file is not None:
            self.file.close()


# Outputs that hold task events back: flushed at exit too, should a run end without
# closing its observers (an unexpected exception).
_holding: weakref.WeakSet[LogOutput] = weakref.WeakSet()


@atexit.register
def _flush_held() -> None:
    for out in list(_holding):
        if out.pending:
            out.flush()


_output: LogOutput | None = None


def setup_logging(opts: RunOptions) -> LogOutput:
    """Configure pmc.log from ``--log-format``, ``--log-file`` and -v/-q (CLI entry only)."""
    global _output
    out = LogOutput(opts.log_format, opts.log_file, opts.log_level)
    log.setup(opts.log_level, stream=out.file, sink=out.message if out.json else None,
              dated=out.file is not None)
    _output = out
    return out


def open_log_file() -> None:
    """Open ``--log-file`` now (the master, before the run). Should it fail, log to
    stderr from here on and raise the OSError: the caller reports it there."""
    out = _output
    if out is None or out.file is None:
        return
    try:
        out.file.open()
    except OSError:
        out.file = None
        log.setup(out.level, sink=out.message if out.json else None)
        raise


def log_output(opts: RunOptions) -> LogOutput:
    """The output set up by ``setup_logging``, or one made from ``opts`` (library use)."""
    if _output is not None:
        return _output
    return LogOutput(opts.log_format, opts.log_file, opts.log_level)


class EventLog(Observer):
    """One structured event per task state transition, plus workflow start and end.

    In JSON mode the per-task events only record their values (``LogOutput.pending``); they
    are rendered later, together, into exactly the lines structlog would have written
    (see ``_ready_line`` and the next ones). The rarer events go through structlog."""

    def __init__(self, out: LogOutput) -> None:
        self.out = out
        # JSON mode writes every task event; text mode shows them only with -v (DEBUG).
        self.emit = out.logger.info if out.json else out.logger.debug
        self.json = out.json
        self.pending = out.pending
        if out.json:
            _holding.add(out)
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
            max_wall_time=info.max_wall_time, pid=os.getpid(), accounting=info.accounting,
            memory_limits=info.memory_limits or None)
        self.out.flush()

    def host_changed(self, host: Host) -> None:
        if host.name not in self.hosts:
            self.hosts.add(host.name)
            self.emit("host", host=host.name, slots=sum(w.slots for w in host.workers),
                      workers=len(host.workers), cpus=host.cpus, memory=host.memory)

    # In JSON mode the three hooks below append to the pending events; a wave of events
    # (the roots of a big DAG all ready at once) is rendered every _HOLD_MAX of them.

    def ready(self, task: Task, seq: int) -> None:
        if self.json:
            pending = self.pending
            pending.append((_ready_line, time.time(), task.name, seq, task.cpus, task.memory))
            if len(pending) >= _HOLD_MAX:
                self.out.render_pending()
        else:
            self.emit("task.ready", task=task.name, seq=seq, cpus=task.cpus,
                      memory=task.memory)

    def dispatched(self, task: Task, seq: int, attempt: int, rank: int, host: str) -> None:
        self.where[task.id] = (rank, host)
        if self.json:
            pending = self.pending
            pending.append((_dispatched_line, time.time(), task.name, seq, attempt, rank, host,
                            task.cpus, task.memory))
            if len(pending) >= _HOLD_MAX:
                self.out.render_pending()
        else:
            self.emit("task.dispatched", task=task.name, seq=seq, **{"try": attempt},
                      rank=rank, host=host, cpus=task.cpus, memory=task.memory)

    def task_started(self, task: Task, seq: int, attempt: int, rank: int, host: str,
                     start: float) -> None:
        ev = (_started_line, start, task.name, seq, attempt, rank, host, task.cpus,
              task.memory)
        self._record(ev)

    def ended(self, task: Task, seq: int, res: TaskResult, error: str | None) -> None:
        # A successful try's end is written now, with the time it ended, before its
        # successor's start: its record being made durable changes nothing it says.
        if res.status == 0 and error is None:
            rank, host = self.where.pop(task.id, (-1, ""))
            self._record((_result_lines, _end_time(res), task.name, seq, res,
                          "succeeded", rank, host, task.cpus, task.memory))

    def result(self, task: Task, seq: int, res: TaskResult, outcome: str) -> None:
        if outcome == "succeeded":
            return  # written at its end (``ended``)
        rank, host = self.where.pop(task.id, (-1, ""))
        self._record((_result_lines, _end_time(res), task.name, seq, res, outcome,
                      rank, host, task.cpus, task.memory))

    def _record(self, ev: tuple[Any, ...]) -> None:
        if self.json:
            pending = self.pending
            pending.append(ev)
            if len(pending) >= _HOLD_MAX:
                self.out.render_pending()
        else:
            for event, fields in _held_events(ev):
                self.emit(event, **fields)

    def held(self, task: Task, reason: str) -> None:
        self.emit("task.held", task=task.name, reason=reason)

    def flush(self) -> None:
        now = time.monotonic()
        if now >= self.next_flush:
            self.next_flush = now + _FLUSH_EVERY
            self.out.flush()
        elif len(self.pending) >= _RENDER_AT:
            # A few at a time, at the end of a turn: a quarter second's worth at once
            # (~2,000 lines, several ms) would leave the slots without their next tasks.
            self.out.render_pending()

    def finished(self, summary: Summary) -> None:
        fields = asdict(summary)
        fields.update(summary_figures(summary))
        self.emit("workflow.finished", dag=self.dag, **fields)
        self.out.flush()

    def close(self) -> None:
        self.out.flush()


# The held-back task events: (line function, time.time() of the event, values...). A
# line function returns the event's JSON line(s) exactly as _render_json writes them, or
# None when a value is not of a type it writes (not a plain int, str, None or finite
# float); such an event is rendered by _render_json from its _held_events instead.


def _ready_line(ev: tuple[Any, ...]) -> str | None:
    _, ts, name, seq, cpus, memory = ev
    if not (type(name) is str and type(seq) is int and type(cpus) is int
            and type(memory) is int):
        return None
    return (f'{{"timestamp":{ts!r},"level":"info","event":"task.ready","task":{_jstr(name)},'
            f'"seq":{seq},"cpus":{cpus},"memory":{memory}}}\n')


def _dispatched_line(ev: tuple[Any, ...]) -> str | None:
    _, ts, name, seq, attempt, rank, host, cpus, memory = ev
    if not (type(name) is str and type(seq) is int and type(attempt) is int
            and type(rank) is int and type(host) is str and type(cpus) is int
            and type(memory) is int):
        return None
    return (f'{{"timestamp":{ts!r},"level":"info","event":"task.dispatched",'
            f'"task":{_jstr(name)},"seq":{seq},"try":{attempt},"rank":{rank},'
            f'"host":{_jstr(host)},"cpus":{cpus},"memory":{memory}}}\n')


def _end_time(res: TaskResult) -> Any:
    """When a try ended (its worker's start + duration); now if that is not a number."""
    try:
        end = res.start + res.duration
        return end if -_INF < end < _INF else time.time()
    except TypeError:
        return time.time()


def _event_time(ev: tuple[Any, ...]) -> float:
    ts = ev[1]
    return ts if type(ts) is float else float(ts) if isinstance(ts, int | float) else 0.0


def _started_line(ev: tuple[Any, ...]) -> str | None:
    _, ts, name, seq, attempt, rank, host, cpus, memory = ev
    if not (type(name) is str and type(seq) is int and type(attempt) is int
            and type(rank) is int and type(host) is str and type(cpus) is int
            and type(memory) is int and type(ts) is float and -_INF < ts < _INF):
        return None
    return (f'{{"timestamp":{ts!r},"level":"info","event":"task.started",'
            f'"task":{_jstr(name)},"seq":{seq},"try":{attempt},"rank":{rank},'
            f'"host":{_jstr(host)},"cpus":{cpus},"memory":{memory}}}\n')


def _num(v: object) -> str | None:
    """A float or None as _ENCODE writes it; None if it is neither (or not finite)."""
    if v is None:
        return "null"
    if type(v) is float and -_INF < v < _INF:
        return repr(v)
    return None


def _result_lines(ev: tuple[Any, ...]) -> str | None:
    """task.finished, directly; the rarer task.failed (then task.retried) take the
    structlog path (None)."""
    _, ts, name, seq, res, outcome, rank, host, cpus, memory = ev
    attempt, status, rss = res.attempt, res.status, res.max_rss_kb
    start, duration, cpu_time = res.start, res.duration, res.cpu_time
    user, system = _num(res.user_cpu), _num(res.system_cpu)
    if not (outcome == "succeeded" and type(name) is str and type(seq) is int
            and type(cpus) is int
            and type(memory) is int and type(rank) is int and type(host) is str
            and type(attempt) is int and type(status) is int
            and (rss is None or type(rss) is int)
            and type(ts) is float and -_INF < ts < _INF
            and type(start) is float and -_INF < start < _INF
            and type(duration) is float and -_INF < duration < _INF
            and type(cpu_time) is float and -_INF < cpu_time < _INF
            and user is not None and system is not None and res.error is None):
        return None
    return (f'{{"timestamp":{ts!r},"level":"info","event":"task.finished",'
            f'"task":{_jstr(name)},"seq":{seq},"try":{attempt},"rank":{rank},'
            f'"host":{_jstr(host)},"cpus":{cpus},"memory":{memory},'
            f'"outcome":"succeeded","status":{status},"start":{start!r},'
            f'"duration":{duration!r},"cpu_time":{cpu_time!r},"user_cpu":{user},'
            f'"system_cpu":{system},"max_rss_kb":{"null" if rss is None else rss},'
            f'"error":null}}\n')


def _held_events(ev: tuple[Any, ...]) -> list[tuple[str, dict[str, Any]]]:
    """The (event, fields) of a held-back task event, as structlog is given them."""
    kind, ts = ev[0], ev[1]
    if kind is _ready_line:
        _, _, name, seq, cpus, memory = ev
        return [("task.ready", {"timestamp": ts, "task": name, "seq": seq, "cpus": cpus,
                                "memory": memory})]
    if kind is _dispatched_line:
        _, _, name, seq, attempt, rank, host, cpus, memory = ev
        return [("task.dispatched", {"timestamp": ts, "task": name, "seq": seq,
                                     "try": attempt, "rank": rank, "host": host,
                                     "cpus": cpus, "memory": memory})]
    if kind is _started_line:
        _, _, name, seq, attempt, rank, host, cpus, memory = ev
        return [("task.started", {"timestamp": ts, "task": name, "seq": seq,
                                  "try": attempt, "rank": rank, "host": host,
                                  "cpus": cpus, "memory": memory})]
    _, _, name, seq, res, outcome, rank, host, cpus, memory = ev
    task = {"task": name, "seq": seq, "try": res.attempt, "rank": rank, "host": host,
            "cpus": cpus, "memory": memory}
    fields = {"timestamp": ts, **task, "outcome": outcome, "status": res.status,
              "start": res.start, "duration": res.duration, "cpu_time": res.cpu_time,
              "user_cpu": res.user_cpu, "system_cpu": res.system_cpu,
              "max_rss_kb": res.max_rss_kb, "error": res.error}
    if outcome != "succeeded":
        # What ended it, in words when the worker gave no reason of its own, and where
        # its stderr is, with its last lines.
        if res.error is None:
            fields["error"] = ("killed by its memory limit (cgroup OOM kill)"
                               if res.oom_killed else describe(res.status))
        fields["oom_killed"] = res.oom_killed
        fields["stderr"] = res.stderr_path
        fields["stderr_tail"] = res.stderr_tail
    out = [("task.finished" if outcome == "succeeded" else "task.failed", fields)]
    if outcome == "retry":
        out.append(("task.retried", {"timestamp": ts, "task": name, "seq": seq,
                                     "try": res.attempt + 1}))
    return out


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
        # Started by a worker and not ended: never more than the slots.
        self.running: dict[int, tuple[Task, int, str]] = {}  # id -> (task, rank, host)
        # Dispatched, not started yet (in flight to the worker, or promoted in the place of
        # a task that ended, the worker's word on its start to come).
        self.sent: dict[int, tuple[Task, int, str]] = {}
        self.prefetched = 0  # queued on workers behind running tasks
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
        elif self.sent.pop(task.id, None) is not None:
            self.lost += 1

    def dispatched(self, task: Task, seq: int, attempt: int, rank: int, host: str) -> None:
        self.dispatched_n += 1
        self.sent[task.id] = (task, rank, host)

    def task_started(self, task: Task, seq: int, attempt: int, rank: int, host: str,
                     start: float) -> None:
        self.sent.pop(task.id, None)
        self.running[task.id] = (task, rank, host)
        self.cpus_busy += task.cpus
        self.memory_busy += task.memory

    def ended(self, task: Task, seq: int, res: TaskResult, error: str | None) -> None:
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

    def queue_changed(self, queued: int) -> None:
        self.prefetched = queued

    def result(self, task: Task, seq: int, res: TaskResult, outcome: str) -> None:
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
        self.sent.clear()
        self.prefetched = 0
        self.cpus_busy = self.memory_busy = 0

    # -- derived figures -------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Tasks on workers not started yet: prefetched behind running ones, or sent."""
        return len(self.sent) + self.prefetched

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
    from pmc.outputs.status import StatusFile

    tally = Tally(opts.dag, opts.site)
    out: list[Observer] = [tally]
    output = log_output(opts)
    if output.json or opts.log_level >= log.DEBUG:
        out.append(EventLog(output))
    out.append(StatusFile(opts.dag, tally))
    if (opts.metrics_port is not None or opts.metrics_textfile
            or opts.metrics_pushgateway):
        from pmc.outputs.metrics import MetricsExport

        out.append(MetricsExport(opts, tally))
    return out
