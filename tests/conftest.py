"""Fixtures shared by the tests; the plain helpers are in pmctest.py."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from pmctest import DIAMOND, pmc, pmc_mpi, write_dag


@pytest.fixture
def diamond(tmp_path: Path) -> Path:
    return write_dag(tmp_path / "diamond.dag", DIAMOND)


@pytest.fixture(params=["local", "mpi2", "mpi4"])
def launch(request: pytest.FixtureRequest):
    """Run pmc embedded, or under mpiexec with 2 or 4 ranks: same DAG, same checks."""
    mode = request.param

    def go(args: Sequence[str], cwd: Path, **kw):
        if mode == "local":
            return pmc(["run", *args], cwd, **kw)
        return pmc_mpi(int(mode[3:]), ["run", *args], cwd, **kw)

    go.mode = mode
    return go
