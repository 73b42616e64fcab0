"""Prometheus metrics: every metric name pmc exports is defined here, and its exporters.

The numbers come from ``pmc.outputs.tally.Tally`` (the counting observer) and are turned
into metric families only when someone collects them — a scrape, a textfile write, a push —
so the master's loop pays nothing per task beyond the tally's attribute updates. The
registry is private (never prometheus_client's global one).

Three ways out, any combination:
- HTTP endpoint on the master (``--metrics-port``, ``--metrics-bind``; port 0 picks a
  free port and the URL is logged at INFO). With ``PMC_METRICS_LINGER=SECONDS`` the
  endpoint stays up after the workflow ends until one scrape has seen the final numbers
  or the time is up, so a scraper does not miss the end of a short job.
- node_exporter textfile (``--metrics-textfile``), replaced atomically (tmp + rename)
  every few seconds and once more at the end.
- Pushgateway (``--metrics-pushgateway URL``): pushed every few seconds and once more at
  the end, so a short job's numbers are not lost.

Every series carries the run's identity (``IDENTITY``): ``dag`` (the DAG's file name),
``site`` (``--site-name`` / ``PMC_SITE_NAME``), ``batch_job`` (the batch system's job id) and
``chain`` (``PMC_CHAIN_ID``), so two runs never share a series and a dashboard can select
one workflow. The batch job id is not called ``job``: Prometheus owns that label (the
scrape job, i.e. which path the numbers came by) and would rename ours ``exported_job``.
No label is per task, and no metric carries a task's command line or environment.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app, push_to_gateway
from prometheus_client.exposition import ThreadingWSGIServer, write_to_textfile
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pmc import log
from pmc.core.events import Observer, RunInfo, Summary
from pmc.errors import FatalError
from pmc.options import RunOptions
from pmc.outputs.tally import DURATION_BUCKETS, Tally

OUTCOMES = ("succeeded", "failed", "retry", "stopped")
TEXTFILE_EVERY = 5.0  # seconds
PUSH_EVERY = 15.0  # seconds
PUSH_TIMEOUT = 10.0  # seconds, per push
LINGER_ENV = "PMC_METRICS_LINGER"
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
        t = self.tally
        info = t.info
        running_now = 1 if info is not None and t.summary is None else 0

        wf = GaugeMetricFamily("pmc_workflow_info", "The workflow this pmc master runs "
                               "(value 1; its identity labels, and the mode)",
                               labels=["mode"])
        wf.add_metric([info.mode if info else ""], 1)
        yield wf
        yield GaugeMetricFamily("pmc_workflow_running",
                                "1 while the workflow runs, 0 once it has ended",
                                value=running_now)
        yield GaugeMetricFamily("pmc_workflow_start_time_seconds",
                                "When the run started, Unix time", value=t.start)
        yield GaugeMetricFamily("pmc_workflow_wall_seconds",
                                "Wall time of the run so far (final at the end)",
                                value=t.wall())
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

        tasks = CounterMetricFamily("pmc_tasks", "Task tries that ended, by outcome "
                                    "(succeeded, failed, retry, stopped)",
                                    labels=["outcome"])
        for outcome, n in zip(OUTCOMES, (t.succeeded, t.failed, t.retried, t.stopped),
                              strict=True):
            tasks.add_metric([outcome], n)
        yield tasks
        yield CounterMetricFamily("pmc_tasks_dispatched", "Task tries sent to workers",
                                  value=t.dispatched_n)
        yield GaugeMetricFamily("pmc_tasks_running", "Tasks running now (started by a "
                                "worker, not ended)",
                                value=len(t.running))
        yield GaugeMetricFamily("pmc_tasks_queued", "Tasks on workers not started yet "
                                "(queued behind running ones, or on their way)",
                                value=t.queued)
        yield GaugeMetricFamily("pmc_tasks_ready", "Tasks ready and waiting for a slot",
                                value=t.ready_now)
        yield GaugeMetricFamily("pmc_tasks_held", "Tasks held back (not enough wall time "
                                "left for their expected runtime)", value=t.held_n)

        cumulative: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip(DURATION_BUCKETS, t.buckets, strict=False):
            total += n
            cumulative.append((_le(bound), total))
        total += t.buckets[-1]
        cumulative.append(("+Inf", total))
        yield HistogramMetricFamily("pmc_task_duration_seconds",
                                    "Wall time of task tries, failed ones included",
                                    buckets=cumulative, sum_value=t.runtime)
        yield CounterMetricFamily("pmc_task_cpu_seconds", "User + system CPU time of task "
                                  "tries", value=t.cpu_time)
        yield CounterMetricFamily("pmc_forwarded_bytes", "Bytes of task output forwarded "
                                  "to the master's files (-f / -F)", value=t.forwarded)

        slots = t.slots
        yield GaugeMetricFamily("pmc_slots", "Task slots in use: the workers' at the "
                                "start, less lost workers' and quarantined hosts', plus "
                                "replacements'", value=slots)
        yield GaugeMetricFamily("pmc_slots_busy", "Task slots running a task",
                                value=len(t.running))
        yield GaugeMetricFamily("pmc_cpus", "Cpus of all hosts",
                                value=info.cpus if info else 0)
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
        yield GaugeMetricFamily(
            "pmc_resource_utilization",
            "Summed task runtime / (wall time x slots), as in the end-of-run log line",
            value=t.utilization())

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
        gpus = GaugeMetricFamily("pmc_gpus", "GPUs per host (hosts that have some)",
                                 labels=["host"])
        gpus_busy = GaugeMetricFamily("pmc_gpus_busy", "GPUs held by running tasks, per "
                                      "host", labels=["host"])
        for host, (busy, total) in t.host_gpus.copy().items():
            gpus.add_metric([host], total)
            gpus_busy.add_metric([host], busy)
        yield gpus
        yield gpus_busy


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


def textfile_path(path: str, labels: Mapping[str, str]) -> str:
    """``--metrics-textfile``: a file, or — given a directory (existing, or ending in
    "/") — a file in it named after the run, so that jobs sharing a node and its textfile
    directory never write the same file: ``pmc_DAG_JOB.prom`` in a batch job,
    ``pmc_DAG_HOST_PID.prom`` outside one."""
    if not (path.endswith("/") or os.path.isdir(path)):
        return path
    stem = os.path.splitext(labels.get("dag", ""))[0] or "dag"
    who = labels.get("batch_job") or f"{socket.gethostname()}_{os.getpid()}"
    name = "_".join(("pmc", stem, who))
    # node_exporter reads *.prom: keep the name to characters every file system takes.
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return os.path.join(path, f"{safe}.prom")


class _SilentHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # no per-scrape lines on the master's stderr


class _V6Server(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _Notify:
    """Response body whose close() — called by wsgiref after the body was sent — tells the
    master that a scrape saw the final numbers."""

    def __init__(self, body: Iterable[bytes], done: Callable[[], None]) -> None:
        self.body = body
        self.done = done

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        self.done()


class MetricsExport(Observer):
    """Serves, writes and pushes the metrics of one run."""

    def __init__(self, opts: RunOptions, tally: Tally) -> None:
        self.tally = tally
        self.labels = identity(opts.dag, opts.site)
        self.registry = make_registry(tally, self.labels)
        self.textfile = textfile_path(opts.metrics_textfile, self.labels) \
            if opts.metrics_textfile else None
        self.gateway = opts.metrics_pushgateway
        # One group per run: a second job of the same workflow on the same host must not
        # replace the first one's numbers.
        self.grouping = {"workflow": os.path.basename(opts.dag) or "dag",
                         "instance": socket.gethostname()}
        if self.labels["batch_job"]:
            self.grouping["batch_job"] = self.labels["batch_job"]
        self.linger = _linger_seconds()
        self.final_scraped = threading.Event()
        self.server: WSGIServer | None = None
        self.url = ""
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        # The endpoint now, so that a port that cannot be had stops the run before it
        # begins; the textfile and pushes once it has started (``started``).
        if opts.metrics_port is not None:
            self._serve(opts.metrics_bind, opts.metrics_port)

    def started(self, info: RunInfo) -> None:
        if (self.textfile or self.gateway) and self.thread is None:
            self.thread = threading.Thread(target=self._periodic, name="pmc-metrics",
                                           daemon=True)
            self.thread.start()

    # -- HTTP --------------------------------------------------------------------------

    def _serve(self, bind: str, port: int) -> None:
        inner = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            body: Iterable[bytes] = inner(environ, start_response)
            if self.tally.summary is not None:
                return _Notify(body, self.final_scraped.set)
            return body

        server_class = _V6Server if ":" in bind else ThreadingWSGIServer
        try:
            self.server = make_server(bind, port, app, server_class,
                                      handler_class=_SilentHandler)
        except OSError as e:
            raise FatalError(f"Cannot serve metrics on {bind}:{port}: {e.strerror or e}") \
                from e
        actual = self.server.server_port
        host = f"[{bind}]" if ":" in bind else bind
        self.url = f"http://{host}:{actual}/metrics"
        threading.Thread(target=self.server.serve_forever, args=(0.1,), name="pmc-metrics-http",
                         daemon=True).start()
        log.info(f"Metrics: serving {self.url}")

    # -- textfile and Pushgateway ------------------------------------------------------

    def _periodic(self) -> None:
        next_push = time.monotonic() + PUSH_EVERY
        while not self.stop.wait(TEXTFILE_EVERY):
            self._write_textfile()
            if self.gateway and time.monotonic() >= next_push:
                next_push = time.monotonic() + PUSH_EVERY
                self._push()

    def _write_textfile(self) -> None:
        if not self.textfile:
            return
        try:
            # Written to PATH.<pid>.<thread> beside it, then renamed: readers never see a
            # half-written file.
            write_to_textfile(self.textfile, self.registry)
        except OSError as e:
            log.warn(f"Cannot write metrics textfile {self.textfile}: {e}")

    def _push(self) -> None:
        assert self.gateway is not None
        try:
            push_to_gateway(self.gateway, job="pmc", registry=self.registry,
                            grouping_key=self.grouping, timeout=PUSH_TIMEOUT)
        except Exception as e:
            log.warn(f"Cannot push metrics to {self.gateway}: {e}")

    # -- the end -----------------------------------------------------------------------

    def finished(self, summary: Summary) -> None:
        self._stop_thread()
        self._write_textfile()
        if self.gateway:
            self._push()
        if self.server is not None and self.linger > 0:
            log.info(f"Metrics: waiting up to {self.linger:g} s for a final scrape of "
                     f"{self.url}")
            self.final_scraped.wait(self.linger)

    def _stop_thread(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def close(self) -> None:
        self._stop_thread()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _linger_seconds() -> float:
    text = os.environ.get(LINGER_ENV, "")
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        log.warn(f"Ignoring {LINGER_ENV}={text!r}: not a number of seconds")
        return 0.0
    return max(0.0, value)
