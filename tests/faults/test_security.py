"""Security properties of the runtime.

- No shell anywhere: shell syntax in a task's arguments, a forwarding destination, the
  host script's path or the DAG's own file name reaches the program literally.
- The metrics endpoint listens on loopback unless another address is configured.
- Output, rescue and log files are created with the user's umask, never world-writable.
- The DAG lock holds against a second run, embedded or under MPI, in either order.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import urllib.request
from pathlib import Path

import pytest
from faultkit import (
    clean_env,
    descendants,
    finish,
    mpi_argv,
    mpi_ranks,
    pmc_argv,
    start,
    wait_for,
)
from pmctest import rescue_done

pytestmark = pytest.mark.faults

HOSTILE_ARGS = ["$(touch pwned)", ";touch pwned", "`touch pwned`", "&& touch pwned",
                "| touch pwned", "> pwned", "$HOME", "a'b", 'x"y', "*"]


def dag_quote(arg: str) -> str:
    if "'" in arg:
        return '"' + arg + '"'
    return "'" + arg + "'"


@pytest.mark.parametrize("mode", ["local", "mpi"])
def test_arguments_reach_the_program_literally(mode: str, tmp_path: Path) -> None:
    quoted = " ".join(dag_quote(a) for a in HOSTILE_ARGS)
    (tmp_path / "w.dag").write_text(
        f"TASK args /usr/bin/printf '[%s]\\n' {quoted}\n"
        "TASK fwd -f 'X=$(touch pwned).out' /bin/sh -c 'echo piped >&$X'\n"
        "TASK ffwd -F 'f.dat=;touch pwned' /bin/sh -c 'echo filed > f.dat'\n")
    args = ["run", "w.dag", "-o", "out.txt"]
    argv = pmc_argv([*args, "--workers", "2"]) if mode == "local" else mpi_argv(3, args)
    assert finish(start(argv, tmp_path), 60) == 0, (tmp_path / "run.stderr").read_text()
    out = (tmp_path / "out.txt").read_text()
    for arg in HOSTILE_ARGS:
        assert f"[{arg}]\n" in out, f"{arg!r} did not arrive as one literal argument"
    assert (tmp_path / "$(touch pwned).out").read_text() == "piped\n"
    assert (tmp_path / ";touch pwned").read_text() == "filed\n"
    assert not (tmp_path / "pwned").exists()


def test_hostile_file_names(tmp_path: Path) -> None:
    """The DAG's file name and the host script's path are never interpreted either."""
    name = "$(touch pwned);`touch pwned`.dag"
    (tmp_path / name).write_text("TASK A /bin/echo ok\n")
    r = subprocess.run(pmc_argv(["run", name, "--workers", "1",
                                 "--host-script", "./$(touch pwned).sh"]),
                       cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert "[error] Unable to exec host script: No such file or directory\n" in r.stderr
    assert "[fatal] Worker 1: Host script failed with status 256\n" in r.stderr
    r = subprocess.run(pmc_argv(["run", name, "--workers", "1"]), cwd=tmp_path,
                       env=clean_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert rescue_done(tmp_path / f"{name}.rescue") == ["A"]
    assert not (tmp_path / "pwned").exists()


# -- metrics endpoint ---------------------------------------------------------------------

def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of the TCP sockets ``pid`` listens on, from /proc."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []  # exited meanwhile
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.readlines()[1:]
        except OSError:
            return []
        for line in rows:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:
                continue
            addr_hex, port_hex = local.split(":")
            raw = bytes.fromhex(addr_hex)
            # /proc prints the address as 32-bit words in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.append((socket.inet_ntop(family, raw), int(port_hex, 16)))
    return out


@pytest.mark.parametrize(("bind", "expect"), [(None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
def test_metrics_endpoint_binds_loopback_unless_configured(bind: str | None, expect: str,
                                                           tmp_path: Path) -> None:
    (tmp_path / "w.dag").write_text(
        "TASK A /bin/sh -c 'while [ ! -e release ]; do sleep 0.1; done'\n")
    args = ["run", "w.dag", "--workers", "1", "--metrics-port", "0"]
    if bind:
        args += ["--metrics-bind", bind]
    proc = start(pmc_argv(args), tmp_path, env=clean_env(PMC_METRICS_LINGER="0"))
    try:
        wait_for(lambda: "Metrics: serving" in (tmp_path / "run.stderr").read_text()
                 or proc.poll() is not None, 60, "the metrics endpoint")
        found = listening(proc.pid)
        assert [a for a, _p in found] == [expect], found
        port = found[0][1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.status == 200
        for pid in descendants(proc.pid):
            assert not listening(pid), "workers and tasks listen on nothing"
    finally:
        (tmp_path / "release").touch()
    assert finish(proc, 60) == 0, (tmp_path / "run.stderr").read_text()


# -- file modes ---------------------------------------------------------------------------

OUTPUTS_DAG = """\
TASK A -f X=piped.txt -F f.dat=filed.txt /bin/sh -c 'echo a; echo e >&2; echo p >&$X; echo f > f.dat'
TASK B /bin/sh -c 'echo b; exit 1'
"""  # noqa: E501


@pytest.mark.parametrize("umask", [0o002, 0o022, 0o077])
def test_files_follow_the_umask(umask: int, tmp_path: Path) -> None:
    (tmp_path / "w.dag").write_text(OUTPUTS_DAG)
    (tmp_path / "p.dag").write_text(OUTPUTS_DAG)
    mine = {"w.dag", "p.dag"}

    def run(args: list[str]) -> int:
        r = subprocess.run(pmc_argv(args), cwd=tmp_path, env=clean_env(),
                           capture_output=True, timeout=60,
                           preexec_fn=lambda: os.umask(umask))
        return r.returncode

    # B fails on purpose; its output is merged into -o / -e all the same.
    assert run(["run", "w.dag", "--workers", "1", "--jobstate-log", "--log-file", "pmc.log",
                "--metrics-textfile", "w.prom", "-r", "w.rescue", "-o", "w.out",
                "-e", "w.err"]) == 1
    assert run(["run", "p.dag", "--workers", "1", "--monitord-hack", "-o", "o.txt",
                "-e", "e.txt"]) == 1
    created = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()
               if p.is_file() and p.name not in mine}
    for expected in ("w.rescue", "pmc.log", "jobstate.log", "w.prom", "w.dag.resource",
                     "w.out", "w.err", "piped.txt", "filed.txt", "p.dag.rescue",
                     "A.out.000", "A.err.000", "p.dag.dagman.out"):
        assert expected in created, sorted(created)
    allowed = 0o666 & ~umask
    bad = {name: oct(mode) for name, mode in created.items()
           if mode & ~allowed or mode & stat.S_IWOTH}
    assert not bad, f"files not created with umask {umask:03o}: {bad}"


# -- the DAG lock -------------------------------------------------------------------------

BLOCK_DAG = """\
TASK A /bin/sh -c 'echo A >> ran.log; while [ ! -e release ]; do sleep 0.1; done'
TASK B /bin/sh -c 'echo B >> ran.log'
EDGE A B
"""


def runner(mode: str) -> list[str]:
    if mode == "local":
        return pmc_argv(["run", "w.dag", "--workers", "1"])
    return mpi_argv(2, ["run", "w.dag"])


PAIRS = [("local", "local"), ("local", "mpi"), ("mpi", "local"), ("mpi", "mpi")]


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=[f"{a}-then-{b}" for a, b in PAIRS])
def test_second_run_is_locked_out(first: str, second: str, tmp_path: Path) -> None:
    (tmp_path / "w.dag").write_text(BLOCK_DAG)
    a = start(runner(first), tmp_path, tmp_path / "a")
    try:
        wait_for(lambda: (tmp_path / "ran.log").exists(), 60, "the first run's task")
        if first == "mpi":
            assert mpi_ranks(a.pid)
        rescue_before = (tmp_path / "w.dag.rescue").read_bytes()
        b = start(runner(second), tmp_path, tmp_path / "b")
        code = finish(b, 60, "the second run (it must not wait for the lock)")
        err = (tmp_path / "b.stderr").read_text()
        assert code == 1, err
        assert "DAG file is already locked by another process: w.dag" in err
        assert (tmp_path / "w.dag.rescue").read_bytes() == rescue_before
        assert a.poll() is None, "the first run goes on"
    finally:
        (tmp_path / "release").touch()
    assert finish(a, 60) == 0, (tmp_path / "a.stderr").read_text()
    assert (tmp_path / "ran.log").read_text() == "A\nB\n", "the second run ran nothing"
