"""Per-task accounting and memory limits: peak memory and user/system cpu of a task's
whole process tree, and ``--strict-limits`` memory enforcement, through cgroups where
the worker may create them; what a worker can say without them otherwise.

Methods, chosen once per worker (``Accounting.method``, reported in the run's start
event):

- ``cgroup-v1``: the v1 ``memory`` and ``cpuacct`` controllers (v1 or hybrid hosts). The
  worker creates ``pmc-<pid>/slot-<n>`` under its own group in each, one pair per task
  slot, reused from task to task: per task, the worker moves itself into the slot's
  groups, spawns the task (which inherits them, before it can run or fork anything), and
  moves itself back — four small writes instead of a mkdir/rmdir pair per task (which
  cost ~40 % of a spawn here). Between tasks the peak and the cpu counters are reset.
  Figures: ``memory.max_usage_in_bytes`` (resident + page cache charged to the task's
  processes), ``cpuacct.usage_user``/``usage_sys``. A slot group still holding processes
  (a task's daemonised leftovers), or more than ``RESIDUAL_MAX`` charged after a reset,
  is replaced by a fresh one, so one task's figures never include another's.
- ``rusage`` (elsewhere, cgroup v2 included for now): ``wait4``'s rusage. A child
  started from the worker inherits the worker's RSS high-water mark through exec, so its
  ``ru_maxrss`` is the task's own only when it exceeds the worker's at the spawn; below
  that the peak is unknown (None), never the worker's figure. Its cpu covers the
  processes the task waited for.

Memory limits (``--strict-limits``, ``Accounting.limits``): ``cgroup`` sets the slot
group's ``memory.limit_in_bytes`` to the task's ``-m`` (a task over it is killed by the
kernel and reported as an OOM kill); ``rlimit`` is RLIMIT_AS, set by the worker's
pre-exec hook (it breaks programs that reserve address space: JVMs, Go).
"""

from __future__ import annotations

import os
import resource

from pmc import log

CGROUP_ROOT = "/sys/fs/cgroup"
RESIDUAL_MAX = 2 << 20  # bytes charged to an idle slot group beyond which it is replaced
_UNLIMITED = b"-1"


