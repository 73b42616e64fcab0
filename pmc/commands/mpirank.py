"""Under an MPI launcher, which rank reads the command line: the master alone.

Every rank of ``mpiexec -n N pegasus-mpi-cluster ...`` (or ``pmc run``) is started with
the same command line, but a worker needs nothing of it: what it must know of the run
comes from the master (its ``WorkerConfig``, and the transport's own settings with the
first message, ``pmc.transport.mpi``). Reading it costs a rank the parser, the option
table, the site profile and the run's modules (about as much cpu as the interpreter's own
start); a worker rank that the launcher's environment names skips all of that and starts
MPI and its loop at once (``serve``).

What reading the command line on every rank also did was end every rank when it was
wrong (a bad option, ``--help``, ``--version``, a bad site profile): the job ended
before MPI started, each rank saying why. Now the master alone reads it, and should it
end before it started MPI, it starts MPI only to dismiss the workers waiting for it with
its exit code (``_dismiss``): the message once, the job's exit code the same, no rank
left waiting.

Only where every rank can tell from the environment and the words alone that the run is
under MPI: a command line that may ask for the embedded mode (``--local``, or a prefix
argparse takes for it) is read by every rank, as before.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

from pmc.errors import ExitCode
from pmc.process import flush_stdio
from pmc.runtime.rankshim import launcher_rank

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
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


# The embedded mode's flag in pmc.options' table, which a worker rank does not import
# (a test holds the two equal).
LOCAL = "--local"


def _may_ask_local(word: str) -> bool:
    return len(word) > 2 and LOCAL.startswith(word)


def world_rank(words: Sequence[str], env: Mapping[str, str]) -> int | None:
    """This rank's number when the run is under MPI and only the master need read the
    command line ``words``; None when every rank reads it."""
    if not launched_by_mpi(env) or any(_may_ask_local(w) for w in words):
        return None
    return launcher_rank(env)


def entry(words: Sequence[str], run: Callable[[], int],
          env: Mapping[str, str] = os.environ) -> int:
    """Run the command (``run``, which reads ``words``) as this rank should: a worker
    rank serves without it, the master runs it and dismisses the workers should it end
    before MPI started."""
    rank = world_rank(words, env)
    if rank is None:
        return run()
    if rank != 0:
        return serve()
    try:
        code = run()
    except SystemExit as e:
        _dismiss(e.code if isinstance(e.code, int) else 0 if e.code is None else 1)
        raise
    except BaseException:
        _dismiss(ExitCode.FAILED)
        raise
    _dismiss(code)
    return code


def serve() -> int:
    """A worker rank's whole life, from before MPI starts; its exit code."""
    import gc

    # No collection while the rank's modules come in (each would walk every object made
    # so far), and none of those objects walked again afterwards: ~10% of the
    # instructions of a worker rank's imports and exit, counted.
    gc.disable()
    from pmc import batchsignals, log
    from pmc.runtime import rankshim

    batchsignals.catch()
    log.standalone()  # no code but pmc's here: nothing could hook the logging module
    log.setup()  # until the master's config says how this worker logs
    # Before MPI starts (see pmc.runtime.rankshim).
    rankshim.keep()
    from pmc.runtime import worker
    from pmc.transport import onehost

    # With every rank on this host, no MPI at all (pmc.transport.onehost).
    transport: Transport | None = onehost.start(True)
    without_mpi = transport is not None
    if transport is None:
        from pmc.transport.mpi import MpiTransport

        transport = MpiTransport()
    gc.freeze()
    gc.enable()
    code = worker.run(transport)
    if without_mpi:
        onehost.leave(code)
    return leave(code)


def leave(code: int) -> int:
    """``code``, to exit with; after a rank was lost MPI_Finalize (mpi4py calls it at
    exit) waits for it for ever: leave at once instead, with everything written."""
    from pmc.transport.notices import peer_lost

    if "pmc.transport.mpi" in sys.modules and peer_lost():
        flush_stdio()
        os._exit(code)
    return code


def _dismiss(code: int) -> None:
    """The master is ending: if it has not started MPI (which tells the workers how the
    run goes), start it to tell them to end with ``code``."""
    from pmc.transport import onehost

    if "pmc.transport.mpi" in sys.modules or onehost.opened():
        return
    # The launcher's word that a rank ended (SIGUSR1) would otherwise end this one.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if onehost.dismiss(code):
        return
    from pmc.transport.mpi import dismiss

    dismiss(code)
