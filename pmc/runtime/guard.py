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


def command(grace: float) -> list[str]:
    """The command that runs the guard with ``grace`` seconds between SIGTERM and
    SIGKILL."""
    return [sys.executable, "-I", "-S", "-c", _BOOT, os.path.abspath(__file__), repr(grace)]


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
        self.free.extend(range(size - 1, old - 1, -1))

    def ready(self) -> None:
        """Start the guard, if not yet: before the process whose group it is to hold."""
        if not self.started:
            self._start()

    def hold(self, pgid: int) -> int:
        """Put a task's process group in the table; returns its slot (-1: no guard)."""
        self.ready()
        if self.table is None:
            return -1
        if not self.free:
            self._grow()
        slot = self.free.pop()
        _SLOT.pack_into(self.table, slot * _SLOT.size, pgid, ~pgid)
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
    argv = command(grace)
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
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0)
    except OSError:
        return set()
    data = data[:len(data) - len(data) % _SLOT.size]
    return {g for g, check in _SLOT.iter_unpack(data) if g > 0 and check == ~g}


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
    terminate(read_table(_TABLE_FD), grace)
    remove_cgroups(cgroups)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
