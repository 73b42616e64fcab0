"""Per-task accounting and memory limits: peak memory and user/system cpu of a task's
whole process tree, and ``--strict-limits`` memory enforcement, through cgroups where
the worker may create them; what a worker can say without them otherwise.

Methods, tried once per worker in this order (``Accounting.method``, reported in the
run's start event; ``Accounting.why`` says what each one not taken was missing):

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
- ``cgroup-v2``: a v2 hierarchy whose ``memory`` controller reaches the worker's group
  (pure v2 hosts; a hybrid host's v2 mount, found in mountinfo, should memory be there).
  Same slots, one group each (``pmc-<pid>/slot-<n>``, ``memory`` enabled in
  ``pmc-<pid>``), same move in, spawn, move out; charges do not move with a process in
  v2, so the worker's own memory stays where it was. The kernel lets a group other than
  the root hand controllers to its children only while it holds no processes: if the
  worker's group does not already hand ``memory`` down, the worker, when it is alone
  there, moves into a leaf ``pmc-<pid>/worker`` (its guard, started after, joins it) so
  that the group may, and at close turns it off and moves them back; with other
  processes there (the job's: not ours to move) it is ``rusage``, saying so. Figures:
  ``memory.peak`` (kernel >= 5.19), reset between tasks through its kept-open file
  (kernel >= 6.12: the reset is per open file). Where it cannot be reset, a reused group's
  peak would be the maximum over its past tasks: a fresh group per task instead. Without
  it (older kernels) the peak is unknown (None). ``cpu.stat`` (there without the cpu
  controller) cannot be reset: ``user_usec``/``system_usec`` less their values when the
  slot was last freed. Leftovers: ``cgroup.events`` ``populated``, ``memory.current``.
- ``rusage`` (elsewhere): ``wait4``'s rusage. A child started from the worker inherits
  the worker's RSS high-water mark through exec, so its ``ru_maxrss`` is the task's own
  only when it exceeds the worker's at the spawn; below that the peak is unknown (None),
  never the worker's figure. Its cpu covers the processes the task waited for.

Memory limits (``--strict-limits``, ``Accounting.limits``): ``cgroup`` sets the slot
group's ``memory.limit_in_bytes`` (v1) or ``memory.max`` (v2) to the task's ``-m``; a task
over it is killed by the kernel and reported as an OOM kill (killed by SIGKILL, and the
group's ``oom_kill`` count, in ``memory.oom_control`` or ``memory.events``, risen since
the slot was freed). ``rlimit`` is RLIMIT_AS, set by the worker's pre-exec hook (it
breaks programs that reserve address space: JVMs, Go).

The kernel's files are found from ``CGROUP_ROOT``, ``PROC_CGROUP`` and ``MOUNTINFO``
(tests point them at a fake tree). ``PMC_NO_CGROUPS=1`` turns cgroups off.
"""

from __future__ import annotations

import errno
import os
import re
import resource
from typing import ClassVar

from pmc import log

CGROUP_ROOT = "/sys/fs/cgroup"  # where the v1 controllers are mounted
PROC_CGROUP = "/proc/self/cgroup"
MOUNTINFO = "/proc/self/mountinfo"  # where the v2 hierarchy is mounted
RESIDUAL_MAX = 2 << 20  # bytes charged to an idle slot group beyond which it is replaced
_RO = os.O_RDONLY | os.O_CLOEXEC
_WO = os.O_WRONLY | os.O_CLOEXEC
_RW = os.O_RDWR | os.O_CLOEXEC


def _own_groups() -> dict[str, str]:
    """controller -> this process's group path, from /proc/self/cgroup; the v2 group
    (the ``0::`` line) under ``""``."""
    out: dict[str, str] = {}
    try:
        with open(PROC_CGROUP) as f:
            for line in f:
                hid, ctrls, path = line.rstrip("\n").split(":", 2)
                if hid == "0" and not ctrls:
                    out[""] = path
                for c in ctrls.split(","):
                    if c:
                        out[c] = path
    except (OSError, ValueError):
        pass
    return out


