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
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pmc import batchsignals, log
from pmc.commands.lifecycle import Run
from pmc.commands.taskoutput import TaskOutput
from pmc.errors import ExitCode, FatalError
from pmc.logsetup import LogOutput, log_output, open_log_file
from pmc.options import RunOptions, without_effect
from pmc.process import flush_stdio
from pmc.runtime.workers import Workers, serve_forked

if TYPE_CHECKING:
    # The master's side is imported where the master is made (below): a worker rank,
    # which runs this module too, needs none of it (~15 ms of imports per rank).
    pass

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


def run(opts: RunOptions, output: LogOutput | None = None) -> int:
    """``pmc run``: the master's or a worker's side of a run; the exit code. ``output``:
    where the master's log and events go (made from ``opts`` if not given)."""
    mode = opts.mode
    if mode == "auto":
        mode = "mpi" if launched_by_mpi(os.environ) else "local"
    # From the start, in every process of the run: a batch system's warning that time is
    # short is noted, never a death (pmc.batchsignals; the master acts on it).
    previous = batchsignals.catch()
    try:
        if mode == "mpi":
            return _run_mpi(opts, output)
        return _run_local(opts, output)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_mpi(opts: RunOptions, output: LogOutput | None) -> int:
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
        code = _run_master(opts, workers, "mpi", output)
    finally:
        workers.release()
    if transport.given_up():
        # A rank given up on may never end, and the job with it: end it (every record
        # is written by now).
        from pmc.transport import jobend

        jobend.end_job(transport.comm, code, transport.given_up())
    return _leave_mpi(code)


def _leave_mpi(code: int) -> int:
    """After a rank was lost MPI_Finalize (mpi4py calls it at exit) waits for it for
    ever: leave at once instead, with everything written."""
    from pmc.transport.mpi import peer_lost

    if peer_lost():
        flush_stdio()
        os._exit(code)
    return code


def _run_local(opts: RunOptions, output: LogOutput | None) -> int:
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
        return _run_master(opts, workers, "local", output)
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


def _run_master(opts: RunOptions, workers: Workers, mode: str,
                output: LogOutput | None) -> int:
    # The collector stays off from the parse until settle_heap: the young collections
    # that the master's start-up allocations would set off walk every object of the DAG
    # (a million tasks: 0.14 s each, before the first task).
    collecting = gc.isenabled()
    thresholds = gc.get_threshold()
    gc.disable()
    try:
        return _read_and_run(opts, workers, mode, output or log_output(opts))
    finally:
        gc.set_threshold(*thresholds)  # settle_heap's, for the loop only
        (gc.enable if collecting else gc.disable)()


def _read_and_run(opts: RunOptions, workers: Workers, mode: str, output: LogOutput) -> int:
    from pmc.core.events import Fanout
    from pmc.core.rescue import RescueError, read_records
    from pmc.dag import DagError, parse_dag
    from pmc.outputs import assemble
    from pmc.runtime import openrun

    # The log file first: every line after this one goes there.
    try:
        open_log_file(output)
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
            outputs = assemble.outputs(opts, output)  # opens nothing (but a metrics endpoint)
        except FatalError as e:
            log.fatal(str(e))
            return ExitCode.FAILED
        out = Fanout([*outputs.observers, *([opened] if opened else [])])
        return Run(opts, dag, workers.take(), out, mode, done=done, reused=reused,
                   progress=outputs.progress, sink=sink, opened=opened).execute()
    finally:
        sink.close()
        if lock_fd >= 0:
            log.debug("Unlocking DAG file...")
            os.close(lock_fd)


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
