"""The worker's processes as the reference's: where host scripts write, which session
everything lives in, what environment tasks inherit from an MPI launch, and host ranks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fakes import InstantWorkers
from pmctest import clean_env, comm, pmc, pmc_mpi, write_dag

from pmc.core.events import Observer
from pmc.dag import parse_dag
from pmc.options import RunOptions
from pmc.runtime.master import Master


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, pgid, sid) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[2]), int(fields[3])


def _tree(root: int) -> dict[int, tuple[int, int, int]]:
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            procs[int(name)] = st
    out, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, st in procs.items():
            if st[0] == parent and pid not in out:
                out[pid] = st
                todo.append(pid)
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_host_script_output_goes_to_stderr(tmp_path: Path) -> None:
    script = tmp_path / "host.sh"
    script.write_text("#!/bin/sh\necho host-script-says-hello\necho host-script-err >&2\n")
    script.chmod(0o755)
    dag = write_dag(tmp_path / "w.dag", "TASK A /bin/echo task-out\n")
    r = pmc(["run", "-v", "--host-script", str(script), dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    # As the reference: the script's stdout is its stderr; the run's stdout carries the
    # tasks' output and records only.
    assert "host-script-says-hello" not in r.stdout
    assert "host-script-says-hello\n" in r.stderr and "host-script-err\n" in r.stderr
    assert "task-out\n[cluster-task name=A," in r.stdout
    assert f"[debug] Worker 1: Launching host script {script}\n" in r.stderr


def test_everything_stays_in_the_jobs_session(tmp_path: Path) -> None:
    """PBS/Torque account for, and clean up, a job by its session: the workers, the host
    script's processes, the guards and the tasks must all be in it. Each still has a
    process group of its own (a terminal's Ctrl-C reaches the master only, and a task's
    group is what the worker kills)."""
    script = tmp_path / "host.sh"
    tag = f"pmc-service-{os.getpid()}-{tmp_path.name}"
    # A service the script leaves running (reparented once the script exits).
    script.write_text(f"#!/bin/sh\n/bin/sh -c 'sleep 300' {tag} &\n")
    script.chmod(0o755)
    dag = write_dag(tmp_path / "w.dag", "TASK A /bin/sh -c 'while [ ! -e release ]; do "
                    "sleep 0.05; done'\nTASK B /bin/sh -c 'while [ ! -e release ]; do "
                    "sleep 0.05; done'\n")
    with open(tmp_path / "run.out", "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pmc", "run", "--workers", "2", "--host-script",
             str(script), dag.name], cwd=tmp_path, env=clean_env(), stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)  # as a batch job's shell
    try:
        deadline = time.monotonic() + 60
        while True:
            tree = _tree(proc.pid)
            tasks = [p for p in tree if "while [ ! -e release ]" in _cmdline(p)
                     and _stat(p) is not None and _stat(p)[1] == p]  # type: ignore[index]
            # A worker starts its guard just after its first task: both, or wait.
            guards = [p for p in tree if "pmc/runtime/guard.py" in _cmdline(p)]
            if len(tasks) == len(guards) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(tasks) == 2, (tmp_path / "run.out").read_text()
        workers = [p for p in tree if tree[p][0] == proc.pid and comm(p).startswith("pmc-worker-")]
        service = [int(p) for p in os.listdir("/proc") if p.isdigit()
                   and tag in _cmdline(int(p))]
        assert len(workers) == 2 and len(guards) == 2 and len(service) == 1, tree
        for pid in (*workers, *guards, *service, *tasks):
            st = tree.get(pid) or _stat(pid)
            assert st is not None
            assert st[2] == proc.pid, f"{_cmdline(pid)!r} left the job's session"
            assert st[1] != proc.pid, f"{_cmdline(pid)!r} is in the master's process group"
    finally:
        (tmp_path / "release").touch()
        code = proc.wait(60)
    assert code == 0, (tmp_path / "run.out").read_text()
    assert all(_stat(p) is None for p in service), "the host script's group is killed"


def test_sigterm_to_the_whole_session_stops_the_run_cleanly(tmp_path: Path) -> None:
    """What PBS/Torque do at the time limit: SIGTERM to every process of the job's
    session at once. The run stops as for a SIGTERM to the master alone."""
    dag = write_dag(tmp_path / "w.dag", "TASK A /bin/sh -c 'echo A >> ran; sleep 300'\n"
                    "TASK B /bin/sh -c 'echo B >> ran; sleep 300'\nTASK C /bin/true\n"
                    "EDGE A C\n")
    with open(tmp_path / "run.err", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pmc", "run", "--workers", "2", "-o", "tasks.out",
             dag.name], cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL,
            stderr=err, start_new_session=True)
    deadline = time.monotonic() + 60
    while not ((tmp_path / "ran").exists() and len((tmp_path / "ran").read_text()) == 4):
        assert time.monotonic() < deadline, "the tasks did not start"
        time.sleep(0.05)
    time.sleep(0.2)
    tree = _tree(proc.pid)
    session = [proc.pid, *(p for p, st in tree.items() if st[2] == proc.pid)]
    assert len(session) >= 7  # master, 2 workers, 2 guards, 2 tasks (and their sleeps)
    for pid in session:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    code = proc.wait(60)
    err = (tmp_path / "run.err").read_text()
    assert code == 3, err
    assert "[fatal] Caught signal 15\n" in err
    assert "failed with exitcode" not in err, "tasks killed by the stop are not failures"
    deadline = time.monotonic() + 10
    while [p for p in tree if _stat(p) is not None] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in tree if _stat(p) is not None], "processes survived the stop"
    assert (tmp_path / "w.dag.rescue").read_text().split() == []
    merged = (tmp_path / "tasks.out").read_text()
    assert "name=A," in merged and "name=B," in merged and "status=15," in merged


def test_nested_pmc_in_a_task_of_an_mpi_run(tmp_path: Path) -> None:
    """A task of an MPI-mode run starts an embedded pmc: it must not take the outer
    launch's PMI variables for its own."""
    inner = write_dag(tmp_path / "inner.dag", "TASK X /bin/sh -c 'echo inner > x.txt'\n"
                      "TASK Y /bin/sh -c 'cat x.txt > y.txt'\nEDGE X Y\n")
    outer = write_dag(
        tmp_path / "outer.dag",
        f"TASK nested {sys.executable} -m pmc run --workers 2 -o inner.out {inner.name}\n"
        "TASK env /bin/sh -c 'env > env.txt'\n")
    r = pmc_mpi(3, ["run", outer.name], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "y.txt").read_text() == "inner\n"
    assert "[cluster-summary stat=\"ok\", tasks=2," in r.stdout
    assert "[cluster-task name=Y," in (tmp_path / "inner.out").read_text()
    env = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text().splitlines()
               if "=" in line)
    launch = [k for k in env if k.startswith(("PMI_", "PMIX_", "HYDI_"))
              or k in ("MPI_LOCALRANKID", "MPI_LOCALNRANKS")]
    assert launch == [], "the launch's variables are kept from tasks"
    assert env["PMC_RANK"] in ("1", "2") and env["PMC_TASK"] == "env"


def test_host_ranks_follow_rank_order_not_registration_order(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK A /bin/true\n")
    transport = InstantWorkers([(4, "h1"), (2, "h2"), (3, "h1"), (1, "h1"), (5, "h2")])
    master = Master(transport, RunOptions(dag=str(dag), nolock=True), parse_dag(str(dag)),
                    set(), Observer(), "local")
    try:
        master.gather_workers()
    finally:
        master.close()
    ranks = {w.rank: w.host_rank for w in master.resources.workers.values()}
    # As the reference: on each host the lowest rank is host rank 0, the next 1, ...
    assert ranks == {1: 0, 3: 1, 4: 2, 2: 0, 5: 1}
    assert [w.rank for w in master.resources.hosts["h1"].workers] == [1, 3, 4]


def test_host_rank_in_the_tasks_environment(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "".join(
        f"TASK t{i} /bin/sh -c 'sleep 0.2; echo $PMC_RANK $PMC_HOST_RANK'\n" for i in range(8)))
    r = pmc(["run", "--workers", "4", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    pairs = {tuple(map(int, line.split())) for line in r.stdout.splitlines()
             if line and not line.startswith("[")}
    assert pairs and all(host_rank == rank - 1 for rank, host_rank in pairs), pairs
