"""Fixtures for the adapter tests: fake batch-system commands first on PATH, and a
helper that runs the real ``pmc`` command line against them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pmctest import DIAMOND

HERE = Path(__file__).parent
REPO = HERE.parent.parent
FAKE_TOOLS = [
    "sbatch",
    "squeue",
    "scontrol",
    "scancel",
    "qsub",
    "qstat",
    "qdel",
    "llsubmit",
    "llq",
    "llcancel",
    "srun",
    "mpiexec",
    "aprun",
    "poe",
    "apptainer",
]

@dataclass
class Fakes:
    bin: Path
    state: Path
    env: dict[str, str]
    work: Path

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        f = self.state / "calls.jsonl"
        if not f.exists():
            return []
        entries = [json.loads(line) for line in f.read_text().splitlines()]
        return [e for e in entries if tool is None or e["tool"] == tool]

    def pmc(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "pmc", *args],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        if check:
            assert proc.returncode == 0, proc.stderr + proc.stdout
        return proc

    def job_output(self) -> str:
        return "".join(p.read_text() for p in sorted(self.state.glob("job-*.out")))

    def profile(self, name: str, data: dict[str, Any]) -> Path:
        path = self.work / name
        path.write_text(yaml.safe_dump(data))
        return path


@pytest.fixture
def fakes(tmp_path: Path) -> Fakes:
    real_mpiexec = shutil.which("mpiexec")
    if real_mpiexec is None:
        pytest.skip("mpiexec (the mpi extra: pip install -e '.[mpi]') is not installed")
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


def python_pmc() -> list[str]:
    """How the job scripts in these tests start pmc: this interpreter, whatever PATH."""
    return [sys.executable, "-m", "pmc"]


def base_profile(scheduler: str, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "site": f"fake-{scheduler}",
        "scheduler": scheduler,
        "walltime": "00:10:00",
        "nodes": 1,
        "ranks_per_node": 3,
        "pmc": {"command": python_pmc()},
    }
    data.update(extra)
    return data


def argv_of(calls: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [c["argv"] for c in calls]
