"""Running a workflow: pick the mode, read and lock the DAG, wire master, workers, outputs.

MPI mode when the process was started by an MPI launcher (decided from the launcher's
environment before mpi4py is imported, since importing it initialises MPI); otherwise the
embedded mode with worker processes on this machine. Both run the same master and worker.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from pmc import log, observe
from pmc.dag import DAG, DagError, parse_dag
from pmc.events import Observer
from pmc.master import (
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_USAGE,
    FatalError,
    Interrupted,
    Master,
    write_summary,
)
from pmc.options import RunOptions
from pmc.recordfiles import DagmanOut, JobstateLog, ResourceLog
from pmc.rescue import RescueError, read_rescue
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


def run(opts: RunOptions, observers: list[Observer] | None = None) -> int:
    mode = opts.mode
    if mode == "auto":
        mode = "mpi" if launched_by_mpi(os.environ) else "local"
    if mode == "mpi":
        return _run_mpi(opts, observers or [])
    return _run_local(opts, observers or [])


def _run_mpi(opts: RunOptions, observers: list[Observer]) -> int:
    from pmc.transport.mpi import MpiTransport

    # With prefetching the next tasks already wait on the workers: a moment's delay in
    # seeing a message costs nothing, and spinning would take cpu from the tasks.
    transport = MpiTransport(sleep_on_recv=not opts.no_sleep_on_recv,
                             spin=not opts.prefetching, host_sockets=opts.host_sockets)
    if transport.rank != 0:
        from pmc import worker

        return worker.run(transport)
    if transport.size < 2:
        log.fatal("At least one worker process is required")
        return EXIT_FAILED
    handed: list[bool] = []

    def hand_over() -> Transport:
        handed.append(True)
        return transport

    code = _run_master(opts, observers, hand_over, "mpi")
    if not handed:
        # Stopped before the master ran (bad DAG, DAG locked by another run, unreadable
        # rescue log): the workers are waiting for their configuration, and would wait for
        # ever. Tell them there is no run.
        from pmc.protocol import SHUTDOWN

        for rank in range(1, transport.size):
            transport.send(rank, (SHUTDOWN,))
        transport.close()
    return code


def _run_local(opts: RunOptions, observers: list[Observer]) -> int:
    from pmc.transport.local import LocalMaster

    workers = opts.workers or os.cpu_count() or 1
    return _run_master(opts, observers, lambda: LocalMaster(workers), "local")


def _run_master(opts: RunOptions, observers: list[Observer], make_transport: Any,
                mode: str) -> int:
    try:
        dag = parse_dag(opts.dag)
    except DagError as e:
        log.fatal(str(e))
        return EXIT_USAGE
    lock_fd = -1
    if not opts.nolock:
        try:
            lock_fd = _lock(opts.dag)
        except FatalError as e:
            log.fatal(str(e))
            return EXIT_FAILED
    try:
        done: set[int] = set()
        if not opts.skip_rescue:
            try:
                done, warnings = read_rescue(opts.rescue_path, dag)
            except RescueError as e:
                log.fatal(str(e))
                return EXIT_FAILED
            for w in warnings:
                log.warn(w)
        return _run_with_transport(opts, dag, done, observers, make_transport(), mode)
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)


def _run_with_transport(opts: RunOptions, dag: DAG, done: set[int],
                        observers: list[Observer], transport: Transport, mode: str) -> int:
    all_observers = list(observers)
    master = Master(transport, opts, dag, done, all_observers, mode,
                    open_outputs=lambda: _record_observers(opts) + observe.observers(opts))
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)
        master.signal_received = signum

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    summary = None
    interrupted = False
    try:
        summary = master.run()
    except Interrupted as e:
        log.error(f"Aborting workflow: {e}")
        interrupted = True
    except FatalError as e:
        log.fatal(str(e))
    except OSError as e:
        log.fatal(f"{e}")
    finally:
        master.shutdown_workers()
        transport.close()
        master.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    failed = summary is None or summary.outcome == "failed"
    _collect_stdio(opts, transport.size, merge=not failed)
    if summary is None:
        for obs in all_observers:
            obs.close()
        return EXIT_INCOMPLETE if interrupted else EXIT_FAILED
    for obs in all_observers:
        obs.finished(summary)
        obs.close()
    write_summary(summary)
    if summary.outcome == "succeeded":
        log.info("Workflow finished successfully")
        return EXIT_OK
    if summary.outcome == "failed":
        log.error(f"Workflow failed: {summary.failed} task(s) failed")
        return EXIT_FAILED
    log.error(f"Workflow incomplete: {summary.reason}; run again to resume from "
              f"{opts.rescue_path}")
    return EXIT_INCOMPLETE


def _record_observers(opts: RunOptions) -> list[Observer]:
    out: list[Observer] = []
    if opts.jobstate_log:
        out.append(JobstateLog(opts.dag))
    if opts.monitord_hack:
        out.append(DagmanOut(opts.dag))
    if not opts.no_resource_log:
        out.append(ResourceLog(opts.dag))
    return out


def _lock(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise FatalError(f"{path}: cannot open DAG file: {e.strerror}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FatalError(f"{path} is locked by another run of this workflow "
                         "(use -n/--nolock to skip locking)") from None
    except OSError as e:
        os.close(fd)
        raise FatalError(f"{path}: cannot lock DAG file: {e.strerror}") from e
    return fd


def _collect_stdio(opts: RunOptions, size: int, merge: bool) -> None:
    """Append each worker's DAG.out.R / DAG.err.R to -o / -e (default: our stdout/stderr),
    worker by worker, and remove them. On failure leave them unmerged (empty ones go)."""
    if opts.per_task_stdio:
        return
    for template, dest, stream in ((f"{opts.dag}.out.", opts.stdout, sys.stdout),
                                   (f"{opts.dag}.err.", opts.stderr, sys.stderr)):
        out_fd = -1
        try:
            for rank in range(1, size):
                path = f"{template}{rank}"
                try:
                    if os.path.getsize(path) == 0:
                        os.unlink(path)
                        continue
                except OSError:
                    continue
                if not merge:
                    continue
                if out_fd < 0:
                    if dest:
                        out_fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
                    else:
                        stream.flush()
                        out_fd = os.dup(stream.fileno())
                _copy_into(path, out_fd)
                os.unlink(path)
        except OSError as e:
            log.error(f"Cannot merge task output into {dest or stream.name}: {e}")
        finally:
            if out_fd >= 0:
                os.close(out_fd)


def _copy_into(path: str, out_fd: int) -> None:
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(out_fd, view):]
