"""Runs across the hosts of the multi-node test cluster (ci/cluster-up.sh), through the
batch script ``pmc submit`` writes: pmc's ranks started by ``srun --mpi=pmi2`` or by
Hydra's ``mpiexec`` (its Slurm bootstrap), ranks on every node, workers on other hosts
than the master's talking MPI over the cluster's network. Each record names the host
that ran the task, and so does ``pmc status``; the host script runs once on each host.
Each node's workers find the node's cpus and its own memory (its memory cgroup's limit,
different on each node), which the resource log, ``pmc status`` and Slurm's view of the
node show alike."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from clusterkit import NODES, REPO, node_resources, on_head, pmc, submit, task_hosts, wait_ended
from pmctest import rescue_done

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("test_cluster")]

TASKS = [f"t{i:02d}" for i in range(15)]


def spread_dag(cwd: Path) -> str:
    # Each task takes long enough that every worker gets some; each writes where it ran.
    lines = [f"TASK {n} /bin/sh -c 'sleep 1; echo {n} $(hostname) >> ran.txt'" for n in TASKS]
    (cwd / "spread.dag").write_text("\n".join(lines) + "\n")
    (cwd / "hostscript.sh").write_text("#!/bin/sh\nhostname >> hostscript.txt\n")
    (cwd / "hostscript.sh").chmod(0o755)
    return "spread.dag"


@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_tasks_run_on_every_node(tmp_path: Path, launcher: str) -> None:
    dag = spread_dag(tmp_path)
    job = submit(tmp_path, dag, "--set", f"launcher={launcher}",
                 "--set", f"pmc.host_script={tmp_path / 'hostscript.sh'}",
                 "--set", "logging.format=json", "--set", "logging.file=events.jsonl")
    status = wait_ended(tmp_path, job)
    assert status.startswith(f"{job} COMPLETED"), status
    assert rescue_done(tmp_path / "spread.dag.rescue") == TASKS
    out = (tmp_path / f"slurm-{job}.out").read_text()
    hosts = task_hosts(out)
    assert sorted(hosts) == TASKS and all(len(h) == 1 for h in hosts.values()), hosts
    # The records name the host each task ran on, and tasks ran on every node.
    ran = dict(line.split() for line in (tmp_path / "ran.txt").read_text().splitlines())
    assert {name: h[0] for name, h in hosts.items()} == ran
    assert sorted(set(ran.values())) == NODES
    # So do the events (task.finished).
    events = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert {e["task"]: e["host"] for e in events if e["event"] == "task.finished"} == ran
    assert sorted((tmp_path / "hostscript.txt").read_text().split()) == NODES
    # Each node's cpus and memory as its workers found them (a host's first line in
    # DAG.resource, all of it free): its own memory, not the machine's three times.
    own = node_resources()
    assert len(set(own.values())) == len(NODES), own
    first: dict[str, tuple[int, int]] = {}
    for line in (tmp_path / "spread.dag.resource").read_text().splitlines():
        _, _, cpus, memory, host = line.split(",")
        first.setdefault(host, (int(cpus), int(memory)))
    assert first == own, (first, own)
    # pmc status names each node with its cpus, its memory and the tasks it ran.
    proc = pmc(tmp_path, "status", dag)
    assert proc.returncode == 0, proc.stderr
    ran_on = list(ran.values())
    for name, (cpus, memory) in own.items():
        assert re.search(rf"^host {name}: {cpus} cpus, {memory} MB memory, "
                         rf"ran {ran_on.count(name)} tasks \(", proc.stdout, re.M), proc.stdout
    # Slurm's view of each node has the same memory (its CPUs are slots: test-cluster.md).
    sinfo = on_head(tmp_path, "sinfo", "-h", "-N", "-o", "%N %m")
    assert sinfo.returncode == 0, sinfo.stderr
    assert {n: int(m) for n, m in (ln.split() for ln in sinfo.stdout.splitlines())} \
        == {n: m for n, (_c, m) in own.items()}, sinfo.stdout


def test_cluster_scale_benchmark_runs(tmp_path: Path) -> None:
    """benchmarks/cluster_scale.py at a tiny size: every configuration completes."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cluster_scale.py"),
                           "--tasks", "20"], capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("SUMMARY 1 node: best "), proc.stdout
    runs = [ln for ln in lines if ln.startswith("round ")]
    assert len(runs) == 4 and all("COMPLETED | 20 tasks in" in ln for ln in runs), runs
