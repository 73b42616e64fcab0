"""A multi-rank task (``--ranks 4 --ranks-per-host 2``, a pmc extension) spanning the
nodes of the multi-node test cluster (ci/cluster-up.sh), started by the default task
launcher inside the allocation (a nested ``srun --overlap`` on the hosts pmc placed it
on), in a job ``pmc submit`` made. Each of the task's ranks writes its rank, the size
of its MPI world and the host it ran on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from clusterkit import submit, task_hosts, wait_ended
from pmctest import rescue_done

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("test_cluster")]

PROGRAM = """\
import socket, sys
from mpi4py import MPI
c = MPI.COMM_WORLD
peers = c.allgather(socket.gethostname())  # talks to every rank, across hosts
with open(f"{sys.argv[1]}.{c.Get_rank()}", "w") as f:
    f.write(f"{c.Get_rank()} {c.Get_size()} {socket.gethostname()} {len(peers)}\\n")
"""


@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_four_rank_task_spans_two_nodes(tmp_path: Path, launcher: str) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "m.dag").write_text(
        f"TASK wide --ranks 4 --ranks-per-host 2 {sys.executable} prog.py out\n")
    job = submit(tmp_path, "m.dag", "--set", f"launcher={launcher}")
    status = wait_ended(tmp_path, job)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert status.startswith(f"{job} COMPLETED"), status + "\n" + out
    assert rescue_done(tmp_path / "m.dag.rescue") == ["wide"]
    got = sorted(p.read_text().split() for p in tmp_path.glob("out.*"))
    assert [(int(r), int(s), int(n)) for r, s, _h, n in got] == [(r, 4, 4) for r in range(4)]
    hosts = [h for _r, _s, h, _n in got]
    # Two ranks on each of two hosts.
    assert len(set(hosts)) == 2 and all(hosts.count(h) == 2 for h in hosts), hosts
    # The record names the task's hosts.
    assert task_hosts(out)["wide"][0].split(",")[0] in hosts, out
