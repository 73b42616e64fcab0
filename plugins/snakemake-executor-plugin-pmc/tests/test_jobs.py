"""Jobs through the plugin as a user runs them (the snakemake command): their threads
and memory become the tasks' requests, a failed job fails the workflow with its log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SNAKEFILE = """
rule all:
    input: "big.txt", "bad.txt"

rule big:
    output: "big.txt"
    threads: 2
    resources: mem_mb=100
    shell: "echo threads={threads} > {output}"

rule bad:
    output: "bad.txt"
    shell: "echo boom-from-the-job >&2; exit 3"
"""


def snakemake(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--executor", "pmc", "--jobs", "4",
         "--pmc-workers", "2", "--latency-wait", "5", *args],
        cwd=cwd, capture_output=True, text=True, timeout=600)


def test_requests_and_a_failed_job_with_its_log(tmp_path: Path) -> None:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    r = snakemake(tmp_path, "--keep-going")
    assert r.returncode == 1, r.stderr
    assert (tmp_path / "big.txt").read_text() == "threads=2\n"
    assert not (tmp_path / "bad.txt").exists()
    said = r.stdout + r.stderr
    # The task is the job's own Snakemake, which exits 1 when the job's command fails.
    assert "failed (exit code 1)" in said
    (log,) = (tmp_path / ".snakemake" / "pmc_logs").glob("bad-*.log")
    assert "boom-from-the-job" in log.read_text()
    assert str(log) in said
    (records,) = (tmp_path / ".snakemake" / "pmc").glob("*/pmc.out")
    lines = records.read_text().splitlines()
    big = [line for line in lines if "cluster-task" in line and "cpus=2" in line]
    assert len(big) == 1 and "memory=100" in big[0]
    assert 'stat="failed", tasks=2, submitted=2, succeeded=1, failed=1' in lines[0]


WARM_SNAKEFILE = """
rule all:
    input: expand("who/{i}.txt", i=range(3)), "bad.txt"

rule who:
    output: "who/{i}.txt"
    resources: mem_mb=4000
    shell: "tr '\\\\0' ' ' < /proc/$PPID/cmdline > {output}; echo >> {output}; "
           "ulimit -v >> {output}"

rule bad:
    output: "bad.txt"
    shell: "echo boom-from-a-warm-job >&2; exit 3"
"""


def test_warm_starts_fork_each_job_from_one_process(tmp_path: Path) -> None:
    """With --pmc-warm each job's Snakemake (the parent of the job's shell) is a fork of
    the warm process, which keeps its command line; the job gets its task's memory
    limit, and a failed job still fails with its log."""
    (tmp_path / "Snakefile").write_text(WARM_SNAKEFILE)
    r = snakemake(tmp_path, "--keep-going", "--pmc-warm", "--pmc-args=--strict-limits")
    assert r.returncode == 1, r.stderr
    for i in range(3):
        parent, limit = (tmp_path / "who" / f"{i}.txt").read_text().splitlines()
        assert "warm.py --serve" in parent, parent
        assert limit == str(4000 * 1024), limit  # ulimit -v is in KiB
    said = r.stdout + r.stderr
    assert "warm starts through" in said
    assert "failed (exit code 1)" in said
    (log,) = (tmp_path / ".snakemake" / "pmc_logs").glob("bad-*.log")
    assert "boom-from-a-warm-job" in log.read_text()
    # The warm process ended with the workflow and removed its socket.
    (rundir,) = (tmp_path / ".snakemake" / "pmc").glob("*")
    assert not (rundir / "warm.sock").exists()
