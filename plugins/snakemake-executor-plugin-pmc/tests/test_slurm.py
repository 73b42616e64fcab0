"""Snakefiles through the real (one-node) Slurm started by pmc's ci/slurm-up.sh.

Many short jobs inside one Slurm job: Snakemake runs in the batch job, its jobs are
tasks of one pmc open run there, and Slurm sees that one job only; with warm starts
(each job's Snakemake forked from one that imported Snakemake). The count is
$PMC_SNAKEMAKE_JOBS (default 500).

``--pmc-site``: Snakemake runs outside Slurm (as on a login node) and pmc's batch wing
submits ONE Slurm job from a site profile, whose open run takes Snakemake's jobs; a job
that ends before its run fails Snakemake's jobs with the reason."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

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


SITE_SNAKEFILE = """\
rule all:
    input: expand("out/{i}.txt", i=range(10)), "bad.txt"

rule short:
    output: "out/{i}.txt"
    shell: "echo {wildcards.i} $SLURM_JOB_ID > {output}"

rule bad:
    output: "bad.txt"
    shell: "echo boom-in-the-slurm-job >&2; exit 3"
"""


def site_snakemake(cwd: Path, profile: str) -> subprocess.CompletedProcess[str]:
    """Snakemake with --pmc-site, outside any Slurm job (as on a login node)."""
    (cwd / "Snakefile").write_text(SITE_SNAKEFILE)
    (cwd / "site.yaml").write_text(profile)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMC_", "SLURM_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--executor", "pmc", "--jobs", "20",
         "--keep-going", "--latency-wait", "60", "--pmc-site", "site.yaml"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


def local_profile(extra: str = "") -> str:
    """The one-node Slurm's profile; its run listens on TCP on loopback only."""
    text = (REPO / "configs" / "site-slurm-local.yaml").read_text()
    return text.replace("walltime: 00:05:00", "walltime: 00:10:00") + \
        "pmc:\n  open_tcp: 127.0.0.1\n" + extra


def test_site_submits_one_slurm_job_that_runs_every_job(tmp_path: Path) -> None:
    slurm_up()
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    time.sleep(1.1)
    r = site_snakemake(tmp_path, local_profile())
    said = r.stdout + r.stderr
    assert r.returncode == 1, said  # the bad job failed, the others did not
    (job,) = jobs_since(since, tmp_path)  # exactly one Slurm job
    outputs = sorted((tmp_path / "out").glob("*.txt"))
    assert len(outputs) == 10
    assert {p.read_text().split()[1] for p in outputs} == {job}  # all inside it
    assert f"to slurm as job {job}" in said
    assert "failed (exit code 1)" in said
    (log,) = (tmp_path / ".snakemake" / "pmc_logs").glob("bad-*.log")
    assert "boom-in-the-slurm-job" in log.read_text()
    # Snakemake closed the run and saw the job end (pmc run: 1, a task failed).
    assert f"the pmc batch job {job} ended: {job} FAILED" in said, said
    (rundir,) = (tmp_path / ".snakemake" / "pmc").glob("*")
    done = [line for line in (rundir / "run.dag.rescue").read_text().splitlines()
            if line.startswith("DONE ")]
    assert len(done) == 10
    for leftover in (".sock", ".token", ".tcp"):
        assert not (rundir / f"run.dag{leftover}").exists(), leftover


def test_site_a_slurm_job_that_ends_before_its_run_fails_the_jobs(tmp_path: Path) -> None:
    slurm_up()
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    time.sleep(1.1)
    r = site_snakemake(tmp_path, local_profile("setup:\n  - exit 5\n"))
    said = r.stdout + r.stderr
    assert r.returncode == 1, said
    (job,) = jobs_since(since, tmp_path)
    assert not (tmp_path / "out").exists()
    reason = f"the pmc batch job {job} ended: {job} FAILED"
    assert said.count(reason) == 11 and said.count("before its open run started") == 11, said
