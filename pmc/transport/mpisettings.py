"""What pmc starts its own MPI library with: settings it puts in the environment of
its ranks before ``MPI_Init`` (``pmc.transport.mpi``), each unless the user set it, and
takes back out once MPI has started, so tasks see the user's environment as it was.
Pure: importing this does not start MPI.

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
- ``UCX_TLS=self,sysv`` and ``UCX_MODULES=`` (empty: no plug-in modules), on the
  same condition: with every rank on this host, UCX (MPICH's network layer) has only
  ranks of this host to reach, for which its System V shared memory is enough.
  Otherwise each rank probes every transport UCX has: it lists the host's network
  interfaces for TCP, loads the InfiniBand, RDMA CM and cross-memory-attach modules and
  tries their devices. One-task runs of 9 and 17 ranks on 2 cores: 1.73 and 3.24 s of
  cpu with the probes, 1.36 and 2.79 s without (``benchmarks/RESULTS.md``). System V
  rather than POSIX shared memory: UCX's POSIX transport keeps its queues in
  ``/dev/shm``, which a container may have small (64 MB under podman and docker): there
  17 ranks died as they started in 2 runs of 3 with it, in none with System V alone.
  Tasks, which may be MPI programs reaching other hosts, never see these settings (see
  above).
"""

from __future__ import annotations

from collections.abc import Mapping

# With every rank on this host (Hydra says so).
ONE_HOST = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "self,sysv", "UCX_MODULES": ""}


def mpi_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings for a rank started with ``environ``, those the user set left out."""
    settings = {"UCX_MEM_EVENTS": "no"}
    if one_host(environ):
        settings.update(ONE_HOST)
    return {name: value for name, value in settings.items() if name not in environ}


def one_host(environ: Mapping[str, str]) -> bool:
    """Whether MPICH's launcher (Hydra) put every rank of the job on this host: the same
    answer on every rank."""
    local = environ.get("MPI_LOCALNRANKS")  # Hydra's: ranks on this host
    return bool(local) and local == environ.get("PMI_SIZE")
