"""Every state change of a task, once, to every observer.

The master calls these hooks in one place; the jobstate log, the fake dagman.out, the
resource log, structured logs and metrics are observers. An observer overrides only the
hooks it needs. Hooks run on the master's loop: they must be cheap and must not block.
``Fanout`` is the one observer the master talks to: it passes each hook on to the
observers that override it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pmc.core.protocol import TaskResult
from pmc.dag import Task

if TYPE_CHECKING:
    from pmc.core.resources import Host


# NamedTuples, as RunOptions (pmc.options): no ``dataclasses`` import on the master's start.
class ArrayInfo(NamedTuple):
    """A task array of the run (a pmc extension): its members, and how many were done
    before it started (from the rescue log) or are reused (--reuse)."""

    name: str
    members: int
    recovered: int = 0
    reused: int = 0


class TriesSoFar(Protocol):
    """The seconds of the tries that ended so far, as the master counts them (its
    ``runtime.summary.Counts``): observers read these rather than count them again."""

    runtime: float  # their durations
    cpu_seconds: float  # their durations x the cpus each held
    cpu_time: float  # their user + system cpu time
    # Per host: their durations, and how many (a multi-rank try on several hosts counts
    # in full on each).
    per_host_runtime: dict[str, float]
    per_host_tries: dict[str, int]


class RunInfo(NamedTuple):
    dag_path: str
    tasks: int
    recovered: int  # already DONE from the rescue log
    workers: int
    slots: int
    cpus: int
    hosts: list[str]
    start: float
    mode: str  # "mpi" or "local"
    site: str = ""
    max_wall_time: float | None = None  # seconds
    # How the workers measure tasks (pmc.runtime.accounting: "cgroup-v1", "rusage"; several,
    # comma-separated, if workers differ), and how --strict-limits enforces memory
    # ("cgroup", "rlimit"; "" without --strict-limits).
    accounting: str = ""
    memory_limits: str = ""
    reused: int = 0  # not run: declared outputs up to date (--reuse, pmc extension)
    arrays: tuple[ArrayInfo, ...] = ()  # task arrays (pmc extension), in DAG order
    counts: TriesSoFar | None = None  # the master's, live


class Summary(NamedTuple):
    ok: bool
    outcome: str  # "succeeded", "failed", "incomplete"
    reason: str
    tasks: int
    submitted: int
    succeeded: int
    failed: int
    extra: int  # retries
    recovered: int
    start: float
    wall: float
    pid: int
    app: str
    runtime: float  # summed task runtime, failed tries included
    cpu_time: float
    slots: int
    cpus: int
    workers: int
    makespan: float
    held: int = 0
    per_host_runtime: Mapping[str, float] = MappingProxyType({})
    # As the reference's [cluster-summary] counts them: tries sent to workers, and tries
    # that failed, retried or not (``submitted``/``failed`` above count tasks).
    tries_submitted: int = 0
    tries_failed: int = 0
    # Tries by what ended them, beside the reference's counts: failed and tried again,
    # and killed by a stop of the run (wall time, a signal, the failure limit; the task
    # runs again in the next run). ``tries_failed`` counts the retried ones too, as PMC.
    tries_retried: int = 0
    tries_stopped: int = 0
    # Summed task runtime x the cpus each try held (-c, times its ranks): what the cpus
    # were busy with (pmc's own figure; the reference's counts slots).
    cpu_seconds: float = 0.0
    # Tasks not run because their declared outputs were up to date (--reuse): counted
    # apart from ``succeeded`` and ``recovered``.
    reused: int = 0

    # The end-of-run figures, defined once for the log lines, the events and the metrics.
    @property
    def utilization(self) -> float:
        """Summed task runtime over wall time x task slots (the manual's "without master")."""
        return self.runtime / ((self.wall or 1e-9) * max(self.slots, 1))

    @property
    def cpu_utilization(self) -> float:
        """The cpus' share of the wall time held by tasks: task-seconds x cpus over wall
        time x the hosts' cpus (pmc's figure: a task holding every core of its host is
        1.0, however many slots the host has)."""
        return self.cpu_seconds / ((self.wall or 1e-9) * max(self.cpus, 1))

    @property
    def utilization_with_master(self) -> float:
        return self.runtime / ((self.wall or 1e-9) * (max(self.slots, 1) + 1))

    @property
    def throughput(self) -> float:
        """Finished tasks (succeeded or failed) per second of wall time."""
        return (self.succeeded + self.failed) / (self.wall or 1e-9)


class Observer:
    """No-op hooks; subclasses override what they need."""

    def started(self, info: RunInfo) -> None:
        pass

    def ready(self, task: Task, seq: int) -> None:
        """The task's parents are all done: it is queued (jobstate SUBMIT)."""

    def ready_run(self, tasks: Iterable[Task], seq: int, count: int) -> None:
        """``count`` tasks ready together, none of them running before, numbered from
        ``seq``: the members of a task array (each made as it is read), or the tasks
        ready at the start. ``ready`` for each, unless an observer counts them at once."""
        for task in tasks:
            self.ready(task, seq)
            seq += 1

    def reused(self, tasks: Iterable[Task]) -> None:
        """At the start, before any ``ready``: tasks not run in this run because their
        declared outputs are up to date (--reuse)."""

    def tasks_added(self, tasks: Sequence[Task], total: int) -> None:
        """Tasks added to an open run (a pmc extension), before any of them is ready;
        the run now has ``total`` tasks."""

    def dispatched(self, task: Task, seq: int, attempt: int, rank: int, host: str) -> None:
        """Sent to a worker (jobstate EXECUTE): to start at once, or (prefetched) when
        the task it was queued behind has ended."""

    def task_started(self, task: Task, seq: int, attempt: int, rank: int, host: str,
                     start: float) -> None:
        """The worker started the try, at ``start`` (its Unix time). Until then a
        dispatched task is queued, not running."""

    def ended(self, task: Task, seq: int, res: TaskResult, error: str | None) -> None:
        """The master heard that a try ended (``error``: why it failed beyond its status,
        if it did); ``result`` follows with the outcome, at once for a failed try, once
        its rescue record is durable for a successful one."""

    def result(self, task: Task, seq: int, res: TaskResult, outcome: str) -> None:
        """A try ended; outcome is "succeeded", "retry", "failed" or "stopped"."""

    def queue_changed(self, queued: int) -> None:
        """How many tasks wait on workers behind running ones (prefetched) changed."""

    def held(self, task: Task, reason: str) -> None:
        """Not started in this run (left for the next allocation)."""

    def host_changed(self, host: Host) -> None:
        """Free slots, cpus or memory of a host changed."""

    def worker_lost(self, rank: int, host: str, slots: int, reason: str,
                    rerun: int) -> None:
        """A worker was lost (its link broke, it failed, or it was silent too long): its
        ``slots`` are gone, and ``rerun`` tasks it was running are ready again."""

    def worker_joined(self, rank: int, host: str, slots: int, replaces: int) -> None:
        """A worker started in place of lost worker ``replaces`` took up its ``slots``."""

    def host_quarantined(self, host: str, reason: str, slots: int) -> None:
        """A host that kept losing workers gets no more tasks: the ``slots`` of the
        workers left on it are out of use (they finish what they run)."""

    def flush(self) -> None:
        """End of one turn of the master's loop."""

    def finished(self, summary: Summary) -> None:
        pass

    def close(self) -> None:
        pass


HOOKS = tuple(name for name, value in vars(Observer).items()
              if callable(value) and not name.startswith("_"))


class Fanout(Observer):
    """Every hook, passed on to the observers (in their order) that override it.

    Several hooks run per task on the master's loop, and most observers leave most hooks
    as the base class's no-op: each hook is bound once, here, to what it must call. A hook
    nobody overrides is the no-op itself, a hook one observer overrides is that observer's
    method; only a hook several override loops over them. The hooks' signatures are
    Observer's; the bindings are set on the instance.
    """

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self.observers = tuple(observers)
        for hook in HOOKS:
            setattr(self, hook, _bind(self.observers, hook))


def _noop(*args: Any) -> None:
    pass


# Hooks whose default calls another: an observer overriding that one needs them too.
_CALLS = {"ready_run": "ready"}


def _bind(observers: Sequence[Observer], hook: str) -> Callable[..., None]:
    """What one hook of a Fanout calls: nothing, the one override, or each override."""
    base = getattr(Observer, hook)
    calls = _CALLS.get(hook)
    methods = [getattr(obs, hook) for obs in observers
               if getattr(type(obs), hook) is not base
               or (calls and getattr(type(obs), calls) is not getattr(Observer, calls))
               # a Fanout within: its bindings are on the instance
               or getattr(obs, "__dict__", {}).get(hook, _noop) is not _noop]
    if not methods:
        return _noop
    if len(methods) == 1:
        return methods[0]  # type: ignore[no-any-return]
    if len(methods) == 2:  # the usual case of a per-task hook (a record file, the tally)
        first, second = methods

        def both(*args: Any) -> None:
            first(*args)
            second(*args)

        return both

    def each(*args: Any) -> None:
        for method in methods:
            method(*args)

    return each
