"""The metrics of a run across the nodes of the multi-node test cluster (ci/cluster-up.sh):
the master, on the first node of the allocation, serves them on the cluster's network
(``metrics.bind: 0.0.0.0``); ``pmc status`` on the head names the endpoint, and a scrape
from the head over HTTP has a series for each node, with that node's cpus and memory
and the task seconds it ran."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from clusterkit import NODES, node_resources, on_head, pmc, submit, wait_ended
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("test_cluster")]

SCRAPE = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10)" \
    ".read().decode())"


def per_host(text: str) -> dict[str, dict[str, float]]:
    """Series name -> host -> value, for the series labelled with a host."""
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "host" in s.labels:
                found.setdefault(s.name, {})[s.labels["host"]] = s.value
    return found


def test_metrics_scraped_from_the_head_name_each_node(tmp_path: Path) -> None:
    (tmp_path / "m.dag").write_text("".join(
        f"TASK t{i:02d} /bin/sh -c 'sleep 2'\n" for i in range(20)))
    job = submit(tmp_path, "m.dag", "--set", "metrics.port=0", "--set", "metrics.bind=0.0.0.0")
    want = NODES
    deadline = time.monotonic() + 120
    series: dict[str, dict[str, float]] = {}
    url = ""
    while True:
        assert time.monotonic() < deadline, (url, series)
        time.sleep(0.5)
        if not url:
            m = re.search(r"^metrics: (http://\S+)", pmc(tmp_path, "status", "m.dag").stdout,
                          re.M)
            url = m.group(1) if m else ""
            continue
        # Real HTTP from the head host to the master's node, over the cluster's network.
        scrape = on_head(tmp_path, sys.executable, "-c", SCRAPE, url)
        if scrape.returncode != 0:  # the run has ended: its endpoint with it
            break
        series = per_host(scrape.stdout)
        if sorted(h for h, v in series.get("pmc_host_task_seconds_total", {}).items()
                  if v > 0) == want:
            break
    assert re.match(r"http://node1:\d+/metrics$", url), url
    own = node_resources()
    assert series["pmc_host_cpus"] == {n: float(c) for n, (c, _m) in own.items()}, series
    assert series["pmc_host_memory_bytes"] == {
        n: float(m << 20) for n, (_c, m) in own.items()}, series
    assert sorted(series["pmc_host_task_seconds_total"]) == want, series
    assert wait_ended(tmp_path, job).startswith(f"{job} COMPLETED")
