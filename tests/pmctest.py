"""Helpers for the tests: run pmc as a real process, write DAGs, read a rescue log, find
the pip MPI's mpiexec, every Task of a parsed DAG. (Fixtures are in conftest.py;
``tests/`` is on pytest's pythonpath.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import pytest

from pmc.dag import DAG, Task
from pmc.dag.model import TaskView

REPO = Path(__file__).resolve().parent.parent


def tasks_of(dag: DAG) -> list[Task]:
    """Every task of ``dag`` as a Task, in id order (a parsed DAG holds none: each is made
    as it is asked for, ``DAG.task``)."""
    return list(TaskView(dag, range(len(dag))))


def find_mpiexec() -> str | None:
    scripts = Path(sysconfig.get_path("scripts"))
    for name in ("mpiexec", "mpiexec.hydra"):
        candidate = scripts / name
        if candidate.exists():
            return str(candidate)
    return shutil.which("mpiexec")


MPIEXEC = find_mpiexec()
NO_MPIEXEC = "mpiexec not installed (pip install '.[mpi]')"


def mpiexec() -> str:
    """The pip MPI's mpiexec. Where there is none the test is skipped, as every test marked
    ``mpi`` is (tests/conftest.py): the one place that says so."""
    if MPIEXEC is None:
        pytest.skip(NO_MPIEXEC)
    return MPIEXEC


def comm(pid: int) -> str:
    """The process's name (``ps -o comm``), "" if it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def clean_env(**extra: str) -> dict[str, str]:
    """The environment a user's shell would give pmc: no launcher variables from outside."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_", "ALPS_", "PMC_", "MPI_"))}
    env.update(extra)
    return env


def pmc(args: Sequence[str], cwd: Path, *, timeout: float = 120, env: dict[str, str] | None = None,
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m pmc ARGS`` in cwd."""
    return subprocess.run(
        [sys.executable, "-m", "pmc", *args], cwd=cwd, env=env or clean_env(),
        capture_output=True, text=True, timeout=timeout, input=input,
    )


def pmc_mpi(n: int, args: Sequence[str], cwd: Path, *, timeout: float = 180,
            env: dict[str, str] | None = None,
            launch: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """``mpiexec -n N [LAUNCH] python -m pmc ARGS`` with the pip MPI."""
    return subprocess.run(
        [mpiexec(), "-n", str(n), *launch, sys.executable, "-m", "pmc", *args], cwd=cwd,
        env=env or clean_env(), capture_output=True, text=True, timeout=timeout,
    )


def write_dag(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def rescue_done(path: Path, *, in_order: bool = False, missing_ok: bool = False) -> list[str]:
    """The names of the tasks a rescue log records DONE, sorted (``in_order``: in the
    log's order). Only lines of exactly ``DONE NAME`` count, so a torn last record such
    as ``DON`` is none. A missing log raises FileNotFoundError unless ``missing_ok``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return []
        raise
    names = []
    for line in data.split(b"\n"):
        fields = line.split()
        if len(fields) == 2 and fields[0] == b"DONE":
            names.append(fields[1].decode())
    return names if in_order else sorted(names)


DIAMOND = """\
TASK A /bin/echo "I am A"
TASK B /bin/echo "I am B"
TASK C /bin/echo "I am C"
TASK D /bin/echo "I am D"

EDGE A B
EDGE A C
EDGE B D
EDGE C D
"""


# A two-rank task's program: each rank writes its rank, size, PMC_HOSTS and step.
MPI_PROGRAM = """\
import os, sys
from mpi4py import MPI
c = MPI.COMM_WORLD
with open(f"{sys.argv[1]}.{c.Get_rank()}", "w") as f:
    f.write(f"{c.Get_rank()} {c.Get_size()} {os.environ.get('PMC_HOSTS', '-')} "
            f"{os.environ.get('SLURM_STEP_ID', '-')}\\n")
"""


def mpi_dag(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "prog.py").write_text(MPI_PROGRAM)
    py = sys.executable
    return write_dag(tmp_path / "m.dag",
                     f"TASK mr --ranks 2 {py} prog.py out\n"
                     f"TASK after {py} -c \"open('after', 'w')\"\n"
                     f"EDGE mr after\n{extra}")


def ranks_written(tmp_path: Path, stem: str) -> list[tuple[int, int, str, str]]:
    """(rank, size, PMC_HOSTS, SLURM_STEP_ID) each rank wrote ("-": not set)."""
    out = []
    for p in sorted(tmp_path.glob(f"{stem}.*")):
        rank, size, hosts, step = p.read_text().split()
        out.append((int(rank), int(size), hosts, step))
    return out


def dashboard_queries() -> list[str]:
    """The PromQL of every panel and variable of configs/grafana-dashboard.json."""
    dash = json.loads((REPO / "configs" / "grafana-dashboard.json").read_text())
    exprs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "expr" and isinstance(v, str):
                    exprs.append(v)
                elif k in ("query", "definition") and isinstance(v, str) and \
                        "label_values" in v:
                    # Grafana's label_values(METRIC, LABEL): the metric is the selector.
                    m = re.fullmatch(r"label_values\((.*),\s*\w+\)", v.strip())
                    assert m, v
                    exprs.append(m.group(1))
                else:
                    walk(v)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dash)
    return exprs
