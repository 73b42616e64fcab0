"""One run of a DAG from the master's hand-shake to its observers' close: ``Run``.

``pmc run`` (``commands/run.py``, its master's side in ``commands/runmaster.py``) reads
and locks the DAG, builds the observers and the transport, then hands them to a ``Run``
and calls ``execute``, which takes the steps in order — ``start`` (the workers'
hand-shake), ``started`` (the observers open their files), ``loop``, ``summary`` (the
end-of-run lines, the summary record, the tasks' output merged), ``shutdown`` (the
workers told to stop), ``finished``, ``close`` — and turns what happened into the exit
code. The benchmarks and the tests take the same steps on a ``Run`` of their own, with a
fake transport, so that what they measure or check is what ``pmc run`` does.
"""

from __future__ import annotations

import gc
import signal
import time
from typing import TYPE_CHECKING

from pmc import log
from pmc.errors import ExitCode, FatalError, Interrupted

if TYPE_CHECKING:
    from pmc.commands.taskoutput import TaskOutput
    from pmc.core.events import Observer, RunInfo, Summary
    from pmc.dag import DAG
    from pmc.options import RunOptions
    from pmc.outputs.progress import Progress
    from pmc.runtime import openrun
    from pmc.runtime.master import Master
    from pmc.transport import Transport

YOUNG_COLLECTION = 100_000  # tracked objects allocated, net, between young collections


