"""Helpers for fault injection: start pmc as a real process tree, find its processes
through /proc (by parentage or by a unique marker in the DAG's commands), measure them,
and make sure nothing a test started outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from pmctest import clean_env, comm, mpiexec


def proc_stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, pgid, sid) of a live process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] == b"Z":
        return None  # a zombie has exited; only its parent's wait is missing
    return int(fields[1]), int(fields[2]), int(fields[3])


def is_worker(pid: int, master: int) -> bool:
    """A worker of ``master``: its direct child named pmc-worker-R. (A task between fork
    and exec still has its worker's name, one level further down.)"""
    st = proc_stat(pid)
    return st is not None and st[0] == master and worker_rank(pid) is not None


def worker_rank(pid: int) -> int | None:
    """The rank in an embedded worker's name (``ps -o comm``: pmc-worker-R), else None."""
    name = comm(pid)
    prefix = "pmc-worker-"
    return int(name[len(prefix):]) if name.startswith(prefix) else None


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def alive(pid: int) -> bool:
    return proc_stat(pid) is not None


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        st = proc_stat(pid)
        if st is not None:
            children.setdefault(st[0], []).append(pid)
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def with_marker(marker: str) -> set[int]:
    """Live processes whose command line contains ``marker``."""
    me = os.getpid()
    return {pid for pid in all_pids() if pid != me and marker in cmdline(pid) and alive(pid)}


def environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return {}
    out = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def mpi_ranks(launcher_pid: int) -> dict[int, int]:
    """rank -> pid of the MPI processes started by ``launcher_pid`` (mpiexec). A worker
    rank is the child of the process the launcher started (its keeper, forked from it:
    pmc.runtime.rankshim)."""
    found: dict[int, set[int]] = {}
    for pid in descendants(launcher_pid):
        rank = environ(pid).get("PMI_RANK")
        if rank is not None and " -m pmc run " in cmdline(pid):
            found.setdefault(int(rank), set()).add(pid)
    out = {}
    for rank, pids in found.items():
        parent = {p: (proc_stat(p) or (0,))[0] for p in pids}
        # The one the launcher started; below it the rank, below that perhaps a task
        # between fork and exec (still showing its worker's command line).
        top = [p for p in pids if parent[p] not in pids]
        if not top:
            continue
        below = [p for p in pids if parent[p] == top[0]]
        out[rank] = below[0] if below else top[0]
    return out


def rank_keepers(launcher_pid: int) -> dict[int, int]:
    """rank -> pid of the processes the launcher started for worker ranks (their
    keepers, pmc.runtime.rankshim, named ``pmc-keeper``)."""
    ranks = mpi_ranks(launcher_pid)
    out = {}
    for rank, pid in ranks.items():
        st = proc_stat(pid)
        if st is not None and comm(st[0]) == "pmc-keeper":
            out[rank] = st[0]
    return out


def status_kb(pid: int, field: str) -> int:
    """A ``kB`` field (VmRSS, VmHWM) of /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_for(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(step)


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """Wait until none of ``pids`` is alive; return the survivors (empty on success)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {p for p in pids if alive(p)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def kill_groups(pids: set[int]) -> None:
    """SIGKILL the process groups of processes this test started (clean-up only)."""
    for pid in pids:
        st = proc_stat(pid)
        if st is None:
            continue
        try:
            if st[1] > 1 and st[1] != os.getpgrp():
                os.killpg(st[1], signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def pmc_argv(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pmc", *args]


def mpi_argv(n: int, args: Sequence[str]) -> list[str]:
    return [mpiexec(), "-n", str(n), sys.executable, "-m", "pmc", *args]


def start(argv: Sequence[str], cwd: Path, out: Path | None = None,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start pmc (or mpiexec) with stdout/stderr in files ``out``.stdout / ``out``.stderr."""
    out = out or cwd / "run"
    with open(f"{out}.stdout", "ab") as so, open(f"{out}.stderr", "ab") as se:
        return subprocess.Popen(list(argv), cwd=cwd, env=env or clean_env(), stdout=so,
                                stderr=se, stdin=subprocess.DEVNULL)


def finish(proc: subprocess.Popen[bytes], timeout: float, what: str = "pmc") -> int:
    """Wait for ``proc``; a hang fails the test (and kills the process tree)."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        tree = descendants(proc.pid) | {proc.pid}
        # Orphans of the run (a dead rank's tasks or guard, now init's) are no longer in
        # the tree, yet may hold what the launcher waits for: those working in its
        # directory are named too, with their parent and group.
        where = _cwd(proc.pid)
        strays = {p for p in all_pids() if where and _cwd(p) == where} - tree
        shown = "; ".join(f"{p} ({proc_stat(p)}): {cmdline(p)[:100]}"
                          for p in sorted(tree | strays))
        stderr = _tail(Path(where) / "run.stderr") if where else ""
        kill_groups(tree | strays)
        proc.wait()
        raise AssertionError(f"{what} did not finish within {timeout:g} s: {shown}"
                             f"\n--- its stderr (last lines):\n{stderr}") from None


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(none)"


def new_marker() -> str:
    return f"pmcfault{uuid.uuid4().hex[:12]}"



class PeakRss:
    """Samples VmHWM (peak RSS, kB) of a process and its pmc descendants (workers) every
    20 ms while it runs. Per process, unlike a wait4() rusage, which also counts the
    memory of the parent that forked the child."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and alive(self.root):
            pids = {"master": self.root}
            for pid in descendants(self.root):
                if is_worker(pid, self.root):
                    pids[f"worker {worker_rank(pid)}"] = pid
            for role, pid in pids.items():
                try:
                    self.peaks[role] = max(self.peaks.get(role, 0), status_kb(pid, "VmHWM"))
                except (OSError, KeyError, IndexError):
                    pass
            time.sleep(0.02)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return self.peaks
