"""The task guard: a small program each worker starts, which outlives it.

The worker keeps every running task's process group in a table the guard shares (a
memfd, the guard's fd 3): a slot per group, written when the task is spawned and cleared
when it is reaped, plain stores to shared memory with no system call and no wake-up of
the guard. The guard's stdin is a pipe only the worker holds, on which the worker sends
one line, ``cDIR``, for each of its accounting cgroups. When that pipe reaches EOF the
worker is gone (exited, or killed with SIGKILL, e.g. by mpiexec tearing down the job,
where nothing of the worker can run), and the guard reads the table and terminates the
groups still in it: SIGTERM, then SIGKILL after the grace period (argv[1], seconds);
then it removes the cgroups. No per-task preexec, no PR_SET_PDEATHSIG.

A slot holds a group and its complement (``_SLOT``): one torn by the worker's death in
the middle of a store reads as neither, and is passed over.

A task's group can go in the table only once the spawn has given its pid, and by then
the task runs: a worker killed in between (seen: 1 run in ~100 of a test that kills a
worker as its task starts, on a loaded 2-core machine) left the task running for ever.
So the first slot marks a spawn under way, with the boot-time second it began
(``Guard.spawning``; cleared by ``hold``); finding it, the guard looks for the task
itself (``orphans``): a process group leader of this session, reparented from the
worker as the guard was, started since the mark, and not a guard.

Run as a program (``command``): ``python -I -S`` imports this file as the top-level
module ``guard`` from its own directory and calls ``main(argv)``. As a program it imports
nothing of pmc (not even the ``pmc`` package), and it is loaded from its cached bytecode,
so that starting it costs what the ``python -c`` of its source it replaces did (not the
~1 ms of compiling this file as a script). The worker's end (``Guard``: starting it,
holding groups, writing the lines) is here too, imported by the worker as a module.
"""

import fcntl
import mmap
import os
import signal
import struct
import sys
import time

# The module's directory is appended to the path (after the standard library's): only
# ``guard`` is looked up there. Its path is on the command line, where ps shows it.
_BOOT = ("import sys; sys.path.append(sys.argv[1].rpartition('/')[0]); import guard; "
         "sys.exit(guard.main(sys.argv[2:]))")
_SLOT = struct.Struct("=ii")  # a held process group, and its complement (~pgid)
_TABLE_FD = 3  # the table, in the guard
_FIRST_SLOTS = 512  # one page; the table doubles when full
_MARK = 0  # the slot of the spawn under way (boot-time second, negated: no group)


def command(grace: float, worker: int) -> list[str]:
    """The command that runs the guard of ``worker`` (a pid) with ``grace`` seconds
    between SIGTERM and SIGKILL."""
    return [sys.executable, "-I", "-S", "-c", _BOOT, os.path.abspath(__file__), repr(grace),
            str(worker)]


