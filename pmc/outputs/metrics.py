"""Prometheus metrics: every metric name pmc exports is defined here, from the run's tally.

The numbers come from ``pmc.outputs.tally.Tally`` (the counting observer) and are turned
into metric families only when someone collects them — a scrape, a textfile write, a push —
so the master's loop pays nothing per task beyond the tally's attribute updates. The
registry is private (never prometheus_client's global one). The ways out (endpoint,
textfile, Pushgateway, file_sd discovery) are ``pmc.outputs.exporters``'.

Every series carries the run's identity (``IDENTITY``): ``dag`` (the DAG's file name),
``site`` (``--site-name`` / ``PMC_SITE_NAME``), ``batch_job`` (the batch system's job id) and
``chain`` (``PMC_CHAIN_ID``), so two runs never share a series and a dashboard can select
one workflow. The batch job id is not called ``job``: Prometheus owns that label (the
scrape job, i.e. which path the numbers came by) and would rename ours ``exported_job``.
No label is per task, and no metric carries a task's command line or environment.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pmc.outputs.tally import DURATION_BUCKETS, RSS_BUCKETS_KB, Tally

OUTCOMES = ("succeeded", "failed", "retry", "stopped")
IDENTITY = ("dag", "site", "batch_job", "chain")
# Where the batch job id comes from, first found wins: the one pmc's batch scripts export,
# then each scheduler's own.
JOB_ID_VARS = ("PMC_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID", "LOADL_STEP_ID")


def batch_job_id(env: Mapping[str, str]) -> str:
    """The batch job this process runs in, or "" outside one."""
    for var in JOB_ID_VARS:
        value = env.get(var, "")
        if value:
            return value
    return ""


def identity(dag: str, site: str = "", env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The labels every series of a run carries (see the module docstring)."""
    env = os.environ if env is None else env
    return {"dag": os.path.basename(dag), "site": site or env.get("PMC_SITE_NAME", ""),
            "batch_job": batch_job_id(env), "chain": env.get("PMC_CHAIN_ID", "")}


class PmcCollector(Collector):
    """Builds pmc's metric families from a Tally at collection time."""

    def __init__(self, tally: Tally, labels: Mapping[str, str] | None = None) -> None:
        self.tally = tally
        self.labels = dict(labels) if labels is not None else identity(tally.dag, tally.site)

    def collect(self) -> Iterator[Metric]:
        ident = self.labels
        for fam in self._families():
            # The run's identity on every sample (a family's own labels come after it).
            fam.samples = [s._replace(labels={**ident, **s.labels}) for s in fam.samples]
            yield fam

    def _families(self) -> Iterator[Metric]:
        yield from _workflow(self.tally)
        yield from _tasks(self.tally)
        yield from _capacity(self.tally)
        yield from _hosts(self.tally)


def _workflow(t: Tally) -> Iterator[Metric]:
    """The run itself: which, since when, whether it runs, how it ended."""
    info = t.info
    wf = GaugeMetricFamily("pmc_workflow_info", "The workflow this pmc master runs "
                           "(value 1; its identity labels, and the mode)", labels=["mode"])
    wf.add_metric([info.mode if info else ""], 1)
    yield wf
    yield GaugeMetricFamily("pmc_workflow_running",
                            "1 while the workflow runs, 0 once it has ended",
                            value=1 if info is not None and t.summary is None else 0)
    yield GaugeMetricFamily("pmc_workflow_start_time_seconds",
                            "When the run started, Unix time", value=t.start)
    yield GaugeMetricFamily("pmc_workflow_wall_seconds",
                            "Wall time of the run so far (final at the end)", value=t.wall())
    yield GaugeMetricFamily("pmc_workflow_tasks", "Tasks in the DAG",
                            value=info.tasks if info else 0)
    yield GaugeMetricFamily("pmc_workflow_recovered_tasks",
                            "Tasks already done according to the rescue log",
                            value=info.recovered if info else 0)
    if t.summary is not None:
        code = {"succeeded": 0, "failed": 1, "incomplete": 3}.get(t.summary.outcome, 1)
        yield GaugeMetricFamily("pmc_workflow_exit_code",
                                "Exit code of the run (0 ok, 1 failed, 3 incomplete); "
                                "absent while it runs", value=code)


def _tasks(t: Tally) -> Iterator[Metric]:
    """Tasks and their tries: counts by outcome, where they are, how long and how big."""
    tasks = CounterMetricFamily("pmc_tasks", "Tasks that reached their final outcome in "
                                "this run: succeeded, failed for good, or reused (not run: "
                                "declared outputs up to date, --reuse)", labels=["outcome"])
    tasks.add_metric(["succeeded"], t.succeeded)
    tasks.add_metric(["failed"], t.failed)
    tasks.add_metric(["reused"], t.reused_n)
    yield tasks
    tries = CounterMetricFamily("pmc_task_tries", "Task tries that ended, by outcome "
                                "(succeeded, failed, retry: failed and tried again, "
                                "stopped: killed by a stop of the run)", labels=["outcome"])
    for outcome, n in zip(OUTCOMES, (t.succeeded, t.failed, t.retried, t.stopped),
                          strict=True):
        tries.add_metric([outcome], n)
    yield tries
    yield CounterMetricFamily("pmc_tasks_dispatched", "Task tries sent to workers",
                              value=t.dispatched_n)
    yield GaugeMetricFamily("pmc_tasks_running", "Tasks running now (started by a "
                            "worker, not ended)", value=len(t.running))
    yield GaugeMetricFamily("pmc_tasks_queued", "Tasks on workers not started yet "
                            "(queued behind running ones, or on their way)", value=t.queued)
    yield GaugeMetricFamily("pmc_tasks_ready", "Tasks ready and waiting for a slot",
                            value=t.ready_now)
    yield GaugeMetricFamily("pmc_tasks_held", "Tasks held back (not enough wall time "
                            "left for their expected runtime)", value=t.held_n)
    yield _histogram("pmc_task_duration_seconds", "Wall time of task tries, failed ones "
                     "included", DURATION_BUCKETS, t.buckets, t.runtime)
    yield _histogram("pmc_task_max_rss_bytes", "Peak memory of ended task tries whose "
                     "peak is known (the whole process tree with cgroup accounting)",
                     [kb * 1024 for kb in RSS_BUCKETS_KB], t.rss_buckets, t.rss_kb * 1024)
    yield CounterMetricFamily("pmc_task_cpu_seconds", "User + system CPU time of task "
                              "tries", value=t.cpu_time)
    yield CounterMetricFamily("pmc_forwarded_bytes", "Bytes of task output forwarded "
                              "to the master's files (-f / -F)", value=t.forwarded)


