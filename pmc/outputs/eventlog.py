"""The event log: one structured event per task state transition, and the run's start and end.

``EventLog`` is the observer that writes the events (ready, dispatched, started, finished
/ failed, retried, held, reused; workers lost and joined, hosts quarantined; the workflow start
and end with the run's totals) to the run's
``LogOutput`` (``pmc.logsetup``). In text mode these are DEBUG lines, in JSON
mode all of them are written. The per-task JSON events (four or five a task) are the one
hot path: on the master's loop they are only recorded (a tuple appended to the output's
held-back lines), and rendered together at the next write or flush, straight into the
exact text the structlog chain would make of them — microseconds a task instead of tens.
The rarer events (workflow start and end, hosts, held tasks, lost workers) go through
structlog.

The event names and fields are documented in docs/observability.md.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pmc.core.events import Observer, RunInfo, Summary
from pmc.core.protocol import TaskResult, describe
from pmc.core.resources import Host
from pmc.dag import Task
from pmc.dag.model import options_of
from pmc.logsetup import LogOutput, flush_at_exit, render_json

_FLUSH_EVERY = 0.25  # seconds between flushes of buffered task events
_HOLD_MAX = 2048  # task events held back before they are rendered anyway
_RENDER_AT = 64  # ... or at the end of a turn of the master's loop

# What logsetup's json_encoder writes for a str (ensure_ascii=False). For an int it writes
# int.__repr__, for a finite float float.__repr__, for None null: the direct task event
# lines below rely on that, and check the types first (anything else takes the structlog
# renderer's path, ``_rendered``).
_jstr: Callable[[str], str] = json.encoder.encode_basestring
_INF = float("inf")


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
            flush_at_exit(out)
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
            memory_limits=info.memory_limits or None, reused=info.reused,
            arrays=[a._asdict() for a in info.arrays])
        self.out.flush()

    def tasks_added(self, tasks: Sequence[Task], total: int) -> None:
        self.emit("workflow.tasks_added", added=len(tasks), tasks=total,
                  names=[t.name for t in tasks[:100]])

    def host_changed(self, host: Host) -> None:
        if host.name not in self.hosts:
            self.hosts.add(host.name)
            self.emit("host", host=host.name, slots=sum(w.slots for w in host.workers),
                      workers=len(host.workers), cpus=host.cpus, memory=host.memory,
                      gpus=len(host.gpus))

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

    def reused(self, tasks: Iterable[Task]) -> None:
        now = time.time()
        for task in tasks:
            self._record((_reused_line, now, task.name, task.outputs))

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
            ev = (_result_lines, _end_time(res), task.name, seq, res, "succeeded", rank, host,
                  task.cpus, task.memory)
            o = options_of(task)  # GPUs or ranks: a longer event
            self._record(ev + _more(task) if o.gpus or o.ranks != 1 else ev)

    def result(self, task: Task, seq: int, res: TaskResult, outcome: str) -> None:
        if outcome == "succeeded":
            return  # written at its end (``ended``)
        rank, host = self.where.pop(task.id, (-1, ""))
        ev = (_result_lines, _end_time(res), task.name, seq, res, outcome, rank, host,
              task.cpus, task.memory)
        o = options_of(task)  # GPUs or ranks: a longer event
        self._record(ev + _more(task) if o.gpus or o.ranks != 1 else ev)

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

    def worker_lost(self, rank: int, host: str, slots: int, reason: str,
                    rerun: int) -> None:
        self.emit("worker.lost", rank=rank, host=host, slots=slots, reason=reason,
                  tasks_rerun=rerun)

    def worker_joined(self, rank: int, host: str, slots: int, replaces: int) -> None:
        self.emit("worker.joined", rank=rank, host=host, slots=slots, replaces=replaces)

    def host_quarantined(self, host: str, reason: str, slots: int) -> None:
        self.emit("host.quarantined", host=host, reason=reason, slots=slots)

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
        fields = summary._asdict()
        fields["per_host_runtime"] = dict(summary.per_host_runtime)
        fields.update(summary_figures(summary))
        self.emit("workflow.finished", dag=self.dag, **fields)
        self.out.flush()

    def close(self) -> None:
        self.out.flush()


# The held-back task events: (line function, time.time() of the event, values...). A
# line function returns the event's JSON line(s) exactly as logsetup.render_json writes
# them: directly when every value is of a type it writes (a plain int, str, None or
# finite float), otherwise by way of that renderer (``_rendered``).


def _more(task: Task) -> tuple[int, int]:
    """What a try's end adds for a task asking for GPUs or ranks (pmc extensions): GPUs
    per rank and ranks (its hosts are its "host": a comma list)."""
    return (task.gpus, task.ranks)


def _ready_line(ev: tuple[Any, ...]) -> str:
    _, ts, name, seq, cpus, memory = ev
    if not (type(name) is str and type(seq) is int and type(cpus) is int
            and type(memory) is int):
        return _rendered(ev)
    return (f'{{"timestamp":{ts!r},"level":"info","event":"task.ready","task":{_jstr(name)},'
            f'"seq":{seq},"cpus":{cpus},"memory":{memory}}}\n')


def _reused_line(ev: tuple[Any, ...]) -> str:
    return "".join(render_json(None, "info", {"event": event, **fields}) + "\n"
                   for event, fields in _held_events(ev))


def _dispatched_line(ev: tuple[Any, ...]) -> str:
    _, ts, name, seq, attempt, rank, host, cpus, memory = ev
    if not (type(name) is str and type(seq) is int and type(attempt) is int
            and type(rank) is int and type(host) is str and type(cpus) is int
            and type(memory) is int):
        return _rendered(ev)
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


def _started_line(ev: tuple[Any, ...]) -> str:
    _, ts, name, seq, attempt, rank, host, cpus, memory = ev
    if not (type(name) is str and type(seq) is int and type(attempt) is int
            and type(rank) is int and type(host) is str and type(cpus) is int
            and type(memory) is int and type(ts) is float and -_INF < ts < _INF):
        return _rendered(ev)
    return (f'{{"timestamp":{ts!r},"level":"info","event":"task.started",'
            f'"task":{_jstr(name)},"seq":{seq},"try":{attempt},"rank":{rank},'
            f'"host":{_jstr(host)},"cpus":{cpus},"memory":{memory}}}\n')


def _num(v: object) -> str | None:
    """A float or None as logsetup's json_encoder writes it; None if it is neither (or not
    finite)."""
    if v is None:
        return "null"
    if type(v) is float and -_INF < v < _INF:
        return repr(v)
    return None


def _result_lines(ev: tuple[Any, ...]) -> str:
    """task.finished, directly; the rarer task.failed (then task.retried) take the
    renderer's path."""
    if len(ev) > 10:  # a task asking for GPUs or ranks: the renderer's path
        return _rendered(ev)
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
        return _rendered(ev)
    return (f'{{"timestamp":{ts!r},"level":"info","event":"task.finished",'
            f'"task":{_jstr(name)},"seq":{seq},"try":{attempt},"rank":{rank},'
            f'"host":{_jstr(host)},"cpus":{cpus},"memory":{memory},'
            f'"outcome":"succeeded","status":{status},"start":{start!r},'
            f'"duration":{duration!r},"cpu_time":{cpu_time!r},"user_cpu":{user},'
            f'"system_cpu":{system},"max_rss_kb":{"null" if rss is None else rss},'
            f'"error":null}}\n')