def settle_heap() -> None:
    """Before the master's loop: what exists now (the DAG, a Task per task) lives as
    long as the run and holds no cycles to collect. Frozen out of the collector's way,
    full collections no longer walk it all; with many slots, results in flight live
    long enough to set those off often (a fifth of the master's cpu per task at 3,200
    slots and a million tasks). No collection first: the parser runs with the
    collector off and makes no cycles, so a full one (0.15 s after a million tasks)
    would walk it all to find nothing.

    In the loop, a young collection comes once the tracked objects have grown by
    YOUNG_COLLECTION rather than Python's 700. Nothing the loop makes holds a cycle
    (every collection of a million-task run finds none), but tasks and results in
    flight outlive a few hundred allocations: collected at 700 they climb to the old
    generation and set off full collections of everything in flight, each finding
    nothing (a million tasks on 10,000 workers x 32 slots: 36 full collections, and
    the master's cpu per task 33.5 -> 27.7 µs without them). A cycle, should one arise,
    waits for at most that many allocations."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION, middle, old)
    gc.enable()  # off since the parse (commands/run.py)


class Run:
    """The master of one run, its transport and observers, and the steps between.

    ``done``: tasks the rescue log says are done; ``reused``: those --reuse reuses;
    ``progress``: the live line, stopped when the loop ends; ``sink``: where the
    workers' output files are merged (None: left where they are); ``opened``: an open
    run's side (tasks added while it runs)."""

    def __init__(self, opts: RunOptions, dag: DAG, transport: Transport, out: Observer,
                 mode: str, *, done: set[int] | None = None, reused: set[int] | None = None,
                 progress: Progress | None = None, sink: TaskOutput | None = None,
                 opened: openrun.OpenRun | None = None) -> None:
        from pmc.runtime.master import Master

        self.opts = opts
        self.transport = transport
        self.out = out
        self.progress = progress
        self.sink = sink
        self.opened = opened
        self.master = Master(transport, opts, dag, done or set(), out, mode, reused or set())
        self.merged = True  # the tasks' output merged (or nothing to merge)

    def start(self) -> RunInfo:
        """The workers' hand-shake (the heap settled first), and what the run is."""
        settle_heap()
        log.info(f"Setting max cached files = {self.master.forward.maxfds}")
        log.info(f"Master starting with {self.transport.size - 1} workers")
        if self.opts.max_wall_time is not None:
            log.info(f"Setting max walltime to {self.opts.max_wall_time:f} minutes")
        return self.master.start()

    def started(self, info: RunInfo) -> None:
        """The observers open their files now: a run that cannot start leaves none."""
        try:
            self.out.started(info)
        except OSError as e:
            raise FatalError(f"Cannot open output file: {e}") from e
        if self.opened is not None:
            self.opened.open(self.master)

    def loop(self) -> Summary:
        """The master's loop, to the end of the workflow or a stop."""
        try:
            return self.master.loop()
        finally:
            # The live line ends with the loop: the end-of-run lines come after it.
            if self.progress is not None:
                self.progress.stop()

    def summary(self, summary: Summary) -> None:
        """PMC's order: the end-of-run lines, the summary record, the tasks' output (then
        the workers' shutdown). Every task has reported (its output and record are in
        the worker's files) unless some never did after a stop: then their output is
        merged once the workers have finished them off."""
        from pmc.runtime.summary import write_summary

        master = self.master
        _end_of_run_lines(master, summary)
        write_summary(summary)
        if self.sink is None:
            return
        if master.gave_up:
            self.sink.pending = True
        else:
            pings = master.losses.ping_quiet
            self.merged = self.sink.merge(self.transport.size,
                                          between=lambda: pings(time.monotonic()))

    def shutdown(self, began: bool = True) -> None:
        """The workers told to stop, the transport and the master closed; output still to
        merge merged (``began``: the run got as far as a summary, so every worker's file
        should be there)."""
        if self.opened is not None:
            self.opened.close()
        log.info("Sending workers shutdown messages...")
        self.master.shutdown_workers()
        self.transport.close()
        self.master.close()
        if self.sink is not None and self.sink.pending:
            # Workers that never got as far as opening their files leave none: no
            # warning about those when the run stopped before it began.
            self.merged = self.sink.merge(self.transport.size, warn_missing=began)

    def finished(self, summary: Summary) -> None:
        self.out.finished(summary)

    def close(self) -> None:
        self.out.close()

    def execute(self) -> int:
        """Every step, signals caught on the way (SIGTERM, SIGINT: the master stops
        cleanly); the exit code."""
        master = self.master

        def on_signal(signum: int, frame: object) -> None:
            master.signal_received = signum

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        summary, interrupted = None, False
        try:
            summary, interrupted = self._run()
            if summary is not None:
                self.summary(summary)
            elif self.sink is not None:
                self.sink.pending = True
        finally:
            self.shutdown(began=summary is not None)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if summary is None:
            self.close()
            return ExitCode.INCOMPLETE if interrupted else ExitCode.FAILED
        self.finished(summary)
        self.close()
        return self._exit_code(summary)

    def _run(self) -> tuple[Summary | None, bool]:
        """start, started, loop: the summary (None if the run stopped on an error, which
        is logged), and whether a signal stopped it before any task could start."""
        from pmc.core.rescue import RescueError

        try:
            self.started(self.start())
            return self.loop(), False
        except Interrupted:
            log.error("Aborting workflow")
            return None, True
        except (FatalError, RescueError) as e:
            log.fatal(str(e))
        except OSError as e:
            log.fatal(f"{e}")
        return None, False

    def _exit_code(self, summary: Summary) -> int:
        if summary.outcome == "succeeded":
            if not self.merged:
                log.error("Workflow succeeded, but its tasks' output could not be merged")
                return ExitCode.FAILED
            log.info("Workflow succeeded")
            return ExitCode.OK
        if summary.outcome == "failed":
            log.error("Workflow failed")
            return ExitCode.FAILED
        what = "aborted" if self.master.stop_reason else "incomplete"
        log.error(f"Workflow {what}: {summary.reason}; run again to resume from "
                  f"{self.opts.rescue_path}")
        return ExitCode.INCOMPLETE


def _end_of_run_lines(master: Master, summary: Summary) -> None:
    """PMC's lines between the end of the loop and the summary record, in its order."""
    if master.stop_reason is not None:
        log.error("Aborting workflow")
    else:
        log.info("Workflow finished")
    if not master.engine.accepting():
        log.error("Max failures reached: DAG prematurely aborted")
    if not log.enabled(log.INFO):
        return
    runtime, wall, makespan = summary.runtime, summary.wall, summary.makespan
    log.info(f"Resource utilization (with master): {summary.utilization_with_master:f}")
    log.info(f"Resource utilization (without master): {summary.utilization:f}")
    log.info(f"Total runtime of tasks: {runtime:f} seconds ({runtime / 60:f} minutes)")
    log.info(f"Wall time: {wall:f} seconds ({wall / 60:f} minutes)")
    log.info(f"Makespan: {makespan:f} seconds ({makespan / 60:f} minutes)")
    # PMC's figure: tasks that succeeded per second of makespan.
    throughput = summary.succeeded / makespan if makespan > 0 else 0.0
    log.info(f"Throughput: {throughput:f} tasks/second")
    log.info(f"File descriptor cache hit rate: {master.forward.hitrate():f}")
