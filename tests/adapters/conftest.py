"""Fixtures for the adapter tests: fake batch-system commands first on PATH, and a
helper that runs the real ``pmc`` command line against them (see adapterkit.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from adapterkit import FAKE_TOOLS, HERE, REPO, Fakes
from pmctest import DIAMOND, mpiexec


@pytest.fixture
def fakes(tmp_path: Path) -> Fakes:
    real_mpiexec = mpiexec()  # the pip MPI's, whatever else is on PATH
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    prog = bin_dir / "_fakesched"
    prog.write_text(f"#!{sys.executable}\n" + (HERE / "fakesched.py").read_text())
    prog.chmod(0o755)
    for tool in FAKE_TOOLS:
        (bin_dir / tool).symlink_to(prog)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "PBS_", "LOADL_", "PMI_", "PMC_"))
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        FAKE_STATE=str(state),
        FAKE_REAL_MPIEXEC=real_mpiexec,
        PMC_LOCAL_JOBS=str(state / "local-jobs"),
        PYTHONPATH=str(REPO),
        # The chain index and the default profile: never the user's own.
        XDG_STATE_HOME=str(tmp_path / "xdg-state"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg-config"),
    )
    (work / "diamond.dag").write_text(DIAMOND)
    return Fakes(bin_dir, state, env, work)
