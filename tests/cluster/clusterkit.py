"""Helpers for the tests on the multi-node test cluster (ci/cluster-up.sh): commands run
on its head host (where Slurm's commands reach its slurmctld), jobs submitted with
``pmc submit`` and the site profile configs/site-test-cluster.yaml, waiting for them,
and playing node failures with ci/cluster-node.sh."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "configs" / "site-test-cluster.yaml"
NODES = ["node1", "node2", "node3"]
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def job_env(cwd: Path) -> dict[str, str]:
    # The job inherits this environment (sbatch --export=ALL): this Python's pmc first,
    # the chain index out of the user's own state directory.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMC_", "SLURM_", "PMI_", "MPI_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               XDG_STATE_HOME=str(cwd / ".state"), XDG_CONFIG_HOME=str(cwd / ".config"))
    return env


def on_head(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A command on the cluster's head host, in cwd (the shared file system)."""
    return subprocess.run(["bash", str(REPO / "ci" / "cluster-run.sh"), *args], cwd=cwd,
                          env=job_env(cwd), capture_output=True, text=True, timeout=timeout,
                          check=False)


def pmc(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return on_head(cwd, sys.executable, "-m", "pmc", *args)


def submit(cwd: Path, dag: str, *args: str, site: Path = PROFILE) -> str:
    proc = pmc(cwd, "submit", "--site", str(site), *args, dag)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout
    return job_id


def job_fields(cwd: Path, job_id: str) -> dict[str, str]:
    """Slurm's record of a job (scontrol show job), field by field."""
    proc = on_head(cwd, "scontrol", "show", "job", job_id)
    assert proc.returncode == 0, proc.stderr
    return dict(w.split("=", 1) for w in proc.stdout.split() if "=" in w)


def wait_state(cwd: Path, job_id: str, states: tuple[str, ...], limit: float = 240) -> str:
    """Wait until Slurm says the job is in one of states; return that state."""
    deadline = time.monotonic() + limit
    while True:
        state = job_fields(cwd, job_id)["JobState"]
        if state in states:
            return state
        assert time.monotonic() < deadline, f"job {job_id} still {state}"
        time.sleep(0.5)


def wait_ended(cwd: Path, job_id: str, limit: float = 240) -> str:
    """Wait for the job to end; its pmc jobs status line (Slurm's state, pmc's words)."""
    wait_state(cwd, job_id, ENDED, limit)
    proc = pmc(cwd, "jobs", "status", "--scheduler", "slurm", job_id)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def node(action: str, name: str) -> None:
    """ci/cluster-node.sh ACTION NODE: kill, freeze, thaw or revive a whole node."""
    subprocess.run(["bash", str(REPO / "ci" / "cluster-node.sh"), action, name], check=True,
                   timeout=120)


def task_hosts(out: str) -> dict[str, list[str]]:
    """Task name -> the hostnames of its records (pmc's [cluster-task ...] lines)."""
    hosts: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.startswith("[cluster-task "):
            fields = dict(part.split("=", 1) for part in line[14:-1].split(", "))
            hosts.setdefault(fields["name"], []).append(fields["hostname"].strip('"'))
    return hosts


def node_resources() -> dict[str, tuple[int, int]]:
    """Node -> (cpus, memory MiB) that ci/cluster-up.sh gave it: the cpus its processes
    may run on (those of the process holding its namespaces) and its memory cgroup's
    limit."""
    found = {}
    for name in NODES:
        holder = int(Path(f"/run/pmc-cluster/{name}.holder").read_text())
        memcg = Path(f"/run/pmc-cluster/{name}.memcg").read_text().strip()
        limit = int(Path(memcg, "memory.limit_in_bytes").read_text())
        found[name] = (len(os.sched_getaffinity(holder)), limit // (1024 * 1024))
    return found