class Guard:
    """The worker's end: the table of held process groups, and the pipe. Lines are sent
    by ``flush``, once the worker has announced its cgroups. Started at once, or, with
    ``start=False``, when first needed: the first group held, the first line sent (a
    worker that never runs a task, as most ranks of a short run, costs no guard: a
    Python of its own, ~15 ms of cpu)."""

    def __init__(self, grace: float, start: bool = True) -> None:
        self.grace = grace
        self.lines: list[bytes] = []
        self.free: list[int] = []  # free slots, the lowest last
        self.table: mmap.mmap | None = None
        self.table_fd = -1
        self.pid = 0
        self.fd = -1
        self.started = False
        if start:
            self._start()

    def _start(self) -> None:
        self.started = True
        try:
            memfd = os.memfd_create("pmc-guard", os.MFD_CLOEXEC)
        except OSError as e:
            _cannot_start(e)
            return
        # Above the fds the guard gets (0-3), so that the spawn's dup2 to 3 is a real
        # one (it clears close-on-exec).
        self.table_fd = fcntl.fcntl(memfd, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(memfd)
        self.fd, self.pid = start(self.grace, self.table_fd)
        if self.fd >= 0:
            self._grow()
        else:
            os.close(self.table_fd)
            self.table_fd = -1

    def _grow(self) -> None:
        """Room for twice the slots (the first time: ``_FIRST_SLOTS``)."""
        old = len(self.table) // _SLOT.size if self.table is not None else 0
        size = max(_FIRST_SLOTS, 2 * old)
        os.ftruncate(self.table_fd, size * _SLOT.size)  # new slots read as zeros
        if self.table is not None:
            self.table.close()
        self.table = mmap.mmap(self.table_fd, size * _SLOT.size)
        self.free.extend(range(size - 1, max(old, _MARK + 1) - 1, -1))

    def ready(self) -> None:
        """Start the guard, if not yet: before the process whose group it is to hold."""
        if not self.started:
            self._start()

    def spawning(self) -> None:
        """A task is about to be spawned (the guard started first, if not yet): marked,
        until ``hold`` or ``spawned_none``, so that a worker killed before it holds the
        task's group still leaves no task behind."""
        self.ready()
        if self.table is not None:
            mark = -int(time.clock_gettime(time.CLOCK_BOOTTIME))
            _SLOT.pack_into(self.table, _MARK * _SLOT.size, mark, ~mark)

    def spawned_none(self) -> None:
        """The spawn marked failed: nothing to look for."""
        if self.table is not None:
            _SLOT.pack_into(self.table, _MARK * _SLOT.size, 0, 0)

    def hold(self, pgid: int) -> int:
        """Put a task's process group in the table (the spawn mark cleared); returns its
        slot (-1: no guard)."""
        self.ready()
        if self.table is None:
            return -1
        if not self.free:
            self._grow()
        slot = self.free.pop()
        _SLOT.pack_into(self.table, slot * _SLOT.size, pgid, ~pgid)
        _SLOT.pack_into(self.table, _MARK * _SLOT.size, 0, 0)
        return slot

    def release(self, slot: int) -> None:
        """The group of ``slot`` was reaped: not the guard's any more."""
        if slot >= 0 and self.table is not None:
            _SLOT.pack_into(self.table, slot * _SLOT.size, 0, 0)
            self.free.append(slot)

    def announce(self, line: bytes) -> None:
        """``cDIR``, with its newline."""
        if self.fd >= 0 or not self.started:
            self.lines.append(line)

    def flush(self) -> None:
        if self.lines and not self.started:
            self._start()
        if self.lines and self.fd >= 0:
            data = b"".join(self.lines)
            try:
                while data:
                    data = data[os.write(self.fd, data):]
            except OSError:
                os.close(self.fd)
                self.fd = -1
        self.lines.clear()


def start(grace: float, table: int) -> tuple[int, int]:
    """Start the guard with ``table`` as its fd 3; return the write end of its pipe and
    its pid ((-1, 0) if it could not start)."""
    rd, wr = os.pipe()
    argv = command(grace, os.getpid())
    pid = 0
    try:
        pid = os.posix_spawn(
            argv[0], argv, os.environ,
            file_actions=[(os.POSIX_SPAWN_DUP2, rd, 0),
                          (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                          (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                          (os.POSIX_SPAWN_DUP2, table, _TABLE_FD)],
            # Its own process group, so that a launcher killing the worker's group spares
            # it; but the job's session, which batch systems (PBS/Torque) account and
            # clean up by.
            setpgroup=0,
            setsigmask=(),  # nothing blocked (the worker's loop blocks what it waits for)
        )
    except OSError as e:
        _cannot_start(e)
        os.close(wr)
        wr = -1
    finally:
        os.close(rd)
    return wr, pid


def _cannot_start(e: OSError) -> None:
    from pmc import log  # the worker's side only: the program imports nothing of pmc

    log.warn(f"Cannot start the task guard ({e.strerror}): tasks may outlive a killed "
             "worker")


# -- the program ------------------------------------------------------------------------


def read_announcements(fd: int) -> list[str]:
    """Read the worker's lines from ``fd`` until EOF: the cgroup directories."""
    cgroups: list[str] = []
    buf = b""
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        *lines, buf = (buf + data).split(b"\n")
        cgroups.extend(line[1:].decode() for line in lines if line[:1] == b"c")
    return cgroups


def read_table(fd: int) -> set[int]:
    """The process groups held in the table at ``fd`` (none if there is no table)."""
    return {g for g, check in _slots(fd) if g > 0 and check == ~g}


def read_mark(fd: int) -> int | None:
    """The boot-time second of the spawn under way in the table at ``fd``, if one is."""
    for mark, check in _slots(fd)[_MARK : _MARK + 1]:
        if mark < 0 and check == ~mark:
            return -mark
    return None


def _slots(fd: int) -> list[tuple[int, int]]:
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0)
    except OSError:
        return []
    return list(_SLOT.iter_unpack(data[:len(data) - len(data) % _SLOT.size]))


def orphans(worker: int, since: int, guard_path: str) -> set[int]:
    """The task ``worker`` spawned, from boot-time second ``since`` on, and died before
    it could hold: a process group leader of this session whose parent is the worker
    or, once the worker's children are reparented (at most a moment after its pipe
    closed), the guard's own new parent; started since then; not a guard."""
    deadline = time.monotonic() + 1.0
    while os.getppid() == worker and time.monotonic() < deadline:
        time.sleep(0.01)
    parents = {worker, os.getppid()}
    me, session, tick = os.getpid(), os.getsid(0), os.sysconf("SC_CLK_TCK")
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or (pid := int(name)) == me:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            # After the name: state ppid pgrp session ... starttime (the 20th).
            fields = stat[stat.rindex(b")") + 2 :].split()
            ppid, pgrp, sid, start = (int(fields[i]) for i in (1, 2, 3, 19))
            if (pgrp != pid or sid != session or ppid not in parents
                    or start // tick < since - 1 or fields[0] == b"Z"):
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if guard_path.encode() in f.read():
                    continue
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        found.add(pid)
    return found


def _signal_all(groups: set[int], sig: int) -> set[int]:
    """Send ``sig`` to every group; those that still exist."""
    alive = set()
    for g in groups:
        try:
            os.killpg(g, sig)
            alive.add(g)
        except OSError:
            pass
    return alive


def terminate(groups: set[int], grace: float) -> None:
    """SIGTERM to every group, SIGKILL to what is left after ``grace`` seconds."""
    groups = _signal_all(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while groups and time.monotonic() < deadline:
        time.sleep(0.05)
        groups = _signal_all(groups, 0)
    _signal_all(groups, signal.SIGKILL)


def remove_cgroups(cgroups: list[str]) -> None:
    """The worker's accounting cgroups (gone already if it exited normally): once its
    tasks are, they can be removed (a few tries while the last processes leave)."""
    for _ in range(20):
        left = []
        for d in cgroups:
            try:
                for sub in os.listdir(d):
                    if sub.startswith("slot-"):
                        os.rmdir(os.path.join(d, sub))
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                left.append(d)
        cgroups = left
        if not cgroups:
            break
        time.sleep(0.1)


def main(argv: list[str]) -> int:
    # The job's SIGTERM/SIGINT/SIGHUP, and a batch system's warnings that time is short
    # (pmc.batchsignals), are for the worker: the guard acts only once the worker is gone.
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
              signal.SIGXCPU):
        signal.signal(s, signal.SIG_IGN)
    grace = float(argv[0])
    cgroups = read_announcements(0)
    groups = read_table(_TABLE_FD)
    since = read_mark(_TABLE_FD)
    if since is not None and len(argv) > 1:
        groups |= orphans(int(argv[1]), since, os.path.abspath(__file__))
    terminate(groups, grace)
    remove_cgroups(cgroups)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