def _v2_dir(own: str) -> str:
    """The directory of v2 group ``own``: under the cgroup2 mount that holds it (the mount
    may show a subtree: its root, the 4th field of mountinfo, is cut from the path)."""
    try:
        with open(MOUNTINFO) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise _Unavailable(f"cannot read {MOUNTINFO}: {e.strerror}") from None
    for line in lines:
        fields, _, fs = line.partition(" - ")
        if not fs.startswith("cgroup2 "):
            continue
        root, mount = (_unescape(s) for s in fields.split()[3:5])
        root = root.rstrip("/")
        if own == root or own.startswith(root + "/"):
            return mount + own[len(root):].rstrip("/")
    raise _Unavailable(f"no cgroup2 mount holds pmc's group {own}")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)  # \040: a space


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, _WO)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _keyed(fd: int) -> dict[str, int]:
    """A flat keyed file kept open ("name value" lines: cpu.stat, memory.events)."""
    out = {}
    for line in os.pread(fd, 4096, 0).decode().splitlines():
        name, _, value = line.partition(" ")
        if value.isdigit():
            out[name] = int(value)
    return out


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError as e:
        log.debug(f"Cannot remove cgroup {path}: {e.strerror}")


# -- slots: a task's group(s) ------------------------------------------------------------


class _Slot:
    """One task slot's group(s), their files kept open: what v1 and v2 slots share. A task
    is started in them (``join``); between tasks they are ``reset``, and kept unless
    ``left_over`` finds something of the last task still there."""

    __slots__ = ("dirs", "fds", "limit")
    LIMIT_FILE: ClassVar[str] = ""
    UNLIMITED: ClassVar[bytes] = b""
    PROCS: ClassVar[tuple[str, ...]] = ()  # the cgroup.procs files a task joins

    def __init__(self, *dirs: str) -> None:
        self.dirs = dirs
        self.fds: dict[str, int] = {}
        self.limit = self.UNLIMITED  # a new group's
        made: list[str] = []
        try:
            for d in dirs:
                os.mkdir(d)
                made.append(d)
            self.open()
        except OSError:
            for fd in self.fds.values():
                os.close(fd)
            for d in made:
                _rmdir(d)
            raise

    def open(self) -> None:
        raise NotImplementedError

    def read(self, name: str) -> int:
        return int(os.pread(self.fds[name], 64, 0))

    def join(self, pid: bytes) -> None:
        for name in self.PROCS:
            os.write(self.fds[name], pid)

    def set_limit(self, limit: int) -> None:
        """The memory limit in bytes, 0 for none."""
        data = str(limit).encode() if limit else self.UNLIMITED
        if data != self.limit:
            self.limit = b"?"  # unknown, should the write fail
            _write(f"{self.dirs[0]}/{self.LIMIT_FILE}", data)
            self.limit = data

    def limited(self) -> bool:
        return self.limit != self.UNLIMITED

    def reset(self) -> None:
        raise NotImplementedError

    def figures(self) -> tuple[int | None, float, float]:
        """Peak memory (kB; None: unknown), user and system cpu (s) since the reset."""
        raise NotImplementedError

    def oom_killed(self) -> bool:
        """Has the kernel killed a process of the group over its limit since the reset?"""
        raise NotImplementedError

    def left_over(self) -> bool:
        """After a reset: does a process, or more than RESIDUAL_MAX, remain charged?"""
        raise NotImplementedError

    def remove(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        for d in self.dirs:
            _rmdir(d)


class _V1Slot(_Slot):
    """A v1 slot: a memory group and a cpuacct group, counters reset by writing 0."""

    __slots__ = ()
    LIMIT_FILE = "memory.limit_in_bytes"
    UNLIMITED = b"-1"
    PROCS = ("mprocs", "cprocs")

    def open(self) -> None:
        mem, cpu = self.dirs
        for name, path, flags in (
                ("mprocs", f"{mem}/cgroup.procs", _WO), ("cprocs", f"{cpu}/cgroup.procs", _WO),
                ("peak", f"{mem}/memory.max_usage_in_bytes", _RW),
                ("usage", f"{mem}/memory.usage_in_bytes", _RO),
                ("cpu", f"{cpu}/cpuacct.usage", _RW), ("user", f"{cpu}/cpuacct.usage_user", _RO),
                ("sys", f"{cpu}/cpuacct.usage_sys", _RO),
                ("members", f"{mem}/cgroup.procs", _RO)):
            self.fds[name] = os.open(path, flags)

    def reset(self) -> None:
        os.pwrite(self.fds["peak"], b"0", 0)
        os.pwrite(self.fds["cpu"], b"0", 0)

    def figures(self) -> tuple[int | None, float, float]:
        return self.read("peak") // 1024, self.read("user") / 1e9, self.read("sys") / 1e9

    def oom_killed(self) -> bool:
        # The count cannot be reset, but a group that saw a kill is replaced.
        try:
            with open(f"{self.dirs[0]}/memory.oom_control") as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1]) > 0
        except (OSError, ValueError):
            pass
        return False

    def left_over(self) -> bool:
        return (self.read("usage") > RESIDUAL_MAX
                or bool(os.pread(self.fds["members"], 16, 0).strip()))