def _rendered(ev: tuple[Any, ...]) -> str:
    """A held-back event with a value of a type not written directly: as structlog does."""
    return "".join([render_json(None, "info", {"event": event, **fields}) + "\n"
                    for event, fields in _held_events(ev)])


def _held_events(ev: tuple[Any, ...]) -> list[tuple[str, dict[str, Any]]]:
    """The (event, fields) of a held-back task event, as structlog is given them."""
    kind, ts = ev[0], ev[1]
    if kind is _ready_line:
        _, _, name, seq, cpus, memory = ev
        return [("task.ready", {"timestamp": ts, "task": name, "seq": seq, "cpus": cpus,
                                "memory": memory})]
    if kind is _reused_line:
        _, _, name, outputs = ev
        return [("task.reused", {"timestamp": ts, "task": name, "outputs": list(outputs or ())})]
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
    _, _, name, seq, res, outcome, rank, host, cpus, memory = ev[:10]
    task = {"task": name, "seq": seq, "try": res.attempt, "rank": rank, "host": host,
            "cpus": cpus, "memory": memory}
    if len(ev) > 10:
        task["gpus"], task["ranks"] = ev[10], ev[11]
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
    """The end-of-run figures, as the [INFO] lines of write_summary give them, and the
    utilisation per cpu (pmc's own)."""
    return {
        "cpu_utilization": s.cpu_utilization,
        "utilization": s.utilization,
        "utilization_with_master": s.utilization_with_master,
        "throughput": s.throughput,
    }
