"""What a worker knows of, and sets up in, the host it runs on: its cpus, memory and
cpu sockets, the environment its tasks start from, and the process settings (descriptor
limit, affinity, inherited descriptors) it fixes before launching anything."""

from __future__ import annotations

import os
import resource

# The variables through which an MPI launcher (Hydra, Open MPI/PRRTE, PMIx, Slurm's PMI,
# Cray's ALPS) tells a process which rank of which launch it is. A task inherits the
# worker's environment, and a pmc (or any MPI program) started by a task of an MPI-mode
# run must not take the outer launch for its own: these are removed from tasks' and host
# scripts' environments. Users' MPI settings stay (OMPI_MCA_* tuning, HYDRA_*, I_MPI_*,
# MPIR_CVAR_*), and so do the batch system's job variables (SLURM_JOB_*, SLURM_STEP_*, ...:
# the task runs in that job and step); of Slurm's per-rank variables only SLURM_PROCID,
# with which pmc recognises an srun launch, goes.
_LAUNCH_PREFIXES = ("PMI_", "PMI2_", "PMIX_", "PRTE_", "HYDI_", "OMPI_COMM_WORLD_",
                    "OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_prte_", "OMPI_MCA_pmix",
                    "OMPI_APP_CTX_")
_LAUNCH_NAMES = frozenset((
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "ALPS_APP_PE", "SLURM_PROCID",
    "OMPI_UNIVERSE_SIZE", "OMPI_FIRST_RANKS", "OMPI_NUM_APP_CTX", "OMPI_FILE_LOCATION",
    "OMPI_ARGV", "OMPI_COMMAND", "OMPI_MCA_initial_wdir", "OMPI_MCA_mpi_yield_when_idle",
    "OMPI_MCA_shmem_RUNTIME_QUERY_hint",
    "PMC_AFFINITY",  # set per task, for multi-core tasks given a set of cpus
))


def task_environment(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The environment tasks start from: the worker's without the outer launch's
    variables (computed once per worker)."""
    return {k: v for k, v in env.items()
            if k not in _LAUNCH_NAMES and not k.startswith(_LAUNCH_PREFIXES)}


def detect_cpus() -> int:
    """The cpus this worker may run on: its affinity, which a cgroup cpuset (a batch
    system's, a container's) narrows; the machine's count where affinity is unknown."""
    try:
        return len(os.sched_getaffinity(0)) or os.cpu_count() or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def detect_memory_mb() -> int:
    """The host's memory: MemTotal, or the memory limit of this process's cgroup where
    that is lower (a batch system's or container's limit is what its tasks can use)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = cgroup_memory_limit()
    return min(total, limit) // (1024 * 1024) if limit else total // (1024 * 1024)


def cgroup_memory_limit(root: str = "/sys/fs/cgroup") -> int | None:
    """The memory limit in bytes that this process's cgroup and its ancestors set (v1:
    the memory controller's hierarchical limit; v2: the lowest memory.max on the path),
    None where there is none or it cannot be read."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return _v1_limit(f"{root}/memory{path.rstrip('/')}")
    for line in lines:
        if line.startswith("0::") and os.path.exists(f"{root}/cgroup.controllers"):
            return _v2_limit(root, line[3:])
    return None


def _v1_limit(directory: str) -> int | None:
    try:
        with open(f"{directory}/memory.stat") as f:
            for line in f:
                if line.startswith("hierarchical_memory_limit "):
                    value = int(line.split()[1])
                    # "No limit" is the largest page-aligned value, not a real bound.
                    return value if value < 1 << 60 else None
    except (OSError, ValueError):
        pass
    return None


def _v2_limit(root: str, path: str) -> int | None:
    limits: list[int] = []
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), 0, -1):
        try:
            with open(f"{root}/{'/'.join(parts[:depth])}/memory.max") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text != "max":
            try:
                limits.append(int(text))
            except ValueError:
                pass
    return min(limits) if limits else None


def cpu_sockets() -> dict[int, int]:
    """cpu id -> physical package id, from sysfs (empty if unknown)."""
    out: dict[int, int] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        path = f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"
        try:
            with open(path) as f:
                out[cpu] = int(f.read().strip())
        except (OSError, ValueError):
            out[cpu] = 0
    return out


def raise_nofile() -> None:
    # Every running task holds a pidfd here: thousands of slots need more descriptors
    # than the usual soft limit of 1024. The hard limit is ours to take.
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError):
        pass  # keep the soft limit; a launch that runs out of fds fails that task


def clear_affinity() -> None:
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except OSError:
        pass  # not allowed (e.g. a cgroup cpuset): keep what we have


def close_on_exec_all() -> None:
    """Mark every inherited descriptor above stderr close-on-exec (an MPI library's
    sockets, a launcher's pipes), so tasks are started with stdin, stdout, stderr and
    their forwarding pipes only."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # the listing's own descriptor, already closed
