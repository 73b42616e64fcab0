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
  never the worker's figure. The worker's mark is read (a system call) only when a
  task's figure exceeds the last one read, and then at the reap: a mark that only rises
  is then at least the one the task inherited, so a figure above it is the task's own
  (one within what the worker grew while the task ran is told as unknown). Its cpu
  covers the processes the task waited for.

Memory limits (``--strict-limits``, ``Accounting.limits``): ``rlimit``, as PMC, is
RLIMIT_AS, set by the worker's pre-exec hook: the task's allocations past its ``-m`` fail
(it breaks programs that reserve address space: JVMs, Go). With ``--limit-memory-by
cgroup`` where the worker has cgroups, ``cgroup`` sets the slot
group's ``memory.limit_in_bytes`` (v1) or ``memory.max`` (v2) to the task's ``-m``; a task
over it is killed by the kernel and reported as an OOM kill (killed by SIGKILL, and the
group's ``oom_kill`` count, in ``memory.oom_control`` or ``memory.events``, risen since
the slot was freed).

The kernel's files are found from ``CGROUP_ROOT``, ``PROC_CGROUP`` and ``MOUNTINFO``
(tests point them at a fake tree). ``PMC_NO_CGROUPS=1`` turns cgroups off.
"""

from __future__ import annotations

import os
import resource

from pmc import log
from pmc.runtime.accounting.cgroupfs import Unavailable
from pmc.runtime.accounting.groups import Groups, V1Groups, V2Groups
from pmc.runtime.accounting.slots import Slot


def not_wanted(mode: str, cgroup_limits: bool, log_format: str) -> str:
    """Why a run's workers should not try cgroups ("" if they should), by
    ``--task-accounting``: a task's cgroups cost its spawn and its own page faults and
    scheduling ~0.1 ms of cpu (a ``/bin/true`` costs ~0.6 ms here), worth it where its
    figures go somewhere (the JSON log's task events) or its limit is set there
    (``cgroup_limits``: --strict-limits --limit-memory-by cgroup)."""
    if mode == "rusage":
        return "--task-accounting rusage"
    if mode == "auto" and not cgroup_limits and log_format != "json":
        return ("--task-accounting auto: no task figures are written (no --log-format "
                "json) nor memory limits set through cgroups (no --strict-limits "
                "--limit-memory-by cgroup)")
    return ""


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

    def __init__(self, slots: int, cgroup_limits: bool, not_wanted: str = "") -> None:
        """``cgroup_limits``: tasks' -m is their slot group's memory limit (--strict-limits
        --limit-memory-by cgroup); ``not_wanted``: why cgroups are not to be tried (see
        ``not_wanted``)."""
        self.method = "rusage"
        self.why = ""  # why cgroups are not used, for the start event and -v
        self.problem = ""  # why the last enter() gave no group, if it failed
        self.strict = cgroup_limits
        self.pid = str(os.getpid()).encode()
        self.free: list[Slot] = []
        self.groups: Groups | None = None
        self.worker_rss = 0  # KiB: this worker's RSS high-water mark when last read
        if os.environ.get("PMC_NO_CGROUPS"):
            self.why = "PMC_NO_CGROUPS is set"
        elif not_wanted:
            self.why = not_wanted
        else:
            self.why = self._choose(slots)
        if self.why:
            log.debug(f"Task accounting through rusage: {self.why}")

    def _choose(self, slots: int) -> str:
        """Set up the first method that works (v1, then v2) with its slots; else say
        what each one was missing."""
        missing = []
        for groups in (V1Groups(), V2Groups()):
            self.groups = groups
            try:
                groups.setup()
                for _ in range(slots):
                    self.free.append(groups.new_slot())
            except Unavailable as e:
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
        return "cgroup" if self.strict and self.method.startswith("cgroup") else "rlimit"

    @property
    def parent(self) -> tuple[str, ...]:
        """The worker's ``pmc-<pid>`` groups, for its guard to remove should it be killed."""
        return self.groups.parent if self.groups else ()

    # -- per task --------------------------------------------------------------------------

    def enter(self, memory_mb: int) -> Slot | None:
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

    def abandon(self, slot: Slot) -> None:
        """The spawn failed: the slot is free again."""
        self.release(slot)

    def collect(self, slot: Slot | None, usage: resource.struct_rusage,
                status: int) -> Usage:
        """The figures of a reaped try; frees its slot for the next one."""
        if slot is None:
            rss = usage.ru_maxrss
            if rss > self.worker_rss:
                self.worker_rss = self_maxrss_kb()  # now: at least what the task inherited
            return Usage(rss if rss > self.worker_rss else None, None, None, False)
        try:
            peak, user, system = slot.figures()
            oom = (status & 0x7F) == 9 and slot.limited() and slot.oom_killed()
        except (OSError, LookupError, ValueError):
            self.release(slot, replace=True)
            return Usage(None, None, None, False)
        self.release(slot, replace=oom)
        return Usage(peak, user, system, oom)

    def release(self, slot: Slot, replace: bool = False) -> None:
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


def self_maxrss_kb() -> int:
    """This process's RSS high-water mark, which a child inherits through exec."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
