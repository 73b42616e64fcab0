"""The transports (pmc.transport): the embedded one with real worker processes and
socket pairs, the stream framing they share with the MPI transport's host sockets, and
the MPI transport itself under ``mpiexec`` (through MPI only, and through host sockets).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from faults.faultkit import mpi_ranks, wait_for
from pmctest import clean_env, comm, mpiexec

from pmc import log
from pmc.core import protocol
from pmc.core.protocol import WorkerConfig
from pmc.options import RunOptions
from pmc.runtime import worker
from pmc.runtime.startup import worker_config
from pmc.transport import TransportError
from pmc.transport.local import Forked, LocalMaster, LocalWorker, Serve, forks
from pmc.transport.mpisettings import mpi_settings
from pmc.transport.stream import RECV, frame, unframe


def _config(tmp: Path) -> WorkerConfig:
    opts = RunOptions(dag=str(tmp / "w.dag"), host_cpus=3, host_memory=1234,
                      keep_affinity=True)
    return worker_config(opts, str(tmp / "out.{rank}"), str(tmp / "err.{rank}"))._replace(
        log_level=log.WARN)


def _gather(t: LocalMaster, tag: int, ranks: set[int], timeout: float = 60.0
            ) -> dict[int, protocol.Message]:
    got: dict[int, protocol.Message] = {}
    deadline = time.monotonic() + timeout
    while set(got) != ranks:
        assert time.monotonic() < deadline, f"waiting for tag {tag} from {ranks - set(got)}"
        for src, msg in t.poll(1.0):
            if msg[0] == tag:
                got[src] = msg
    return got


# -- pmc's MPI settings -----------------------------------------------------------------


HYDRA_ONE_HOST = {"PMI_RANK": "0", "PMI_SIZE": "3", "PMI_FD": "9", "MPI_LOCALNRANKS": "3"}
HYDRA_TWO_HOSTS = {**HYDRA_ONE_HOST, "PMI_SIZE": "6"}
SLURM_PMI2 = {"PMI_RANK": "0", "PMI_SIZE": "3", "PMI_FD": "9", "PMI_JOBID": "17.0"}


@pytest.mark.parametrize(("environ", "settings"), [
    # mpiexec with every rank on this host: no shared-memory segment among them, and
    # UCX tries no network.
    (HYDRA_ONE_HOST, {"UCX_MEM_EVENTS": "no", "MPIR_CVAR_NOLOCAL": "1",
                      "UCX_TLS": "self,sysv", "UCX_MODULES": ""}),
    # Ranks on other hosts, or a launcher that does not say (srun --mpi=pmi2, Open
    # MPI): MPICH's own choice, so that ranks do not publish their whole address.
    (HYDRA_TWO_HOSTS, {"UCX_MEM_EVENTS": "no"}),
    (SLURM_PMI2, {"UCX_MEM_EVENTS": "no"}),
    ({"OMPI_COMM_WORLD_SIZE": "3"}, {"UCX_MEM_EVENTS": "no"}),
    # What the user set stays theirs.
    ({**HYDRA_ONE_HOST, "MPIR_CVAR_NOLOCAL": "0", "UCX_TLS": "tcp"},
     {"UCX_MEM_EVENTS": "no", "UCX_MODULES": ""}),
    ({**SLURM_PMI2, "UCX_MEM_EVENTS": "yes"}, {}),
])
def test_pmc_mpi_settings_by_launcher(environ: dict[str, str],
                                      settings: dict[str, str]) -> None:
    assert mpi_settings(environ) == settings


MOUNT_THEN_RUN = 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"'


def _can_mount_a_dev_shm() -> bool:
    """Whether this process may give a command a /dev/shm of its own (root, with the
    right to mount: not in an unprivileged container)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "sh", "-c", MOUNT_THEN_RUN, "sh", "true"],
                          capture_output=True, check=False).returncode == 0


