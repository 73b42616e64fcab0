"""End to end with real processes: embedded and under mpiexec, the same DAGs and checks."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from pmctest import DIAMOND, clean_env, mpiexec, pmc, pmc_mpi, write_dag

CLUSTER_TASK = re.compile(
    r'^\[cluster-task name=(\w+), start="[0-9T:.+-]+", duration=\d+\.\d{3}, status=(-?\d+), '
    r'app="([^"]*)", hostname="[^"]+", slot=(\d+), cpus=(\d+), memory=(\d+)\]$', re.M)
SUMMARY = re.compile(
    r'^\[cluster-summary stat="(ok|failed)", tasks=(\d+), submitted=(\d+), succeeded=(\d+), '
    r'failed=(\d+), extra=(\d+), start="[^"]+", duration=\d+\.\d{3}, pid=\d+, app="[^"]+", '
    r'runtime=\d+\.\d{3}, slots=(\d+), cpus=(\d+)\]$', re.M)


def rescue_records(path: Path) -> list[str]:
    data = path.read_text()
    assert data == "" or data.startswith("\n"), "records are newline-first"
    return [line for line in data.split("\n") if line]


def test_diamond(launch, diamond: Path) -> None:
    r = launch([diamond.name], diamond.parent)
    assert r.returncode == 0, r.stderr
    for name in "ABCD":
        assert f"I am {name}\n" in r.stdout
    records = CLUSTER_TASK.findall(r.stdout)
    assert sorted(rec[0] for rec in records) == ["A", "B", "C", "D"]
    assert all(rec[1] == "0" and rec[2] == "/bin/echo" for rec in records)
    m = SUMMARY.search(r.stdout)
    assert m is not None and m.groups()[:6] == ("ok", "4", "4", "4", "0", "0")
    done = rescue_records(diamond.parent / "diamond.dag.rescue")
    assert sorted(done) == ["DONE A", "DONE B", "DONE C", "DONE D"]
    assert done[0] == "DONE A" and done[-1] == "DONE D"
    assert "[info] Workflow succeeded\n" in r.stderr
    for line in ("Resource utilization (with master):", "Resource utilization (without master):",
                 "Total runtime of tasks:", "Wall time:", "Makespan:", "Throughput:"):
        assert f"[info] {line}" in r.stderr
    leftovers = [p.name for p in diamond.parent.iterdir()
                 if ".out." in p.name or ".err." in p.name]
    assert leftovers == [], "per-worker files are merged and removed"


def test_task_output_stays_grouped_per_worker(launch, tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "".join(
        f'TASK t{i} /bin/sh -c "echo start{i}; sleep 0.05; echo end{i}"\n' for i in range(8)))
    r = launch([dag.name, "-o", "out.txt"], tmp_path)
    assert r.returncode == 0, r.stderr
    out = (tmp_path / "out.txt").read_text().splitlines()
    for i in range(8):
        start = out.index(f"start{i}")
        assert out[start + 1] == f"end{i}", "a task's lines are never split by another's"
        assert out[start + 2].startswith(f"[cluster-task name=t{i},")


def test_restart_reruns_only_what_is_not_done(launch, tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    dag = write_dag(tmp_path / "w.dag", f"""\
TASK A /bin/sh -c "echo A >> {log}"
TASK B /bin/sh -c "echo B >> {log}; test -e {tmp_path}/flag"
TASK C /bin/sh -c "echo C >> {log}"
TASK D /bin/sh -c "echo D >> {log}"
EDGE A B
EDGE A C
EDGE B D
EDGE C D
""")
    r = launch([dag.name], tmp_path)
    assert r.returncode == 1
    assert "[error] Task B failed with exitcode 256\n" in r.stderr
    assert sorted(rescue_records(tmp_path / "w.dag.rescue")) == ["DONE A", "DONE C"]
    assert sorted(log.read_text().split()) == ["A", "B", "C"]
    m = SUMMARY.search(r.stdout)
    assert m is not None and m.group(1) == "failed" and m.group(5) == "1"
    # A failed run merges its tasks' output and records as any run does (PMC does).
    assert not list(tmp_path.glob("w.dag.out.*"))
    assert [rec[0] for rec in CLUSTER_TASK.findall(r.stdout)].count("B") == 1

    (tmp_path / "flag").touch()
    log.unlink()
    r = launch([dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(log.read_text().split()) == ["B", "D"]
    assert sorted(rescue_records(tmp_path / "w.dag.rescue")) == [
        "DONE A", "DONE B", "DONE C", "DONE D"]
    assert "Recovered 2 finished task(s)" in r.stderr


def test_skip_rescue_runs_everything_again(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    assert pmc(["run", dag.name], tmp_path).returncode == 0
    r = pmc(["run", "-s", dag.name], tmp_path)
    assert r.returncode == 0
    assert len(CLUSTER_TASK.findall(r.stdout)) == 4


def test_custom_rescue_path(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = pmc(["run", "-r", "elsewhere.log", dag.name], tmp_path)
    assert r.returncode == 0
    assert len(rescue_records(tmp_path / "elsewhere.log")) == 4
    assert not (tmp_path / "d.dag.rescue").exists()


def test_locked_dag_is_refused_at_once(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    with open(dag, "r+") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)  # a POSIX lock, as PMC takes
        r = pmc(["run", dag.name], tmp_path)
        assert r.returncode == 1
        assert "DAG file is already locked by another process" in r.stderr
        assert not (tmp_path / "d.dag.rescue").exists()
        r = pmc(["run", "--nolock", dag.name], tmp_path)
        assert r.returncode == 0, r.stderr


def test_missing_and_non_executable_programs_are_task_failures(launch, tmp_path: Path) -> None:
    noexec = tmp_path / "script.sh"
    noexec.write_text("#!/bin/sh\necho hi\n")
    dag = write_dag(tmp_path / "w.dag",
                    f"TASK gone /no/such/program arg\nTASK noexec {noexec}\nTASK ok /bin/true\n")
    r = launch([dag.name], tmp_path)
    assert r.returncode == 1
    # As the reference: the message in the task's stderr (merged into the run's), a
    # record with wait status 256 (its child exits 1), the master's error line.
    assert ("Unable to exec command /no/such/program for task gone: No such file or "
            "directory\n") in r.stderr
    assert f"Unable to exec command {noexec} for task noexec: Permission denied\n" in r.stderr
    statuses = {m[0]: (m[1], m[2]) for m in CLUSTER_TASK.findall(r.stdout)}
    assert statuses == {"gone": ("256", "/no/such/program"), "noexec": ("256", str(noexec)),
                        "ok": ("0", "/bin/true")}
    assert "[error] Task gone failed with exitcode 256\n" in r.stderr
    assert rescue_records(tmp_path / "w.dag.rescue") == ["DONE ok"]
    assert "Traceback" not in r.stderr


def test_task_environment(launch, tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK envtask -m 7 -c 1 /usr/bin/env\n")
    r = launch([dag.name, "--host-memory", "100"], tmp_path)
    assert r.returncode == 0, r.stderr
    env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line
               and not line.startswith("["))
    assert env["PMC_TASK"] == "envtask"
    assert env["PMC_MEMORY"] == "7"
    assert env["PMC_CPUS"] == "1"
    assert int(env["PMC_RANK"]) >= 1
    assert env["PMC_HOST_RANK"].isdigit()
    assert "PMC_AFFINITY" not in env


def test_tasks_read_nothing_from_stdin(tmp_path: Path) -> None:
    # Each task's stdin is /dev/null, read-only, whatever pmc's own stdin holds; a task
    # with -f pipes (more file actions at its start) too.
    script = 'echo "$(readlink /proc/self/fd/0) [$(cat)]"; echo x 2>/dev/null >&0 || echo ro'
    dag = write_dag(tmp_path / "w.dag", "".join(
        f"TASK t{i} {opt}/bin/sh -c '{script}'\n"
        for i, opt in enumerate(["", "-f P=p.out ", ""])))
    r = pmc(["run", dag.name, "--local", "--workers", "1"], tmp_path, input="typed\n" * 999)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("/dev/null []\nro\n") == 3, r.stdout
    assert "typed" not in r.stdout


@pytest.mark.parametrize("pythonpath", [None, "/nonexistent/pmc-test-path"])
def test_tasks_get_the_users_environment_unchanged(tmp_path: Path,
                                                   pythonpath: str | None) -> None:
    # Workers are started with the master's import path on their command line: none of
    # it may leak into the tasks' environment (a Python task would import from it).
    dag = write_dag(tmp_path / "w.dag", "TASK A /usr/bin/env\n")
    env = clean_env(PMCTEST_MARK="a b")
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    r = pmc(["run", dag.name, "--local", "--workers", "1"], tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    seen = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line
                and not line.startswith("["))
    assert seen["PMCTEST_MARK"] == "a b"
    assert seen.get("PYTHONPATH") == pythonpath
    assert set(seen) - set(env) == {"PMC_TASK", "PMC_MEMORY", "PMC_CPUS", "PMC_RANK",
                                    "PMC_HOST_RANK"}


# What pmc starts its own MPI library with (pmc.transport.mpi), and a value of each a
# user might set.
PMC_MPI_SETTINGS = {"UCX_MEM_EVENTS": "yes", "MPIR_CVAR_NOLOCAL": "0", "UCX_TLS": "tcp,self",
                    "UCX_MODULES": "cma"}


@pytest.mark.parametrize("users", [False, True])
def test_mpi_tasks_get_the_users_environment_unchanged(tmp_path: Path, users: bool) -> None:
    # Neither the launcher's variables nor the settings pmc starts its own MPI library
    # with reach a task; a value the user set does, as set.
    dag = write_dag(tmp_path / "w.dag", "TASK A /usr/bin/env\n")
    env = clean_env(PMCTEST_MARK="a b")
    if users:
        env.update(PMC_MPI_SETTINGS)
    r = pmc_mpi(3, ["run", dag.name], tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    seen = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line
                and not line.startswith("["))
    assert seen["PMCTEST_MARK"] == "a b"
    for name, value in PMC_MPI_SETTINGS.items():
        assert seen.get(name) == (value if users else None), name
    # Hydra sets GFORTRAN_UNBUFFERED_PRECONNECTED for every process it starts, and the
    # reference's tasks inherit it too.
    assert set(seen) - set(env) - {"GFORTRAN_UNBUFFERED_PRECONNECTED"} == {
        "PMC_TASK", "PMC_MEMORY", "PMC_CPUS", "PMC_RANK", "PMC_HOST_RANK"}


def test_quoted_arguments_reach_the_program_literally(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag",
                    "TASK A /usr/bin/printf '%s|' 'a < b || c > d' foo 'bar baz' $HOME\n")
    r = pmc(["run", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "a < b || c > d|foo|bar baz|$HOME|" in r.stdout


def test_stdout_and_stderr_files_are_appended_never_truncated(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", 'TASK A /bin/sh -c "echo out; echo err >&2"\n')
    (tmp_path / "o.txt").write_text("before\n")
    (tmp_path / "e.txt").write_text("before\n")
    r = pmc(["run", "-o", "o.txt", "-e", "e.txt", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    out = (tmp_path / "o.txt").read_text()
    assert out.startswith("before\nout\n[cluster-task name=A,")
    assert (tmp_path / "e.txt").read_text() == "before\nerr\n"
    assert "[cluster-summary" in r.stdout


def test_max_failures_stops_new_tasks(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "".join(f"TASK f{i} /bin/false\n" for i in range(10)))
    r = pmc(["run", "--workers", "1", "-m", "2", dag.name], tmp_path)
    assert r.returncode == 1
    assert "[error] Max failures reached: DAG prematurely aborted\n" in r.stderr
    m = SUMMARY.search(r.stdout)
    assert m is not None and m.group(5) == "2" and m.group(3) == "2"


def test_tries_retry_a_task(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    dag = write_dag(tmp_path / "w.dag",
                    f'TASK A /bin/sh -c "echo x >> {counter}; test $(wc -l < {counter}) -ge 3"\n')
    r = pmc(["run", "-t", "3", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert counter.read_text().count("x") == 3
    # PMC logs each failed try alike: wait status 256 (exit code 1), twice.
    assert r.stderr.count("[error] Task A failed with exitcode 256\n") == 2
    m = SUMMARY.search(r.stdout)
    # As the reference counts: three tries submitted, two failed, extra always 0.
    assert m is not None and m.group(3, 4, 5, 6) == ("3", "1", "2", "0")


def test_task_too_big_for_any_host_aborts_before_start(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK small /bin/true\nTASK huge -c 64 /bin/true\n")
    r = pmc(["run", "--host-cpus", "4", dag.name], tmp_path)
    assert r.returncode == 1
    assert "FATAL ERROR: No host is capable of running task huge" in r.stderr
    assert not (tmp_path / "w.dag.rescue").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.dag"]


def test_bad_dag_writes_nothing(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK A /bin/true\nEDGE A B\n")
    r = pmc(["run", dag.name], tmp_path)
    assert r.returncode == 2
    assert "w.dag:2" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.dag"]


def test_resource_limits_serialise_tasks(tmp_path: Path) -> None:
    # Two workers, but each task needs both cpus of the host: they must not overlap.
    dag = write_dag(tmp_path / "w.dag", "".join(
        f'TASK t{i} -c 2 /bin/sh -c "mkdir {tmp_path}/busy && sleep 0.1 && rmdir {tmp_path}/busy"\n'
        for i in range(4)))
    r = pmc(["run", "--workers", "2", "--host-cpus", "2", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr


def test_mpi_with_one_rank_needs_a_worker(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = pmc_mpi(1, ["run", dag.name], tmp_path)
    assert r.returncode != 0
    assert "At least one worker process is required" in r.stderr


def test_log_levels(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    quiet = pmc(["run", "-q", dag.name], tmp_path)
    assert quiet.returncode == 0 and "[info]" not in quiet.stderr
    verbose = pmc(["run", "-s", "-v", dag.name], tmp_path)
    assert "[debug]" in verbose.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    for args in (["run", "-t", "0", dag.name], ["run", "--max-wall-time", "abc", dag.name],
                 ["run", "--bogus", dag.name], ["run"], ["run", "--maxfds", "0", dag.name],
                 ["run", "--maxfds", "99999999", dag.name]):
        r = pmc(args, tmp_path)
        assert r.returncode == 2, args
        assert "Traceback" not in r.stderr
    r = pmc(["run", dag.name], tmp_path, env=clean_env(PMC_HOST_CPUS="many"))
    assert r.returncode == 2 and "PMC_HOST_CPUS" in r.stderr


def test_pegasus_mpi_cluster_command(tmp_path: Path) -> None:
    exe = Path(sysconfig.get_path("scripts")) / "pegasus-mpi-cluster"
    if not exe.exists():
        pytest.skip("console scripts not installed")
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    v = subprocess.run([str(exe), "-V"], capture_output=True, text=True, env=clean_env())
    assert v.returncode == 0 and "pegasus-mpi-cluster" in v.stdout
    r = subprocess.run([str(exe), "-s", "--workers", "2", dag.name], cwd=tmp_path,
                       capture_output=True, text=True, env=clean_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(rescue_records(tmp_path / "d.dag.rescue")) == 4
    h = subprocess.run([str(exe), "-h"], capture_output=True, text=True, env=clean_env())
    for opt in ("--skip-rescue", "--max-failures", "--tries", "--nolock", "--rescue",
                "--host-script", "--host-memory", "--host-cpus", "--strict-limits",
                "--max-wall-time", "--per-task-stdio", "--jobstate-log", "--monitord-hack",
                "--no-resource-log", "--no-sleep-on-recv", "--maxfds", "--keep-affinity",
                "--set-affinity"):
        assert opt in h.stdout


def test_umask_is_respected(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = subprocess.run(["/bin/sh", "-c", f"umask 077 && exec {os.sys.executable} -m pmc run "
                        f"-o out.txt {dag.name}"], cwd=tmp_path, env=clean_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in ("d.dag.rescue", "out.txt", "d.dag.resource"):
        assert (tmp_path / name).stat().st_mode & 0o077 == 0, name


def test_mpi_run_that_cannot_start_ends_every_rank(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    with open(dag, "r+") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)  # a POSIX lock, as PMC takes
        r = pmc_mpi(3, ["run", dag.name], tmp_path, timeout=60)
    assert r.returncode != 0
    assert "DAG file is already locked by another process" in r.stderr
    bad = write_dag(tmp_path / "bad.dag", "TASK A\n")
    r = pmc_mpi(3, ["run", bad.name], tmp_path, timeout=60)
    assert r.returncode != 0 and "bad.dag:1" in r.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("always_mpi", ["", "1"], ids=["no-mpi", "mpi"])
def test_mpi_run_that_cannot_start_waits_for_a_late_worker(tmp_path: Path,
                                                           always_mpi: str) -> None:
    # The master stops at once (the DAG is locked) while its worker has not yet
    # connected (every rank on one host, no MPI), or, past MPI_Init, has not yet answered
    # the offer of a host socket: the SHUTDOWN that waits for it must still reach the
    # worker, or the worker and the job wait for ever.
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    args = ["run", dag.name]
    # (MPI started as pmc starts it: ranks whose MPI settings differ may never meet.)
    start_mpi = "import pmc.transport.mpi; " if always_mpi else ""
    late = (f"import runpy, sys, time; {start_mpi}time.sleep(2); "
            f"sys.argv = ['pmc', *{args!r}]; runpy.run_module('pmc', run_name='__main__')")
    cmd = [mpiexec(), "-n", "1", sys.executable, "-m", "pmc", *args,
           ":", "-n", "1", sys.executable, "-c", late]
    with open(dag, "r+") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)  # a POSIX lock, as PMC takes
        r = subprocess.run(cmd, cwd=tmp_path, env=clean_env(PMC_ALWAYS_MPI=always_mpi),
                           capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode != 0
    assert "DAG file is already locked by another process" in r.stderr


def test_mpi_workers_on_the_masters_host_talk_through_sockets(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = pmc_mpi(3, ["run", "-v", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    for rank in (1, 2):
        assert f"Worker {rank} is on the master's host: messages through a Unix socket" \
            in r.stderr
    r = pmc_mpi(3, ["run", "-v", "-s", "--no-host-sockets", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Unix socket" not in r.stderr
    assert SUMMARY.search(r.stdout) is not None


@pytest.mark.mpi
def test_mpi_workers_on_another_host_keep_to_mpi(tmp_path: Path) -> None:
    # Rank 2 runs under another host name (its own UTS namespace): it must answer the
    # master's offer with "no" and talk through MPI, while rank 1 uses the socket. (MPI
    # asked for: the launcher has every rank on one host, and would go without it.)
    probe = subprocess.run(["unshare", "--uts", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a UTS namespace here: {probe.stderr.decode().strip()}")
    text = "".join(f"TASK t{i} /bin/sleep 0.02\n" for i in range(40))
    dag = write_dag(tmp_path / "m.dag", text)
    run = [sys.executable, "-m", "pmc", "run", "-v", "--host-cpus", "1", dag.name]
    cmd = [mpiexec(), "-n", "2", *run, ":", "-n", "1", "unshare", "--uts", "sh", "-c",
           'hostname elsewhere && exec "$0" "$@"', *run]
    r = subprocess.run(cmd, cwd=tmp_path, env=clean_env(PMC_ALWAYS_MPI="1"),
                       capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0, r.stderr
    assert "Worker 1 is on the master's host" in r.stderr
    assert "Worker 2 is on" not in r.stderr
    hosts = {(int(m.group(4)), h) for m in CLUSTER_TASK.finditer(r.stdout)
             for h in re.findall(r'hostname="([^"]+)"', m.group(0))}
    assert {slot for slot, _ in hosts} == {1, 2}, hosts  # both ran tasks
    assert (2, "elsewhere") in hosts and all(h != "elsewhere" for s, h in hosts if s == 1)
    assert len(CLUSTER_TASK.findall(r.stdout)) == 40


# A program that runs a workflow in-process, then says how it left the collector.
GC_PROGRAM = """
import gc, sys
from pmc.commands.cli import main
if sys.argv[1] == "off":
    gc.disable()
