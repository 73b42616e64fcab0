"""How pmc starts its own MPI library (``start_mpi``, for ``pmc.transport.mpi``): the
settings it puts in the environment of its ranks before ``MPI_Init``, each unless the
user set it, and takes back out once MPI has started, so tasks see the user's
environment as it was. Importing this does not start MPI.

pmc's messages are small and few, and on one host they go through sockets once the
ranks have met.

- ``UCX_MEM_EVENTS=no``: UCX (under the pip MPICH and most Open MPI builds) hooks the
  process's memory calls so that its cache of memory registered with a network card
  learns when memory is unmapped. The hooks cost every rank ~0.04 s of cpu to install
  and a worker more on every task it spawns (posix_spawn maps and unmaps a stack):
  without them a drop-in run of 10,000 tasks takes ~0.2 s less cpu in pmc's ranks.
- ``MPIR_CVAR_NOLOCAL=1`` (MPICH), only when MPICH's own launcher (Hydra: ``mpiexec``)
  put every rank on this host: no shared-memory segment between the ranks. Setting it
  up ends in a barrier where MPICH waits by calling sched_yield in a loop; ranks reach
  MPI_Init at different moments (the slowest one is still importing), and on a kernel
  with autogroup, where each rank is a scheduling group of its own, the waiting ranks
  keep their whole share of the cores from the late one. A one-task run of 3 ranks on 2
  cores: 20,000-210,000 sched_yield calls, 0.38 s of wall and 0.65 s of cpu; 0.32 s and
  0.52 s without the segment. Not otherwise: without the segment every rank publishes
  its whole network address through the launcher's key-value store (nine 1 KB puts per
  rank under the pip MPICH; with the segment, none on a single host), which under
  Slurm's PMI2 (``srun --mpi=pmi2``) once left a job's ranks stuck in MPI_Init until
  its time limit, and across hosts grows with every rank. The condition is the same on
  every rank (MPICH ranks that differ on it never get through MPI_Init): Hydra gives
  each rank the job's size and its host's number of ranks.
- ``MPIR_CVAR_CH4_NETMOD=ofi`` and ``FI_PROVIDER=shm`` (MPICH built with libfabric among
  its ch4 network modules, as the pip MPICH is beside UCX), under the same condition:
  libfabric's shared-memory provider starts in a fraction of what UCX takes to look at
  every network device of the host (it reads sysfs, opens the InfiniBand and RDMA
  libraries, and probes sockets, thousands of system calls per rank): MPI's start and
  stop of 17 Python ranks on 2 cores ~2.0 s of cpu against ~2.5 s. Only when both are
  unset, and MPICH says in its version text that it has libfabric: the library is the
  same for every rank on the host, so the condition still is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

_OFI_SHM = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "shm"}


def mpi_settings(environ: Mapping[str, str], library: str = "") -> dict[str, str]:
    """The settings for a rank started with ``environ`` under the MPI library whose
    ``MPI_Get_library_version`` is ``library``, those the user set left out."""
    settings = {"UCX_MEM_EVENTS": "no"}
    local = environ.get("MPI_LOCALNRANKS")  # Hydra's: ranks on this host
    if local and local == environ.get("PMI_SIZE"):
        settings["MPIR_CVAR_NOLOCAL"] = "1"
        if "ofi" in ch4_netmods(library) and not any(k in environ for k in _OFI_SHM):
            settings.update(_OFI_SHM)
    return {name: value for name, value in settings.items() if name not in environ}


def ch4_netmods(library: str) -> set[str]:
    """The network modules of an MPICH ch4 build, from its version text (``MPICH
    Device: ch4:ucx ofi``); none for any other library or device."""
    for line in library.splitlines():
        name, _, device = line.partition(":")
        if name.strip() == "MPICH Device" and device.strip().startswith("ch4:"):
            return set(device.strip()[4:].replace(",", " ").split())
    return set()


def start_mpi() -> None:
    """Start MPI with pmc's settings. mpi4py loads the library first, so that the
    settings know which one it is, and ends MPI at exit as if it had started it."""
    import mpi4py

    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = True
    from mpi4py import MPI

    added = mpi_settings(os.environ, MPI.Get_library_version())
    os.environ.update(added)
    try:
        MPI.Init_thread(MPI.THREAD_MULTIPLE)  # the level mpi4py starts MPI with
    finally:
        for name in added:
            os.environ.pop(name, None)
