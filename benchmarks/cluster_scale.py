"""Throughput across hosts on the multi-node test cluster (ci/cluster-up.sh).

The same DAG (N independent tasks) and the same total ranks (one master and R-1 workers)
with the ranks on 1, 2 and 3 nodes, submitted as users do (``pmc submit --site
configs/site-test-cluster.yaml``, pmc's ranks started by ``srun --mpi=pmi2``), one
configuration after the other by turns. On one node the workers talk to the master over
a Unix socket (host sockets); on one node with ``--no-host-sockets`` every message goes
through MPI as it must between hosts; on 2 and 3 nodes the workers on the other nodes
talk MPI over the cluster's network (TCP over veth pairs and a bridge). The figure is
the run's own wall time (``wall`` of its status snapshot, from the master's start to
its end) and the tasks per second it makes; the records give the tasks each host ran.

All the "hosts" share this machine's cores: the figures say what crossing a host
boundary costs pmc's messages, not what more hardware would add.

    bash ci/cluster-up.sh && python benchmarks/cluster_scale.py --tasks 2000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import machine

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "configs" / "site-test-cluster.yaml"


def on_head(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", str(REPO / "ci" / "cluster-run.sh"), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def job_state(cwd: Path, job: str) -> str:
    show = on_head(cwd, "scontrol", "show", "job", job).stdout
    return dict(w.split("=", 1) for w in show.split() if "=" in w).get("JobState", "?")


def one(base: Path, nodes: int, ranks: int, tasks: int, sockets: bool, label: str,
        limit: float = 300) -> dict[str, object]:
    cwd = Path(tempfile.mkdtemp(prefix=f"cluster-{label}-", dir=base))
    (cwd / "w.dag").write_text("".join(f"TASK t{i} /bin/true\n" for i in range(tasks)))
    args = ["--nodes", str(nodes), "--ranks-per-node", str(ranks // nodes),
            "--walltime", "00:20:00", "--set", "pmc.jobstate_log=false"]
    if not sockets:
        args += ["--set", "pmc.no_host_sockets=true"]
    sub = on_head(cwd, sys.executable, "-m", "pmc", "submit", "--site", str(PROFILE),
                  *args, "w.dag")
    if sub.returncode != 0:
        raise SystemExit(f"pmc submit failed: {sub.stderr}")
    job = sub.stdout.strip()
    deadline = time.monotonic() + limit
    while (state := job_state(cwd, job)) in ("PENDING", "RUNNING", "CONFIGURING",
                                              "COMPLETING"):
        if time.monotonic() > deadline:
            on_head(cwd, "scancel", job)  # reported as it ended, without figures
        time.sleep(0.5)
    try:
        snap = json.loads((cwd / "w.dag.status.json").read_text())
    except FileNotFoundError:  # pmc's master never started (its ranks' wire-up hung)
        snap = {"succeeded": 0, "wall": float("nan")}
    hosts: Counter[str] = Counter()
    for line in (cwd / f"slurm-{job}.out").read_text().splitlines():
        if line.startswith("[cluster-task "):
            hosts[line.split('hostname="', 1)[1].split('"', 1)[0]] += 1
    return {"label": label, "nodes": nodes, "job": job, "state": state,
            "succeeded": snap["succeeded"], "wall": snap["wall"],
            "rate": snap["succeeded"] / snap["wall"] if snap["succeeded"] else 0.0,
            "hosts": dict(sorted(hosts.items()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--ranks", type=int, default=6, help="total ranks (default 6)")
    ap.add_argument("--rounds", type=int, default=1)
    ns = ap.parse_args()
    configs = [(1, True, "1 node"), (1, False, "1 node, --no-host-sockets"),
               (2, True, "2 nodes"), (3, True, "3 nodes")]
    print(f"machine: {machine()}; load {os.getloadavg()[0]:.1f} at the start")
    print(f"{ns.tasks} tasks of /bin/true, {ns.ranks} ranks ({ns.ranks - 1} workers)")
    rates: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="pmc-cluster-scale-") as tmp:
        for rnd in range(ns.rounds):
            for nodes, sockets, label in configs:
                r = one(Path(tmp), nodes, ns.ranks, ns.tasks, sockets,
                        label.replace(" ", "").replace(",", "-"))
                print(f"round {rnd + 1} | {label:28s} | job {r['job']} {r['state']} | "
                      f"{r['succeeded']} tasks in {r['wall']:.2f} s = {r['rate']:.0f} "
                      f"tasks/s | by host {r['hosts']}", flush=True)
                rates.setdefault(label, []).append(float(r["rate"]))  # type: ignore[arg-type]
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    print("SUMMARY " + "; ".join(f"{label}: best {max(v):.0f} tasks/s"
                                 for label, v in rates.items()))


if __name__ == "__main__":
    main()
