"""Which observers a run has: the one place that knows, from the run's options.

``outputs(opts)`` builds them all, in the order the master tells them events: the record
files (jobstate.log, dagman.out, the resource log), the tally (before everything that
reads it), the event log, the status snapshot, the metrics export, the progress line.
Building them opens no file and starts no thread — each does so when the run starts (its
``started`` hook) — so the composition root may build them before the master exists.
The one exception is the metrics endpoint: it is bound here, so that a port that cannot
be had is a ``FatalError`` raised before anything runs.
"""

from __future__ import annotations

from typing import NamedTuple

from pmc import log
from pmc.core.events import Observer
from pmc.logsetup import LogOutput, log_output
from pmc.options import RunOptions
from pmc.outputs.eventlog import EventLog
from pmc.outputs.progress import Progress, progress_observer
from pmc.outputs.recordfiles import DagmanOut, JobstateLog, ResourceLog
from pmc.outputs.status import StatusFile
from pmc.outputs.tally import Tally


class Outputs(NamedTuple):
    """A run's observers, and its progress line (stopped by the caller when the
    workflow's loop ends, before the end-of-run lines), if it has one."""

    observers: list[Observer]
    progress: Progress | None = None


def outputs(opts: RunOptions, output: LogOutput | None = None) -> Outputs:
    """The observers of one run (see the module docstring); ``output``: where the log
    goes, which the event log shares (made from ``opts`` if not given)."""
    observers = record_files(opts)
    tally = Tally(opts.dag, opts.site)
    observers.append(tally)
    if output is None:
        output = log_output(opts)
    if output.json or opts.log_level >= log.DEBUG:
        observers.append(EventLog(output))
    export = None
    if (opts.metrics_port is not None or opts.metrics_textfile
            or opts.metrics_pushgateway or opts.metrics_file_sd):
        # Imported only when asked for: prometheus_client takes a while to import.
        from pmc.outputs.exporters import MetricsExport

        export = MetricsExport(opts, tally)
    # The snapshot says where the endpoint is (its port may not be the one asked for).
    observers.append(StatusFile(opts.dag, tally, export.url if export else ""))
    if export is not None:
        observers.append(export)
    progress = progress_observer(opts, [tally])
    if progress is not None:
        observers.append(progress)
    return Outputs(observers, progress)


def record_files(opts: RunOptions) -> list[Observer]:
    """The record files asked for: jobstate.log, dagman.out, the resource log."""
    out: list[Observer] = []
    if opts.jobstate_log:
        out.append(JobstateLog(opts.dag))
    if opts.monitord_hack:
        out.append(DagmanOut(opts.dag))
    if not opts.no_resource_log:
        out.append(ResourceLog(opts.dag))
    return out
