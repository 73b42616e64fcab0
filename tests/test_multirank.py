"""Multi-rank tasks (``--ranks``, ``--ranks-per-host``: pmc extensions), with real runs: a
2-rank mpi4py program started by the default launcher (mpiexec outside Slurm, srun
--overlap inside an allocation) embedded, inside an ``mpiexec`` MPI-mode run, and inside
a job of the real one-node Slurm. Each rank writes its rank and size to a file of its
own; the test reads them back. The Slurm case is tests/slurm/test_multirank_slurm.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from pmctest import clean_env, mpi_dag, pmc, pmc_mpi, ranks_written, write_dag

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.mpi

def test_two_rank_task_embedded(tmp_path: Path) -> None:
    dag = mpi_dag(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = pmc(["run", "--local", "--workers", "2", "--host-cpus", "2", dag.name], tmp_path,
            env=clean_env(TMPDIR=str(tmp)))
    assert r.returncode == 0, r.stderr
    got = ranks_written(tmp_path, "out")
    assert [(rank, size) for rank, size, _h, _s in got] == [(0, 2), (1, 2)]
    assert all(hosts != "-" for _r, _s, hosts, _st in got), "PMC_HOSTS names its host"
    assert (tmp_path / "after").exists(), "its child ran after it succeeded"
    assert "DONE mr" in (tmp_path / "m.dag.rescue").read_text()
    record = next(line for line in r.stdout.splitlines() if "name=mr," in line)
    assert record.endswith(", cpus=2, memory=0]"), "what the task held: both ranks' cpus"
    # The node file lived in the worker's temporary directory, and is gone with it.
    assert not list(tmp.glob("pmc-ranks-*"))


def test_two_rank_task_inside_an_mpiexec_run(tmp_path: Path) -> None:
    # The outer launch's PMI variables are scrubbed from the task's environment, so the
    # nested mpiexec starts a world of its own (size 2, not the run's 3).
    dag = mpi_dag(tmp_path)
    r = pmc_mpi(3, ["run", "--mpi", "--host-cpus", "2", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert [(rank, size) for rank, size, _h, _s in ranks_written(tmp_path, "out")] == \
        [(0, 2), (1, 2)]
    assert (tmp_path / "after").exists()


def test_ranks_per_host_takes_the_whole_host_and_waits_for_it(tmp_path: Path) -> None:
    py = sys.executable
    dag = mpi_dag(tmp_path, f"TASK four --ranks 4 --ranks-per-host 4 {py} prog.py four\n")
    r = pmc(["run", "--local", "--workers", "2", "--host-cpus", "4", "--log-format", "json",
             "--log-file", "ev.jsonl", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert [(rank, size) for rank, size, _h, _s in ranks_written(tmp_path, "four")] == \
        [(0, 4), (1, 4), (2, 4), (3, 4)]
    ends = {}
    for line in (tmp_path / "ev.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev["event"] == "task.finished":
            ends[ev["task"]] = ev
    assert ends["four"]["ranks"] == 4 and ends["mr"]["ranks"] == 2
    # Four cpus: "four" needs all of them, so it never ran beside "mr" (2 of them).
    mr, four = ends["mr"], ends["four"]
    assert four["start"] >= mr["start"] + mr["duration"] or \
        mr["start"] >= four["start"] + four["duration"]


def test_more_ranks_than_the_hosts_have_is_refused_at_start(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "big.dag", "TASK big --ranks 8 touch ran\n")
    r = pmc(["run", "--local", "--workers", "2", "--host-cpus", "4", dag.name], tmp_path)
    assert r.returncode == 1
    assert "FATAL ERROR: No host is capable of running task big" in r.stderr
    assert not (tmp_path / "ran").exists()


def test_a_bad_launcher_template_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    dag = mpi_dag(tmp_path)
    r = pmc(["run", "--local", "--workers", "1", "--task-launcher", "mpiexec -n {rank}",
             dag.name], tmp_path)
    assert r.returncode == 2, "a usage error, like any bad option value"
    assert r.stderr.splitlines()[-1] == (
        "pmc run: error: argument --task-launcher: task launcher template "
        "'mpiexec -n {rank}': unknown placeholder {rank} (known: {ranks} {nhosts} {hosts} "
        "{ranks_per_host} {cpus_per_rank} {nodefile})")
    assert not list(tmp_path.glob("out.*"))


MEMORY_PROGRAM = """\
import sys
from mpi4py import MPI
block = bytearray(60 * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1
MPI.COMM_WORLD.Barrier()
open(f"{sys.argv[1]}.{MPI.COMM_WORLD.Get_rank()}", "w").write("ok")
"""


def test_strict_limits_give_each_rank_its_memory(tmp_path: Path) -> None:
    # -m is per rank: two ranks of ~90 MB each fit a 2-rank task of -m 120, whose
    # cgroup holds both (240 MB), though together they pass 120 MB.
    (tmp_path / "mem.py").write_text(MEMORY_PROGRAM)
    dag = write_dag(tmp_path / "m.dag", f"TASK mr --ranks 2 -m 120 {sys.executable} mem.py out\n")
    r = pmc(["run", "--local", "--workers", "2", "--strict-limits", "--limit-memory-by",
             "cgroup", "--log-format", "json",
             "--log-file", "ev.jsonl", dag.name], tmp_path)
    events = [json.loads(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["event"] == "workflow.started")
    if started.get("memory_limits") != "cgroup":
        pytest.skip("no cgroup for task memory limits here")
    assert r.returncode == 0, r.stderr
    end = next(e for e in events if e["event"] == "task.finished")
    assert end["max_rss_kb"] > 120 * 1024, "the ranks together passed one rank's -m"
    assert sorted(p.name for p in tmp_path.glob("out.*")) == ["out.0", "out.1"]
