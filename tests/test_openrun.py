"""Open runs (pmc extension): tasks added to a running ``pmc run --open`` from a file,
from stdin and from ``pmc.client``; batches refused whole; the journal across a
``kill -9`` of the master; who may add; hostile messages."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pwd
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from openrunkit import LOG, WAIT_FOR, OpenRun, ran, wait_until
from pmctest import MPIEXEC, pmc, rescue_done, write_dag

from pmc.client import Client, SubmitError


def test_tasks_added_from_a_file_and_stdin_with_edges_to_done_and_pending(tmp_path, runs):
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n"
                    f"TASK B {WAIT_FOR.format(name='B', gate='go')}\n")
    run = OpenRun(dag)
    runs.append(run)
    wait_until(lambda: "A" in run.done() and "B" in ran(tmp_path), "A done, B running")
    # C after A (done: ready at once), D after B (running: it waits).
    more = write_dag(tmp_path / "more.txt", f"TASK C {LOG.format(name='C')}\nEDGE A C\n"
                     f"TASK D {LOG.format(name='D')}\nEDGE B D\n")
    r = run.add(more.name)
    assert r.returncode == 0, r.stderr
    assert "added 2 task(s)" in r.stdout
    wait_until(lambda: "C" in run.done(), "C done while B still runs")
    assert "D" not in ran(tmp_path) and "B" not in run.done()
    # From stdin: E after D (pending) and after C (done).
    r = run.add("-", f"TASK E {LOG.format(name='E')}\nEDGE D E\nEDGE C E\n")
    assert r.returncode == 0, r.stderr
    time.sleep(0.5)
    assert "E" not in ran(tmp_path)
    (tmp_path / "go").touch()
    wait_until(lambda: "E" in run.done(), "E done")
    code, out, err = run.finish()
    assert code == 0, err
    assert sorted(ran(tmp_path)[:3]) == ["A", "B", "C"] and ran(tmp_path)[3:] == ["D", "E"]
    assert sorted(run.done()) == ["A", "B", "C", "D", "E"]
    assert "tasks=5, submitted=5, succeeded=5" in out
    assert "Open run: added 2 task(s) and 2 edge(s) from more.txt" in err
    assert "Open run: added 1 task(s) and 2 edge(s) from <stdin>" in err
    snapshot = json.loads((tmp_path / "wf.dag.status.json").read_text())
    assert snapshot["tasks"] == 5 and snapshot["succeeded"] == 5
    status = pmc(["status", "--json", dag.name], tmp_path)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["tasks"] == 5


def test_a_bad_batch_is_refused_whole(tmp_path, runs):
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
    run = OpenRun(dag)
    runs.append(run)
    bad = write_dag(tmp_path / "bad.txt", f"TASK B {LOG.format(name='B')}\n# fine so far\n"
                    "TASK C -c nope /bin/true\n")
    r = run.add(bad.name)
    assert r.returncode == 2
    assert "bad.txt:3:" in r.stderr
    # A name already taken, an EDGE to a task no batch has, a child added before.
    for text, where, what in [
        ("TASK A /bin/true\n", "<stdin>:1:", "already in the DAG"),
        ("TASK B /bin/true\nEDGE X B\n", "<stdin>:2:", "unknown task 'X'"),
        ("TASK B /bin/true\nEDGE B A\n", "<stdin>:2:", "must be a task of the same batch"),
    ]:
        r = run.add("-", text)
        assert r.returncode == 2 and where in r.stderr and what in r.stderr, r.stderr
    assert (tmp_path / "wf.dag.added").read_text() == ""  # nothing of them kept
    # B's name is free: nothing of the first batch was added.
    r = run.add("-", f"TASK B {LOG.format(name='B')}\n")
    assert r.returncode == 0, r.stderr
    code, out, err = run.finish()
    assert code == 0, err
    assert sorted(ran(tmp_path)) == ["A", "B"]
    assert "tasks=2," in out


def test_a_cycle_is_refused(tmp_path, runs):
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
    run = OpenRun(dag)
    runs.append(run)
    r = run.add("-", "TASK X /bin/true\nTASK Y /bin/true\nTASK Z /bin/true\n"
                "EDGE A X\nEDGE X Y\nEDGE Y Z\nEDGE Z X\n")
    assert r.returncode == 2
    assert "<stdin>:5:" in r.stderr and "would close a cycle" in r.stderr
    code, out, err = run.finish()
    assert code == 0, err
    assert "tasks=1," in out and ran(tmp_path) == ["A"]


def test_kill_9_of_the_master_keeps_the_added_tasks(tmp_path, runs):
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
    run = OpenRun(dag)
    runs.append(run)
    r = run.add("-", f"TASK B {LOG.format(name='B')}\nEDGE A B\n")
    assert r.returncode == 0, r.stderr
    r = run.add("-", f"TASK C {WAIT_FOR.format(name='C', gate='go')}\nEDGE B C\n"
                f"TASK D {LOG.format(name='D')}\nEDGE C D\n")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: "C" in ran(tmp_path) and "B" in run.done(), "B done, C running")
    os.kill(run.proc.pid, signal.SIGKILL)
    run.proc.communicate()
    (tmp_path / "go").touch()  # the killed run's C may end now
    # Run again (not open): the DAG, the journal, the rescue log.
    again = pmc(["run", "--workers", "2", dag.name], tmp_path)
    assert again.returncode == 0, again.stderr
    assert "Read 3 task(s) added to the DAG before from wf.dag.added" in again.stderr
    assert "tasks=4, submitted=2, succeeded=2" in again.stdout  # C and D only
    assert sorted(ran(tmp_path)) == ["A", "B", "C", "C", "D"]  # C again: it was not done
    assert sorted(rescue_done(tmp_path / "wf.dag.rescue")) == ["A", "B", "C", "D"]


def test_the_client_submits_waits_and_reads_records(tmp_path, runs):
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
    run = OpenRun(dag)
    runs.append(run)
    with Client.connect(str(dag)) as client:
        gate = client.submit(["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.05; done"])
        first = client.submit(["/bin/sh", "-c", "echo \"$0 $1\" >> ran.txt", "one", "it's"],
                              after=["A"], cpus=1, memory=1, priority=5)
        second = client.submit(["/bin/sh", "-c", "echo second >> ran.txt; exit 3"],
                               after=[first, gate], tries=2)
        assert gate.state().state == "running" or gate.state().state == "ready"
        (f,) = client.wait([first], timeout=60)
        assert f.state == "done" and f.exit_code == 0 and f.record is not None
        assert second.state().state == "waiting"
        (tmp_path / "go").touch()
        g, s = client.wait([gate, second], timeout=60)
        assert g.ok and not s.ok
        assert s.state == "failed" and s.exit_code == 3 and s.tries == 2
        assert s.record is not None and s.record["outcome"] == "failed"
        with pytest.raises(SubmitError, match="must be a task of the same batch"):
            client.add(f"TASK late /bin/true\nEDGE late {first.name}\n")
        client.close_run()
    out, err = run.proc.communicate(timeout=120)
    assert run.proc.returncode == 1, err  # a task failed
    assert "tasks=4, submitted=5, succeeded=3, failed=2" in out  # tries, as PMC counts
    lines = (tmp_path / "ran.txt").read_text().splitlines()
    assert lines == ["A", "one it's", "second", "second"]


def _raw(path: str, payload: bytes, shut: bool = True) -> bytes:
    """Send raw bytes to the run's socket; what it answers before closing."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        chunks = []
        try:
            s.sendall(payload)
            if shut:
                s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed with the rest of a refused message unread
    return b"".join(chunks)


