"""Helpers for the tests: run pmc as a real process, write DAGs, read a rescue log, find
the pip MPI's mpiexec. (Fixtures are in conftest.py; ``tests/`` is on pytest's pythonpath.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def find_mpiexec() -> str | None:
    scripts = Path(sysconfig.get_path("scripts"))
    for name in ("mpiexec", "mpiexec.hydra"):
        candidate = scripts / name
        if candidate.exists():
            return str(candidate)
    return shutil.which("mpiexec")


MPIEXEC = find_mpiexec()


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
        input: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m pmc ARGS`` in cwd."""
    return subprocess.run(
        [sys.executable, "-m", "pmc", *args], cwd=cwd, env=env or clean_env(),
        capture_output=True, text=True, timeout=timeout,
    )


def pmc_mpi(n: int, args: Sequence[str], cwd: Path, *, timeout: float = 180,
            env: dict[str, str] | None = None,
            launch: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """``mpiexec -n N [LAUNCH] python -m pmc ARGS`` with the pip MPI."""
    if MPIEXEC is None:
        pytest.skip("mpiexec not installed (pip install '.[mpi]')")
    return subprocess.run(
        [MPIEXEC, "-n", str(n), *launch, sys.executable, "-m", "pmc", *args], cwd=cwd,
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
