"""The worker's own ``pmc-<pid>`` group(s), v1 or v2, in which its slots are made, and
its way back from a slot after a spawn."""

from __future__ import annotations

import errno
import os

from pmc import log
from pmc.runtime.accounting import cgroupfs
from pmc.runtime.accounting.cgroupfs import (
    WO,
    Unavailable,
    own_groups,
    read_file,
    remove_group,
    sweep,
    v2_dir,
    write_file,
)
from pmc.runtime.accounting.slots import Slot, V1Slot, V2Slot, peak_mode

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import ClassVar


class Groups:
    """The worker's ``pmc-<pid>`` group(s), where its slots are made, and its way back from
    a slot: what v1 and v2 share. ``setup`` raises Unavailable (or OSError) if they
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

    def make_slot(self, name: str) -> Slot:
        raise NotImplementedError

    def new_slot(self) -> Slot:
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
            remove_group(d)
        self.parent = ()


class V1Groups(Groups):
    METHOD = "cgroup-v1"
    WHAT = "v1 memory/cpuacct cgroups"

    def setup(self) -> None:
        groups = own_groups()
        if "memory" not in groups or "cpuacct" not in groups:
            raise Unavailable("no v1 memory and cpuacct controllers")
        roots = (f"{cgroupfs.CGROUP_ROOT}/memory", f"{cgroupfs.CGROUP_ROOT}/cpuacct")
        if not all(os.path.isdir(r) for r in roots):
            raise Unavailable(f"v1 controllers not mounted under {cgroupfs.CGROUP_ROOT}")
        bases = (roots[0] + groups["memory"].rstrip("/"),
                 roots[1] + groups["cpuacct"].rstrip("/"))
        for d in bases:
            sweep(d)
        for d in bases:
            os.mkdir(f"{d}/pmc-{os.getpid()}")
            self.parent += (f"{d}/pmc-{os.getpid()}",)
        for d in bases:
            self.home_fds.append(os.open(f"{d}/cgroup.procs", WO))

    def make_slot(self, name: str) -> Slot:
        mem, cpu = self.parent
        return V1Slot(f"{mem}/{name}", f"{cpu}/{name}")


class V2Groups(Groups):
    METHOD = "cgroup-v2"
    WHAT = "cgroup v2 groups"

    def __init__(self) -> None:
        super().__init__()
        self.base = ""  # the worker's own group
        self.leaf = ""  # pmc-<pid>/worker, should the worker have had to leave its group
        self.enabled = False  # memory enabled for the children of base by this worker
        self.peak = ""  # see peak_mode

    def setup(self) -> None:
        own = own_groups().get("")
        if own is None:
            raise Unavailable(f"no cgroup v2 group in {cgroupfs.PROC_CGROUP}")
        self.base = v2_dir(own)
        try:
            ctrls = read_file(f"{self.base}/cgroup.controllers").split()
            passed = read_file(f"{self.base}/cgroup.subtree_control").split()
        except OSError as e:
            raise Unavailable(f"cannot read cgroup v2 group {self.base}: {e.strerror}") \
                from None
        if "memory" not in ctrls:
            raise Unavailable(f"no memory controller in cgroup v2 for pmc's group {own} "
                               f"({self.base}/cgroup.controllers: {' '.join(ctrls) or 'empty'})")
        sweep(self.base)
        pmc = f"{self.base}/pmc-{os.getpid()}"
        home = self.base
        if "memory" not in passed:
            home = self._enable_memory(own, pmc)
        if not self.parent:
            os.mkdir(pmc)
            self.parent = (pmc,)
        write_file(f"{pmc}/cgroup.subtree_control", b"+memory")
        self.home_fds.append(os.open(f"{home}/cgroup.procs", WO))
        self.peak = peak_mode(f"{pmc}/memory.peak")
        self.reuse = self.peak != "fresh"

    def _enable_memory(self, own: str, pmc: str) -> str:
        """Have the worker's group hand memory to its children; return where the worker
        lives from now on (its group, or a leaf of ours if it had to leave it)."""
        control = f"{self.base}/cgroup.subtree_control"
        try:
            write_file(control, b"+memory")  # the root (left so: others may come to use it)
            return self.base
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise Unavailable(f"cgroup v2: cannot enable memory under pmc's group "
                                   f"{own}: {e.strerror}") from None
        # EBUSY: the group holds processes and is not the root. It can be emptied only if
        # the worker is alone there: the job's other processes are not ours to move.
        me = str(os.getpid())
        others = [p for p in read_file(f"{self.base}/cgroup.procs").split() if p != me]
        if others:
            raise Unavailable(
                f"cgroup v2: memory is not enabled under pmc's group {own}, and cannot be: "
                f"the group holds processes other than this worker ({len(others)}), and "
                "only an empty group (or the root) may hand controllers down")
        os.mkdir(pmc)
        self.parent = (pmc,)
        os.mkdir(f"{pmc}/worker")
        self.leaf = f"{pmc}/worker"
        write_file(f"{self.leaf}/cgroup.procs", me.encode())
        try:
            write_file(control, b"+memory")
        except OSError as e:
            raise Unavailable(f"cgroup v2: cannot enable memory under pmc's group {own}, "
                               f"even with this worker moved out of it: {e.strerror}") from None
        self.enabled = True
        return self.leaf

    def make_slot(self, name: str) -> Slot:
        return V2Slot(f"{self.parent[0]}/{name}", self.peak)

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
            write_file(f"{self.parent[0]}/cgroup.subtree_control", b"-memory")
            if self.enabled:
                write_file(f"{self.base}/cgroup.subtree_control", b"-memory")
                self.enabled = False
            for pid in read_file(f"{self.leaf}/cgroup.procs").split():
                try:
                    write_file(f"{self.base}/cgroup.procs", pid.encode())
                except ProcessLookupError:
                    pass
        except OSError as e:
            log.debug(f"Cannot move back from cgroup {self.leaf}: {e.strerror}")
            return
        remove_group(self.leaf)
        self.leaf = ""
