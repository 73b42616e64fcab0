"""Running a workflow: pick the mode, read and lock the DAG, wire master, workers, outputs.

The composition root: the run's observers are built here, before the master exists, and
told here that the run started (once the master's hand-shake with its workers is done:
no output file is created for a run that cannot start), finished, and is over.

MPI mode when the process was started by an MPI launcher (decided from the launcher's
environment before mpi4py is imported, since importing it initialises MPI); otherwise the
embedded mode with worker processes on this machine. Both run the same master and worker.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pmc import batchsignals, log, logsetup
from pmc.errors import ExitCode, FatalError, Interrupted
from pmc.options import RunOptions, without_effect
from pmc.process import flush_stdio
from pmc.runtime.workers import Workers, serve_forked

if TYPE_CHECKING:
    # The master's side is imported where the master is made (below): a worker rank,
    # which runs this module too, needs none of it (~15 ms of imports per rank).
    from pmc.core.events import Observer, Summary
    from pmc.dag import DAG
    from pmc.outputs.progress import Progress
    from pmc.runtime import openrun
    from pmc.runtime.master import Master
    from pmc.transport import Transport

_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "ALPS_APP_PE",
            "MPI_LOCALRANKID")


def launched_by_mpi(env: Mapping[str, str]) -> bool:
    """True when an MPI launcher (mpiexec, srun, aprun, poe) started this process."""
    if any(k in env for k in _MPI_ENV):
        return True
    step = env.get("SLURM_STEP_ID")
    # The batch script itself runs in a step named "batch" (or 4294967294): not a launch.
    return step is not None and "SLURM_PROCID" in env and step not in (
        "batch", "extern", "4294967294", "4294967295")


def run(opts: RunOptions) -> int:
    mode = opts.mode
    if mode == "auto":
        mode = "mpi" if launched_by_mpi(os.environ) else "local"
    # From the start, in every process of the run: a batch system's warning that time is
    # short is noted, never a death (pmc.batchsignals; the master acts on it).
    previous = batchsignals.catch()
    try:
        if mode == "mpi":
            return _run_mpi(opts)
        return _run_local(opts)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_mpi(opts: RunOptions) -> int:
    from pmc.runtime import rankshim

    # Before MPI starts: a worker rank's death by a signal becomes an exit, which Hydra
    # survives (its proxy kills every rank when it reaps one killed by a signal).
    rankshim.keep()
    from pmc.transport.mpi import MpiTransport

    # With prefetching the next tasks already wait on the workers: a moment's delay in
    # seeing a message costs nothing, and spinning would take cpu from the tasks.
    transport = MpiTransport(sleep_on_recv=not opts.no_sleep_on_recv,
                             spin=not opts.prefetching, host_sockets=opts.host_sockets)
    if transport.rank != 0:
        from pmc.runtime import worker

        return _leave_mpi(worker.run(transport))
    if transport.size < 2:
        log.fatal("At least one worker process is required")
        return ExitCode.FAILED
    workers = Workers(lambda: transport)
    workers.started()
    try:
        code = _run_master(opts, workers, "mpi")
    finally:
        workers.release()
    return _leave_mpi(code)


def _leave_mpi(code: int) -> int:
    """After a rank was lost MPI_Finalize (mpi4py calls it at exit) waits for it for
    ever: leave at once instead, with everything written."""
    from pmc.transport.mpi import peer_lost

    if peer_lost():
        flush_stdio()
        os._exit(code)
    return code


def _run_local(opts: RunOptions) -> int:
    from pmc.dag.edgehelper import MIN_BYTES
    from pmc.transport.local import LocalMaster, forks

    n = opts.workers or os.cpu_count() or 1
    workers = Workers(lambda: LocalMaster(n, serve=serve_forked))
    try:
        # Started before the DAG is read, so that their start overlaps the master's, as
        # MPI's ranks do. Forked from this process (local.forks), they import the
        # worker's modules and wait for their configuration. Fresh Pythons would spend
        # ~60 ms of cpu each on their start: a DAG file big enough for the edge helper
        # keeps the other core busy, and then they start once it is read.
        if forks() or _size(opts.dag) < MIN_BYTES:
            workers.started()
        return _run_master(opts, workers, "local")
    except FatalError as e:
        log.fatal(str(e))
        return ExitCode.FAILED
    finally:
        workers.release()


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0  # the reader says why it cannot read it


def _run_master(opts: RunOptions, workers: Workers, mode: str) -> int:
    # The collector stays off from the parse until settle_heap: the young collections
    # that the master's start-up allocations would set off walk every object of the DAG
    # (a million tasks: 0.14 s each, before the first task).
    collecting = gc.isenabled()
    thresholds = gc.get_threshold()
    gc.disable()
    try:
        return _read_and_run(opts, workers, mode)
    finally:
        gc.set_threshold(*thresholds)  # settle_heap's, for the loop only
        (gc.enable if collecting else gc.disable)()


def _read_and_run(opts: RunOptions, workers: Workers, mode: str) -> int:
    from pmc.core.events import Fanout
    from pmc.core.rescue import RescueError, read_records
    from pmc.dag import DagError, parse_dag
    from pmc.outputs import assemble
    from pmc.runtime import openrun

    # The log file first: every line after this one goes there.
    try:
        logsetup.open_log_file()
    except OSError as e:
        log.fatal(f"Unable to open log file: {opts.log_file}: {e.strerror}")
        return ExitCode.FAILED
    if opts.site_profile:
        log.info(f"Site profile: {opts.site_profile}")
    for text in without_effect(opts, mode):
        log.warn(text)
    if log.enabled(log.DEBUG):
        log.debug(f"Using old rescue file: {'' if opts.skip_rescue else opts.rescue_path}")
        log.debug(f"Using new rescue file: {opts.rescue_path}")
    try:
        dag = parse_dag(opts.dag)
        opened = openrun.prepare(opts, dag)  # the tasks added before, an open run's side
    except DagError as e:
        log.fatal(str(e))
        return ExitCode.USAGE
    workers.started()
    lock_fd = -1
    if not opts.nolock:
        log.debug("Locking DAG file...")
        try:
            lock_fd = _lock(opts.dag)
        except FatalError as e:
            log.fatal(str(e))
            return ExitCode.FAILED
    sink = TaskOutput(opts)
    try:
        done: set[int] = set()
        reused: set[int] = set()
        if not opts.skip_rescue:
            try:
                done, reused, warnings = read_records(opts.rescue_path, dag)
            except RescueError as e:
                log.fatal(str(e))
                return ExitCode.FAILED
            for w in warnings:
                log.warn(w)
        done |= reused  # reused in a run before: done, unless --reuse judges again
        if opts.reuse:
            from pmc.runtime.reuse import reusable

            done, reused = reusable(dag, done)
        else:
            reused = set()
        # Files the run will write, checked before any task runs: a run that cannot keep
        # its rescue log or deliver its tasks' output stops here, with nothing done.
        try:
            _check_rescue_dir(opts.rescue_path)
            sink.open()
            outputs = assemble.outputs(opts)  # opens nothing (but a metrics endpoint)
        except FatalError as e:
            log.fatal(str(e))
            return ExitCode.FAILED
        out = Fanout([*outputs.observers, *([opened] if opened else [])])
        return _run_with_transport(opts, dag, done, out, outputs.progress, workers.take(),
                                   mode, sink, reused, opened)
    finally:
        sink.close()
        if lock_fd >= 0:
            log.debug("Unlocking DAG file...")
            os.close(lock_fd)


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
    gc.enable()  # off since the parse (_run_master)


def _run_with_transport(opts: RunOptions, dag: DAG, done: set[int], out: Observer,
                        progress: Progress | None, transport: Transport, mode: str,
                        sink: TaskOutput, reused: set[int],
                        opened: openrun.OpenRun | None = None) -> int:
    from pmc.core.rescue import RescueError
    from pmc.runtime.master import Master
    from pmc.runtime.summary import write_summary

    master = Master(transport, opts, dag, done, out, mode, reused)
    settle_heap()
    log.info(f"Setting max cached files = {master.forward.maxfds}")
    log.info(f"Master starting with {transport.size - 1} workers")
    if opts.max_wall_time is not None:
        log.info(f"Setting max walltime to {opts.max_wall_time:f} minutes")

    def on_signal(signum: int, frame: object) -> None:
        master.signal_received = signum

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    summary = None
    interrupted = False
    merged = True
    try:
        try:
            try:
                info = master.start()
                try:
                    out.started(info)  # the output files open now
                except OSError as e:
                    raise FatalError(f"Cannot open output file: {e}") from e
                if opened is not None:
                    opened.open(master)
                summary = master.loop()
            finally:
                # The live line ends with the loop: the end-of-run lines come after it.
                if progress is not None:
                    progress.stop()
        except Interrupted:
            log.error("Aborting workflow")
            interrupted = True
        except (FatalError, RescueError) as e:
            log.fatal(str(e))
        except OSError as e:
            log.fatal(f"{e}")
        if summary is not None:
            # PMC's order: the end-of-run lines, the summary record, the tasks' output,
            # then the workers' shutdown. Every task has reported (its output and record
            # are in the worker's files) unless some never did after a stop: then their
            # output is merged once the workers have finished them off.
            _end_of_run_lines(master, summary)
            write_summary(summary)
            if not master.gave_up:
                merged = sink.merge(transport.size,
                                    between=lambda: master.ping_quiet(time.monotonic()))
            else:
                sink.pending = True
        else:
            sink.pending = True
    finally:
        if opened is not None:
            opened.close()
        log.info("Sending workers shutdown messages...")
        master.shutdown_workers()
        transport.close()
        master.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if sink.pending:
        # Workers that never got as far as opening their files leave none: no warning
        # about those when the run stopped before it began.
        merged = sink.merge(transport.size, warn_missing=summary is not None)
    if summary is None:
        out.close()
        return ExitCode.INCOMPLETE if interrupted else ExitCode.FAILED
    out.finished(summary)
    out.close()
    if summary.outcome == "succeeded":
        if not merged:
            log.error("Workflow succeeded, but its tasks' output could not be merged")
            return ExitCode.FAILED
        log.info("Workflow succeeded")
        return ExitCode.OK
    if summary.outcome == "failed":
        log.error("Workflow failed")
        return ExitCode.FAILED
    what = "aborted" if master.stop_reason else "incomplete"
    log.error(f"Workflow {what}: {summary.reason}; run again to resume from "
              f"{opts.rescue_path}")
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


def _lock(path: str) -> int:
    """An exclusive POSIX record lock (fcntl F_SETLK, F_WRLCK) on the whole DAG file, as
    PMC takes: two runs of either program on one DAG exclude each other.

    POSIX locks belong to the process and go the moment it closes *any* descriptor of the
    file, so the DAG is parsed before the lock is taken and nothing in this process opens
    it again while the run holds the lock (the edge helper reads it in a process of its
    own, and only while parsing). Like PMC's, the lock needs the file open for writing."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise FatalError(f"Unable to open DAG file: {path}: {e.strerror} "
                         "(use -n/--nolock to run without the lock)") from e
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES):
            # The reference's words, then how to go on regardless.
            raise FatalError(f"DAG file is already locked by another process: {path}: "
                             f"{os.strerror(e.errno)} (another run of this workflow holds "
                             "it; use -n/--nolock to skip locking)") from None
        raise FatalError(f"Unable to lock DAG file: {path}: {e.strerror}") from e
    return fd