class _V2Slot(_Slot):
    """A v2 slot: one group. Its peak is reset through the memory.peak file it holds open
    (``peak`` "reset"), or not at all ("fresh": the group serves one task; "": no peak);
    cpu and OOM kills are counters read against their values at the reset."""

    __slots__ = ("cpu0", "ooms0", "peak")
    LIMIT_FILE = "memory.max"
    UNLIMITED = b"max"
    PROCS = ("procs",)

    def __init__(self, path: str, peak: str) -> None:
        self.peak = peak
        self.cpu0 = (0, 0)
        self.ooms0 = 0
        super().__init__(path)

    def open(self) -> None:
        d = self.dirs[0]
        self.fds["procs"] = os.open(f"{d}/cgroup.procs", _WO)
        if self.peak:
            self.fds["peak"] = os.open(f"{d}/memory.peak", _RW if self.peak == "reset" else _RO)
        for name, file in (("current", "memory.current"), ("cpu", "cpu.stat"),
                           ("events", "memory.events"), ("state", "cgroup.events")):
            self.fds[name] = os.open(f"{d}/{file}", _RO)

    def reset(self) -> None:
        if self.peak == "reset":
            os.pwrite(self.fds["peak"], b"0", 0)  # any write: the peak is the usage now
        cpu = _keyed(self.fds["cpu"])
        self.cpu0 = (cpu.get("user_usec", 0), cpu.get("system_usec", 0))
        self.ooms0 = _keyed(self.fds["events"]).get("oom_kill", 0)

    def figures(self) -> tuple[int | None, float, float]:
        peak = self.read("peak") // 1024 if self.peak else None
        cpu = _keyed(self.fds["cpu"])
        return (peak, (cpu["user_usec"] - self.cpu0[0]) / 1e6,
                (cpu["system_usec"] - self.cpu0[1]) / 1e6)

    def oom_killed(self) -> bool:
        return _keyed(self.fds["events"]).get("oom_kill", 0) > self.ooms0

    def left_over(self) -> bool:
        return (self.read("current") > RESIDUAL_MAX
                or _keyed(self.fds["state"]).get("populated", 1) != 0)


def _peak_mode(path: str) -> str:
    """How slots measure their peak, found once on ``path`` (a memory.peak): "reset" if a
    write to it is accepted (kernel >= 6.12), "fresh" if it is read-only (opening it for
    writing fails), "" if there is none (kernel < 5.19)."""
    try:
        fd = os.open(path, _RW)
    except FileNotFoundError:
        return ""
    except OSError:
        return "fresh"
    try:
        os.pwrite(fd, b"0", 0)
        return "reset"
    except OSError:
        return "fresh"
    finally:
        os.close(fd)


# -- the worker's groups -----------------------------------------------------------------


class _Groups:
    """The worker's ``pmc-<pid>`` group(s), where its slots are made, and its way back from
    a slot: what v1 and v2 share. ``setup`` raises _Unavailable (or OSError) if they
    cannot be used; ``close`` undoes whatever was done."""

    METHOD: ClassVar[str] = ""
    WHAT: ClassVar[str] = ""  # what cannot be created, for messages

    def __init__(self) -> None:
        self.parent: tuple[str, ...] = ()  # pmc-<pid> dir(s), made by this worker
        self.home_fds: list[int] = []  # cgroup.procs the worker returns to after a spawn
        self.serial = 0
        self.reuse = True  # can a slot serve task after task?

    def setup(self) -> None:
        raise NotImplementedError

    def make_slot(self, name: str) -> _Slot:
        raise NotImplementedError

    def new_slot(self) -> _Slot:
        self.serial += 1
        slot = self.make_slot(f"slot-{self.serial}")
        try:
            slot.reset()
        except OSError:
            slot.remove()
            raise
        return slot

    def go_home(self, pid: bytes) -> None:
        for fd in self.home_fds:
            os.write(fd, pid)

    def close(self) -> None:
        for fd in self.home_fds:
            os.close(fd)
        self.home_fds = []
        for d in self.parent:
            _rmdir(d)
        self.parent = ()


