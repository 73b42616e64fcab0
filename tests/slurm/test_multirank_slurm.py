"""A multi-rank task (``--ranks``, a pmc extension) in a job of the real one-node Slurm
cluster: pmc's ranks started by srun, the task's 2 ranks by a nested ``srun --overlap``
(the default launcher inside an allocation)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pmctest import clean_env, mpi_dag, ranks_written

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


@pytest.mark.slow
def test_two_rank_task_in_a_slurm_job_through_srun_overlap(tmp_path: Path) -> None:
    """A job of 3 ranks on the one-node cluster: pmc's ranks started by srun, the
    2-rank task by a nested ``srun --overlap`` (the default inside an allocation)."""
    dag = mpi_dag(tmp_path)
    env = {k: v for k, v in clean_env().items() if not k.startswith("PMC_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"srun --mpi=pmi2 -n 3 {sys.executable} -m pmc run --mpi --host-cpus 3 {dag.name}\n"
        "echo \"pmc exit $?\"\n")
    sub = subprocess.run(["sbatch", "--parsable", "-n", "3", "-o", "job.out", str(script)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 180
    while True:
        q = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True,
                           timeout=30)
        if not q.stdout.strip():
            break
        assert time.monotonic() < deadline, f"job {job} still queued or running"
        time.sleep(0.5)
    out = (tmp_path / "job.out").read_text()
    assert "pmc exit 0" in out, out
    got = ranks_written(tmp_path, "out")
    assert [(rank, size) for rank, size, _h, _s in got] == [(0, 2), (1, 2)]
    # Both ranks in one job step of their own: not pmc's (step 0), so srun started them.
    steps = {step for _r, _s, _h, step in got}
    assert len(steps) == 1 and steps != {"-"} and steps != {"0"}, steps
