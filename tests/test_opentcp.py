"""An open run's TCP channel (``pmc run --open --open-tcp``, a pmc extension): a client
that cannot reach the Unix socket finds the run through ``DAG.tcp``, adds tasks and
waits for them; the token (proved, never sent) admits; hostile messages over TCP are
refused with the run going on; the address file is private and gone after the run.
Everything here listens and connects on 127.0.0.1 only."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
from pathlib import Path

import pytest
from openrunkit import LOG, OpenRun, ran, wait_until
from pmctest import pmc, write_dag

from pmc.client import Client
from pmc.openchannel import proof

LOOPBACK = "127.0.0.1:0"


def _address(dag: Path) -> tuple[str, int]:
    data = json.loads(Path(f"{dag}.tcp").read_text())
    assert data["hosts"] == ["127.0.0.1"], data
    return "127.0.0.1", int(data["port"])


def test_a_client_over_tcp_adds_tasks_and_waits_for_them(tmp_path, runs):
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
    run = OpenRun(dag, "--open-tcp", LOOPBACK)  # (OpenRun gives --open too)
    runs.append(run)
    tcp = Path(f"{dag}.tcp")
    assert (tcp.stat().st_mode & 0o777) == 0o600
    host, port = _address(dag)
    with Client.connect(str(dag), channel="tcp") as client:
        assert client._sock.family == socket.AF_INET
        assert client._sock.getpeername() == (host, port)
        first = client.submit(["/bin/sh", "-c", "echo one >> ran.txt"], after=["A"])
        second = client.submit(["/bin/sh", "-c", "echo two >> ran.txt; exit 4"],
                               after=[first])
        f, s = client.wait([first, second], timeout=120)
        assert f.ok and f.exit_code == 0
        assert s.state == "failed" and s.exit_code == 4
    # As on another host: the Unix socket cannot be reached, so pmc add and pmc close
    # (no option) go through DAG.tcp.
    os.unlink(f"{dag}.sock")
    r = run.add("-", f"TASK late {LOG.format(name='late')}\nEDGE A late\n")
    assert r.returncode == 0, r.stderr
    assert "added 1 task(s)" in r.stdout
    wait_until(lambda: "late" in run.done(), "late done")
    code, out, err = run.finish()
    assert code == 1, err  # a task failed
    assert "tasks=4, submitted=4, succeeded=3, failed=1" in out
    assert ran(tmp_path) == ["A", "one", "two", "late"]
    assert f"Open run: listening on TCP at 127.0.0.1:{port} (written to {dag.name}.tcp)" in err
    token_text = err + out
    assert "refused" not in token_text
    for leftover in (".tcp", ".token", ".sock"):
        assert not Path(f"{dag}{leftover}").exists(), leftover


def _exchange(where: tuple[str, int], payload: bytes | None = None,
              ) -> tuple[dict[str, object], bytes]:
    """Connect over TCP, read the greeting, send ``payload`` and return the greeting and
    all the run answered before closing."""
    with socket.create_connection(where, timeout=30) as s:
        head = s.recv(4)
        (size,) = struct.unpack(">I", head)
        body = b""
        while len(body) < size:
            body += s.recv(size - len(body))
        hello = json.loads(body)
        chunks = []
        try:
            if payload is not None:
                s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before all of it was read
        with contextlib.suppress(OSError):  # (already closed by the run)
            s.shutdown(socket.SHUT_WR)
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                chunks.append(chunk)
    return hello, b"".join(chunks)


def _frame(obj: object) -> bytes:
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def _with_proof(where: tuple[str, int], token: str, obj: dict[str, object],
                tamper: bool = False) -> bytes:
    """A request carrying the proof for the challenge of its own connection (or, with
    ``tamper``, of another one)."""
    with socket.create_connection(where, timeout=30) as s:
        (size,) = struct.unpack(">I", s.recv(4))
        hello = json.loads(s.recv(size))
        challenge = str(hello["challenge"])
        if tamper:
            challenge = ("0" if challenge[0] != "0" else "1") + challenge[1:]
        s.sendall(_frame({**obj, "token": proof(token, challenge)}))
        (size,) = struct.unpack(">I", s.recv(4))
        return s.recv(size)


def test_over_tcp_a_wrong_token_and_hostile_messages_are_refused(tmp_path, runs):
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
    run = OpenRun(dag, "--open-tcp", LOOPBACK)
    runs.append(run)
    where = _address(dag)
    token = (tmp_path / "wf.dag.token").read_text().strip()
    add = {"op": "add", "text": "TASK Z /bin/sh -c 'echo Z >> ran.txt'\n"}
    hello, _ = _exchange(where)
    assert hello["pmc"] == "pmc-open-run" and len(str(hello["challenge"])) == 32
    answers = {
        # The token itself is not what a TCP request carries: its proof is.
        "the token in clear": _exchange(where, _frame({**add, "token": token}))[1],
        "another connection's proof": _with_proof(where, token, add, tamper=True),
        "no token": _exchange(where, _frame(add))[1],
        "garbage": _exchange(where, struct.pack(">I", 12) + b"\xff\xfe not json!")[1],
        "huge": _exchange(where, struct.pack(">I", 0xFFFFFFF0) + b"{}")[1],
        "truncated": _exchange(where, _frame({**add, "token": token})[:30])[1],
        "not an object": _exchange(where, _frame([1, 2, 3]))[1],
    }
    for what, answer in answers.items():
        # (What the run did not read may reset the connection before its answer is.)
        assert b"refused" in answer or (what == "huge" and answer == b""), (what, answer)
    assert b"unknown operation" in _with_proof(where, token, {"op": "rm -rf"})
    # The run goes on: a request with its proof is taken over TCP, and none of the
    # above added Z.
    reply = json.loads(_with_proof(where, token, {"op": "info"}))
    assert reply["ok"] and reply["tasks"] == 1
    with Client.connect(str(dag), channel="tcp") as client:
        client.add(f"TASK B {LOG.format(name='B')}\n")
        client.close_run()
    out, err = run.proc.communicate(timeout=120)
    assert run.proc.returncode == 0, err
    assert sorted(ran(tmp_path)) == ["A", "B"]
    refusals = [line for line in err.splitlines() if "refused a request from 127.0.0.1:" in line]
    assert all("(TCP)" in line for line in refusals) and len(refusals) == 8, refusals
    for reason in ("wrong token", "message is not JSON", "over the limit",
                   "truncated message", "not a JSON object", "unknown operation"):
        assert reason in err, (reason, err)
    assert token not in err and token not in out
    assert not Path(f"{dag}.tcp").exists()


def test_tcp_options_refused_and_a_port_taken(tmp_path, runs):
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
    r = pmc(["run", "--open-tcp", "not a host:1", dag.name], tmp_path)
    assert r.returncode == 2, r.stderr
    assert "argument --open-tcp: not a host, address or interface: 'not a host'" in r.stderr
    r = pmc(["run", "--open-tcp", LOOPBACK, "--schedule", "critical-path", dag.name],
            tmp_path)
    assert r.returncode == 2 and "--open cannot be combined with --schedule" in r.stderr
    profile = tmp_path / "site.yaml"
    for value, error in (("'*:0'", "an open run orders its tasks by priority"),
                         ("'host:99999'", "not a TCP port: 99999")):
        profile.write_text("site: here\nscheduler: slurm\npmc:\n  schedule: critical-path\n"
                           f"  open_tcp: {value}\n")
        r = pmc(["run", "--site", str(profile), dag.name], tmp_path)
        assert r.returncode == 2, r.stderr
        assert f"{profile}: pmc.open_tcp" in r.stderr and error in r.stderr, r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = pmc(["run", "--workers", "1", "--open-tcp", f"127.0.0.1:{port}",
                 dag.name], tmp_path)
        assert r.returncode != 0
        assert f"cannot listen on TCP 127.0.0.1:{port}: Address already in use" in r.stderr
        assert not (tmp_path / "ran.txt").exists()  # stopped before A started
        for leftover in (".tcp", ".token", ".sock"):
            assert not Path(f"{dag}{leftover}").exists(), leftover
        # A range: the first free port of it.
        free = socket.socket()
        try:
            free.bind(("127.0.0.1", port + 1))
        except OSError:
            pytest.skip(f"port {port + 1} is taken too")
        free.close()
        run = OpenRun(dag, "--open-tcp", f"127.0.0.1:{port}-{port + 1}")
        runs.append(run)
        assert _address(dag) == ("127.0.0.1", port + 1)
        code, _out, err = run.finish()
        assert code == 0, err


def test_an_interface_by_its_name(tmp_path, runs):
    """``--open-tcp lo``: the interface's address (loopback's, here), written for
    clients; a client reaches the run through it."""
    dag = write_dag(tmp_path / "wf.dag", f"TASK A {LOG.format(name='A')}\n")
    run = OpenRun(dag, "--open-tcp", "lo")
    runs.append(run)
    host, port = _address(dag)
    with Client.connect(str(dag), channel="tcp") as client:
        assert client._sock.getpeername() == (host, port)
        assert client.info()["tasks"] == 1
    code, _out, err = run.finish()
    assert code == 0, err
    assert f"listening on TCP at 127.0.0.1:{port}" in err
