"""Launchers: the argv that starts the MPI ranks inside an allocation.

Each is given the rank count, ranks per node, cpus per rank, the profile's extra
launcher arguments and the command, and returns an argv. Always launching through the
scheduler's own launcher keeps every rank visible to its accounting and limits. The
site's MPI family (the profile's ``mpi``) picks the spelling: ``mpiexec`` is Hydra's
(MPICH, MVAPICH, Intel MPI) or Open MPI's, ``srun`` speaks PMI-2 or PMIx to the ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Launch = Callable[[int, int, int, Sequence[str], Sequence[str]], list[str]]


def srun(
    ranks: int, per_node: int, cpus: int, extra: Sequence[str], cmd: Sequence[str],
    pmi: str = "pmi2",
) -> list[str]:
    # pmi2 starts mpi4py from the pip MPICH correctly; Open MPI's ranks need PMIx. The
    # step outlives a rank that dies (--kill-on-bad-exit=0) or a node that fails
    # (--no-kill): pmc's master runs the lost worker's tasks elsewhere.
    return [
        "srun",
        f"--mpi={pmi}",
        "--kill-on-bad-exit=0",
        "--no-kill",
        f"--ntasks={ranks}",
        f"--ntasks-per-node={per_node}",
        f"--cpus-per-task={cpus}",
        *extra,
        *cmd,
    ]


def mpiexec(
    ranks: int, per_node: int, cpus: int, extra: Sequence[str], cmd: Sequence[str]
) -> list[str]:
    # MPICH (Hydra) spelling; an Open MPI site adds its own mapping in launcher_args.
    # -disable-auto-cleanup: the job outlives a rank that dies (Hydra may still end it
    # when the dead rank was killed by a signal: docs/reliability.md).
    return ["mpiexec", "-disable-auto-cleanup", "-n", str(ranks), "-ppn", str(per_node),
            *extra, *cmd]


def openmpi_mpiexec(
    ranks: int, per_node: int, cpus: int, extra: Sequence[str], cmd: Sequence[str],
    exported: Sequence[str] = (),
) -> list[str]:
    # Open MPI's spelling (4.1 and 5 alike). --enable-recovery: the job outlives a rank
    # that dies (without it mpiexec ends every rank as soon as one exits non-zero;
    # checked with Open MPI 4.1). --bind-to none, as Hydra: pmc places its tasks on the
    # cpus itself. Open MPI passes the environment only to the ranks on its own node:
    # -x carries the script's variables (PATH, with the venv or module that holds pmc)
    # to the others.
    return ["mpiexec", "--enable-recovery", "-n", str(ranks), "--map-by",
            f"ppr:{per_node}:node", "--bind-to", "none",
            *(word for name in exported for word in ("-x", name)), *extra, *cmd]


# aprun and poe have no switch to outlive a rank: ALPS and POE end the whole
# application when one rank dies. The script's status is still the workflow's (pmc
# status), and a chained script resumes from the rescue log.
def aprun(
    ranks: int, per_node: int, cpus: int, extra: Sequence[str], cmd: Sequence[str]
) -> list[str]:
    return ["aprun", "-n", str(ranks), "-N", str(per_node), "-d", str(cpus), *extra, *cmd]


def poe(
    ranks: int, per_node: int, cpus: int, extra: Sequence[str], cmd: Sequence[str]
) -> list[str]:
    # Under LoadLeveler, POE takes the task count and placement from the job step
    # (node, tasks_per_node); POE's own flags follow the program.
    return ["poe", *cmd, *extra]


LAUNCHERS: dict[str, Launch] = {"srun": srun, "mpiexec": mpiexec, "aprun": aprun, "poe": poe}


def launch_argv(
    name: str,
    *,
    ranks: int,
    ranks_per_node: int,
    cpus_per_rank: int,
    extra: Sequence[str],
    command: Sequence[str],
    mpi: str = "mpich",
    exported: Sequence[str] = (),
) -> list[str]:
    """The launch line; ``exported``: the variables the script sets, for a launcher
    that does not pass its whole environment on (Open MPI's)."""
    args = (ranks, ranks_per_node, cpus_per_rank, list(extra), list(command))
    if mpi == "openmpi" and name == "mpiexec":
        return openmpi_mpiexec(*args, exported=exported)
    if mpi == "openmpi" and name == "srun":
        return srun(*args, pmi="pmix")
    return LAUNCHERS[name](*args)