def _check_rescue_dir(path: str) -> None:
    """Fail now if the rescue log cannot be written where it goes: the run writes it by
    way of a temporary file beside it, so create and remove one there."""
    probe = f"{path}.tmp.{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        os.unlink(probe)
    except OSError as e:
        raise FatalError(f"Unable to open rescue file: {path}: {e.strerror}") from e


class TaskOutput:
    """``-o`` / ``-e``: opened before the run (so a path that cannot be written stops it
    before any task runs), and at the end given each worker's ``DAG.out.R`` /
    ``DAG.err.R``, worker by worker, whatever the outcome; the merged files are removed.

    Without ``-o`` / ``-e`` the output goes to this process's stdout / stderr. With
    ``--per-task-stdio`` there is nothing to merge and nothing is opened, as in PMC."""

    def __init__(self, opts: RunOptions) -> None:
        self.opts = opts
        self.out_fd = -1
        self.err_fd = -1
        self.pending = False  # merge still to do (after the workers are shut down)

    def open(self) -> None:
        o = self.opts
        if o.per_task_stdio:
            return
        if o.stdout:
            self.out_fd = _open_output(o.stdout, "stdout")
        if o.stderr:
            if o.stderr == o.stdout:
                self.err_fd = self.out_fd
            else:
                self.err_fd = _open_output(o.stderr, "stderr")

    def merge(self, size: int, warn_missing: bool = True,
              between: Callable[[], None] = lambda: None) -> bool:
        """Append every worker's files; False (and an error line) if one could not be.
        ``between`` runs before each file (the master's heartbeats)."""
        self.pending = False
        if self.opts.per_task_stdio:
            return True
        log.info("Merging task stdio from workers...")
        ok = True
        dag = self.opts.dag
        for rank in range(1, size):
            log.debug(f"Merging stdio from worker {rank}...")
            for kind, fd, stream in (("stdout", self.out_fd, sys.stdout),
                                     ("stderr", self.err_fd, sys.stderr)):
                path = f"{dag}.{kind[3:]}.{rank}"
                log.trace(f"Merging {kind} file: {path}")
                between()
                try:
                    if fd < 0:
                        stream.flush()
                    _copy_into(path, fd if fd >= 0 else stream.fileno())
                    os.unlink(path)
                except FileNotFoundError:
                    if warn_missing:
                        log.warn(f"No {kind} file: {path}")
                except (OSError, ValueError) as e:
                    ok = False
                    where = self.opts.stdout if kind == "stdout" else self.opts.stderr
                    log.error(f"Unable to merge task {kind} file {path} into "
                              f"{where or kind}: {getattr(e, 'strerror', None) or e}")
        return ok

    def close(self) -> None:
        for fd in {self.out_fd, self.err_fd}:
            if fd >= 0:
                os.close(fd)
        self.out_fd = self.err_fd = -1


def _open_output(path: str, kind: str) -> int:
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise FatalError(f"Unable to open {kind} file: {path}: {e.strerror}") from e


def _copy_into(path: str, out_fd: int) -> None:
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(out_fd, view):]
