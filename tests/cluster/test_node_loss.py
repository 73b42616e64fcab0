"""Whole nodes lost mid-run on the multi-node test cluster (ci/cluster-up.sh), under
both launchers of pmc's batch script (``srun --mpi=pmi2`` and Hydra's ``mpiexec``):

- killed (``ci/cluster-node.sh kill``: every process of the node ends, its network goes
  silent): the workflow finishes on the other nodes, nothing recorded DONE runs again,
  and the job ends COMPLETED, its status the workflow's;
- frozen (``ci/cluster-node.sh freeze``: every process of the node stopped): its
  workers are declared lost after --worker-timeout, and once the workflow is over pmc
  ends the job itself, within a bounded time of its last record.

Each prints the times users see: the loss noticed, the last record to the job's end."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from clusterkit import job_fields, node, pmc, submit, task_hosts, wait_ended
from pmctest import rescue_done

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.usefixtures("test_cluster")]

TASKS = [f"t{i:02d}" for i in range(30)]
VICTIM = "node3"  # the master runs on node1, the first node of the allocation
TIMEOUT = 10  # --worker-timeout


def work_dag(cwd: Path) -> str:
    lines = [f"TASK {n} /bin/sh -c 'sleep 2; echo {n} $(hostname) >> ran.txt'" for n in TASKS]
    (cwd / "work.dag").write_text("\n".join(lines) + "\n")
    return "work.dag"


def ran(cwd: Path) -> list[tuple[str, str]]:
    try:
        return [(a, b) for a, b in (ln.split() for ln in (cwd / "ran.txt").read_text()
                                     .splitlines())]
    except FileNotFoundError:
        return []


def wait_running_on(cwd: Path, host: str, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while not any(h == host for _, h in ran(cwd)):
        assert time.monotonic() < deadline, f"no task ran on {host}: {ran(cwd)}"
        time.sleep(0.2)


def slurm_time(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def check_after_loss(cwd: Path, job: str, done_before: list[str], how: str,
                     launcher: str, t0: float) -> None:
    status = wait_ended(cwd, job, limit=300)
    out = (cwd / f"slurm-{job}.out").read_text()
    assert status.startswith(f"{job} COMPLETED"), status + "\n" + out
    assert "Workflow succeeded" in out, out
    assert "was lost" in out, out
    # pmc ended the job itself rather than wait for the lost node's ranks.
    assert "were given up on and may never end: ending the job" in out, out
    assert rescue_done(cwd / "work.dag.rescue") == TASKS
    names = [n for n, _ in ran(cwd)]
    assert sorted(set(names)) == TASKS
    again = [n for n in done_before if names.count(n) != 1]
    assert not again, f"tasks recorded DONE before the loss ran again: {again}"
    # Every record after the loss names a host still up.
    hosts = task_hosts(out)
    assert all(len(h) == 1 for h in hosts.values()), hosts
    assert pmc(cwd, "status", "work.dag").returncode == 0
    fields = job_fields(cwd, job)
    last_record = (cwd / "work.dag.rescue").stat().st_mtime
    end = slurm_time(fields["EndTime"])
    lost_at = next(ln for ln in out.splitlines() if "was lost" in ln)
    # Slurm's EndTime is to the second: the job's end may show before the last record.
    print(f"\n[node-loss] {how} {VICTIM}, {launcher}: job {job} {fields['JobState']} "
          f"exit {fields['ExitCode']}; the job ended {end - last_record:.1f} s after the "
          f"last record, {end - t0:.1f} s after the {how}; "
          f"{len(names) - len(TASKS)} task(s) ran again; {lost_at.strip()}")
    # Bounded: the job does not wait for the lost node's ranks (Slurm's times are to the
    # second).
    assert end - last_record < TIMEOUT + 60


@pytest.mark.parametrize("how", ["kill", "freeze"])
@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_node_lost_mid_run(tmp_path: Path, launcher: str, how: str) -> None:
    """VICTIM killed or frozen (ci/cluster-node.sh) once it has run a task."""
    dag = work_dag(tmp_path)
    job = submit(tmp_path, dag, "--set", f"launcher={launcher}",
                 "--set", f"pmc.worker_timeout={TIMEOUT}")
    try:
        wait_running_on(tmp_path, VICTIM)
        done_before = rescue_done(tmp_path / "work.dag.rescue", missing_ok=True)
        t0 = time.time()
        node(how, VICTIM)
        check_after_loss(tmp_path, job, done_before, how, launcher, t0)
    finally:
        if how == "freeze":
            node("thaw", VICTIM)
        node("revive", VICTIM)


WIDE = """\
import socket, sys, time
from mpi4py import MPI
c = MPI.COMM_WORLD
host = socket.gethostname()
with open(f"start.{c.Get_rank()}", "a") as f:
    f.write(f"{host}\\n")
time.sleep(float(sys.argv[1]))
peers = c.allgather(host)
with open(f"wide.{c.Get_rank()}", "w") as f:
    f.write(f"{c.Get_rank()} {c.Get_size()} {host}\\n")
"""


@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_node_killed_under_part_of_a_multirank_task(tmp_path: Path, launcher: str) -> None:
    """A node killed while it runs two of the four ranks of a task (``--ranks 4
    --ranks-per-host 2``): that try ends, the task runs again on the hosts left, every
    task is DONE once and the job ends COMPLETED."""
    (tmp_path / "wide.py").write_text(WIDE)
    others = [f"s{i:02d}" for i in range(6)]
    (tmp_path / "work.dag").write_text(
        f"TASK wide --ranks 4 --ranks-per-host 2 {sys.executable} wide.py 15\n"
        + "".join(f"TASK {n} /bin/sh -c 'sleep 2; echo {n} $(hostname) >> ran.txt'\n"
                  for n in others))
    job = submit(tmp_path, "work.dag", "--set", f"launcher={launcher}",
                 "--set", f"pmc.worker_timeout={TIMEOUT}", "--set", "pmc.tries=3")
    victim = ""
    try:
        deadline = time.monotonic() + 120
        while True:
            started = [p.read_text().split() for p in tmp_path.glob("start.*")]
            hosts = {h for lines in started for h in lines}
            if len(started) == 4:
                victim = sorted(hosts - {"node1"})[0]
                break
            assert time.monotonic() < deadline, started
            time.sleep(0.2)
        t0 = time.time()
        node("kill", victim)
        status = wait_ended(tmp_path, job, limit=300)
        out = (tmp_path / f"slurm-{job}.out").read_text()
        assert status.startswith(f"{job} COMPLETED"), status + "\n" + out
        assert rescue_done(tmp_path / "work.dag.rescue") == sorted(["wide", *others])
        wide = sorted(p.read_text().split() for p in tmp_path.glob("wide.[0-9]"))
        assert [(int(r), int(s)) for r, s, _h in wide] == [(r, 4) for r in range(4)]
        assert victim not in {h for _r, _s, h in wide}, "the task's last try ran on the " \
            "hosts left"
        assert sorted(ln.split()[0] for ln in (tmp_path / "ran.txt").read_text()
                      .splitlines()) == others
        end = slurm_time(job_fields(tmp_path, job)["EndTime"])
        print(f"\n[node-loss] kill {victim} under 2 of the 4 ranks of a task, {launcher}: "
              f"job {job} "
              f"COMPLETED {end - t0:.0f} s after the kill")
    finally:
        if victim:
            node("revive", victim)
