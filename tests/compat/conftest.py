"""Fixtures of the differential suite (the helpers are in compatkit.py).

The whole suite skips, with the one reason, when the reference cannot be built here: its
sources are not at ../shared/reference/pegasus-mpi-cluster, or g++, make or Open MPI
(libopenmpi-dev, openmpi-bin) are missing. Otherwise the reference is built once (cached
outside the repository by a hash of its sources) and every test runs the same DAG
through it (under /usr/bin/mpiexec.openmpi) and through pmc's pegasus-mpi-cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from compatkit import Pair, Run, build_reference, missing_prerequisite

_CACHE: dict[tuple[object, ...], Run] = {}


@pytest.fixture(scope="session")
def reference_binary() -> Path:
    reason = missing_prerequisite()
    if reason is not None:
        pytest.skip(f"differential suite: {reason}")
    return build_reference()


@pytest.fixture(scope="session")
def pair(reference_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    return Pair(reference_binary, tmp_path_factory.mktemp("compat"), _CACHE)


@pytest.fixture(params=["mpi", "embedded"])
def mode(request: pytest.FixtureRequest) -> str:
    """pmc under the pip MPI's mpiexec, or embedded (no launcher, ``--workers``)."""
    return str(request.param)
