"""Per-task accounting (pmc.runtime.accounting): the task's own peak memory and cpu, its
children's included; unknown rather than the worker's figure without cgroups;
--strict-limits through the cgroup memory limit.

Real runs, seen in the JSON event log, for the method the host gives pmc: the cgroup-v1
tests run where pmc may create v1 memory/cpuacct groups (root on a v1 or hybrid host, as
CI), the cgroup-v2 ones where a v2 memory controller is pmc's to use (root on a v2 host,
alone in its group or in the root group); each skips elsewhere, saying why. cgroup v2
is also checked against a fake cgroup2 tree (FakeCgroups: the kernel's side of the
files), which runs everywhere."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pmctest import clean_env, pmc, write_dag

from pmc.runtime.accounting import Accounting, Usage, cgroupfs

# What the host gives pmc, asked of a child process as a worker started from here would
# be (on a v2 host the worker may only leave a group it is alone in): the method a run
# gets and why, then why the v2 groups cannot be used ("" if they can).
_PROBE = """
from pmc.runtime.accounting import Accounting, cgroupfs
from pmc.runtime.accounting.groups import V2Groups
acc = Accounting(1, False)
print(acc.method)
print(acc.why)
acc.close()
v2 = V2Groups()
try:
    v2.setup()
    print("" if v2.peak else "no memory.peak (kernel < 5.19): peaks are unknown")
except cgroupfs.Unavailable as e:
    print(e)
except OSError as e:
    print(f"cannot create cgroup v2 groups: {e.strerror}")
finally:
    v2.close()
