"""The task guard: a small program each worker starts, which outlives it.

The worker announces every task's process group on a pipe only it holds (the guard's
stdin), one line each: ``+PGID`` when started, ``-PGID`` when reaped, and ``cDIR`` for
each of its accounting cgroups. When that pipe reaches EOF the worker is gone (exited, or
killed with SIGKILL, e.g. by mpiexec tearing down the job, where nothing of the worker
can run), and the guard terminates the groups still announced: SIGTERM, then SIGKILL
after the grace period (argv[1], seconds); then it removes the cgroups. No per-task
preexec, no PR_SET_PDEATHSIG.

Run as a program (``command``): ``python -I -S`` imports this file as the top-level
module ``guard`` from its own directory and calls ``main(argv)``. As a program it imports
nothing of pmc (not even the ``pmc`` package), and it is loaded from its cached bytecode,
so that starting it costs what the ``python -c`` of its source it replaces did (not the
~1 ms of compiling this file as a script). The worker's end (``Guard``: starting it,
writing the lines) is here too, imported by the worker as a module.
"""

import os
import signal
import sys
import time

# The module's directory is appended to the path (after the standard library's): only
# ``guard`` is looked up there. Its path is on the command line, where ps shows it.
_BOOT = ("import sys; sys.path.append(sys.argv[1].rpartition('/')[0]); import guard; "
         "sys.exit(guard.main(sys.argv[2:]))")


def command(grace: float) -> list[str]:
    """The command that runs the guard with ``grace`` seconds between SIGTERM and
    SIGKILL."""
    return [sys.executable, "-I", "-S", "-c", _BOOT, os.path.abspath(__file__), repr(grace)]


class Guard:
    """The worker's end of its guard's pipe. Lines are sent by ``flush`` once per loop
    turn: one write (and one wake-up of the guard) for every task started and reaped in
    the turn, not two per task."""

    def __init__(self, grace: float) -> None:
        self.fd = start(grace)
        self.lines: list[bytes] = []

    def announce(self, line: bytes) -> None:
        """``+PGID``, ``-PGID`` or ``cDIR``, with its newline."""
        if self.fd >= 0:
            self.lines.append(line)

    def flush(self) -> None:
        if self.lines and self.fd >= 0:
            data = b"".join(self.lines)
            try:
                while data:
                    data = data[os.write(self.fd, data):]
            except OSError:
                os.close(self.fd)
                self.fd = -1
        self.lines.clear()


def start(grace: float) -> int:
    """Start the guard; return the write end of its pipe (-1 if it could not start)."""
    rd, wr = os.pipe()
    argv = command(grace)
    try:
        os.posix_spawn(
            argv[0], argv, os.environ,
            file_actions=[(os.POSIX_SPAWN_DUP2, rd, 0),
                          (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                          (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)],
            # Its own process group, so that a launcher killing the worker's group spares
            # it; but the job's session, which batch systems (PBS/Torque) account and
            # clean up by.
            setpgroup=0,
        )
    except OSError as e:
        from pmc import log  # the worker's side only: the program imports nothing of pmc

        log.warn(f"Cannot start the task guard ({e.strerror}): tasks may outlive a killed "
                 "worker")
        os.close(wr)
        wr = -1
    finally:
        os.close(rd)
    return wr


# -- the program ------------------------------------------------------------------------


def read_announcements(fd: int) -> tuple[set[int], list[str]]:
    """Read the worker's lines from ``fd`` until EOF: the process groups still announced,
    and the cgroup directories."""
    groups: set[int] = set()
    cgroups: list[str] = []
    buf = b""
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        *lines, buf = (buf + data).split(b"\n")
        for line in lines:
            if line[:1] == b"c":
                cgroups.append(line[1:].decode())
                continue
            (groups.add if line[:1] == b"+" else groups.discard)(int(line[1:]))
        time.sleep(0.1)  # let lines gather in the pipe: a few wake-ups a second, not 2 per task
    return groups, cgroups


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
    # The job's SIGTERM/SIGINT/SIGHUP are for the worker: the guard acts only once the
    # worker is gone.
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    grace = float(argv[0])
    groups, cgroups = read_announcements(0)
    terminate(groups, grace)
    remove_cgroups(cgroups)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