def _frame(obj: object) -> bytes:
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def test_hostile_messages_and_a_wrong_token_are_refused(tmp_path, runs):
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
    run = OpenRun(dag)
    runs.append(run)
    sock = f"{dag}.sock"
    token = (tmp_path / "wf.dag.token").read_text().strip()
    assert (os.stat(sock).st_mode & 0o777) == 0o600
    assert (os.stat(tmp_path / "wf.dag.token").st_mode & 0o777) == 0o600
    add = {"op": "add", "text": "TASK Z /bin/sh -c 'echo Z >> ran.txt'\n"}
    wrong = ("y" if token[0] == "x" else "x") + token[1:]  # one character off, always
    answers = {
        "wrong token": _raw(sock, _frame({**add, "token": wrong})),
        "no token": _raw(sock, _frame(add)),
        "garbage": _raw(sock, struct.pack(">I", 12) + b"\xff\xfe not json!"),
        "not json": _raw(sock, struct.pack(">I", 7) + b"{'op':}"),
        "huge": _raw(sock, struct.pack(">I", 0xFFFFFFF0) + b"{}"),
        "truncated": _raw(sock, _frame({**add, "token": token})[:30]),
        "not an object": _raw(sock, _frame([1, 2, 3])),
        "bad op": _raw(sock, _frame({"op": "rm -rf", "token": token})),
    }
    for what, answer in answers.items():
        assert b"refused" in answer or answer == b"", (what, answer)
    # The run goes on: it still takes a good request, and none of the above added Z.
    with Client.connect(str(dag)) as client:
        assert client.info()["tasks"] == 1
        client.add(f"TASK B {LOG.format(name='B')}\n")
    code, out, err = run.finish()
    assert code == 0, err
    assert sorted(ran(tmp_path)) == ["A", "B"]
    for reason in ("wrong token", "message is not JSON", "over the limit",
                   "truncated message", "not a JSON object", "unknown operation"):
        assert reason in err, (reason, err)
    assert token not in err and token not in out


