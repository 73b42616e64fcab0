"""``--pmc-site`` across hosts of pmc's multi-node test cluster (ci/cluster-up.sh):
Snakemake runs on the head host (as on a login node), pmc's batch wing submits ONE job
from configs/site-test-cluster.yaml, whose open run (master on node1, workers on the
three nodes) listens on TCP; Snakemake reaches it over the cluster's network
(``--pmc-channel tcp``: the hosts of this cluster share one machine's file system,
where the run's Unix socket would be reached too) and its jobs run on the nodes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[3]
NODES = {"node1", "node2", "node3"}

SNAKEFILE = """\
rule all:
    input: expand("out/{i}.txt", i=range(10)), "bad.txt"

rule short:
    output: "out/{i}.txt"
    shell: "hostname > {output}"

rule bad:
    output: "bad.txt"
    shell: "echo boom-on-a-node >&2; exit 3"
"""


def on_head(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMC_", "SLURM_", "PMI_", "MPI_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(["bash", str(REPO / "ci" / "cluster-run.sh"), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def cluster_up(cwd: Path) -> None:
    try:
        proc = on_head(cwd, "sinfo", "-h", "-N", "-o", "%N %T", timeout=30)
        states = dict(line.split() for line in proc.stdout.splitlines() if line.strip())
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        states, proc = {}, None
        detail = str(e)
    else:
        detail = proc.stderr.strip() or str(states)
    if all(states.get(n) in ("idle", "mixed", "allocated") for n in NODES):
        return
    reason = f"the test cluster is not up ({detail}); start it: bash ci/cluster-up.sh"
    if os.environ.get("PMC_TEST_CLUSTER") == "1":
        pytest.fail(f"PMC_TEST_CLUSTER=1 but {reason}")
    pytest.skip(reason)


def test_snakemake_on_the_head_runs_its_jobs_on_the_nodes_over_tcp(tmp_path: Path) -> None:
    cluster_up(tmp_path)
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    before = set(on_head(tmp_path, "squeue", "--states=all", "-h", "-o", "%i").stdout.split())
    r = on_head(tmp_path, sys.executable, "-m", "snakemake", "--executor", "pmc", "--jobs",
                "20", "--keep-going", "--latency-wait", "60", "--pmc-channel", "tcp",
                "--pmc-site", str(REPO / "configs" / "site-test-cluster.yaml"),
                timeout=900)
    said = r.stdout + r.stderr
    assert r.returncode == 1, said  # the bad job failed, the others did not
    after = set(on_head(tmp_path, "squeue", "--states=all", "-h", "-o", "%i").stdout.split())
    (job,) = after - before  # exactly one Slurm job
    hosts = {p.read_text().strip() for p in (tmp_path / "out").glob("*.txt")}
    assert len(list((tmp_path / "out").glob("*.txt"))) == 10 and hosts <= NODES, hosts
    assert f"batch job {job}'s open run reached over TCP" in said, said
    assert "failed (exit code 1)" in said
    (log,) = (tmp_path / ".snakemake" / "pmc_logs").glob("bad-*.log")
    assert "boom-on-a-node" in log.read_text()
    assert f"the pmc batch job {job} ended: {job} FAILED" in said, said
    (rundir,) = (tmp_path / ".snakemake" / "pmc").glob("*")
    output = "".join(p.read_text() for p in rundir.glob("slurm-*.out"))
    assert "Open run: listening on TCP at node1:" in output, output[-3000:]