@pytest.mark.mpi
@pytest.mark.parametrize("always_mpi", ["", "1"], ids=["no-mpi", "mpi"])
def test_seventeen_ranks_start_in_a_small_dev_shm(tmp_path: Path, always_mpi: str) -> None:
    # A container's /dev/shm is often 64 MB (podman's and docker's default). UCX's
    # POSIX shared memory kept its queues there, and 17 ranks on one host died as they
    # started (with UCX's own choice of transports, in 3 runs of 3); pmc's one-host
    # settings keep MPI out of it, when it starts MPI at all (PMC_ALWAYS_MPI).
    if not _can_mount_a_dev_shm():
        pytest.skip("needs the right to mount a small /dev/shm for the run (root, unshare)")
    (tmp_path / "w.dag").write_text("TASK A /bin/true\n")
    r = subprocess.run(["unshare", "-m", "sh", "-c", MOUNT_THEN_RUN, "sh", mpiexec(), "-n",
                        "17", sys.executable, "-m", "pmc", "run", "w.dag"],
                       cwd=tmp_path, env=clean_env(PMC_ALWAYS_MPI=always_mpi),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stat=\"ok\", tasks=1" in r.stdout


# -- stream framing ---------------------------------------------------------------------


def test_unframe_keeps_partial_messages() -> None:
    data = frame((1, "a")) + frame((2, b"x" * 100))
    buf = bytearray(data[:-10])
    out: list[protocol.Message] = []
    unframe(buf, out)
    assert out == [(1, "a")] and len(buf) == len(frame((2, b"x" * 100))) - 10
    buf += data[-10:]
    unframe(buf, out)
    assert out == [(1, "a"), (2, b"x" * 100)] and not buf


def test_task_specs_and_results_travel_as_plain_tuples() -> None:
    """A TASKS or RESULTS message names no record class on the wire (each record's
    pickle would run Python code at both ends) and is read back as the same records."""
    spec = protocol.TaskSpec(7, "t", "/bin/true", 1, 0, 1, None, (("f", "out"),), "ID7",
                             (0,), after=3, env=(("PMC_ARRAY_INDEX", "2"),))
    result = protocol.TaskResult(7, 1, 256, 1.5, 0.25, 0.1, 2048, "why",
                                 (("out", b"data"),), 0.05, 0.05, False, "/err", "tail")
    for msg in (protocol.tasks([spec, spec._replace(id=8)]),
                protocol.results([result], [(7, 1.5)])):
        data = frame(msg)
        assert b"TaskSpec" not in data and b"TaskResult" not in data
        out: list[protocol.Message] = []
        unframe(bytearray(data), out)
        assert out == [msg]
        (back,) = out
        assert type(back) is type(msg)
        assert all(type(r) is type(msg[1][0]) for r in back[1])
        assert back[1][0].id == 7


# -- the embedded transport -------------------------------------------------------------


def test_local_worker_end_over_a_socket_pair() -> None:
    mine, theirs = socket.socketpair()
    worker = LocalWorker(theirs.detach(), 3, 5)
    try:
        assert worker.rank == 3 and worker.size == 5 and worker.lost() == []
        assert worker.fileno() is not None
        assert worker.poll(0) == [] and worker.poll(0.05) == []
        big = b"y" * (RECV * 2 + 17)  # more than one read's buffer
        # From another thread: the socket buffer holds less than the message.
        sender = threading.Thread(target=mine.sendall, args=(
            frame(protocol.forward(7, "a.out", big)) + frame(protocol.shutdown(True)),))
        sender.start()
        got: list[tuple[int, protocol.Message]] = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += worker.poll(1.0)
        sender.join(10)
        assert got == [(0, protocol.forward(7, "a.out", big)), (0, protocol.shutdown(True))]
        assert isinstance(got[0][1], protocol.Forward) and got[0][1].data == big
        worker.send(0, protocol.bye(None))
        buf = bytearray(mine.recv(1 << 16))
        out: list[protocol.Message] = []
        unframe(buf, out)
        assert out == [protocol.bye(None)] and isinstance(out[0], protocol.Bye)
        mine.close()  # the master is gone
        with pytest.raises(TransportError):
            worker.poll(1.0)
    finally:
        worker.close()


def test_local_master_with_real_workers(tmp_path: Path) -> None:
    """CONFIG to each worker process, its HELLO back, SHUTDOWN, BYE: the start and end
    of every embedded run, through the socket pairs."""
    t = LocalMaster(2, env=clean_env())
    try:
        assert t.rank == 0 and t.size == 3 and t.fileno() is not None
        for rank in (1, 2):
            t.send(rank, protocol.config(_config(tmp_path)))
        hellos = _gather(t, protocol.HELLO, {1, 2})
        for msg in hellos.values():
            assert isinstance(msg, protocol.Hello)
            assert msg.version == protocol.VERSION and msg.cpus == 3 and msg.memory == 1234
        pids = {rank: msg.pid for rank, msg in hellos.items()}
        assert pids == {rank: p.pid for rank, p in t.procs.items()}
        for rank in (1, 2):
            t.send(rank, protocol.shutdown(False))
        _gather(t, protocol.BYE, {1, 2})
    finally:
        t.close()
    assert all(p.returncode == 0 for p in t.procs.values())


def test_local_master_reports_a_lost_worker(tmp_path: Path) -> None:
    t = LocalMaster(2, env=clean_env())
    try:
        for rank in (1, 2):
            t.send(rank, protocol.config(_config(tmp_path)))
        _gather(t, protocol.HELLO, {1, 2})
        t.procs[2].send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        lost: list[int] = []
        while not lost:
            assert time.monotonic() < deadline, "the killed worker was not reported"
            t.poll(0.5)
            lost = t.lost()
        assert lost == [2] and t.lost() == []
        with pytest.raises(TransportError):
            t.send(2, protocol.shutdown(False))
        t.send(1, protocol.shutdown(False))
        _gather(t, protocol.BYE, {1})
    finally:
        t.close()


def test_forked_workers_hold_only_their_own_socket(tmp_path: Path) -> None:
    """Workers forked from the master (as ``pmc run`` starts them): named pmc-worker-R,
    each in a process group of its own, and none holds another's socket: once the
    master's end of worker 1's pair closes, worker 1 leaves, though worker 2 (forked
    after the pair was made) lives on."""
    assert forks(), "a thread of an earlier test still runs"
    t = LocalMaster(2, env=clean_env(), serve=worker.serve)
    try:
        assert all(isinstance(p, Forked) for p in t.procs.values())
        for rank in (1, 2):
            t.send(rank, protocol.config(_config(tmp_path)))
        hellos = _gather(t, protocol.HELLO, {1, 2})
        for rank, proc in t.procs.items():
            assert hellos[rank].pid == proc.pid
            assert comm(proc.pid) == f"pmc-worker-{rank}"
            assert os.getpgid(proc.pid) == proc.pid
        conn = t.conns.pop(1)  # as if the master were gone, for worker 1
        t.sel.unregister(conn.sock)
        conn.sock.close()
        assert t.procs[1].wait(30) == 1
        assert t.procs[2].poll() is None
        t.send(2, protocol.shutdown(False))
        _gather(t, protocol.BYE, {2})
    finally:
        t.close()
    assert t.procs[2].returncode == 0


def test_what_the_master_wrote_before_the_fork_comes_out_once(tmp_path: Path) -> None:
    """A program that runs a workflow through pmc's entry after writing to a piped (so
    block-buffered) stdout: the forked workers do not write that text again."""
    dag = tmp_path / "d.dag"
    dag.write_text("TASK a /bin/echo from-the-task\n")
    program = ("import sys; sys.stdout.write('written before the run\\n'); "
               "from pmc.commands.cli import main; sys.exit(main(sys.argv[1:]))")
    env = clean_env()
    env.pop("PYTHONUNBUFFERED", None)
    r = subprocess.run([sys.executable, "-c", program, "run", "--workers", "2", "d.dag"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("written before the run") == 1, r.stdout
    assert r.stdout.count("from-the-task") == 1, r.stdout


@pytest.mark.parametrize("serve", [None, worker.serve], ids=["fresh", "forked"])
def test_a_worker_tells_the_master_why_it_failed(tmp_path: Path, serve: Serve | None) -> None:
    """Its loop dies of an unexpected exception: WORKER_FAILED with the traceback, then a
    non-zero exit."""
    t = LocalMaster(1, env=clean_env(), serve=serve)
    try:
        # A task whose spec is not a TaskSpec: the worker's loop cannot handle it.
        t.send(1, protocol.config(_config(tmp_path)))
        _gather(t, protocol.HELLO, {1})
        t.send(1, protocol.start(0, False, None))
        t.send(1, protocol.tasks(["not a task spec"]))  # type: ignore[list-item]
        (msg,) = _gather(t, protocol.WORKER_FAILED, {1}).values()
        assert isinstance(msg, protocol.WorkerFailed)
        host, text = msg.hostname, msg.traceback
        assert host == socket.gethostname()
        assert text.startswith("Traceback (most recent call last):")
        assert text.rstrip().splitlines()[-1].split(":")[0].endswith("Error")
        assert t.procs[1].wait(30) != 0
    finally:
        t.close()


# -- MPI ----------------------------------------------------------------------------------

_MPI_PROGRAM = r"""
import sys
from pmc.transport.mpi import MpiTransport

sockets, sleep = sys.argv[1] == "1", sys.argv[2] == "1"
t = MpiTransport(sleep_on_recv=sleep, host_sockets=sockets)
big = b"z" * (3 << 20)

def wait(n):
    got = []
    while len(got) < n:
        got += t.poll(None)
    return got

if t.rank == 0:
    for rank in range(1, t.size):
        for i in range(3):
            t.send(rank, ("ping", i))
        t.send(rank, ("big", big))
    got = wait(4 * (t.size - 1))
    for rank in range(1, t.size):
        mine = [m for src, m in got if src == rank]
        assert mine[:3] == [("pong", i, rank) for i in range(3)], mine
        assert mine[3][0] == "big" and mine[3][1] == len(big) and mine[3][2] in (0, 1), mine
        print(f"rank {rank} direct={mine[3][2]}")
    assert t.poll(0.05) == [] and t.lost() == []
    for rank in range(1, t.size):
        t.send(rank, ("bye",))
    print("master ok")
else:
    for src, m in wait(4):
        assert src == 0
        if m[0] == "ping":
            t.send(0, ("pong", m[1], t.rank))
        else:
            assert m == ("big", big)
            t.send(0, ("big", len(m[1]), int(t.fileno() is not None)))
    assert wait(1) == [(0, ("bye",))]
t.close()
"""


@pytest.mark.mpi
@pytest.mark.parametrize(("sockets", "sleep", "direct"), [
    ("1", "1", 1),  # the workers share the master's host: a Unix socket each
    ("0", "1", 0),  # every message through MPI, as between hosts
    ("1", "0", 0),  # --no-sleep-on-recv: blocking receives, no host sockets
])
def test_mpi_transport(tmp_path: Path, sockets: str, sleep: str, direct: int) -> None:
    program = tmp_path / "prog.py"
    program.write_text(_MPI_PROGRAM)
    r = subprocess.run([mpiexec(), "-n", "3", sys.executable, str(program), sockets, sleep],
                       cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "master ok" in r.stdout
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("rank")) == [
        f"rank {rank} direct={direct}" for rank in (1, 2)]


# -- every rank on one host: no MPI (pmc.transport.onehost) --------------------------------

_HOLD = "/bin/sh -c 'touch started.$PMC_TASK; while [ ! -e go ]; do sleep 0.05; done'"


def _loads_mpi(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "libmpi" in f.read()


@pytest.mark.mpi
@pytest.mark.parametrize(("how", "mpi"), [
    ("default", False),  # Hydra put every rank here: no rank loads the MPI library
    ("PMC_ALWAYS_MPI=1", True),  # asked for in the environment: MPI as across hosts
    ("--no-host-sockets", True),  # every message through MPI: it starts after the store
])
def test_ranks_on_one_host_start_mpi_only_when_asked(tmp_path: Path, how: str,
                                                     mpi: bool) -> None:
    (tmp_path / "w.dag").write_text(f"TASK a {_HOLD}\nTASK b {_HOLD}\n")
    env = clean_env(PMC_ALWAYS_MPI="1") if how.startswith("PMC_") else clean_env()
    args = [how] if how.startswith("--") else []
    proc = subprocess.Popen([mpiexec(), "-n", "3", sys.executable, "-m", "pmc", "run", *args,
                             "w.dag"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(list(tmp_path.glob("started.*"))) == 2, 60, "both tasks running")
        ranks = mpi_ranks(proc.pid)
        assert sorted(ranks) == [0, 1, 2], ranks
        loads = {rank: _loads_mpi(pid) for rank, pid in ranks.items()}
    finally:
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert 'stat="ok", tasks=2' in out + err
    assert loads == dict.fromkeys(range(3), mpi)
