"""A continuation chain (``pmc submit --until-done``) over two allocations of the
multi-node test cluster (ci/cluster-up.sh), the second on other nodes than the first:
once the first link runs, its node is drained (as an operator takes a node out of
service), so the link it queued behind itself starts elsewhere and resumes from the
rescue log on the shared file system. Every task runs once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from clusterkit import ENDED, PROFILE, job_fields, on_head, submit, wait_state
from pmctest import rescue_done

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.usefixtures("test_cluster")]


def chain_links(cwd: Path) -> list[dict[str, str]]:
    path = cwd / "long.dag.chain"
    if not path.exists():
        return []
    events = [dict(w.split("=", 1) for w in ln.split()[1:])
              for ln in path.read_text().splitlines()]
    return [e for e in events if e["event"] == "ended"]


@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_until_done_chain_moves_to_other_nodes(tmp_path: Path, launcher: str) -> None:
    # 12 tasks of 6 s on 2 workers: 36 s of work; a link stops after 20 s.
    names = [f"t{i:02d}" for i in range(12)]
    (tmp_path / "long.dag").write_text("".join(
        f"TASK {n} --expected-runtime 6 /bin/sh -c 'sleep 6; echo {n} $(hostname) >> ran.txt'\n"
        for n in names))
    profile = yaml.safe_load(PROFILE.read_text())
    profile.update(walltime=1, walltime_margin="00:00:40", nodes=1, ranks_per_node=3,
                   launcher=launcher)
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(profile))
    first = submit(tmp_path, "long.dag", "--until-done", "--max-jobs", "4",
                   site=tmp_path / "site.yaml")
    deadline = time.monotonic() + 120
    while job_fields(tmp_path, first)["JobState"] != "RUNNING":
        assert time.monotonic() < deadline, job_fields(tmp_path, first)
        time.sleep(0.5)
    node1 = job_fields(tmp_path, first)["NodeList"]
    drain = on_head(tmp_path, "scontrol", "update", f"nodename={node1}", "state=drain",
                    "reason=pmc-chain-test")
    assert drain.returncode == 0, drain.stderr
    try:
        deadline = time.monotonic() + 300
        while not (links := chain_links(tmp_path)) or links[-1]["outcome"] == "continued":
            assert time.monotonic() < deadline, links
            time.sleep(1)
    finally:
        on_head(tmp_path, "scontrol", "update", f"nodename={node1}", "state=resume")
    assert len(links) >= 2, links
    assert [e["outcome"] for e in links] == ["continued"] * (len(links) - 1) + ["succeeded"]
    jobs = [e["job"] for e in links]
    assert jobs[0] == first
    for job in jobs:
        assert wait_state(tmp_path, job, ENDED) == "COMPLETED", job
    nodes = [job_fields(tmp_path, job)["NodeList"] for job in jobs]
    assert all(n != node1 for n in nodes[1:]), nodes
    assert rescue_done(tmp_path / "long.dag.rescue") == names
    ran = [ln.split() for ln in (tmp_path / "ran.txt").read_text().splitlines()]
    assert sorted(n for n, _ in ran) == names, "a finished task ran again"
    assert {h for _, h in ran} == {node1, *nodes[1:]}, "tasks ran in both allocations"
    print(f"\n[chain] links {jobs} on nodes {nodes}")