class _V1Groups(_Groups):
    METHOD = "cgroup-v1"
    WHAT = "v1 memory/cpuacct cgroups"

    def setup(self) -> None:
        groups = _own_groups()
        if "memory" not in groups or "cpuacct" not in groups:
            raise _Unavailable("no v1 memory and cpuacct controllers")
        roots = (f"{CGROUP_ROOT}/memory", f"{CGROUP_ROOT}/cpuacct")
        if not all(os.path.isdir(r) for r in roots):
            raise _Unavailable(f"v1 controllers not mounted under {CGROUP_ROOT}")
        bases = (roots[0] + groups["memory"].rstrip("/"),
                 roots[1] + groups["cpuacct"].rstrip("/"))
        for d in bases:
            _sweep(d)
        for d in bases:
            os.mkdir(f"{d}/pmc-{os.getpid()}")
            self.parent += (f"{d}/pmc-{os.getpid()}",)
        for d in bases:
            self.home_fds.append(os.open(f"{d}/cgroup.procs", _WO))

    def make_slot(self, name: str) -> _Slot:
        mem, cpu = self.parent
        return _V1Slot(f"{mem}/{name}", f"{cpu}/{name}")


class _V2Groups(_Groups):
    METHOD = "cgroup-v2"
    WHAT = "cgroup v2 groups"

    def __init__(self) -> None:
        super().__init__()
        self.base = ""  # the worker's own group
        self.leaf = ""  # pmc-<pid>/worker, should the worker have had to leave its group
        self.enabled = False  # memory enabled for the children of base by this worker
        self.peak = ""  # see _peak_mode

    def setup(self) -> None:
        own = _own_groups().get("")
        if own is None:
            raise _Unavailable(f"no cgroup v2 group in {PROC_CGROUP}")
        self.base = _v2_dir(own)
        try:
            ctrls = _read(f"{self.base}/cgroup.controllers").split()
            passed = _read(f"{self.base}/cgroup.subtree_control").split()
        except OSError as e:
            raise _Unavailable(f"cannot read cgroup v2 group {self.base}: {e.strerror}") \
                from None
        if "memory" not in ctrls:
            raise _Unavailable(f"no memory controller in cgroup v2 for pmc's group {own} "
                               f"({self.base}/cgroup.controllers: {' '.join(ctrls) or 'empty'})")
        _sweep(self.base)
        pmc = f"{self.base}/pmc-{os.getpid()}"
        home = self.base
        if "memory" not in passed:
            home = self._enable_memory(own, pmc)
        if not self.parent:
            os.mkdir(pmc)
            self.parent = (pmc,)
        _write(f"{pmc}/cgroup.subtree_control", b"+memory")
        self.home_fds.append(os.open(f"{home}/cgroup.procs", _WO))
        self.peak = _peak_mode(f"{pmc}/memory.peak")
        self.reuse = self.peak != "fresh"

    def _enable_memory(self, own: str, pmc: str) -> str:
        """Have the worker's group hand memory to its children; return where the worker
        lives from now on (its group, or a leaf of ours if it had to leave it)."""
        control = f"{self.base}/cgroup.subtree_control"
        try:
            _write(control, b"+memory")  # the root (left so: others may come to use it)
            return self.base
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise _Unavailable(f"cgroup v2: cannot enable memory under pmc's group "
                                   f"{own}: {e.strerror}") from None
        # EBUSY: the group holds processes and is not the root. It can be emptied only if
        # the worker is alone there: the job's other processes are not ours to move.
        me = str(os.getpid())
        others = [p for p in _read(f"{self.base}/cgroup.procs").split() if p != me]
        if others:
            raise _Unavailable(
                f"cgroup v2: memory is not enabled under pmc's group {own}, and cannot be: "
                f"the group holds processes other than this worker ({len(others)}), and "
                "only an empty group (or the root) may hand controllers down")
        os.mkdir(pmc)
        self.parent = (pmc,)
        os.mkdir(f"{pmc}/worker")
        self.leaf = f"{pmc}/worker"
        _write(f"{self.leaf}/cgroup.procs", me.encode())
        try:
            _write(control, b"+memory")
        except OSError as e:
            raise _Unavailable(f"cgroup v2: cannot enable memory under pmc's group {own}, "
                               f"even with this worker moved out of it: {e.strerror}") from None
        self.enabled = True
        return self.leaf

    def make_slot(self, name: str) -> _Slot:
        return _V2Slot(f"{self.parent[0]}/{name}", self.peak)

    def close(self) -> None:
        if self.leaf:
            self._leave_leaf()
        super().close()

    def _leave_leaf(self) -> None:
        # Back into the worker's group with what it started from the leaf (its guard). The
        # group takes processes again once it hands no controller down: memory off under
        # pmc-<pid>, then under the group (refused while another worker's groups use it:
        # then all stay).
        try:
            _write(f"{self.parent[0]}/cgroup.subtree_control", b"-memory")
            if self.enabled:
                _write(f"{self.base}/cgroup.subtree_control", b"-memory")
                self.enabled = False
            for pid in _read(f"{self.leaf}/cgroup.procs").split():
                try:
                    _write(f"{self.base}/cgroup.procs", pid.encode())
                except ProcessLookupError:
                    pass
        except OSError as e:
            log.debug(f"Cannot move back from cgroup {self.leaf}: {e.strerror}")
            return
        _rmdir(self.leaf)
        self.leaf = ""


