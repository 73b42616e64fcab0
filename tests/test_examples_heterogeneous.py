"""The GPU and MPI-task examples (examples/gpus.dag, examples/mpi-task.dag) do what
README and docs/heterogeneous.md say, run as a user would from a copy of examples/."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from pmctest import REPO, pmc, pmc_mpi


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("*.rescue", "*.resource", "*.json"))
    return tmp_path


def test_gpus_example_each_task_its_own_devices(examples: Path) -> None:
    proc = pmc(["run", "--host-gpus", "4", "examples/gpus.dag"], examples)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "prep: no GPU asked, CUDA_VISIBLE_DEVICES=[]" in out
    got = dict(re.findall(r"^(train\d) on GPUs? (\S+)$", out, re.M))
    assert sorted(got) == ["train1", "train2", "train3"]
    assert [len(got[t].split(",")) for t in ("train1", "train2", "train3")] == [2, 2, 1]
    for ids in got.values():
        assert set(ids.split(",")) <= {"0", "1", "2", "3"}
    assert "all folds trained" in out


def test_gpus_example_refused_with_too_few_gpus(examples: Path) -> None:
    proc = pmc(["run", "--host-gpus", "1", "examples/gpus.dag"], examples)
    assert proc.returncode != 0
    assert "No host is capable of running task train1" in proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("outer", [0, 3])
def test_mpi_task_example(examples: Path, outer: int) -> None:
    args = ["run", "examples/mpi-task.dag"]
    proc = pmc_mpi(outer, args, examples) if outer else pmc(args, examples)
    assert proc.returncode == 0, proc.stderr
    host = os.uname().nodename
    assert proc.stdout.count(f"2 ranks on {host}") == 2, proc.stdout
    assert "both MPI tasks done" in proc.stdout
