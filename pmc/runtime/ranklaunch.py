"""Starting a task as an N-rank MPI program: the launcher template (shell words with
placeholders, substituted word by word, never through a shell), the default templates
for a Slurm allocation and for MPICH's Hydra, the node file, and the environment that
lets the nested launcher work inside an MPI-mode run (the outer launch's per-rank
variables removed)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pmc.files import atomic_write
from pmc.launchtemplate import PLACEHOLDERS, check_template, fields, words
from pmc.runtime.hostinfo import task_environment

# Inside a Slurm allocation: a step overlapping pmc's own (--overlap: the workers' step
# holds the cpus the master reserved for this task), using only what it asks for
# (--exact), PMI-2 (what MPICH and Intel MPI start with; Open MPI wants --mpi=pmix),
# the ranks placed host by host as the node file lists them (arbitrary distribution;
# srun reads a --nodelist containing "/" as a file; task_env also points SLURM_HOSTFILE
# at it, for templates without --nodelist).
DEFAULT_SLURM = ("srun --mpi=pmi2 --overlap --exact --distribution=arbitrary --ntasks={ranks} "
                 "--nodelist={nodefile} --cpus-per-task={cpus_per_rank}")
# Elsewhere, MPICH's Hydra: its -f reads the node file, one line per rank.
DEFAULT_MPIEXEC = "mpiexec -n {ranks} -f {nodefile}"

def default_template(env: Mapping[str, str]) -> str:
    """srun inside a Slurm allocation (SLURM_JOB_ID set), else mpiexec."""
    return DEFAULT_SLURM if env.get("SLURM_JOB_ID") else DEFAULT_MPIEXEC


def launcher_argv(template: str, *, ranks: int, hosts: Sequence[tuple[str, int]],
                  cpus_per_rank: int, nodefile: str) -> list[str]:
    """The launcher's argv (the task's own argv is appended by the caller). Template:
    shell words (shlex rules) with placeholders {ranks} {nhosts} {hosts} (comma list)
    {ranks_per_host} (only when equal on every host) {cpus_per_rank} {nodefile};
    substituted per word, never through a shell."""
    counts = {n for _h, n in hosts}
    values: dict[str, str] = {
        "ranks": str(ranks), "nhosts": str(len(hosts)),
        "hosts": ",".join(h for h, _n in hosts),
        "cpus_per_rank": str(cpus_per_rank), "nodefile": nodefile,
    }
    if len(counts) == 1:
        values["ranks_per_host"] = str(counts.pop())
    argv: list[str] = []
    for word in words(template):
        names = fields(template, word)
        if "ranks_per_host" in names and "ranks_per_host" not in values:
            spread = ",".join(f"{h}:{n}" for h, n in hosts)
            raise ValueError(f"task launcher template {template!r}: {{ranks_per_host}} "
                             f"needs the same number of ranks on every host, not {spread}")
        argv.append(word.format_map(values) if names else word.replace("{{", "{").replace(
            "}}", "}"))
    return argv


def write_nodefile(path: str, hosts: Sequence[tuple[str, int]]) -> None:
    """One line per rank, a host's lines together (the PBS_NODEFILE form that Hydra's
    -f, Open MPI's --hostfile and Slurm's SLURM_HOSTFILE all read)."""
    atomic_write(path, "".join(f"{h}\n" * n for h, n in hosts))


# Slurm's per-step and per-task variables, and the srun options an outer srun step (or
# sbatch -c: SRUN_CPUS_PER_TASK) leaves in the environment: left in place, a nested srun
# takes the outer step's layout (its task count, nodes, cpus per task, distribution,
# binding) for its own. The job's variables (SLURM_JOB_*, SLURM_NODELIST,
# SLURM_GPUS_PER_NODE, SLURM_MEM_PER_NODE, ...) stay: the nested step runs in that job.
_SLURM_STEP = re.compile(
    r"^(SLURM_(STEP_.*|STEPID|NODEID|LOCALID|GTIDS|TASK_PID|TASKS_PER_NODE|PRIO_PROCESS|"
    r"LAUNCH_NODE_IPADDR|SRUN_COMM_.*|UMASK|DISTRIBUTION|DIST_PLANESIZE|CPU_BIND.*|"
    r"MEM_BIND.*|NTASKS|NPROCS|NTASKS_PER_.*|CPUS_PER_TASK|EXACT|OVERLAP|NNODES|HOSTFILE|"
    r"ARBITRARY_NODELIST|MPI_TYPE|PMIX_.*|PMIXP_.*|PMI2_.*|TOPOLOGY_ADDR.*)"
    r"|SRUN_CPUS_PER_TASK)$")
# Hydra's own markers of a process it started.
_HYDRA = ("HYDRA_CONTROL_FD", "HYDI_CONTROL_FD", "PMI_FD", "PMI_PORT", "PMI_RANK",
          "PMI_SIZE", "MPIR_CVAR_CH3_INTERFACE_HOSTNAME")


def task_env(env: Mapping[str, str], hosts: Sequence[tuple[str, int]],
             nodefile: str) -> dict[str, str]:
    """The multi-rank task's environment: the outer run's PMI/PMIx/Hydra/Open MPI/Slurm
    per-rank variables scrubbed, plus PMC_HOSTS (comma list) and PMC_NODEFILE (and
    SLURM_HOSTFILE, the node file, for the default srun template)."""
    out = task_environment(dict(env))
    for key in list(out):
        if key in _HYDRA or _SLURM_STEP.match(key):
            del out[key]
    out["PMC_HOSTS"] = ",".join(h for h, _n in hosts)
    out["PMC_NODEFILE"] = nodefile
    out["SLURM_HOSTFILE"] = nodefile
    return out


__all__ = ["DEFAULT_MPIEXEC", "DEFAULT_SLURM", "PLACEHOLDERS", "check_template",
           "default_template", "launcher_argv", "task_env", "write_nodefile"]
