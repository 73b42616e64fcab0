"""The run's end-of-run figures: counted by the master as tries end, summed up once.

``Counts`` keeps what the engine does not (tries as the reference's [cluster-summary]
counts them, task runtime and cpu time, the makespan's ends); ``Counts.summary`` puts
them together with the engine's and the resources' into the ``Summary``.
"""

from __future__ import annotations

import os
import sys

from pmc.core.engine import Engine
from pmc.core.events import Summary
from pmc.core.protocol import TaskResult
from pmc.core.records import cluster_summary_record
from pmc.core.resources import Resources


class Counts:
    __slots__ = ("cpu_seconds", "cpu_time", "first_start", "last_end", "per_host_runtime",
                 "per_host_tries", "runtime", "tries_failed", "tries_stopped",
                 "tries_submitted")

    def __init__(self) -> None:
        # Tries as the reference's [cluster-summary] counts them: every try sent to a
        # worker, every try that failed (retried or not).
        self.tries_submitted = 0
        self.tries_failed = 0
        self.tries_stopped = 0  # killed by a stop of the run
        self.runtime = 0.0
        self.cpu_seconds = 0.0  # runtime x the cpus each try held
        self.cpu_time = 0.0
        self.first_start: float | None = None
        self.last_end = 0.0
        # Per host, the tries that ended there and their seconds. A multi-rank try with
        # ranks on several hosts held each of them for its whole duration: it counts in
        # full on every one (the summary, the event log, pmc status and the metrics all
        # read these).
        self.per_host_runtime: dict[str, float] = {}
        self.per_host_tries: dict[str, int] = {}

    def ended(self, res: TaskResult, host: str, cpus: int) -> None:
        """A try that held ``cpus`` (all its ranks') ended on ``host`` (for a multi-rank
        try on several hosts, their names, comma-separated)."""
        d = res.duration
        self.runtime += d
        self.cpu_seconds += d * cpus
        self.cpu_time += res.cpu_time
        runtime, tries = self.per_host_runtime, self.per_host_tries
        for name in host.split(",") if "," in host else (host,):
            runtime[name] = runtime.get(name, 0.0) + d
            tries[name] = tries.get(name, 0) + 1
        if self.first_start is None or res.start < self.first_start:
            self.first_start = res.start
        self.last_end = max(self.last_end, res.start + res.duration)

    def summary(self, engine: Engine, resources: Resources, stop_reason: str | None,
                start: float, wall: float) -> Summary:
        if engine.nfailed:
            outcome, ok = "failed", False
        elif engine.succeeded():
            outcome, ok = "succeeded", True
        else:
            outcome, ok = "incomplete", False
        reason = stop_reason or ""
        if not reason and engine.nheld:
            reason = f"{engine.nheld} task(s) held back: not enough wall time left"
        makespan = (self.last_end - self.first_start) if self.first_start is not None else 0.0
        return Summary(
            ok=ok, outcome=outcome, reason=reason, tasks=engine.ntasks,
            submitted=engine.nsubmitted, succeeded=engine.ndone - engine.recovered,
            failed=engine.nfailed, extra=engine.nretries, recovered=engine.recovered,
            tries_submitted=self.tries_submitted, tries_failed=self.tries_failed,
            tries_retried=engine.nretries, tries_stopped=self.tries_stopped,
            start=start, wall=wall, pid=os.getpid(), app=os.path.abspath(sys.argv[0]),
            runtime=self.runtime, cpu_time=self.cpu_time, slots=resources.total_slots,
            cpus=resources.total_cpus, workers=len(resources.workers),
            makespan=makespan, held=engine.nheld, per_host_runtime=self.per_host_runtime,
            cpu_seconds=self.cpu_seconds,
            reused=engine.nreused,
        )


def write_summary(summary: Summary) -> None:
    """The [cluster-summary] record on stdout (always stdout, even with -o, as PMC)."""
    try:
        sys.stdout.write(cluster_summary_record(summary))
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
