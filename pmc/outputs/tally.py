"""The run's tally: the one observer that counts, read by whatever reports counts.

A few attribute updates per event (and one bisect for the duration histogram), so the
master's hot loop pays for counting once however many outputs are on. Read by the
Prometheus collector (``pmc.outputs.metrics``), the status snapshot
(``pmc.outputs.status``) and the progress line (``pmc.outputs.progress``); it imports none
of them.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from pmc.core.events import Observer, RunInfo, Summary, TriesSoFar
from pmc.core.protocol import TaskResult
from pmc.core.resources import Host
from pmc.dag import Task
from pmc.dag.model import options_of

NAMES_KEPT = 20  # failed members' names kept per array

# Upper bounds (seconds) of the task duration histogram: milliseconds to hours.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 300.0, 900.0, 3600.0, 14400.0)
# Upper bounds (KiB, as the workers measure it) of the tries' peak memory histogram:
# 1 MiB to 256 GiB, by fours.
RSS_BUCKETS_KB = tuple(1024 << (2 * i) for i in range(10))


class ArrayProgress:
    """A task array's members (a pmc extension), counted as the tally counts tasks."""

    __slots__ = ("done", "failed", "failed_names", "members", "reused", "running")

    def __init__(self, members: int, done: int, reused: int) -> None:
        self.members = members
        self.done = done  # succeeded, in this run or one before
        self.reused = reused
        self.running = 0
        self.failed = 0  # for good, in this run
        self.failed_names: list[str] = []  # the first few


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
        # Started by a worker and not ended: never more than the slots. id -> (task, rank,
        # host, its start: the worker's Unix time).
        self.running: dict[int, tuple[Task, int, str, float]] = {}
        # Dispatched, not started yet (in flight to the worker, or promoted in the place of
        # a task that ended, the worker's word on its start to come).
        self.sent: dict[int, tuple[Task, int, str]] = {}
        self.prefetched = 0  # queued on workers behind running tasks
        self.cpus_busy = 0
        self.memory_busy = 0
        # The seconds of the tries ended: the master's counts (RunInfo.counts), read.
        self.counts: TriesSoFar | None = None
        self.forwarded = 0
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)  # last: above the top bound
        # Peak memory of ended tries whose peak is known (KiB): per bucket, and the sum.
        self.rss_buckets = [0] * (len(RSS_BUCKETS_KB) + 1)
        self.rss_kb = 0
        # Per host, the seconds of the tries ended there and how many: the master's
        # counts (RunInfo.counts), read (a multi-rank try on several hosts: on each).
        self.host_runtime: dict[str, float] = {}
        self.host_tasks: dict[str, int] = {}
        self.host_slots: dict[str, int] = {}
        # The hosts themselves, read when collected (their free cpus and memory now):
        # nothing to copy per task.
        self.hosts: dict[str, Host] = {}
        # GPUs per host that has some: host -> (busy, total), as of its last change.
        self.host_gpus: dict[str, tuple[int, int]] = {}
        # Running multi-rank tasks (pmc extension): id -> (name, its hosts, comma list).
        self.multirank: dict[int, tuple[str, str]] = {}
        self.failed_names: list[str] = []  # permanently failed, in order
        self.reused_n = 0  # not run: declared outputs up to date (--reuse)
        # Task arrays (pmc extension), by name: empty for a DAG without any, which then
        # pays one test of an empty dict per hook below.
        self.arrays: dict[str, ArrayProgress] = {}
        # Workers lost and started in their place, hosts quarantined; the slots and
        # workers these took away or brought, against the counts at the start.
        self.workers_lost = 0
        self.workers_joined = 0
        self.hosts_quarantined: list[str] = []
        self.slots_change = 0
        self.workers_change = 0

    @property
    def runtime(self) -> float:
        """Seconds of the tries ended so far."""
        return self.counts.runtime if self.counts is not None else 0.0

    @property
    def cpu_seconds(self) -> float:
        """Those seconds times the cpus each try held."""
        return self.counts.cpu_seconds if self.counts is not None else 0.0

    @property
    def cpu_time(self) -> float:
        """User + system cpu time of the tries ended so far."""
        return self.counts.cpu_time if self.counts is not None else 0.0

    # -- hooks -----------------------------------------------------------------------------

    def started(self, info: RunInfo) -> None:
        self.info = info
        self.start = info.start
        self.counts = info.counts
        if info.counts is not None:
            self.host_runtime = info.counts.per_host_runtime
            self.host_tasks = info.counts.per_host_tries
        self.reused_n = info.reused
        self.arrays = {a.name: ArrayProgress(a.members, a.recovered, a.reused)
                       for a in info.arrays}

    def tasks_added(self, tasks: Sequence[Task], total: int) -> None:
        if self.info is not None:  # an open run's total (status, progress, metrics)
            self.info = self.info._replace(tasks=total)

    def host_changed(self, host: Host) -> None:
        if host.name not in self.host_slots:
            self.host_slots[host.name] = sum(w.slots for w in host.workers)
            self.hosts[host.name] = host
        if host.gpus:
            self.host_gpus[host.name] = (len(host.gpus) - len(host.free_gpus), len(host.gpus))

    def ready(self, task: Task, seq: int) -> None:
        self.ready_events += 1
        lost = self.running.pop(task.id, None)
        if lost is not None:
            # Ready again without a result: its worker was lost and it will run again.
            self.lost += 1
            self.cpus_busy -= task.cpus
            self.memory_busy -= task.memory
            if self.arrays and task.array is not None:
                self.arrays[task.array.name].running -= 1
            if self.multirank:
                self._multirank_ended(task)
        elif self.sent.pop(task.id, None) is not None:
            self.lost += 1

    def ready_run(self, tasks: Iterable[Task], seq: int, count: int) -> None:
        self.ready_events += count  # ready at once: none was running

    def dispatched(self, task: Task, seq: int, attempt: int, rank: int, host: str) -> None:
        self.dispatched_n += 1
        self.sent[task.id] = (task, rank, host)

    def task_started(self, task: Task, seq: int, attempt: int, rank: int, host: str,
                     start: float) -> None:
        self.sent.pop(task.id, None)
        self.running[task.id] = (task, rank, host, start)
        self.cpus_busy += task.cpus
        self.memory_busy += task.memory
        if self.arrays and task.array is not None:
            self.arrays[task.array.name].running += 1
        if options_of(task).ranks != 1:  # its other ranks' cpus and memory are busy too
            self.multirank[task.id] = (task.name, host)
            self.cpus_busy += task.cpus * (task.ranks - 1)
            self.memory_busy += task.memory * (task.ranks - 1)

    def _multirank_ended(self, task: Task) -> None:
        if self.multirank.pop(task.id, None) is not None:
            self.cpus_busy -= task.cpus * (task.ranks - 1)
            self.memory_busy -= task.memory * (task.ranks - 1)

    def ended(self, task: Task, seq: int, res: TaskResult, error: str | None) -> None:
        d = res.duration
        entry = self.running.pop(task.id, None)
        if entry is not None:
            self.cpus_busy -= task.cpus
            self.memory_busy -= task.memory
            if self.arrays and task.array is not None:
                self.arrays[task.array.name].running -= 1
            if self.multirank:
                self._multirank_ended(task)
        self.buckets[bisect_left(DURATION_BUCKETS, d)] += 1
        rss = res.max_rss_kb
        if rss is not None:
            self.rss_buckets[bisect_left(RSS_BUCKETS_KB, rss)] += 1
            self.rss_kb += rss

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
        if self.arrays and task.array is not None:
            self._array_result(self.arrays[task.array.name], task.name, outcome)

    @staticmethod
    def _array_result(progress: ArrayProgress, name: str, outcome: str) -> None:
        if outcome == "succeeded":
            progress.done += 1
        elif outcome == "failed":
            progress.failed += 1
            if len(progress.failed_names) < NAMES_KEPT:
                progress.failed_names.append(name)

    def held(self, task: Task, reason: str) -> None:
        self.held_n += 1

    def worker_lost(self, rank: int, host: str, slots: int, reason: str,
                    rerun: int) -> None:
        self.workers_lost += 1
        self.workers_change -= 1
        self.slots_change -= slots

    def worker_joined(self, rank: int, host: str, slots: int, replaces: int) -> None:
        self.workers_joined += 1
        self.workers_change += 1
        self.slots_change += slots

    def host_quarantined(self, host: str, reason: str, slots: int) -> None:
        self.hosts_quarantined.append(host)
        self.slots_change -= slots

    def finished(self, summary: Summary) -> None:
        self.summary = summary
        for progress in self.arrays.values():
            progress.running = 0
        self.running.clear()
        self.multirank.clear()
        self.sent.clear()
        self.prefetched = 0
        self.cpus_busy = self.memory_busy = 0

    # -- derived figures -------------------------------------------------------------------

    def host_cpus(self) -> dict[str, tuple[int, int]]:
        """Cpus per host: (requested by the tasks holding them, total)."""
        return {name: (h.cpus - h.free_cpus, h.cpus) for name, h in self.hosts.copy().items()}

    def host_memory(self) -> dict[str, tuple[int, int]]:
        """Memory (MB) per host: (requested by the tasks holding it, total)."""
        return {name: (h.memory - h.free_memory, h.memory)
                for name, h in self.hosts.copy().items()}

    @property
    def queued(self) -> int:
        """Tasks on workers not started yet: prefetched behind running ones, or sent."""
        return len(self.sent) + self.prefetched

    @property
    def ready_now(self) -> int:
        return max(0, self.ready_events - self.dispatched_n - self.held_n)

    @property
    def slots(self) -> int:
        """Task slots in use now: those of the start, less those of lost workers and
        quarantined hosts, plus those of workers started in their place."""
        return self.info.slots + self.slots_change if self.info is not None else 0

    @property
    def workers(self) -> int:
        """Workers now: those of the start, less the lost, plus their replacements."""
        return self.info.workers + self.workers_change if self.info is not None else 0

    def wall(self) -> float:
        if self.summary is not None:
            return self.summary.wall
        if self.info is None:
            return 0.0
        return max(0.0, time.time() - self.info.start)

    def utilization(self) -> tuple[float, float]:
        """(per cpu, per slot) so far: the seconds of ended tries and of running ones up
        to now (times the cpus each holds, for the first), over the wall time x the cpus
        (the slots) of the start. At the end, the summary's ``cpu_utilization`` and
        ``utilization``: the end-of-run figures."""
        info = self.info
        if self.summary is not None:
            return self.summary.cpu_utilization, self.summary.utilization
        if info is None:
            return 0.0, 0.0
        wall = self.wall()
        cpu_s, slot_s = self.cpu_seconds, self.runtime
        now = time.time()
        # A copy: the master's thread changes the dict while a scrape reads it.
        for task, _rank, _host, start in self.running.copy().values():
            elapsed = max(0.0, now - start)  # (a worker's clock a little ahead: none yet)
            o = options_of(task)
            slot_s += elapsed
            cpu_s += elapsed * o.cpus * o.ranks
        return (cpu_s / (wall * info.cpus) if wall > 0 and info.cpus > 0 else 0.0,
                slot_s / (wall * info.slots) if wall > 0 and info.slots > 0 else 0.0)
