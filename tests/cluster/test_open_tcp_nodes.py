"""An open run's TCP channel across hosts of the multi-node test cluster
(ci/cluster-up.sh): the run, submitted with ``pmc.open_tcp: "*"``, listens on its node
(node1, the master's); a client on the head host, another network namespace, reads
``DAG.tcp`` and the token from the shared file system, connects over the cluster's
network, adds tasks that run on the nodes, waits for them and closes the run.

(Unix sockets are reached through the file system, which the cluster's hosts share as
one machine's: the client asks for TCP by name, ``channel="tcp"``, as a client on a
real other host would take it when the socket cannot be reached.)"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from clusterkit import NODES, on_head, submit, wait_ended

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("test_cluster")]

CLIENT = """\
import json, sys
from pmc.client import Client
with Client.connect(sys.argv[1], channel="tcp") as run:
    peer = run._sock.getpeername()
    tasks = [run.submit(["/bin/sh", "-c", f"hostname > out{i}.txt; sleep 1"])
             for i in range(6)]
    states = run.wait(tasks, timeout=180)
    run.close_run()
print(json.dumps({"peer": list(peer), "ok": [s.ok for s in states]}))
"""


def test_a_client_on_the_head_adds_tasks_over_tcp_to_a_run_on_a_node(tmp_path: Path) -> None:
    (tmp_path / "open.dag").write_text("TASK first /bin/sh -c 'hostname > first.txt'\n")
    (tmp_path / "client.py").write_text(CLIENT)
    job = submit(tmp_path, "open.dag", "--set", "pmc.open_tcp=*")
    token = tmp_path / "open.dag.token"
    deadline = time.monotonic() + 180
    while not token.exists():
        assert time.monotonic() < deadline, "the run never opened its channel"
        time.sleep(0.5)
    secret = token.read_text().strip()
    address = json.loads((tmp_path / "open.dag.tcp").read_text())
    assert address["hosts"][0] == "node1", address  # the master's node, by its name
    client = on_head(tmp_path, sys.executable, "client.py", "open.dag", timeout=300)
    assert client.returncode == 0, client.stderr
    said = json.loads(client.stdout)
    assert said["ok"] == [True] * 6
    assert said["peer"] == ["10.77.0.11", address["port"]]  # node1, over the network
    assert wait_ended(tmp_path, job).startswith(f"{job} COMPLETED")
    hosts = {(tmp_path / f"out{i}.txt").read_text().strip() for i in range(6)}
    assert hosts <= set(NODES), hosts
    log = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert re.search(r"Open run: listening on TCP at node1:\d+, 10\.77\.0\.11:\d+", log), log
    assert "refused" not in log and secret not in log
    for leftover in (".tcp", ".token", ".sock"):
        assert not (tmp_path / f"open.dag{leftover}").exists(), leftover
