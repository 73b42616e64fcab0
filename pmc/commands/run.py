"""Running a workflow: pick the mode, start the workers, and hand over to the master's side.

The composition root: the master's side (``commands/runmaster.py``) reads and locks the
DAG and builds the run's observers before the master exists, and a ``Run``
(``commands/lifecycle.py``) tells them that the run started (once the master's hand-shake
with its workers is done: no output file is created for a run that cannot start),
finished, and is over.

MPI mode when the process was started by an MPI launcher (decided from the launcher's
environment before mpi4py is imported, since importing it initialises MPI); otherwise the
embedded mode with worker processes on this machine. Both run the same master and worker.
Every rank runs this module, so what only the master, only a worker or only MPI needs is
imported where it is needed, each with its reason.
"""

from __future__ import annotations

import gc
import os
import signal

from pmc import batchsignals, log
from pmc.commands.mpirank import launched_by_mpi, leave
from pmc.errors import ExitCode, FatalError
from pmc.logsetup import LogOutput, log_output
from pmc.options import RunOptions
from pmc.runtime import rankshim
from pmc.runtime.workers import Workers, serve_forked
from pmc.transport import onehost
from pmc.transport.local import LocalMaster, LocalWorker, forks
from pmc.transport.onehost import HostMaster

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from pmc.transport.mpi import MpiTransport


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
    # Before MPI starts: a worker rank's death by a signal becomes an exit, which Hydra
    # survives (its proxy kills every rank when it reaps one killed by a signal).
    rankshim.keep()
    # With every rank on this host, no MPI at all (pmc.transport.onehost).
    transport: MpiTransport | HostMaster | LocalWorker | None = onehost.start(
        opts.host_sockets and not opts.no_sleep_on_recv)
    if transport is None:
        # Imported here, not above: importing it initialises MPI (after the keeper, and
        # never in an embedded run, which may have no MPI at all: mpi4py is optional).
        from pmc.transport import mpi

        # With prefetching the next tasks already wait on the workers: a moment's delay
        # in seeing a message costs nothing, and spinning would take cpu from the tasks.
        transport = mpi.MpiTransport(sleep_on_recv=not opts.no_sleep_on_recv,
                                     spin=not opts.prefetching,
                                     host_sockets=opts.host_sockets)
    if isinstance(transport, LocalWorker) or transport.rank != 0:
        # Only a worker rank imports the worker (the master's rank does without its ~30
        # modules).
        from pmc.runtime import worker

        return leave(worker.run(transport))
    if transport.size < 2:
        log.fatal("At least one worker process is required")
        return ExitCode.FAILED
    master = transport
    workers = Workers(lambda: master)
    workers.started()
    try:
        code = _run_master(opts, workers, "mpi", output)
    finally:
        workers.release()
    if master.given_up():
        # A rank given up on may never end, and the job with it: end it (every record
        # is written by now). Imported only then: it brings subprocess, which no other
        # part of a rank needs.
        from pmc.transport import jobend

        jobend.end_job(master.abort, code, master.given_up())
    return leave(code)


def _run_local(opts: RunOptions, output: LogOutput | None) -> int:
    # Imported here: a worker rank reads no DAG, and this brings the DAG's line reader.
    from pmc.dag.edgehelper import MIN_BYTES

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
        # The master's side is imported only by the master, once its workers are on
        # their way (forked ones without its modules): a worker rank, which runs this
        # module too, needs none of it.
        from pmc.commands.runmaster import read_and_run

        return read_and_run(opts, workers, mode, output or log_output(opts))
    finally:
        gc.set_threshold(*thresholds)  # settle_heap's, for the loop only
        (gc.enable if collecting else gc.disable)()
