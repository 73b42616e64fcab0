"""A Snakefile of many short jobs inside one job of the real (one-node) Slurm started
by pmc's ci/slurm-up.sh: Snakemake runs in the batch job, its jobs are tasks of one pmc
open run there, and Slurm sees that one job only; with warm starts (each job's
Snakemake forked from one that imported Snakemake). The count is $PMC_SNAKEMAKE_JOBS
(default 500)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

SNAKEFILE = """\
COUNT = int(config.get("count", 500))

rule all:
    input: expand("out/{i}.txt", i=range(COUNT))

rule short:
    output: "out/{i}.txt"
    shell: "echo {wildcards.i} > {output}"
"""


def slurm_up() -> None:
    if shutil.which("sinfo") is None:
        pytest.skip("no Slurm here: start one with pmc's ci/slurm-up.sh")
    states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                            check=False).stdout.split()
    if not any(s in ("idle", "mixed", "allocated") for s in states):
        if os.environ.get("PMC_TEST_SLURM") == "1":
            pytest.fail("PMC_TEST_SLURM=1 but the local Slurm cluster is not up")
        pytest.skip("the local Slurm cluster is not up: start it with ci/slurm-up.sh")


def jobs_since(since: str, where: Path) -> set[str]:
    """The Slurm jobs submitted from ``since`` on with their work directory in ``where``
    (not those of others sharing the cluster)."""
    out = subprocess.run(["squeue", "--states=all", "-h", "-o", "%i|%V|%Z"],
                         capture_output=True, text=True, check=True).stdout
    return {job for job, submitted, cwd in (line.split("|", 2) for line in out.splitlines())
            if submitted >= since and cwd.startswith(str(where))}


def test_a_snakefile_of_many_short_jobs_runs_inside_one_slurm_job(tmp_path: Path) -> None:
    slurm_up()
    count = int(os.environ.get("PMC_SNAKEMAKE_JOBS", "500"))
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    snake = shlex.join([sys.executable, "-m", "snakemake", "--executor", "pmc", "--jobs",
                        str(count), "--pmc-workers", "2", "--pmc-warm", "--latency-wait", "60",
                        "--config", f"count={count}"])
    (tmp_path / "job.sh").write_text(f"#!/bin/sh\n{snake}\n")
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    time.sleep(1.1)
    job = subprocess.run(["sbatch", "--parsable", "-N1", "-n1", "-c", "2", "-o", "job.out",
                          "job.sh"], cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout.strip().split(";")[0]
    end = time.monotonic() + 3 * 3600
    state = ""
    while time.monotonic() < end:
        state = subprocess.run(["squeue", "--states=all", "-h", "-j", job, "-o", "%T"],
                               capture_output=True, text=True, check=False).stdout.strip()
        if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        time.sleep(2)
    log = (tmp_path / "job.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    assert len(list((tmp_path / "out").glob("*.txt"))) == count
    assert jobs_since(since, tmp_path) == {job}  # the workflow's jobs were never Slurm's
    (records,) = (tmp_path / ".snakemake" / "pmc").glob("*/pmc.out")
    assert f'stat="ok", tasks={count}, submitted={count}, succeeded={count}' in \
        records.read_text().splitlines()[0]