class _Unavailable(Exception):
    """cgroup accounting cannot be used here (the message says why)."""


# -- the worker's interface --------------------------------------------------------------


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
        self.groups: _Groups | None = None
        if os.environ.get("PMC_NO_CGROUPS"):
            self.why = "PMC_NO_CGROUPS is set"
        else:
            self.why = self._choose(slots)
        if self.why:
            log.debug(f"Task accounting through rusage: {self.why}")

    def _choose(self, slots: int) -> str:
        """Set up the first method that works (v1, then v2) with its slots; else say
        what each one was missing."""
        missing = []
        for groups in (_V1Groups(), _V2Groups()):
            self.groups = groups
            try:
                groups.setup()
                for _ in range(slots):
                    self.free.append(groups.new_slot())
            except _Unavailable as e:
                missing.append(str(e))
            except OSError as e:
                missing.append(f"cannot create {groups.WHAT}: {e.strerror or e}")
            else:
                self.method = groups.METHOD
                return ""
            self.close()
        return "; ".join(missing)

    @property
    def limits(self) -> str:
        """How --strict-limits enforces memory here."""
        return "cgroup" if self.method.startswith("cgroup") else "rlimit"

    @property
    def parent(self) -> tuple[str, ...]:
        """The worker's ``pmc-<pid>`` groups, for its guard to remove should it be killed."""
        return self.groups.parent if self.groups else ()

    # -- per task --------------------------------------------------------------------------

    def enter(self, memory_mb: int) -> _Slot | None:
        """Before a spawn: move this worker into a free slot's groups (the child inherits
        them), the slot's limit set to ``memory_mb`` with --strict-limits. None: no
        cgroup for this task (``rusage``, or the groups failed: then ``self.problem``
        says why, and a task that needs its limit must not start)."""
        self.problem = ""
        if self.groups is None or self.method == "rusage":
            return None
        try:
            # More tasks than slots is not expected; should it happen, one more slot.
            slot = self.free.pop() if self.free else self.groups.new_slot()
        except OSError as e:
            self.problem = f"cannot create a task cgroup: {e.strerror or e}"
            return None
        try:
            slot.set_limit(memory_mb << 20 if self.strict and memory_mb > 0 else 0)
            slot.join(self.pid)
        except OSError as e:
            self.problem = f"cannot use the task cgroup {slot.dirs[0]}: {e.strerror or e}"
            self.leave()
            self.release(slot, replace=True)
            return None
        return slot

    def leave(self) -> None:
        """After the spawn (whatever happened): back into the worker's own groups. Should
        that fail, the worker would count in the next task's figures: cgroup accounting
        ends here for this worker (``rusage`` from now on)."""
        if self.groups is None:
            return
        try:
            self.groups.go_home(self.pid)
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
            peak, user, system = slot.figures()
            oom = (status & 0x7F) == 9 and slot.limited() and slot.oom_killed()
        except (OSError, LookupError, ValueError):
            self.release(slot, replace=True)
            return Usage(None, None, None, False)
        self.release(slot, replace=oom)
        return Usage(peak, user, system, oom)

    def release(self, slot: _Slot, replace: bool = False) -> None:
        if self.groups is None:
            slot.remove()
            return
        try:
            if not self.groups.reuse:
                replace = True
            if not replace:
                slot.reset()
                replace = slot.left_over()
        except (OSError, ValueError):
            replace = True
        if replace:
            # Leftover processes or charges (page cache the last task wrote, an OOM kill
            # count, a peak that cannot be reset) would be the next task's: a fresh group
            # instead. The old one goes when it empties; its charges move to the parent.
            slot.remove()
            try:
                slot = self.groups.new_slot()
            except OSError as e:
                log.warn(f"Cannot create a task cgroup: {e.strerror}")
                return
        self.free.append(slot)

    def close(self) -> None:
        for slot in self.free:
            slot.remove()
        self.free.clear()
        if self.groups is not None:
            self.groups.close()
            self.groups = None


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
                if sub.startswith("slot-") or sub == "worker":
                    os.rmdir(f"{group}/{sub}")
            os.rmdir(group)
        except OSError:
            pass  # processes still in it: not ours to touch


def self_maxrss_kb() -> int:
    """This process's RSS high-water mark, which a child inherits through exec."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