def _histogram(name: str, help: str, bounds: Sequence[float], counts: Sequence[int],
               total: float) -> HistogramMetricFamily:
    cumulative: list[tuple[str, float]] = []
    n = 0
    for bound, count in zip(bounds, counts, strict=False):
        n += count
        cumulative.append((_le(bound), n))
    cumulative.append(("+Inf", n + counts[-1]))
    return HistogramMetricFamily(name, help, buckets=cumulative, sum_value=total)


def _capacity(t: Tally) -> Iterator[Metric]:
    """Slots, cpus and workers of the whole run, and how busy they were."""
    info = t.info
    yield GaugeMetricFamily("pmc_slots", "Task slots in use: the workers' at the start, "
                            "less lost workers' and quarantined hosts', plus "
                            "replacements'", value=t.slots)
    yield GaugeMetricFamily("pmc_slots_busy", "Task slots running a task",
                            value=len(t.running))
    yield GaugeMetricFamily("pmc_cpus", "Cpus of all hosts", value=info.cpus if info else 0)
    yield GaugeMetricFamily("pmc_cpus_busy", "Cpus requested by running tasks",
                            value=t.cpus_busy)
    yield GaugeMetricFamily("pmc_workers", "Worker ranks now (lost ones gone, "
                            "replacements counted)", value=t.workers)
    yield CounterMetricFamily("pmc_workers_lost", "Workers lost (link broken, failed, "
                              "or silent for --worker-timeout)", value=t.workers_lost)
    yield CounterMetricFamily("pmc_workers_replaced", "Workers started in place of "
                              "lost ones (embedded mode)", value=t.workers_joined)
    yield GaugeMetricFamily("pmc_hosts_quarantined", "Hosts that get no more tasks "
                            "after losing workers repeatedly",
                            value=len(t.hosts_quarantined))
    per_cpu, per_slot = t.utilization()
    yield GaugeMetricFamily(
        "pmc_cpu_utilization_ratio", "Share of the cpus' time held by tasks so far: "
        "task seconds x the cpus each holds (running ones up to now) / (wall time x "
        "cpus); final at the end", value=per_cpu)
    yield GaugeMetricFamily(
        "pmc_slot_utilization_ratio", "Share of the slots' time busy so far: task "
        "seconds (running ones up to now) / (wall time x slots); at the end, the "
        "'Resource utilization (without master)' line", value=per_slot)


def _hosts(t: Tally) -> Iterator[Metric]:
    """Per host: runtime, slots, cpus and memory (requested by tasks, and total), GPUs."""
    host_rt = CounterMetricFamily("pmc_host_task_seconds", "Summed task runtime per "
                                  "host", labels=["host"])
    for host, secs in t.host_runtime.copy().items():
        host_rt.add_metric([host], secs)
    yield host_rt
    host_slots = GaugeMetricFamily("pmc_host_slots", "Task slots per host",
                                   labels=["host"])
    for host, n in t.host_slots.copy().items():
        host_slots.add_metric([host], n)
    yield host_slots
    yield from _busy_total(t.host_cpus(), "pmc_host_cpus", "Cpus per host",
                           "pmc_host_cpus_busy", "Cpus per host requested by the tasks "
                           "holding them (running, or on their way)", 1)
    yield from _busy_total(t.host_memory(), "pmc_host_memory_bytes", "Memory per host "
                           "(detected, or --host-memory)", "pmc_host_memory_requested_bytes",
                           "Memory per host requested (-m) by the tasks holding it "
                           "(running, or on their way)", 1 << 20)
    yield from _busy_total(t.host_gpus, "pmc_gpus", "GPUs per host (hosts that have some)",
                           "pmc_gpus_busy", "GPUs held by running tasks, per host", 1)


def _busy_total(per_host: dict[str, tuple[int, int]], total_name: str, total_help: str,
                busy_name: str, busy_help: str, unit: int) -> Iterator[Metric]:
    """Two per-host gauges from ``host -> (busy, total)``, times ``unit``."""
    total = GaugeMetricFamily(total_name, total_help, labels=["host"])
    busy = GaugeMetricFamily(busy_name, busy_help, labels=["host"])
    for host, (b, n) in per_host.copy().items():
        total.add_metric([host], n * unit)
        busy.add_metric([host], b * unit)
    yield total
    yield busy


def _le(bound: float) -> str:
    return repr(float(bound))


def metric_names(registry: CollectorRegistry) -> set[str]:
    """Every series name a query can use: gauges as named, counters with ``_total``,
    histograms with ``_bucket``/``_sum``/``_count``."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    for fam in registry.collect():
        names.update(fam.name + s for s in suffixes.get(fam.type, ("",)))
    return names


def make_registry(tally: Tally, labels: Mapping[str, str] | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PmcCollector(tally, labels))
    return registry