gc.set_threshold(700, 10, 10)
seen = []
import pmc.runtime.master as master
loop = master.Master.loop
def loop_seeing(self):
    seen.append(gc.isenabled())
    seen.append(gc.get_threshold())
    return loop(self)
master.Master.loop = loop_seeing
code = main(["run", "--workers", "1", sys.argv[2]])
print(code, seen, gc.isenabled(), gc.get_threshold())
"""


@pytest.mark.parametrize(("before", "dag_text", "said"), [
    ("on", DIAMOND, "0 [True, (100000, 10, 10)] True (700, 10, 10)"),
    ("off", DIAMOND, "0 [True, (100000, 10, 10)] False (700, 10, 10)"),
    ("on", "TASK a /bin/true\nEDGE a nowhere\n", "2 [] True (700, 10, 10)"),
])
def test_the_collector_runs_in_the_loop_and_is_left_as_found(before: str, dag_text: str,
                                                             said: str, tmp_path: Path) -> None:
    # Off from the parse to the loop (the DAG's objects are not walked by collections
    # that would find nothing), on in the loop with young collections 100,000 objects
    # apart (tasks in flight do not climb to full collections), and as it was, both,
    # once the run returns.
    write_dag(tmp_path / "d.dag", dag_text)
    r = subprocess.run([sys.executable, "-c", GC_PROGRAM, before, "d.dag"], cwd=tmp_path,
                       env=clean_env(), capture_output=True, text=True, timeout=120)
    assert r.stdout.splitlines()[-1] == said, r.stderr
