"""``--pmc-site PROFILE`` (an extension of the plugin): Snakemake's jobs run as tasks of
one open run in ONE batch job that pmc's batch wing submits from the site profile;
here with pmc's "local" scheduler (the batch script detached on this machine, its ranks
under the pip MPICH's mpiexec), which needs no batch system. The same on the real Slurm
is in test_slurm.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

# The run listens on TCP on loopback only (the profile's choice wins over the plugin's
# default, every interface): Snakemake, on the run's host, takes the Unix socket anyway.
PROFILE = """\
site: snakemake-local
scheduler: local
nodes: 1
ranks_per_node: 3
pmc:
  open_tcp: 127.0.0.1
"""

SNAKEFILE = """\
COUNT = int(config.get("count", 6))

rule all:
    input: expand("out/{i}.txt", i=range(COUNT)), "bad.txt"

rule short:
    output: "out/{i}.txt"
    threads: 1
    shell: "echo {wildcards.i} > {output}"

rule bad:
    output: "bad.txt"
    shell: "echo boom-in-the-batch-job >&2; exit 3"
"""


def env_for(cwd: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMC_", "SLURM_"))}
    # The batch script finds this Python's pmc and mpiexec; local jobs' records here.
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PMC_LOCAL_JOBS=str(cwd / "jobs"))
    return env


def snakemake(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--executor", "pmc", "--jobs", "20",
         "--latency-wait", "30", *args],
        cwd=cwd, env=env_for(cwd), capture_output=True, text=True, timeout=900)


def local_jobs(cwd: Path) -> list[Path]:
    """The local scheduler's record of each job submitted (one file of its exit status
    per job once it ended)."""
    return sorted((cwd / "jobs").glob("*"))


def test_jobs_run_in_one_batch_job_submitted_from_a_site_profile(tmp_path: Path) -> None:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "site.yaml").write_text(PROFILE)
    r = snakemake(tmp_path, "--keep-going", "--pmc-site", "site.yaml")
    said = r.stdout + r.stderr
    assert r.returncode == 1, said  # the bad job failed
    assert sorted(p.name for p in (tmp_path / "out").glob("*.txt")) == \
        [f"{i}.txt" for i in range(6)]
    assert "failed (exit code 1)" in said
    (log,) = (tmp_path / ".snakemake" / "pmc_logs").glob("bad-*.log")
    assert "boom-in-the-batch-job" in log.read_text()
    # One batch job, submitted by pmc submit, which Snakemake followed to its end.
    (rundir,) = (tmp_path / ".snakemake" / "pmc").glob("*")
    scripts = list(rundir.glob("run.dag.*.sh"))
    assert len(scripts) == 1, scripts
    assert "--open-tcp 127.0.0.1 " in scripts[0].read_text()
    assert "submitted" in said and "to local as job" in said
    assert len(local_jobs(tmp_path)) == 1, local_jobs(tmp_path)
    assert "job(s) handed to it" in said
    assert "ended:" in said and "FAILED" in said  # pmc run exits 1: a task failed
    for leftover in (".sock", ".token", ".tcp"):
        assert not (rundir / f"run.dag{leftover}").exists(), leftover
    rescue = (rundir / "run.dag.rescue").read_text().splitlines()
    assert sum(line.startswith("DONE ") for line in rescue) == 6  # the short jobs


def test_a_batch_job_that_ends_before_its_run_fails_the_jobs_with_the_reason(
        tmp_path: Path) -> None:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "site.yaml").write_text(PROFILE + "setup:\n  - exit 5\n")
    r = snakemake(tmp_path, "--keep-going", "--pmc-site", "site.yaml", "--config", "count=2")
    said = r.stdout + r.stderr
    assert r.returncode == 1, said
    assert not (tmp_path / "out").exists()
    # Each job fails with the reason (the local scheduler keeps no exit status of a
    # script that ended in its setup lines: UNKNOWN).
    assert said.count("ended: ") == 3 and said.count("before its open run started") == 3, said
    (rundir,) = (tmp_path / ".snakemake" / "pmc").glob("*")
    assert len(list(rundir.glob("run.dag.*.sh"))) == 1


GATED = """\
rule all:
    input: expand("gated/{i}.txt", i=range(2))

rule gated:
    output: "gated/{i}.txt"
    shell: "touch started-{wildcards.i}; while [ ! -e gate ]; do sleep 0.1; done; touch {output}"
"""


def test_a_batch_job_cancelled_while_its_jobs_run_fails_them_with_the_reason(
        tmp_path: Path) -> None:
    (tmp_path / "Snakefile").write_text(GATED)
    (tmp_path / "site.yaml").write_text(PROFILE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--executor", "pmc", "--jobs", "4",
         "--keep-going", "--pmc-site", "site.yaml"], cwd=tmp_path, env=env_for(tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not all((tmp_path / f"started-{i}").exists() for i in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout
            time.sleep(0.2)
        (log,) = (tmp_path / ".snakemake" / "log").glob("*.snakemake.log")
        job = re.search(r"to local as job (\S+)", log.read_text())
        assert job is not None, log.read_text()
        cancel = subprocess.run(
            [sys.executable, "-m", "pmc", "jobs", "cancel", "--scheduler", "local",
             job.group(1)], cwd=tmp_path, env=env_for(tmp_path), capture_output=True,
            text=True, timeout=120)
        assert cancel.returncode == 0, cancel.stderr
        said, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, said
    assert not (tmp_path / "gated").exists() or not list((tmp_path / "gated").iterdir())
    assert said.count("the pmc run is gone") == 2, said
    assert f"the pmc batch job {job.group(1)} ended: " in said, said


def test_site_refuses_the_options_of_a_run_started_here(tmp_path: Path) -> None:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "site.yaml").write_text(PROFILE)
    r = snakemake(tmp_path, "--pmc-site", "site.yaml", "--pmc-workers", "2", "--pmc-warm")
    assert r.returncode == 1
    assert "--pmc-site cannot be combined with --pmc-workers, --pmc-warm" in r.stderr
    assert not (tmp_path / "jobs").exists()  # nothing submitted
    (tmp_path / "bad.yaml").write_text(PROFILE.replace("nodes: 1", "nodes: zero"))
    r = snakemake(tmp_path, "--pmc-site", "bad.yaml")
    assert r.returncode == 1
    assert "bad.yaml" in r.stderr and "nodes" in r.stderr, r.stderr
