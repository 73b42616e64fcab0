"""PMC features with real processes, embedded and under mpiexec: I/O forwarding, host
scripts, per-task stdio, strict limits, affinity, wall time, Pegasus monitoring files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest
from pmctest import DIAMOND, clean_env, pmc, pmc_mpi, rescue_done, write_dag

PY = sys.executable


# -- I/O forwarding ---------------------------------------------------------------------

WRITER = r"""
import os, sys
fd = int(os.environ[sys.argv[1]])
name = os.environ["PMC_TASK"]
for i in range(int(sys.argv[2])):
    os.write(fd, f"{name} record {i:05d} ".encode() + b"x" * 40 + b"\n")
"""


def test_pipe_forwarding_from_concurrent_writers_never_interleaves(launch, tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    out = tmp_path / "shared.txt"
    out.write_text("existing line\n")
    tasks = [f"TASK w{i} -f OUT={out} {PY} {script} OUT {10_000 if i == 0 else 500}\n"
             for i in range(6)]
    dag = write_dag(tmp_path / "w.dag", "".join(tasks))
    r = launch([dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == "existing line", "forwarded files are appended to, never truncated"
    body = lines[1:]
    assert len(body) == 10_000 + 5 * 500
    # Each task's records form one contiguous block, in order.
    blocks: list[str] = []
    for line in body:
        name = line.split()[0]
        if not blocks or blocks[-1] != name:
            blocks.append(name)
    assert sorted(blocks) == [f"w{i}" for i in range(6)], "no task's data is split"
    for i in range(6):
        mine = [line for line in body if line.startswith(f"w{i} ")]
        assert mine == sorted(mine)


def test_pipe_forwarding_env_and_several_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    dag = write_dag(tmp_path / "w.dag",
                    f'TASK t -f A={a} -f B={b} /bin/sh -c "echo to-a >&$A; echo to-b >&$B; '
                    f'echo fds $A $B"\n')
    r = pmc(["run", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert a.read_text() == "to-a\n" and b.read_text() == "to-b\n"
    fds = re.search(r"fds (\d+) (\d+)", r.stdout)
    assert fds is not None and fds.group(1) != fds.group(2)


def test_forwarded_data_of_a_failed_task_is_not_written(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    dag = write_dag(tmp_path / "w.dag", f'TASK t -f O={out} /bin/sh -c "echo data >&$O; exit 3"\n')
    r = pmc(["run", dag.name], tmp_path)
    assert r.returncode == 1
    assert not out.exists() or out.read_text() == ""


def test_forwarding_write_error_fails_the_task(launch, tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag",
                    f'TASK t -f O={tmp_path}/no/such/dir/out /bin/sh -c "echo data >&$O"\n')
    r = launch([dag.name], tmp_path)
    assert r.returncode == 1
    assert re.search(rf"^\[error\] Error writing 5 bytes to {tmp_path}/no/such/dir/out for "
                     r"task t$", r.stderr, re.M), r.stderr
    assert "[error] Task t failed due to collective I/O errors\n" in r.stderr
    assert rescue_done(tmp_path / "w.dag.rescue") == []


def test_maxfds_one_still_writes_every_file(launch, tmp_path: Path) -> None:
    tasks = "".join(
        f'TASK t{i} -f O={tmp_path}/f{i % 3}.txt /bin/sh -c "echo t{i} >&$O"\n' for i in range(9))
    dag = write_dag(tmp_path / "w.dag", tasks)
    r = launch(["--maxfds", "1", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    for k in range(3):
        assert sorted((tmp_path / f"f{k}.txt").read_text().split()) == sorted(
            f"t{i}" for i in range(9) if i % 3 == k)


def test_file_forwarding(launch, tmp_path: Path) -> None:
    dest = tmp_path / "dest.txt"
    tasks = "".join(
        f'TASK t{i} -F {tmp_path}/src{i}={dest} /bin/sh -c "printf \'%s\\n\' t{i}-a t{i}-b '
        f'> {tmp_path}/src{i}"\n' for i in range(5))
    tasks += f"TASK nofile -F {tmp_path}/never={dest} /bin/true\n"
    dag = write_dag(tmp_path / "w.dag", tasks)
    r = launch([dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    lines = dest.read_text().splitlines()
    assert len(lines) == 10
    for i in range(5):
        k = lines.index(f"t{i}-a")
        assert lines[k + 1] == f"t{i}-b"
    assert not list(tmp_path.glob("src*")), "sources are deleted after forwarding"


def test_file_forwarding_limits(launch, tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    dag = write_dag(tmp_path / "w.dag", f"""\
TASK dir -F {tmp_path}/adir={tmp_path}/d1 /bin/true
TASK big -F {tmp_path}/big={tmp_path}/d2 /bin/sh -c "head -c 1048577 /dev/zero > {tmp_path}/big"
TASK fine -F {tmp_path}/ok={tmp_path}/d3 /bin/sh -c "head -c 1048576 /dev/zero > {tmp_path}/ok"
""")
    r = launch([dag.name], tmp_path)
    assert r.returncode == 1
    assert f"[error] Task dir: {tmp_path}/adir is not a file\n" in r.stderr
    assert f"[error] Task big: File {tmp_path}/big is too large\n" in r.stderr
    assert rescue_done(tmp_path / "w.dag.rescue") == ["fine"]
    assert (tmp_path / "d3").stat().st_size == 1 << 20
    assert not (tmp_path / "d2").exists()


# -- host scripts -----------------------------------------------------------------------

def test_host_script_runs_once_per_host_before_any_task(launch, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    script = tmp_path / "host.sh"
    script.write_text(f"#!/bin/sh\necho host-script >> {marks}\necho hello from host script\n")
    script.chmod(0o755)
    dag = write_dag(tmp_path / "w.dag", f'TASK a /bin/sh -c "echo task >> {marks}"\n'
                                        f'TASK b /bin/sh -c "echo task >> {marks}"\n')
    r = launch(["--host-script", str(script), dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert marks.read_text().splitlines() == ["host-script", "task", "task"]
    assert "hello from host script" in r.stdout + r.stderr


def test_host_script_from_environment(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    script = tmp_path / "host.sh"
    script.write_text(f"#!/bin/sh\necho ran > {marks}\n")
    script.chmod(0o755)
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = pmc(["run", dag.name], tmp_path, env=clean_env(PMC_HOST_SCRIPT=str(script)))
    assert r.returncode == 0, r.stderr
    assert marks.read_text() == "ran\n"


def test_failing_host_script_aborts_the_workflow(launch, tmp_path: Path) -> None:
    script = tmp_path / "host.sh"
    script.write_text("#!/bin/sh\nexit 7\n")
    script.chmod(0o755)
    dag = write_dag(tmp_path / "w.dag", f"TASK a /bin/sh -c 'touch {tmp_path}/ran'\n")
    r = launch(["--host-script", str(script), dag.name], tmp_path)
    assert r.returncode == 1
    assert "[fatal] Worker 1: Host script failed with status 1792\n" in r.stderr
    assert not (tmp_path / "ran").exists()


def test_host_script_timeout(tmp_path: Path) -> None:
    script = tmp_path / "host.sh"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    dag = write_dag(tmp_path / "w.dag", f"TASK a /bin/sh -c 'touch {tmp_path}/ran'\n")
    t0 = time.monotonic()
    r = pmc(["run", "--host-script", str(script), "--host-script-timeout", "1", dag.name],
            tmp_path)
    assert r.returncode == 1
    assert "Host script" in r.stderr and "timed out" in r.stderr
    assert not (tmp_path / "ran").exists()
    assert time.monotonic() - t0 < 25, "the script is stopped, not waited for"


def test_host_script_children_are_terminated_at_the_end(launch, tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    script = tmp_path / "host.sh"
    # A service left running by the host script, as memcached would be.
    script.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nexit 0\n")
    script.chmod(0o755)
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = launch(["--host-script", str(script), dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    pid = int(pidfile.read_text())
    for _ in range(50):
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid), "the host script's process group got SIGTERM"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


# -- per-task stdio, strict limits, affinity --------------------------------------------

def test_per_task_stdio(launch, tmp_path: Path) -> None:
    counter = tmp_path / "n"
    dag = write_dag(tmp_path / "w.dag",
                    f'TASK A -t 2 /bin/sh -c "echo out; echo err >&2; echo x >> {counter}; '
                    f'test $(wc -l < {counter}) -ge 2"\nTASK B /bin/echo b\n')
    r = launch(["--per-task-stdio", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    for n in ("000", "001"):
        out = (tmp_path / f"A.out.{n}").read_text()
        assert out.startswith("out\n[cluster-task name=A,")
        assert (tmp_path / f"A.err.{n}").read_text() == "err\n"
    assert (tmp_path / "B.out.000").read_text().startswith("b\n")
    assert "I am" not in r.stdout and "[cluster-task" not in r.stdout
    assert "[cluster-summary" in r.stdout


def test_strict_limits(launch, tmp_path: Path) -> None:
    alloc = f"{PY} -c \"bytearray(200 * 1024 * 1024)\""
    dag = write_dag(tmp_path / "w.dag",
                    f"TASK greedy -m 100 {alloc}\nTASK modest -m 400 {alloc}\n"
                    "TASK unlimited /bin/true\n")
    r = launch(["--strict-limits", dag.name], tmp_path)
    assert r.returncode == 1
    assert "Task greedy failed" in r.stderr
    assert rescue_done(tmp_path / "w.dag.rescue") == ["modest", "unlimited"]
    # Without --strict-limits the same allocation succeeds.
    r = launch(["-s", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr


AFFINITY = f"{PY} -c \"import os; print('cpus', sorted(os.sched_getaffinity(0)), " \
           "os.environ.get('PMC_AFFINITY'))\""


def _affinities(stdout: str) -> list[str]:
    return re.findall(r"^cpus (.*)$", stdout, re.M)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cpus")
def test_inherited_affinity_is_cleared_unless_kept(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", f"TASK a {AFFINITY}\n")
    all_cpus = sorted(range(os.cpu_count() or 1))
    pinned = ["taskset", "-c", "0", PY, "-m", "pmc", "run", "-s", dag.name]
    r = subprocess.run(pinned, cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert _affinities(r.stdout) == [f"{all_cpus} None"]
    r = subprocess.run([*pinned[:-1], "--keep-affinity", dag.name], cwd=tmp_path,
                       env=clean_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert _affinities(r.stdout) == ["[0] None"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cpus")
def test_launcher_binding_kept_for_tasks(tmp_path: Path) -> None:
    # README's recipe for kernels with autogroup: mpiexec binds rank 0 to every cpu and
    # each worker to one; --keep-affinity passes a worker's binding on to its tasks.
    probe = f"{PY} -c \"import os; print('rank', os.environ['PMC_RANK'], 'cpus', " \
            "sorted(os.sched_getaffinity(0)))\""
    dag = write_dag(tmp_path / "w.dag", "".join(f"TASK t{i} {probe}\n" for i in range(8)))
    a, b = sorted(os.sched_getaffinity(0))[:2]
    bind = ["-bind-to", f"user:{a}+{b},{a},{b}"]
    r = pmc_mpi(3, ["run", "--mpi", "--keep-affinity", dag.name], tmp_path, launch=bind)
    assert r.returncode == 0, r.stderr
    seen = re.findall(r"^rank (\d) cpus \[(\d+)\]$", r.stdout, re.M)
    assert len(seen) == 8, r.stdout
    assert all(int(cpu) == (a, b)[int(rank) - 1] for rank, cpu in seen), seen
    # Without --keep-affinity pmc clears the binding, as PMC does.
    r = pmc_mpi(3, ["run", "--mpi", "-s", dag.name], tmp_path, launch=bind)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(f"cpus {sorted(range(os.cpu_count() or 1))}\n") == 8, r.stdout


# --set-affinity binds to the host's real cpus (--host-cpus is refused with it, as in the
# reference), so the figures below need a host of exactly cpus 0 and 1.
@pytest.mark.skipif(sorted(os.sched_getaffinity(0)) != [0, 1] or os.cpu_count() != 2,
                    reason="needs a host of exactly 2 cpus, 0 and 1")
def test_set_affinity_binds_multicore_tasks(launch, tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", f"TASK two -c 2 {AFFINITY}\nTASK one {AFFINITY}\n"
                                        "EDGE two one\n")
    r = launch(["--set-affinity", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(_affinities(r.stdout)) == ["[0, 1] 0,1", "[0, 1] None"]


# -- wall time --------------------------------------------------------------------------

def test_max_wall_time_aborts_and_still_merges(launch, tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag",
                    'TASK quick /bin/echo quick-output\n'
                    'TASK slow1 /bin/sh -c "echo slow-start; sleep 60"\n'
                    'TASK slow2 /bin/sh -c "trap \'\' TERM; sleep 60"\n'
                    "TASK after /bin/true\nEDGE quick after\nEDGE slow1 after\n")
    t0 = time.monotonic()
    r = launch(["--max-wall-time", "0.05", dag.name], tmp_path)
    took = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    assert "[fatal] Workflow wall time exceeded!\n" in r.stderr
    assert "[error] Aborting workflow\n" in r.stderr and "maximum wall time" in r.stderr
    assert took < 30, "the limit (3 s) plus the kill grace, not the tasks' 60 s"
    assert "quick-output" in r.stdout and "slow-start" in r.stdout, "stdio is merged"
    assert rescue_done(tmp_path / "w.dag.rescue") == ["quick"]
    assert not list(tmp_path.glob("w.dag.out.*"))


def test_max_wall_time_from_environment(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK slow /bin/sleep 60\n")
    r = pmc(["run", dag.name], tmp_path, env=clean_env(PMC_MAX_WALL_TIME="0.02"))
    assert r.returncode == 3
    assert "maximum wall time of 0.02 minutes" in r.stderr


def test_expected_runtime_holds_tasks_that_cannot_finish(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK short --expected-runtime 1 /bin/true\n"
                                        "TASK long --expected-runtime 3600 /bin/true\n")
    r = pmc(["run", "--max-wall-time", "10", dag.name], tmp_path)
    assert r.returncode == 3
    assert "Task long not started: expected runtime 3600 s exceeds" in r.stderr
    assert rescue_done(tmp_path / "w.dag.rescue") == ["short"]
    # Without a wall-time limit nothing is held back.
    r = pmc(["run", dag.name], tmp_path)
    assert r.returncode == 0
    assert rescue_done(tmp_path / "w.dag.rescue") == ["long", "short"]


# -- Pegasus monitoring files -----------------------------------------------------------

JOBSTATE = re.compile(r"^\d+\.\d{6} (?:INTERNAL \*\*\* PMC_(?:STARTED|FINISHED [01]) \*\*\*|"
                      r"\S+ (?:SUBMIT|EXECUTE|JOB_TERMINATED) (\d+)\.0 - - \1|"
                      r"\S+ JOB_(?:SUCCESS|FAILURE) -?\d+ - - \d+)$")
DATE = r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d"


def test_jobstate_log(launch, tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    (tmp_path / "jobstate.log").write_text("previous line\n")
    r = launch(["--jobstate-log", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "jobstate.log").read_text().splitlines()
    assert lines[0] == "previous line"
    body = lines[1:]
    for line in body:
        assert JOBSTATE.match(line), line
    assert body[0].endswith("INTERNAL *** PMC_STARTED ***")
    assert body[-1].endswith("INTERNAL *** PMC_FINISHED 0 ***")
    states = [line.split()[1:3] for line in body[1:-1]]
    for name in "ABCD":
        assert [s for n, s in states if n == name] == [
            "SUBMIT", "EXECUTE", "JOB_TERMINATED", "JOB_SUCCESS"]
    seqs = {line.split()[1]: line.split()[-1] for line in body[1:-1]}
    assert sorted(seqs.values()) == ["1", "2", "3", "4"]
    assert seqs["A"] == "1" and seqs["D"] == "4"


def test_jobstate_log_of_a_failure(launch, tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK bad /bin/sh -c 'exit 5'\n")
    r = launch(["--jobstate-log", dag.name], tmp_path)
    assert r.returncode == 1
    body = (tmp_path / "jobstate.log").read_text().splitlines()
    # The raw wait status, as the reference writes it: exit code 5 is 1280.
    assert re.match(r"^\d+\.\d{6} bad JOB_FAILURE 1280 - - 1$", body[-2])
    assert body[-1].endswith("INTERNAL *** PMC_FINISHED 1 ***")


def test_monitord_hack(launch, tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND + "TASK E /bin/false\n")
    r = launch(["--monitord-hack", dag.name], tmp_path)
    assert r.returncode == 1
    text = (tmp_path / "d.dag.dagman.out").read_text().splitlines()
    for line in text:
        assert re.match(f"^{DATE} ", line), line
    body = [line[18:] for line in text]
    assert body[0] == ("This is a fake DAGMan log file generated by PMC for the purpose of "
                       "tricking monitord")
    assert body[1] == "** condor_scheduniv_exec.0.0 (CONDOR_DAGMAN) STARTING UP"
    assert re.match(r"^\*\* PID = \d+$", body[2])
    assert body[3] == "Parsing d.dag ..."
    assert "Submitting Condor Node A job(s)..." in body
    assert "Event: ULOG_SUBMIT for Condor Node A (1.0)" in body
    assert "Event: ULOG_EXECUTE for Condor Node A (1.0)" in body
    assert "Event: ULOG_JOB_TERMINATED for Condor Node A (1.0)" in body
    assert "Node A job proc (1.0) completed successfully." in body
    assert any(re.match(r"^Node E job proc \(\d+\.0\) failed with status 256\.$", b) for b in body)
    assert re.match(r"^\*\*\*\* condor_scheduniv_exec\.0\.0 \(condor_DAGMAN\) pid \d+ "
                    r"EXITING WITH STATUS 1$", body[-1])
    assert (tmp_path / "A.out.000").exists(), "--monitord-hack implies --per-task-stdio"


def test_resource_log(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK a -c 2 -m 10 /bin/true\nTASK b /bin/true\n")
    r = pmc(["run", "--workers", "2", "--host-cpus", "4", "--host-memory", "100", dag.name],
            tmp_path)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "w.dag.resource").read_text().splitlines()
    host = os.uname().nodename
    for line in lines:
        assert re.match(rf"^\d+\.\d+,\d+,\d+,\d+,{re.escape(host)}$", line), line
    assert lines[0].split(",")[1:4] == ["2", "4", "100"]
    assert lines[-1].split(",")[1:4] == ["2", "4", "100"]
    assert any(line.split(",")[2] in ("1", "2") for line in lines), "busy cpus are shown"


def test_resource_log_has_a_line_per_change_with_its_values(tmp_path: Path) -> None:
    """Each change of a host's free resources is one line with the values it had then,
    in order: across many turns and to the end of the run, and in a run closed without
    an end."""
    from pmc.core.events import RunInfo, Summary
    from pmc.core.resources import Resources
    from pmc.outputs.recordfiles import ResourceLog

    res = Resources()
    workers = [res.add_worker(rank, f"node{rank % 3}", 64, 1000, 8) for rank in range(1, 7)]
    info = RunInfo(dag_path="w.dag", tasks=0, recovered=0, workers=6, slots=48, cpus=192,
                   hosts=[], start=0.0, mode="local")

    def churn(log: ResourceLog, changes: int) -> list[str]:
        expected = []
        for i in range(changes):
            w = workers[i * 7 % len(workers)]
            if i % 2 == 0 and w.free_slots:
                res.allocate(w, 1 + i % 3, 10)
            elif w.free_slots < w.slots:
                res.release(w, 1, 10)
            h = w.host
            log.host_changed(h)
            expected.append(f"{h.free_slots},{h.free_cpus},{h.free_memory},{h.name}")
            if i % 1000 == 999:
                log.flush()  # the end of a turn
        return expected

    log = ResourceLog(str(tmp_path / "a.dag"))
    log.started(info)
    expected = churn(log, 25_000)
    log.finished(cast(Summary, None))
    log.close()
    lines = (tmp_path / "a.dag.resource").read_text().splitlines()
    assert [line.split(",", 1)[1] for line in lines] == expected
    times = [float(line.split(",", 1)[0]) for line in lines]
    assert times == sorted(times)
    assert all(re.fullmatch(r"\d+\.\d{6}", line.split(",", 1)[0]) for line in lines)

    log = ResourceLog(str(tmp_path / "b.dag"))  # stopped: closed, never finished
    log.started(info)
    expected = churn(log, 10)
    log.close()
    lines = (tmp_path / "b.dag.resource").read_text().splitlines()
    assert [line.split(",", 1)[1] for line in lines] == expected


def test_no_resource_log(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = pmc(["run", "--no-resource-log", dag.name], tmp_path)
    assert r.returncode == 0
    assert not (tmp_path / "d.dag.resource").exists()


def test_no_sleep_on_recv_under_mpi(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = pmc_mpi(3, ["run", "--no-sleep-on-recv", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert rescue_done(tmp_path / "d.dag.rescue") == ["A", "B", "C", "D"]


def test_signal_while_the_host_script_runs_is_an_incomplete_run(tmp_path: Path) -> None:
    script = tmp_path / "host.sh"
    script.write_text(f"#!/bin/sh\ntouch {tmp_path}/started\nsleep 60\n")
    script.chmod(0o755)
    dag = write_dag(tmp_path / "w.dag", f"TASK a /bin/sh -c 'touch {tmp_path}/ran'\n")
    proc = subprocess.Popen([PY, "-m", "pmc", "run", "--host-script", str(script), dag.name],
                            cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for _ in range(300):
        if (tmp_path / "started").exists():
            break
        time.sleep(0.05)
    proc.terminate()
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert "[fatal] Caught signal 15\n" in err and "[error] Aborting workflow\n" in err
    assert not (tmp_path / "ran").exists()
