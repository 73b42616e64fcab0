"""pmc under a real Open MPI launcher (Debian's ``mpiexec.openmpi``, Open MPI 4.1), with
an mpi4py built against that Open MPI in a venv of its own (tests/openmpi.py): the ranks
form one world, and the launch line pmc writes for an Open MPI site
(``--enable-recovery``, ``--map-by ppr:N:node``) outlives a worker rank killed mid-run, and
a job whose worker rank is frozen is ended by pmc once its workflow is over.
The generated PBS script under the same launcher: tests/adapters/test_openmpi_site.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import openmpi
import pytest
from pmctest import DIAMOND, comm, rescue_done, write_dag

pytestmark = [pytest.mark.mpi, pytest.mark.slow, openmpi.may_build]

# A file per rank: the launcher's forwarding of the ranks' stdout may interleave lines.
PROBE = """
from mpi4py import MPI
c = MPI.COMM_WORLD
with open(f"probe.{c.Get_rank()}", "w") as out:
    out.write(f"rank {c.Get_rank()} of {c.Get_size()}: {MPI.Get_library_version()}")
"""


def launch(n: int, *args: str) -> list[str]:
    assert openmpi.MPIEXEC
    return [openmpi.MPIEXEC, "-n", str(n), "--bind-to", "none", *args]


def test_three_ranks_form_one_world_and_run_the_dag_with_two_workers(tmp_path: Path) -> None:
    python = str(openmpi.openmpi_python())
    probe = subprocess.run(launch(3, python, "-c", PROBE), cwd=tmp_path, env=openmpi.env(),
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    said = [(tmp_path / f"probe.{r}").read_text() for r in range(3)]
    assert [text.partition(": ")[0] for text in said] == [f"rank {r} of 3" for r in range(3)]
    assert all(text.partition(": ")[2].startswith("Open MPI v") for text in said), said
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = subprocess.run(launch(3, python, "-m", "pmc", "run", dag.name), cwd=tmp_path,
                       env=openmpi.env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Master starting with 2 workers" in r.stderr
    assert 'stat="ok", tasks=4, submitted=4, succeeded=4, failed=0' in r.stdout
    assert rescue_done(tmp_path / "d.dag.rescue") == ["A", "B", "C", "D"]


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def below(pid: int) -> list[int]:
    todo, out = [pid], []
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def lose_a_worker(tmp_path: Path, tasks: int, freeze: bool,
                  *options: str) -> tuple[int, str, str, float]:
    """Run ``tasks`` tasks with pmc's launch line for an Open MPI site; once two are
    recorded, kill a worker rank (SIGKILL) or freeze it (SIGSTOP to the rank, its keeper
    and its tasks: every process of it, as on a node that hangs). Returns the launcher's
    exit status, stdout, stderr and the seconds from the fault to the launcher's end."""
    python = str(openmpi.openmpi_python())
    write_dag(tmp_path / "w.dag", "".join(f"TASK t{i} /bin/sleep 0.5\n" for i in range(tasks)))
    argv = [openmpi.MPIEXEC or "", "--enable-recovery", "-n", "3", "--map-by", "ppr:3:node",
            "--bind-to", "none", python, "-m", "pmc", "run", *options, "w.dag"]
    with subprocess.Popen(argv, cwd=tmp_path, env=openmpi.env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            deadline = time.monotonic() + 60
            worker = keeper = None
            while worker is None and time.monotonic() < deadline:
                done = len(rescue_done(tmp_path / "w.dag.rescue", missing_ok=True))
                keepers = [p for p in below(proc.pid) if comm(p) == "pmc-keeper"]
                if done >= 2 and keepers and children(keepers[0]):
                    keeper, worker = keepers[0], children(keepers[0])[0]
                time.sleep(0.05)
            assert worker is not None and keeper is not None, \
                "no worker rank running tasks within 60 s"
            if freeze:
                for pid in [keeper, worker, *below(worker)]:
                    os.kill(pid, signal.SIGSTOP)
            else:
                os.kill(worker, signal.SIGKILL)
            fault = time.monotonic()
            out, err = proc.communicate(timeout=120)
            ended = time.monotonic() - fault
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err, ended


def test_the_open_mpi_launch_line_outlives_a_lost_worker_rank(tmp_path: Path) -> None:
    tasks = 12
    code, out, err, _ = lose_a_worker(tmp_path, tasks, False)
    assert code == 0, err[-3000:]
    assert "was lost" in err
    assert len(rescue_done(tmp_path / "w.dag.rescue")) == tasks
    assert f"succeeded={tasks}, failed=0" in out


def test_a_frozen_worker_rank_is_lost_and_pmc_ends_the_open_mpi_job(tmp_path: Path) -> None:
    """A rank that never answers (stopped) holds Open MPI's mpiexec as it holds Hydra's:
    pmc declares it lost after --worker-timeout, finishes the workflow on the other
    worker, and then ends the job itself (MPI_Abort with the workflow's status, which
    Open MPI's launcher passes on), stopped processes and all."""
    tasks = 12
    code, out, err, ended = lose_a_worker(tmp_path, tasks, True, "--worker-timeout", "5")
    assert code == 0, err[-3000:]
    assert re.search(r"Worker \d was lost \(silent for 5 s\)", err), err[-3000:]
    assert "ending the job (MPI_Abort with the workflow's exit status 0)" in err
    assert len(rescue_done(tmp_path / "w.dag.rescue")) == tasks
    assert f"succeeded={tasks}, failed=0" in out
    print(f"\n[openmpi] frozen worker rank: the job ended {ended:.1f} s after the freeze")