def _as_other_user(cwd: Path, stdin: str, act: Callable[[], object]) -> tuple[int, str, str]:
    """Run ``act`` in a child of this process that is user ``nobody`` (a real other uid:
    setgroups, setgid, setuid as root), in ``cwd``, with ``stdin`` as its standard input:
    its exit code (SystemExit's, or what ``act`` returns), stdout and stderr.

    A fork, not an exec: the other user runs pmc's own code already loaded here, so
    this needs no Python install that user may read (CI's is in a home directory
    only root enters)."""
    who = pwd.getpwnam("nobody")
    # pmc's modules loaded before the fork: the child may not be able to read them.
    for module in ("pmc.commands.cli", "pmc.commands.openrun", "pmc.client"):
        importlib.import_module(module)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    os.write(in_w, stdin.encode())
    os.close(in_w)
    pid = os.fork()
    if pid == 0:  # the other user; whatever happens, it ends here
        code = 70
        try:
            for fd, std in ((in_r, 0), (out_w, 1), (err_w, 2)):
                os.dup2(fd, std)
            sys.stdin = open(0, closefd=False)  # noqa: SIM115
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            os.setgroups([])
            os.setgid(who.pw_gid)
            os.setuid(who.pw_uid)
            if os.getuid() != who.pw_uid or os.geteuid() != who.pw_uid:
                raise RuntimeError("still root")
            os.chdir(cwd)
            result = act()
            code = result if isinstance(result, int) else 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException as e:  # reported to the test through stderr
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
            code = 71
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    end = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            done = os.waitpid(pid, 0)
            break
        time.sleep(0.05)
    with open(out_r, "rb") as out, open(err_r, "rb") as err:
        return os.waitstatus_to_exitcode(done[1]), out.read().decode(), err.read().decode()


def _try_the_socket(token: str) -> str:
    """What the peer of the run's socket sees of a well-formed add with the right
    token: its reply, or the error its connection ended with."""
    s = socket.socket(socket.AF_UNIX)
    s.connect("wf.dag.sock")
    body = json.dumps({"op": "add", "token": token, "text": "TASK Z /bin/true\n"}).encode()
    try:
        s.sendall(struct.pack(">I", len(body)) + body)
        return repr(s.recv(100))
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()