def _own_groups() -> dict[str, str]:
    """controller -> this process's group path, from /proc/self/cgroup (v1 lines)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _hid, ctrls, path = line.rstrip("\n").split(":", 2)
                for c in ctrls.split(","):
                    if c:
                        out[c] = path
    except OSError:
        pass
    return out


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


class _Slot:
    """One slot's pair of v1 groups, with its counter files kept open."""

    __slots__ = ("cpu_dir", "fds", "limit", "mem_dir")

    def __init__(self, mem_dir: str, cpu_dir: str) -> None:
        os.mkdir(mem_dir)
        try:
            os.mkdir(cpu_dir)
        except OSError:
            os.rmdir(mem_dir)
            raise
        self.mem_dir = mem_dir
        self.cpu_dir = cpu_dir
        self.limit = b""
        flags = os.O_RDWR | os.O_CLOEXEC
        self.fds = {
            "mprocs": os.open(f"{mem_dir}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC),
            "cprocs": os.open(f"{cpu_dir}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC),
            "peak": os.open(f"{mem_dir}/memory.max_usage_in_bytes", flags),
            "usage": os.open(f"{mem_dir}/memory.usage_in_bytes", os.O_RDONLY | os.O_CLOEXEC),
            "cpu": os.open(f"{cpu_dir}/cpuacct.usage", flags),
            "user": os.open(f"{cpu_dir}/cpuacct.usage_user", os.O_RDONLY | os.O_CLOEXEC),
            "sys": os.open(f"{cpu_dir}/cpuacct.usage_sys", os.O_RDONLY | os.O_CLOEXEC),
            "members": os.open(f"{mem_dir}/cgroup.procs", os.O_RDONLY | os.O_CLOEXEC),
        }

    def read(self, name: str) -> int:
        return int(os.pread(self.fds[name], 64, 0))

    def busy(self) -> bool:
        """Does a process (a task's leftover) remain in the group?"""
        try:
            return bool(os.pread(self.fds["members"], 16, 0).strip())
        except OSError:
            return True

    def reset(self) -> None:
        os.pwrite(self.fds["peak"], b"0", 0)
        os.pwrite(self.fds["cpu"], b"0", 0)

    def oom_kills(self) -> int:
        try:
            with open(f"{self.mem_dir}/memory.oom_control") as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        for d in (self.mem_dir, self.cpu_dir):
            try:
                os.rmdir(d)
            except OSError as e:
                log.debug(f"Cannot remove cgroup {d}: {e.strerror}")


class Usage:
    """What the worker tells of one finished try."""

    __slots__ = ("max_rss_kb", "oom_killed", "system_cpu", "user_cpu")

    def __init__(self, max_rss_kb: int | None, user_cpu: float | None,
                 system_cpu: float | None, oom_killed: bool) -> None:
        self.max_rss_kb = max_rss_kb
        self.user_cpu = user_cpu
        self.system_cpu = system_cpu
        self.oom_killed = oom_killed


class Accounting:
    """The worker's accounting for its slots (see the module docstring)."""

    def __init__(self, slots: int, strict_limits: bool) -> None:
        self.method = "rusage"
        self.why = ""  # why cgroups are not used, for the start event and -v
        self.problem = ""  # why the last enter() gave no group, if it failed
        self.strict = strict_limits
        self.pid = str(os.getpid()).encode()
        self.free: list[_Slot] = []
        self.base: tuple[str, str] = ("", "")  # the worker's own (memory, cpuacct) dirs
        self.parent: tuple[str, str] = ("", "")
        self.serial = 0
        self.owner_fds: tuple[int, int] = (-1, -1)
        if os.environ.get("PMC_NO_CGROUPS"):
            self.why = "PMC_NO_CGROUPS is set"
        else:
            try:
                self._setup_v1(slots)
                self.method = "cgroup-v1"
            except OSError as e:
                self.why = f"cannot create v1 memory/cpuacct cgroups: {e.strerror or e}"
                self.close()
            except _Unavailable as e:
                self.why = str(e)
        if self.why:
            log.debug(f"Task accounting through rusage: {self.why}")

    @property
    def limits(self) -> str:
        """How --strict-limits enforces memory here."""
        return "cgroup" if self.method.startswith("cgroup") else "rlimit"

    # -- set-up --------------------------------------------------------------------------

    def _setup_v1(self, slots: int) -> None:
        groups = _own_groups()
        mem_root, cpu_root = f"{CGROUP_ROOT}/memory", f"{CGROUP_ROOT}/cpuacct"
        if "memory" not in groups or "cpuacct" not in groups:
            raise _Unavailable("no v1 memory and cpuacct controllers (cgroup v2 accounting "
                               "is not implemented)")
        if not (os.path.isdir(mem_root) and os.path.isdir(cpu_root)):
            raise _Unavailable(f"v1 controllers not mounted under {CGROUP_ROOT}")
        mem = mem_root + groups["memory"].rstrip("/")
        cpu = cpu_root + groups["cpuacct"].rstrip("/")
        self.base = (mem, cpu)
        for d in self.base:
            _sweep(d)
        name = f"pmc-{os.getpid()}"
        os.mkdir(f"{mem}/{name}")
        try:
            os.mkdir(f"{cpu}/{name}")
        except OSError:
            os.rmdir(f"{mem}/{name}")
            raise
        self.parent = (f"{mem}/{name}", f"{cpu}/{name}")
        self.owner_fds = (os.open(f"{mem}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC),
                          os.open(f"{cpu}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        for _ in range(slots):
            self.free.append(self._new_slot())

    def _new_slot(self) -> _Slot:
        self.serial += 1
        mem, cpu = self.parent
        slot = _Slot(f"{mem}/slot-{self.serial}", f"{cpu}/slot-{self.serial}")
        slot.reset()
        return slot

    # -- per task --------------------------------------------------------------------------

    def enter(self, memory_mb: int) -> _Slot | None:
        """Before a spawn: move this worker into a free slot's groups (the child inherits
        them), the slot's limit set to ``memory_mb`` with --strict-limits. None: no
        cgroup for this task (``rusage``, or the groups failed: then ``self.problem``
        says why, and a task that needs its limit must not start)."""
        self.problem = ""
        if self.method == "rusage":
            return None
        try:
            if not self.free:
                self.free.append(self._new_slot())  # more tasks than slots: not expected
            slot = self.free.pop()
        except OSError as e:
            self.problem = f"cannot create a task cgroup: {e.strerror or e}"
            return None
        limit = str(memory_mb << 20).encode() if self.strict and memory_mb > 0 else _UNLIMITED
        try:
            if limit != slot.limit:
                slot.limit = b"?"
                _write(f"{slot.mem_dir}/memory.limit_in_bytes", limit)
                slot.limit = limit
            os.write(slot.fds["mprocs"], self.pid)
            os.write(slot.fds["cprocs"], self.pid)
        except OSError as e:
            self.problem = f"cannot use the task cgroup {slot.mem_dir}: {e.strerror or e}"
            self.leave()
            self.release(slot, replace=True)
            return None
        return slot

    def leave(self) -> None:
        """After the spawn (whatever happened): back into the worker's own groups. Should
        that fail, the worker would count in the next task's figures: cgroup accounting
        ends here for this worker (``rusage`` from now on)."""
        try:
            os.write(self.owner_fds[0], self.pid)
            os.write(self.owner_fds[1], self.pid)
        except OSError as e:
            log.error(f"Cannot move the worker back to its own cgroup ({e.strerror}): "
                      "task accounting through rusage from now on")
            self.method = "rusage"

    def abandon(self, slot: _Slot) -> None:
        """The spawn failed: the slot is free again."""
        self.release(slot)

    def collect(self, slot: _Slot | None, usage: resource.struct_rusage, status: int,
                worker_rss_kb: int) -> Usage:
        """The figures of a reaped try; frees its slot for the next one."""
        if slot is None:
            rss = usage.ru_maxrss
            return Usage(rss if rss > worker_rss_kb else None, None, None, False)
        try:
            peak = slot.read("peak") // 1024
            user = slot.read("user") / 1e9
            system = slot.read("sys") / 1e9
            oom = (status & 0x7F) == 9 and slot.limit != _UNLIMITED and slot.oom_kills() > 0
        except (OSError, ValueError):
            self.release(slot, replace=True)
            return Usage(None, None, None, False)
        self.release(slot, replace=oom)
        return Usage(peak, user, system, oom)

    def release(self, slot: _Slot, replace: bool = False) -> None:
        try:
            if not replace:
                slot.reset()
                replace = slot.read("usage") > RESIDUAL_MAX or slot.busy()
        except (OSError, ValueError):
            replace = True
        if replace:
            # Leftover processes or charges (page cache the last task wrote, an OOM kill
            # count) would be the next task's: a fresh group instead. The old one goes
            # when it empties; its charges move to the parent.
            slot.remove()
            try:
                slot = self._new_slot()
            except OSError as e:
                log.warn(f"Cannot create a task cgroup: {e.strerror}")
                return
        self.free.append(slot)

    def close(self) -> None:
        for slot in self.free:
            slot.remove()
        self.free.clear()
        for fd in self.owner_fds:
            if fd >= 0:
                os.close(fd)
        self.owner_fds = (-1, -1)
        for d in self.parent:
            if d:
                try:
                    os.rmdir(d)
                except OSError as e:
                    log.debug(f"Cannot remove cgroup {d}: {e.strerror}")
        self.parent = ("", "")


def _sweep(base: str) -> None:
    """Remove the empty groups of workers that are gone: a worker killed with SIGKILL
    (by mpiexec tearing a job down, the OOM killer) cannot remove its own."""
    try:
        names = [n for n in os.listdir(base) if n.startswith("pmc-") and n[4:].isdigit()]
    except OSError:
        return
    for name in names:
        try:
            os.kill(int(name[4:]), 0)
            continue  # a live worker's (or a reused pid's: left alone)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        group = f"{base}/{name}"
        try:
            for sub in os.listdir(group):
                if sub.startswith("slot-"):
                    os.rmdir(f"{group}/{sub}")
            os.rmdir(group)
        except OSError:
            pass  # processes still in it: not ours to touch


class _Unavailable(Exception):
    """cgroup accounting cannot be used here (the message says why)."""


def self_maxrss_kb() -> int:
    """This process's RSS high-water mark, which a child inherits through exec."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
