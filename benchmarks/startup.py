"""Start-up and shut-down: the cpu and wall time of a run of one task, for trees by turns.

    python benchmarks/startup.py                                  # this checkout
    python benchmarks/startup.py --trees old=/tmp/base,new=. --rounds 9
    python benchmarks/startup.py --modes dropin,reference --workers 2,8,16 --rounds 7 \
        --reference /path/to/pegasus-mpi-cluster    # 3, 9 and 17 ranks, against the reference

A one-task DAG (``/bin/true``) run as users start it: ``mpiexec -n W+1
pegasus-mpi-cluster -s -o /dev/null -e /dev/null`` ("dropin", no binding flags),
``mpiexec -n W+1 python -m pmc run --mpi`` ("mpi") and ``python -m pmc run --local
--workers W`` ("local"); and, as the bound of the MPI modes, ``mpiexec -n W+1 python -c
"from mpi4py import MPI"`` with the settings pmc starts MPI with ("mpi4py": the
interpreters, ``MPI_Init`` and ``MPI_Finalize``, no pmc; ``_common.MPI_CONTROL``); with
``--reference BINARY``, "reference": the reference the same way under Open MPI's launcher
(``/usr/bin/mpiexec.openmpi --oversubscribe -n W+1 BINARY -s -o /dev/null -e /dev/null``,
tree-independent: run once a round). ``--workers`` takes a list (``2,8,16``: 3, 9 and
17 ranks), each size in every round. What
such a run costs is what every run pays besides its tasks: interpreters, imports,
``MPI_Init``, the hand-shake and the way out. Each round
runs every tree and mode once, by turns, so that the machine's drift falls on all
alike; reported per mode and tree: the median (and range) of the cpu seconds of every
process of the run (``RUSAGE_CHILDREN``, the launcher and the task included) and of
the wall seconds, and the ratio of each tree's median cpu to the first tree's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import (
    PYTHON,
    children_cpu,
    machine,
    median,
    mpi_control,
    mpiexec,
    reference_launch,
    workdir,
)


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_", "PMC_"))}
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    return env




def _check_tree(tree: Path) -> None:
    """Refuse a tree that this interpreter would not import: an editable install's
    finder comes before PYTHONPATH, and every tree would then be the installed one."""
    got = subprocess.run([PYTHON, "-c", "import pmc; print(pmc.__file__)"], env=_env(tree),
                         cwd="/", capture_output=True, text=True, check=True).stdout.strip()
    if not Path(got).resolve().is_relative_to(tree):
        raise SystemExit(f"with PYTHONPATH={tree} this interpreter imports {got}: measure "
                         "trees with an interpreter where pmc is not installed editable")


def one(tree: Path, mode: str, dag: Path, workers: int, reference: str | None = None
        ) -> tuple[float, float]:
    """(cpu, wall) seconds of one run of ``dag``."""
    for suffix in (".rescue", ".resource", ".status.json"):
        Path(f"{dag}{suffix}").unlink(missing_ok=True)
    env = _env(tree)
    if mode == "reference":
        assert reference is not None
        launch, extra = reference_launch(workers + 1, reference)
        env.update(extra)
        cmd = [*launch, "-s", "-o", os.devnull, "-e", os.devnull, str(dag)]
    elif mode == "dropin":
        cmd = [mpiexec(), "-n", str(workers + 1), str(Path(PYTHON).parent / "pegasus-mpi-cluster"),
               "-s", "-o", os.devnull, "-e", os.devnull, str(dag)]
    elif mode == "mpi4py":
        return mpi_control(workers, tree)
    elif mode == "mpi":
        cmd = [mpiexec(), "-n", str(workers + 1), PYTHON, "-m", "pmc", "run", "--mpi", "-q",
               "-s", "-o", os.devnull, str(dag)]
    else:
        cmd = [PYTHON, "-m", "pmc", "run", "--local", "--workers", str(workers), "-q", "-s",
               "-o", os.devnull, str(dag)]
    c0, t0 = children_cpu(), time.monotonic()
    proc = subprocess.run(cmd, cwd=dag.parent, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    wall, cpu = time.monotonic() - t0, children_cpu() - c0
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run of {tree} failed ({proc.returncode}):\n{proc.stdout}")
    return cpu, wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trees", default=f"pmc={Path(__file__).resolve().parent.parent}",
                   help="NAME=CHECKOUT,... (default: this checkout)")
    p.add_argument("--modes", default="dropin,mpi,local,mpi4py")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--workers", default="2", help="workers, or a list of them: 2,8,16")
    p.add_argument("--reference", metavar="BINARY",
                   help="the reference's binary, for the mode 'reference'")
    p.add_argument("--keep", metavar="DIR", help="work in DIR and keep the files")
    a = p.parse_args(argv)
    trees = [(name, Path(path).resolve()) for name, path in
             (t.split("=", 1) for t in a.trees.split(","))]
    modes = a.modes.split(",")
    if "reference" in modes and not a.reference:
        p.error("the mode 'reference' needs --reference BINARY")
    sizes = [int(w) for w in a.workers.split(",") if w]
    for _name, tree in trees:  # compiled first, as an install is
        if len({t for _, t in trees}) > 1:  # trees to tell apart: each must be imported
            _check_tree(tree)
        subprocess.run([PYTHON, "-m", "compileall", "-q", str(tree / "pmc")], check=True)
    work = workdir(a.keep)
    dag = work / "one.dag"
    dag.write_text("TASK t1 /bin/true\n")
    print(machine())
    print(f"{a.rounds} rounds, workers {a.workers}, one /bin/true task; by turns: "
          + ", ".join(f"{n}={t}" for n, t in trees))
    runs = [(w, mode, name, tree) for w in sizes for mode in modes
            for name, tree in (trees[:1] if mode == "reference" else trees)]
    got: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
    for _ in range(a.rounds):
        for w, mode, name, tree in runs:
            key = (w, mode, "-" if mode == "reference" else name)
            got.setdefault(key, []).append(one(tree, mode, dag, w, a.reference))
    print(f"{'ranks':>5} {'mode':9} {'tree':8} {'cpu s median (range)':26} "
          f"{'wall s median (range)':26} cpu ratio")
    parts = []
    for (w, mode, name), values in got.items():
        base = median([c for c, _ in got[next(k for k in got if k[:2] == (w, mode))]])
        cpus = [c for c, _ in values]
        walls = [x for _, x in values]
        print(f"{w + 1:5d} {mode:9} {name:8} {median(cpus):.3f} ({min(cpus):.3f}-{max(cpus):.3f})"
              f"{'':6} {median(walls):.3f} ({min(walls):.3f}-{max(walls):.3f})"
              f"{'':6} {median(cpus) / base:.2f}")
        parts.append(f"{w + 1} ranks {mode} {name} cpu {median(cpus):.3f} s "
                     f"wall {median(walls):.3f} s")
    print("SUMMARY startup: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
