"""The multi-node test cluster for tests marked ``cluster`` (ci/cluster-up.sh): skip
when it is not up, unless ``PMC_TEST_CLUSTER=1`` (set by CI after ci/cluster-up.sh),
where a missing cluster fails."""

from __future__ import annotations

import os
import subprocess

import pytest
from clusterkit import NODES, REPO


@pytest.fixture(scope="session")
def test_cluster() -> None:
    required = os.environ.get("PMC_TEST_CLUSTER") == "1"
    try:
        proc = subprocess.run(
            ["bash", str(REPO / "ci" / "cluster-run.sh"), "sinfo", "-h", "-N", "-o", "%N %T"],
            capture_output=True, text=True, timeout=30, check=False)
        states = dict(line.split() for line in proc.stdout.splitlines() if line.strip())
        up = [n for n in NODES if states.get(n) in ("idle", "mixed", "allocated")]
        if proc.returncode == 0 and len(up) == len(NODES):
            return
        detail = (proc.stderr.strip() or str(states) or "no nodes").splitlines()[0]
    except (OSError, subprocess.TimeoutExpired) as exc:
        detail = str(exc)
    reason = f"the test cluster is not up ({detail}); start it: bash ci/cluster-up.sh"
    if required:
        pytest.fail(f"PMC_TEST_CLUSTER=1 but {reason}")
    pytest.skip(reason)