"""


def _host() -> dict[str, str]:
    """cgroup method -> why real runs cannot use it here ("": they can)."""
    out = subprocess.run([sys.executable, "-c", _PROBE], env=clean_env(), text=True,
                         capture_output=True, check=True).stdout.split("\n")
    method, why, v2_why = out[:3]
    return {"cgroup-v1": "" if method == "cgroup-v1" else why,
            "cgroup-v2": "" if method == "cgroup-v2" and not v2_why else
            v2_why or f"pmc uses {method} here"}


HOST = _host()
cgroup_methods = pytest.mark.parametrize("method", [
    pytest.param(m, marks=pytest.mark.skipif(bool(why), reason=f"no {m} here: {why}"))
    for m, why in HOST.items()])
PY = sys.executable
TOUCH = "b = b'x' * ({mb} << 20)"


def run(tmp_path: Path, dag_text: str, *args: str,
        env: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]]]:
    dag = write_dag(tmp_path / "a.dag", dag_text)
    r = pmc(["run", "--workers", "1", "--log-format", "json", "--log-file", "ev.jsonl",
             *args, dag.name], tmp_path, env=env)
    evs = [json.loads(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()]
    return r.returncode, evs


def ended(evs: list[dict[str, Any]], task: str) -> dict[str, Any]:
    return next(ev for ev in evs if ev["event"] in ("task.finished", "task.failed")
                and ev["task"] == task)


@cgroup_methods
def test_peak_memory_and_cpu_of_the_task_itself(tmp_path: Path, method: str) -> None:
    code, evs = run(tmp_path, f'TASK big {PY} -c "{TOUCH.format(mb=200)}"\n'
                              "TASK small /bin/true\n"
                              "EDGE big small\n")
    assert code == 0
    assert next(ev for ev in evs if ev["event"] == "workflow.started")["accounting"] \
        == method
    big = ended(evs, "big")
    assert 200 * 1024 <= big["max_rss_kb"] <= 220 * 1024  # 200 MB, within 10 %
    assert big["user_cpu"] is not None and big["system_cpu"] is not None
    # After a 200 MB task in the same slot: its own, not the worker's or the last task's.
    assert 0 < ended(evs, "small")["max_rss_kb"] < 4 * 1024


@cgroup_methods
def test_a_forking_task_counts_its_children(tmp_path: Path, method: str) -> None:
    # The parent holds 100 MB while its child touches another 100 MB: the tree's peak is
    # 200 MB, where any one process's RSS is about 100 MB.
    (tmp_path / "child.py").write_text(TOUCH.format(mb=100) + "\n")
    (tmp_path / "tree.py").write_text(
        f"import subprocess, sys\n{TOUCH.format(mb=100)}\n"
        "subprocess.run([sys.executable, 'child.py'], check=True)\n")
    code, evs = run(tmp_path, f"TASK tree {PY} tree.py\n")
    assert code == 0
    assert ended(evs, "tree")["max_rss_kb"] >= 200 * 1024


@cgroup_methods
def test_strict_limits_kill_through_the_cgroup(tmp_path: Path, method: str) -> None:
    # Address space is not memory: 1 GiB reserved untouched runs under -m 50 (RLIMIT_AS
    # would refuse it, as it breaks JVMs and Go); touching 200 MB is an OOM kill.
    reserve = "import mmap; m = mmap.mmap(-1, 1 << 30); m[0:1] = b'x'"
    code, evs = run(tmp_path, f'TASK reserve -m 50 {PY} -c "{reserve}"\n'
                              f'TASK hog -m 50 {PY} -c "{TOUCH.format(mb=200)}"\n',
                    "--strict-limits", "--limit-memory-by", "cgroup")
    assert code == 1
    assert next(ev for ev in evs if ev["event"] == "workflow.started")["memory_limits"] \
        == "cgroup"
    assert ended(evs, "reserve")["event"] == "task.finished"
    hog = ended(evs, "hog")
    assert hog["event"] == "task.failed" and hog["oom_killed"] is True
    assert "memory limit" in hog["error"]
    assert hog["status"] == 9


def test_without_cgroups_the_peak_is_unknown_not_the_workers(tmp_path: Path) -> None:
    code, evs = run(tmp_path, "TASK t /bin/true\n",
                    env=clean_env(PMC_NO_CGROUPS="1"))
    assert code == 0
    assert next(ev for ev in evs if ev["event"] == "workflow.started")["accounting"] \
        == "rusage"
    t = ended(evs, "t")
    assert t["max_rss_kb"] is None  # /bin/true's inherited high-water mark is the worker's
    assert t["user_cpu"] is None


def test_without_cgroups_a_peak_above_the_workers_is_the_tasks_own(tmp_path: Path) -> None:
    """rusage: a task over the worker's high-water mark reports its own peak, and a
    small task after it (the mark read again only when a figure could be the task's)
    still reports none."""
    code, evs = run(tmp_path, f'TASK big {PY} -c "{TOUCH.format(mb=200)}"\n'
                              "TASK small /bin/true\n"
                              "EDGE big small\n",
                    env=clean_env(PMC_NO_CGROUPS="1"))
    assert code == 0
    assert 200 * 1024 <= ended(evs, "big")["max_rss_kb"] <= 220 * 1024
    assert ended(evs, "small")["max_rss_kb"] is None


def test_task_accounting_rusage_is_used_even_where_cgroups_could_be(tmp_path: Path) -> None:
    code, evs = run(tmp_path, "TASK t /bin/true\n", "--task-accounting", "rusage")
    assert code == 0
    assert next(ev for ev in evs if ev["event"] == "workflow.started")["accounting"] \
        == "rusage"
    assert ended(evs, "t")["user_cpu"] is None


CGROUPS_HERE = not HOST["cgroup-v1"] or not HOST["cgroup-v2"]


@pytest.mark.parametrize(("args", "uses_cgroups"), [
    ((), False),  # auto, a text log: nothing would read the figures
    (("--strict-limits",), False),  # auto: RLIMIT_AS needs no group
    (("--strict-limits", "--limit-memory-by", "cgroup"), CGROUPS_HERE),  # the limit does
    (("--task-accounting", "cgroup"), CGROUPS_HERE),
])
def test_task_accounting_in_a_text_log_run(tmp_path: Path, args: tuple[str, ...],
                                           uses_cgroups: bool) -> None:
    dag = write_dag(tmp_path / "a.dag", "TASK t /bin/true\n")
    r = pmc(["run", "--workers", "1", "-v", *args, dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "Task accounting through rusage" in line]
    if uses_cgroups:
        assert not said
    else:
        assert len(said) == 1
        if not args:
            assert "--task-accounting auto: no task figures are written" in said[0]


def test_failed_task_names_its_stderr_and_last_lines(tmp_path: Path) -> None:
    script = "for i in $(seq 1 30); do echo line$i >&2; done; exit 3"
    code, evs = run(tmp_path, f"TASK bad /bin/sh -c '{script}'\n")
    assert code == 1
    bad = ended(evs, "bad")
    assert bad["error"] == "exit code 3"
    assert bad["stderr"] == str(tmp_path / "a.dag.err.1")
    assert bad["stderr_tail"].splitlines() == [f"line{i}" for i in range(21, 31)]


@cgroup_methods
def test_groups_of_a_killed_worker_are_removed(tmp_path: Path, method: str) -> None:
    """A worker killed with SIGKILL cannot remove its cgroups: its guard does. (The run
    goes on: a worker started in the lost one's place runs the task again, and this
    time it ends at once.)"""
    dag = write_dag(tmp_path / "k.dag", "TASK k /bin/sh -c '[ -e worker.pid ] && exit 0; "
                                        "echo $PPID > worker.pid; exec sleep 60'\n")
    proc = subprocess.Popen([PY, "-m", "pmc", "run", "--workers", "1",
                             "--task-accounting", "cgroup", dag.name],
                            cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        pid_file = tmp_path / "worker.pid"
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        groups = cgroupfs.own_groups()
        if method == "cgroup-v1":
            root = cgroupfs.CGROUP_ROOT
            dirs = [f"{root}/memory{groups['memory'].rstrip('/')}/pmc-{worker}",
                    f"{root}/cpuacct{groups['cpuacct'].rstrip('/')}/pmc-{worker}"]
        else:
            dirs = [f"{cgroupfs.v2_dir(groups[''])}/pmc-{worker}"]
        assert all(os.path.isdir(d) for d in dirs)
        os.kill(worker, signal.SIGKILL)
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 60
        while any(os.path.exists(d) for d in dirs):
            assert time.monotonic() < deadline, dirs
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- cgroup v2 against a fake cgroup2 tree ---------------------------------------------------

ME = os.getpid()
_real_open, _real_write, _real_pwrite = os.open, os.write, os.pwrite
_real_mkdir, _real_rmdir = os.mkdir, os.rmdir
V2_MEMORY = {"memory.current": "0", "memory.max": "max", "memory.peak": "0",
             "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0"}
V1_FILES = {"cgroup.procs": "", "memory.max_usage_in_bytes": "0",
            "memory.usage_in_bytes": "0", "memory.limit_in_bytes": "9223372036854771712",
            "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0",
            "cpuacct.usage": "0", "cpuacct.usage_user": "0", "cpuacct.usage_sys": "0"}


class FakeCgroups:
    """The kernel's side of cgroupfs on a tree in tmp_path, as far as pmc.runtime.accounting sees
    it: mkdir fills a group with the files of its controllers; a write to cgroup.procs
    moves the process, refused into a (non-root) group that hands controllers down;
    cgroup.subtree_control follows the "no internal processes" rule; a write to
    memory.peak resets it to memory.current, and opening it for writing fails where it
    is read-only (``peak`` "read-only", kernels before 6.12); any other write replaces the
    value; rmdir refuses a group with children or processes. Writes are recorded."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp_path
        self.v2 = tmp_path / "cg 2"  # mountinfo escapes the space
        self.v1 = tmp_path / "v1"
        self.peak = "resettable"  # or "read-only", "missing"
        self.writes: list[tuple[str, bytes]] = []
        self.own = self.v2
        monkeypatch.setattr(cgroupfs, "PROC_CGROUP", str(tmp_path / "proc-self-cgroup"))
        monkeypatch.setattr(cgroupfs, "MOUNTINFO", str(tmp_path / "proc-self-mountinfo"))
        monkeypatch.setattr(cgroupfs, "CGROUP_ROOT", str(self.v1))
        monkeypatch.setattr(os, "open", self._open)
        monkeypatch.setattr(os, "write", lambda fd, data: self._write(fd, data, _real_write))
        monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: self._write(
            fd, data, lambda fd, data: _real_pwrite(fd, data, offset)))
        monkeypatch.setattr(os, "mkdir", self._mkdir)
        monkeypatch.setattr(os, "rmdir", self._rmdir)

    def host(self, own: str = "/", *, controllers: str = "cpu io memory pids",
             passed: str = "", others: tuple[int, ...] = (), v1: bool = False) -> None:
        """This process in v2 group ``own`` (with ``others``), ``controllers`` available
        to it, ``passed`` in its subtree_control; the v1 memory and cpuacct hierarchies
        too with ``v1``."""
        _real_mkdir(self.v2)
        top = own == "/"
        self.set(self.v2, "cgroup.controllers", controllers)
        self.set(self.v2, "cgroup.subtree_control", passed if top else controllers)
        self.set(self.v2, "cgroup.procs", "")
        self.set(self.v2, "cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0")
        self.own = self.v2 / own.strip("/")
        if not top:
            os.mkdir(self.own)
            self.set(self.own, "cgroup.subtree_control", passed)
        self.set(self.own, "cgroup.procs", "\n".join(str(p) for p in (ME, *others)))
        lines = [f"0::{own}"]
        mounts = [f"41 31 0:38 / {str(self.v2).replace(' ', chr(92) + '040')} rw,relatime "
                  "- cgroup2 cgroup2 rw"]
        if v1:
            lines[:0] = ["4:memory:/", "2:cpuacct:/"]
            _real_mkdir(self.v1)
            for i, c in enumerate(("memory", "cpuacct")):
                _real_mkdir(self.v1 / c)
                self.set(self.v1 / c, "cgroup.procs", str(ME))
                mounts.append(f"{35 + i} 31 0:{32 + i} / {self.v1 / c} rw - cgroup cgroup rw,{c}")
        (self.tmp / "proc-self-cgroup").write_text("\n".join(lines) + "\n")
        (self.tmp / "proc-self-mountinfo").write_text("\n".join(mounts) + "\n")

    def set(self, group: Path, name: str, value: str) -> None:
        (group / name).write_text(value + "\n" if value else "")

    def get(self, group: Path, name: str) -> str:
        return (group / name).read_text().strip()

    def procs(self, group: Path) -> list[int]:
        return [int(p) for p in self.get(group, "cgroup.procs").split()]

    @property
    def pmc(self) -> Path:
        return self.own / f"pmc-{ME}"

    # -- the kernel's side ------------------------------------------------------------------

    def _hierarchy(self, path: str | os.PathLike[str]) -> Path | None:
        p = Path(path)
        for root in (self.v2, self.v1 / "memory", self.v1 / "cpuacct"):
            if p == root or root in p.parents:
                return root
        return None

    def _open(self, path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if (str(path).endswith("/memory.peak") and self._hierarchy(path) == self.v2
                and flags & (os.O_WRONLY | os.O_RDWR) and self.peak == "read-only"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return _real_open(path, flags, mode, **kw)

    def _write(self, fd: int, data: bytes, real: Any) -> int:
        try:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            path = None
        root = self._hierarchy(path) if path else None
        if path is None or root is None:
            return int(real(fd, data))
        self.writes.append((str(path), bytes(data)))
        group, name, text = path.parent, path.name, bytes(data).decode().strip()
        if name == "cgroup.procs":
            if root == self.v2 and group != root and self.get(group, "cgroup.subtree_control"):
                raise OSError(errno.EBUSY, "Device or resource busy")
            for procs in root.rglob("cgroup.procs"):
                self.set(procs.parent, "cgroup.procs",
                         "\n".join(p for p in procs.read_text().split() if p != text))
            self.set(group, "cgroup.procs", "\n".join([*self.get(group, name).split(), text]))
        elif name == "cgroup.subtree_control":
            passed = self.get(group, name).split()
            children = [c for c in group.iterdir() if c.is_dir()]
            for word in text.split():
                c = word[1:]
                if word[0] == "+" and c not in passed:
                    if c not in self.get(group, "cgroup.controllers").split():
                        raise OSError(errno.ENOENT, "No such file or directory")
                    if group != root and self.procs(group):
                        raise OSError(errno.EBUSY, "Device or resource busy")
                    passed.append(c)
                elif word[0] == "-" and c in passed:
                    if any(c in self.get(g, name).split() for g in children):
                        raise OSError(errno.EBUSY, "Device or resource busy")
                    passed.remove(c)
            self.set(group, name, " ".join(passed))
            for g in children:  # their files come and go with the controllers
                self.set(g, "cgroup.controllers", " ".join(passed))
                for file, value in self._memory_files().items():
                    if "memory" not in passed:
                        (g / file).unlink(missing_ok=True)
                    elif not (g / file).exists():
                        self.set(g, file, value)
        elif name == "memory.peak":
            self.set(group, name, self.get(group, "memory.current"))
        else:
            self.set(group, name, text)
        return len(data)

    def _mkdir(self, path: Any, mode: int = 0o777, **kw: Any) -> None:
        _real_mkdir(path, mode, **kw)
        root = self._hierarchy(path)
        group = Path(path)
        if root == self.v2:
            ctrls = self.get(group.parent, "cgroup.subtree_control")
            files = {"cgroup.controllers": ctrls, "cgroup.subtree_control": "",
                     "cgroup.procs": "", "cgroup.events": "populated 0\nfrozen 0",
                     "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0"}
            if "memory" in ctrls.split():
                files.update(self._memory_files())
        elif root is not None:
            files = V1_FILES
        else:
            return
        for name, value in files.items():
            self.set(group, name, value)

    def _memory_files(self) -> dict[str, str]:
        return {f: v for f, v in V2_MEMORY.items()
                if f != "memory.peak" or self.peak != "missing"}

    def _rmdir(self, path: Any, **kw: Any) -> None:
        group = Path(path)
        if self._hierarchy(group) is not None:
            if any(c.is_dir() for c in group.iterdir()) or self.procs(group):
                raise OSError(errno.EBUSY, "Device or resource busy", str(path))
            for f in group.iterdir():
                f.unlink()
        _real_rmdir(path, **kw)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCgroups]:
    monkeypatch.delenv("PMC_NO_CGROUPS", raising=False)
    yield FakeCgroups(tmp_path, monkeypatch)


def task(fake: FakeCgroups, acc: Accounting, *, memory: int = 0, peak: int = 0,
         user: float = 0.0, system: float = 0.0, oom_kills: int = 0, status: int = 0,
         current: int = 0, populated: int = 0) -> tuple[Usage, Path]:
    """One task through a slot: the worker in it for the spawn, then out; the kernel's
    counters of the slot (cumulative, as the kernel's) set as the task leaves them."""
    slot = acc.enter(memory)
    assert slot is not None, acc.problem
    group = Path(slot.dirs[0])
    assert fake.procs(group) == [ME]  # the child would inherit it
    acc.leave()
    assert ME not in fake.procs(group)
    if (group / "memory.peak").exists():
        fake.set(group, "memory.peak", str(peak))
    fake.set(group, "cpu.stat", f"usage_usec {int((user + system) * 1e6)}\n"
                                f"user_usec {int(user * 1e6)}\nsystem_usec {int(system * 1e6)}")
    fake.set(group, "memory.events", V2_MEMORY["memory.events"].replace(
        "oom_kill 0", f"oom_kill {oom_kills}"))
    fake.set(group, "memory.current", str(current))
    fake.set(group, "cgroup.events", f"populated {populated}\nfrozen 0")
    if populated:
        fake.set(group, "cgroup.procs", "1")  # a process it left behind
    fake.writes.clear()
    # The rusage is not looked at for a task with a slot.
    return acc.collect(slot, resource.getrusage(resource.RUSAGE_CHILDREN), status), group


def slot_dirs(fake: FakeCgroups) -> list[str]:
    return sorted(p.name for p in fake.pmc.iterdir() if p.is_dir())


@pytest.mark.parametrize(("v1", "controllers", "method"), [
    (True, "cpu io memory pids", "cgroup-v1"),
    (False, "cpu io memory pids", "cgroup-v2"),
    (False, "cpu io pids", "rusage"),
])
def test_methods_are_tried_v1_then_v2_then_rusage(fake: FakeCgroups, v1: bool,
                                                   controllers: str, method: str) -> None:
    fake.host("/", controllers=controllers, v1=v1)
    acc = Accounting(2, False)
    try:
        assert acc.method == method
        if method == "cgroup-v1":
            assert acc.parent == (f"{fake.v1}/memory/pmc-{ME}", f"{fake.v1}/cpuacct/pmc-{ME}")
            assert not fake.pmc.exists()
        elif method == "cgroup-v2":
            assert (acc.why, acc.parent) == ("", (str(fake.pmc),))
            assert acc.limits == "rlimit", "no memory limits asked of the cgroups"
            assert fake.get(fake.pmc, "cgroup.subtree_control") == "memory"
            assert slot_dirs(fake) == ["slot-1", "slot-2"]
            assert fake.procs(fake.v2) == [ME]  # the root group may hold processes
        else:
            assert acc.limits == "rlimit"
            assert acc.why == ("no v1 memory and cpuacct controllers; no memory controller in "
                               f"cgroup v2 for pmc's group / ({fake.v2}/cgroup.controllers: "
                               "cpu io pids)")
            assert acc.enter(100) is None and acc.problem == ""
    finally:
        acc.close()
    assert not fake.pmc.exists()


def test_v2_peak_is_reset_and_cpu_counted_from_the_last_task(fake: FakeCgroups) -> None:
    fake.host("/", passed="memory")
    acc = Accounting(1, False)
    try:
        used, group = task(fake, acc, peak=200 << 20, user=3.0, system=1.0, current=1 << 20)
        assert (used.max_rss_kb, used.user_cpu, used.system_cpu, used.oom_killed) \
            == (200 << 10, 3.0, 1.0, False)
        # Reset through the file the slot holds open (the kernel resets per open file):
        # the peak is now what is charged (1 MiB, under RESIDUAL_MAX: the slot is kept).
        assert fake.writes == [(str(group / "memory.peak"), b"0")]
        assert fake.get(group, "memory.peak") == str(1 << 20)
        used, again = task(fake, acc, peak=5 << 20, user=3.5, system=1.25)
        assert again == group
        assert (used.max_rss_kb, used.user_cpu, used.system_cpu) == (5 << 10, 0.5, 0.25)
    finally:
        acc.close()


def test_v2_strict_limits_go_to_memory_max_and_oom_kills_are_told(fake: FakeCgroups) -> None:
    fake.host("/")
    acc = Accounting(1, True)
    try:
        # A child killed by the OOM killer, the task itself surviving: not its OOM kill.
        used, group = task(fake, acc, memory=50, oom_kills=1, status=0)
        assert fake.get(group, "memory.max") == str(50 << 20) and not used.oom_killed
        # Killed (SIGKILL), the count unchanged since the slot was freed: not an OOM kill.
        used, again = task(fake, acc, memory=50, oom_kills=1, status=signal.SIGKILL)
        assert again == group and not used.oom_killed
        used, again = task(fake, acc, memory=0, oom_kills=1)
        assert again == group and fake.get(group, "memory.max") == "max"
        used, again = task(fake, acc, memory=50, oom_kills=2, status=signal.SIGKILL)
        assert again == group and used.oom_killed
        assert not group.exists() and slot_dirs(fake) == ["slot-2"]  # a fresh group
    finally:
        acc.close()


def test_v2_without_strict_limits_memory_max_stays_max(fake: FakeCgroups) -> None:
    fake.host("/")
    acc = Accounting(1, False)
    try:
        used, group = task(fake, acc, memory=50, oom_kills=1, status=signal.SIGKILL)
        assert fake.get(group, "memory.max") == "max" and not used.oom_killed
        assert not any(path.endswith("memory.max") for path, _ in fake.writes)
    finally:
        acc.close()


def test_v2_a_peak_that_cannot_be_reset_gets_a_group_per_task(fake: FakeCgroups) -> None:
    # Kernels 5.19 to 6.11: memory.peak is read-only, and a reused group's would be the
    # largest of all its tasks.
    fake.peak = "read-only"
    fake.host("/")
    acc = Accounting(1, False)
    try:
        assert acc.method == "cgroup-v2"
        used, first = task(fake, acc, peak=200 << 20, user=1.0)
        assert used.max_rss_kb == 200 << 10 and used.user_cpu == 1.0
        assert not first.exists() and slot_dirs(fake) == ["slot-2"]
        used, second = task(fake, acc, peak=1 << 20, user=0.5)
        assert second != first and used.max_rss_kb == 1 << 10 and used.user_cpu == 0.5
        assert not any(path.endswith("memory.peak") for path, _ in fake.writes)
    finally:
        acc.close()


def test_v2_without_memory_peak_the_peak_is_unknown(fake: FakeCgroups) -> None:
    fake.peak = "missing"  # kernels before 5.19
    fake.host("/")
    acc = Accounting(1, False)
    try:
        used, _group = task(fake, acc, user=2.0, system=0.5)
        assert (used.max_rss_kb, used.user_cpu, used.system_cpu) == (None, 2.0, 0.5)
    finally:
        acc.close()


@pytest.mark.parametrize(("current", "populated", "kept"), [
    (1 << 20, 0, True), (3 << 20, 0, False), (0, 1, False)])
def test_v2_a_slot_with_leftovers_is_replaced(fake: FakeCgroups, current: int,
                                              populated: int, kept: bool) -> None:
    fake.host("/")
    acc = Accounting(1, False)
    try:
        _used, group = task(fake, acc, current=current, populated=populated)
        # Replaced by slot-2; one still holding processes stays until they are gone.
        assert slot_dirs(fake) == (["slot-1"] if kept else
                                   ["slot-1", "slot-2"] if populated else ["slot-2"])
        _used, again = task(fake, acc)
        assert (again == group) == kept
        if group.exists():
            fake.set(group, "cgroup.procs", "")  # its process gone, close may remove it
    finally:
        acc.close()


def test_v2_group_shared_with_other_processes_is_left_alone(fake: FakeCgroups) -> None:
    fake.host("/job", others=(1,))
    acc = Accounting(1, False)
    try:
        assert acc.method == "rusage"
        assert ("memory is not enabled under pmc's group /job, and cannot be: the group "
                "holds processes other than this worker (1)") in acc.why
    finally:
        acc.close()
    assert fake.get(fake.own, "cgroup.subtree_control") == ""
    assert fake.procs(fake.own) == [ME, 1]
    assert not fake.pmc.exists()


def test_v2_worker_alone_in_its_group_moves_to_a_leaf(fake: FakeCgroups) -> None:
    fake.host("/job")
    acc = Accounting(1, True)
    leaf = fake.pmc / "worker"
    try:
        assert acc.method == "cgroup-v2"
        assert fake.procs(leaf) == [ME] and fake.procs(fake.own) == []
        assert fake.get(fake.own, "cgroup.subtree_control") == "memory"
        assert fake.get(fake.pmc, "cgroup.subtree_control") == "memory"
        used, _group = task(fake, acc, memory=10, peak=3 << 20)
        assert used.max_rss_kb == 3 << 10
        assert fake.procs(leaf) == [ME]  # back from the slot into the leaf
    finally:
        acc.close()
    # As found: the group hands nothing down, and holds the worker again.
    assert fake.get(fake.own, "cgroup.subtree_control") == ""
    assert fake.procs(fake.own) == [ME]
    assert not fake.pmc.exists()


def test_v2_groups_of_dead_workers_are_swept(fake: FakeCgroups) -> None:
    fake.host("/", passed="memory")
    child = subprocess.Popen(["true"])
    child.wait()
    dead = fake.v2 / f"pmc-{child.pid}"
    for d in (dead, dead / "slot-3", dead / "worker", fake.v2 / "pmc-1"):
        os.mkdir(d)
    acc = Accounting(1, False)
    try:
        assert acc.method == "cgroup-v2"
        assert not dead.exists()
        assert (fake.v2 / "pmc-1").exists()  # pid 1 lives
    finally:
        acc.close()


@pytest.mark.parametrize(("own", "mount_root", "expected"), [
    ("/", "/", "/sys/fs/cgroup"),
    ("/user.slice/x.scope", "/", "/sys/fs/cgroup/user.slice/x.scope"),
    ("/kubepods/pod1/c1", "/kubepods/pod1", "/sys/fs/cgroup/c1"),  # a subtree mounted
])
def test_v2_group_dir_from_mountinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     own: str, mount_root: str, expected: str) -> None:
    info = tmp_path / "mountinfo"
    info.write_text("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
                    f"41 31 0:38 {mount_root} /sys/fs/cgroup rw shared:9 - cgroup2 cgroup2 rw\n")
    monkeypatch.setattr(cgroupfs, "MOUNTINFO", str(info))
    assert cgroupfs.v2_dir(own) == expected
