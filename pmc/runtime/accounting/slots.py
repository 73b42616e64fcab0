"""A task slot's cgroup(s), v1 or v2: a task is started in them, its figures are read
from them, and they are reset or replaced between tasks."""

from __future__ import annotations

import os

from pmc.runtime.accounting.cgroupfs import (
    RESIDUAL_MAX,
    RO,
    RW,
    WO,
    keyed,
    remove_group,
    write_file,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import ClassVar


class Slot:
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
                remove_group(d)
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
            write_file(f"{self.dirs[0]}/{self.LIMIT_FILE}", data)
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
            remove_group(d)


class V1Slot(Slot):
    """A v1 slot: a memory group and a cpuacct group, counters reset by writing 0."""

    __slots__ = ()
    LIMIT_FILE = "memory.limit_in_bytes"
    UNLIMITED = b"-1"
    PROCS = ("mprocs", "cprocs")

    def open(self) -> None:
        mem, cpu = self.dirs
        for name, path, flags in (
                ("mprocs", f"{mem}/cgroup.procs", WO), ("cprocs", f"{cpu}/cgroup.procs", WO),
                ("peak", f"{mem}/memory.max_usage_in_bytes", RW),
                ("usage", f"{mem}/memory.usage_in_bytes", RO),
                ("cpu", f"{cpu}/cpuacct.usage", RW), ("user", f"{cpu}/cpuacct.usage_user", RO),
                ("sys", f"{cpu}/cpuacct.usage_sys", RO),
                ("members", f"{mem}/cgroup.procs", RO)):
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


class V2Slot(Slot):
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
        self.fds["procs"] = os.open(f"{d}/cgroup.procs", WO)
        if self.peak:
            self.fds["peak"] = os.open(f"{d}/memory.peak", RW if self.peak == "reset" else RO)
        for name, file in (("current", "memory.current"), ("cpu", "cpu.stat"),
                           ("events", "memory.events"), ("state", "cgroup.events")):
            self.fds[name] = os.open(f"{d}/{file}", RO)

    def reset(self) -> None:
        if self.peak == "reset":
            os.pwrite(self.fds["peak"], b"0", 0)  # any write: the peak is the usage now
        cpu = keyed(self.fds["cpu"])
        self.cpu0 = (cpu.get("user_usec", 0), cpu.get("system_usec", 0))
        self.ooms0 = keyed(self.fds["events"]).get("oom_kill", 0)

    def figures(self) -> tuple[int | None, float, float]:
        peak = self.read("peak") // 1024 if self.peak else None
        cpu = keyed(self.fds["cpu"])
        return (peak, (cpu["user_usec"] - self.cpu0[0]) / 1e6,
                (cpu["system_usec"] - self.cpu0[1]) / 1e6)

    def oom_killed(self) -> bool:
        return keyed(self.fds["events"]).get("oom_kill", 0) > self.ooms0

    def left_over(self) -> bool:
        return (self.read("current") > RESIDUAL_MAX
                or keyed(self.fds["state"]).get("populated", 1) != 0)


def peak_mode(path: str) -> str:
    """How slots measure their peak, found once on ``path`` (a memory.peak): "reset" if a
    write to it is accepted (kernel >= 6.12), "fresh" if it is read-only (opening it for
    writing fails), "" if there is none (kernel < 5.19)."""
    try:
        fd = os.open(path, RW)
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
