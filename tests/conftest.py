"""Fixtures shared by the tests; the plain helpers are in pmctest.py."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from openrunkit import OpenRun
from pmctest import DIAMOND, mpiexec, pmc, pmc_mpi, write_dag


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``mpi`` is skipped where the pip MPI's mpiexec is missing."""
    if item.get_closest_marker("mpi") is not None:
        mpiexec()


@pytest.fixture
def diamond(tmp_path: Path) -> Path:
    return write_dag(tmp_path / "diamond.dag", DIAMOND)


@pytest.fixture(params=["local", pytest.param("mpi2", marks=pytest.mark.mpi),
                        pytest.param("mpi4", marks=pytest.mark.mpi)])
def launch(request: pytest.FixtureRequest):
    """Run pmc embedded, or under mpiexec with 2 or 4 ranks: same DAG, same checks. With
    2 ranks the worker talks to the master through a host socket; with 4 every message
    goes through MPI (``--no-host-sockets``), as between hosts."""
    mode = request.param

    def go(args: Sequence[str], cwd: Path, **kw):
        if mode == "local":
            return pmc(["run", *args], cwd, **kw)
        ranks = int(mode[3:])
        extra = ["--no-host-sockets"] if ranks == 4 else []
        return pmc_mpi(ranks, ["run", *extra, *args], cwd, **kw)

    go.mode = mode
    return go


@pytest.fixture(autouse=True, scope="session")
def _no_user_site_profile(tmp_path_factory: pytest.TempPathFactory):
    """pmc run reads $PMC_SITE, else ~/.config/pmc/site.yaml: never the user's own in the
    tests (their processes inherit this environment)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    patch.delenv("PMC_SITE", raising=False)
    yield
    patch.undo()


@pytest.fixture
def runs() -> Iterator[list[OpenRun]]:
    """Open runs a test started (append each): stopped at its end, whatever happened."""
    started: list[OpenRun] = []
    yield started
    for run in started:
        run.stop()
