"""What the adapter tests share: the fake batch-system commands put first on PATH
(``fakesched.py`` behind each name), the ``Fakes`` a test drives them with, and the
profiles the job scripts start pmc from. The ``fakes`` fixture (conftest.py) builds one.
Imported by name from the tests (``from adapterkit import ...``): a module called
conftest is ambiguous when several test folders are collected together."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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
