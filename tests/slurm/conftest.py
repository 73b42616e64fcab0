"""The local Slurm cluster for tests marked ``slurm``: skip when it is not up, unless
``PMC_TEST_SLURM=1`` (set by CI after ci/slurm-up.sh), where a missing cluster fails."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    required = os.environ.get("PMC_TEST_SLURM") == "1"
    if shutil.which("sinfo") is None:
        reason = "no Slurm here (sinfo not found); start one with: bash ci/slurm-up.sh"
    else:
        proc = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30, check=False
        )
        states = proc.stdout.split()
        if proc.returncode == 0 and any(s in ("idle", "mixed", "allocated") for s in states):
            return
        detail = (proc.stderr.strip() or ",".join(states) or "no nodes").splitlines()[0]
        reason = f"the local Slurm cluster is not up ({detail}); start it: bash ci/slurm-up.sh"
    if required:
        pytest.fail(f"PMC_TEST_SLURM=1 but {reason}")
    pytest.skip(reason)