def test_another_user_cannot_add_a_task(runs):
    if os.getuid() != 0:
        pytest.skip("needs root, to be another user")
    from pmc.commands.cli import main as pmc_main
    # A directory others may enter, and a socket others may open (as if its mode had
    # been changed): the uid of the peer is still checked.
    where = Path(tempfile.mkdtemp(prefix="pmc-open-"))
    try:
        os.chmod(where, 0o755)
        dag = write_dag(where / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
        run = OpenRun(dag)
        runs.append(run)
        code, _out, err = _as_other_user(where, "TASK Z /bin/true\n",
                                         lambda: pmc_main(["add", "wf.dag", "-"]))
        assert code == 1, err
        assert "cannot read wf.dag.token: Permission denied" in err
        os.chmod(f"{dag}.sock", 0o666)
        token = (where / "wf.dag.token").read_text().strip()
        code, out, err = _as_other_user(where, "", lambda: print(_try_the_socket(token)))
        assert code == 0, err
        # Turned away before its request is read.
        assert out.strip() in ("b''", "BrokenPipeError", "ConnectionResetError"), out
        code, out, err = run.finish()
        assert code == 0, err
        assert "tasks=1," in out
        assert f"refused a connection from uid {pwd.getpwnam('nobody').pw_uid}" in err
        assert token not in err
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_a_batch_joins_the_dag_as_if_it_had_been_written_in_it(tmp_path):
    """The compressed edges after ``extend`` are those of the DAG written whole; the
    engine readies what the batch's parents allow."""
    from pmc.core.engine import Engine
    from pmc.dag import parse_dag
    from pmc.dag.extend import extend, parse_batch

    head = "".join(f"TASK T{i} /bin/true\n" for i in range(6)) + \
        "EDGE T0 T2\nEDGE T1 T2\nEDGE T4 T5\n"
    more = "TASK N0 /bin/true\nTASK N1 -c 2 /bin/true\nEDGE T5 N0\nEDGE T1 N0\n" \
        "EDGE N0 N1\nEDGE T3 N1\nEDGE T1 N1\n"
    dag = parse_dag(str(write_dag(tmp_path / "a.dag", head)))
    engine = Engine(dag)
    for t in (0, 1, 3):  # T0, T1, T3 run and end
        engine.pop(next(cls for _k, cls in engine.ready_heads() if engine.classes[cls]
                        and engine.task_of(engine.classes[cls][0]) == t))
    for t in (0, 1, 3):
        engine.complete(t, True)
    batch = parse_batch(dag, "more", more)
    extend(dag, batch)
    whole = parse_dag(str(write_dag(tmp_path / "b.dag", head + more)))
    for t in range(len(whole)):
        assert sorted(dag.children(t)) == sorted(whole.children(t)), t
    assert list(dag.nparents) == list(whole.nparents)
    assert dag.id_of("N1") == 7 and dag.task(7).cpus == 2 and dag.task(7).line == 2
    assert engine.add(6, batch.edges) == []  # N0 waits for T5, N1 for N0
    assert engine.ntasks == 8 and engine.waiting_on[6:] .tolist() == [1, 1]


def test_added_tasks_are_in_the_event_log_and_the_report(tmp_path, runs):
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
    run = OpenRun(dag, "--log-format", "json", "--log-file", "events.json")
    runs.append(run)
    r = run.add("-", f"TASK B {LOG.format(name='B')}\nEDGE A B\n")
    assert r.returncode == 0, r.stderr
    code, _out, err = run.finish()
    assert code == 0, err
    events = [json.loads(line) for line in (tmp_path / "events.json").read_text().splitlines()
              if line.startswith("{")]
    (added,) = [e for e in events if e.get("event") == "workflow.tasks_added"]
    assert added["added"] == 1 and added["tasks"] == 2 and added["names"] == ["B"]
    assert {e["task"] for e in events if e.get("event") == "task.finished"} == {"A", "B"}
    report = pmc(["report", "events.json"], tmp_path)
    assert report.returncode == 0, report.stderr
    assert "Tasks in DAG: 2 " in report.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_an_open_run_under_mpiexec(tmp_path, runs, ranks):
    """Under MPI the master polls the transport: a request still wakes it (3 ranks:
    --no-host-sockets, every message through MPI)."""
    if MPIEXEC is None:
        pytest.skip("mpiexec not installed (pip install '.[mpi]')")
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
    extra = ["--no-host-sockets"] if ranks == 3 else []
    run = OpenRun(dag, *extra, launcher=[MPIEXEC, "-n", str(ranks)])
    runs.append(run)
    wait_until(lambda: "A" in run.done(), "A done")
    r = run.add("-", f"TASK B {LOG.format(name='B')}\nEDGE A B\n")
    assert r.returncode == 0, r.stderr
    with Client.connect(str(dag)) as client:
        (b,) = client.wait([client.submit(["/bin/sh", "-c", "echo C >> ran.txt"],
                                          after=["B"])], timeout=120)
        assert b.ok
    code, out, err = run.finish()
    assert code == 0, err
    assert ran(tmp_path) == ["A", "B", "C"]
    assert "tasks=3, submitted=3, succeeded=3" in out


def test_a_torn_last_batch_of_the_journal_is_ignored(tmp_path):
    from pmc.dag import parse_dag
    from pmc.runtime.journal import Journal, replay

    dag_path = write_dag(tmp_path / "wf.dag", "TASK A /bin/true\n")
    journal = Journal(str(tmp_path / "wf.dag.added"))
    journal.append("TASK B /bin/true\nEDGE A B\n")
    journal.append("TASK C -c 2 /bin/true\nEDGE B C\n")
    journal.close()
    whole = (tmp_path / "wf.dag.added").read_bytes()
    dag = parse_dag(str(dag_path))
    assert replay(dag, str(tmp_path / "wf.dag.added")) == (2, [])
    assert [dag.name_of(t) for t in range(len(dag))] == ["A", "B", "C"]
    assert list(dag.children(1)) == [2] and dag.task(2).cpus == 2
    assert dag.task(2).line == 5  # its line in the journal
    (tmp_path / "wf.dag.added").write_bytes(whole[:-5])  # killed mid-write
    dag = parse_dag(str(dag_path))
    added, warnings = replay(dag, str(tmp_path / "wf.dag.added"))
    assert added == 1 and len(dag) == 2
    assert warnings == [f"{tmp_path}/wf.dag.added:4: ignoring a torn last batch "
                        "(never acknowledged)"]
