"""Ending an MPI job whose workflow is over while ranks were given up on.

A rank the master gave up on (lost: silent past --worker-timeout, or its connection
broke) may never end: a rank whose processes are stopped, or on a node that hangs,
holds the launcher (Hydra's ``mpiexec -disable-auto-cleanup``, srun) and with it the
job until its wall time. So once the workflow is over and every record is written, the
master ends the job itself: ``MPI_Abort`` with the workflow's exit status (PMI's
abort in a run without MPI, ``pmc.transport.onehost``). Hydra's mpiexec then kills every
rank and exits with that status; srun ends the step, and pmc's batch script takes the
workflow's status from its record, as after any lost rank. The abort waits (at most
``DRAIN_WITHIN`` seconds) until the launcher has read what the master wrote to its
stdout and stderr: the launcher ends its part on the abort without reading the rest of
the master's pipes, and the run's last lines (``Workflow failed``, the warning below)
were lost so in one run of 20 to 40 under Hydra on a loaded 2-core machine. Should the
launcher still be there ``FALLBACK_AFTER`` seconds later (its part on a node that hangs
does not answer), a watchdog forked before the abort ends it: the job step (``scancel
JOB.STEP``) inside a Slurm allocation, else the process that started the master (the
launcher's proxy), killed.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from typing import NoReturn

from pmc import log
from pmc.process import flush_stdio, set_name

FALLBACK_AFTER = 15.0  # seconds the launcher has to act on MPI_Abort
DRAIN_WITHIN = 5.0  # seconds the launcher has to read the master's last lines


def end_job(abort: Callable[[int], object], code: int, lost: list[int]) -> NoReturn:
    """Abort the job with the workflow's status ``code`` (``abort``: the transport's);
    never returns."""
    log.warn(f"Ranks {lost} were given up on and may never end: ending the job "
             f"(MPI_Abort with the workflow's exit status {code})")
    flush_stdio()
    drained((1, 2), DRAIN_WITHIN)
    _watchdog(os.getppid())
    abort(code)
    os._exit(code)  # an abort does not come back: should it, leave all the same


def drained(fds: tuple[int, ...], within: float) -> bool:
    """Wait until whoever reads ``fds`` (pipes or sockets) has read all that was
    written to them, at most ``within`` seconds; whether they were. A file, a terminal
    or a closed descriptor has nothing to wait for."""
    deadline = time.monotonic() + within
    while (left := [fd for fd in fds if _unread(fd)]):
        if time.monotonic() >= deadline:
            return False
        fds = tuple(left)
        time.sleep(0.005)
    return True


def _unread(fd: int) -> int:
    """Bytes written to ``fd`` and not read yet at the other end: a pipe's content
    (FIONREAD, either end), a socket's send queue (TIOCOUTQ); 0 for anything else."""
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode):
            request = termios.FIONREAD
        elif stat.S_ISSOCK(mode):
            request = termios.TIOCOUTQ
        else:
            return 0
        return int(struct.unpack("i", fcntl.ioctl(fd, request, b"\0\0\0\0"))[0])
    except OSError:
        return 0


def _watchdog(launcher: int) -> None:
    """Fork a process that outlives this one and ends the launcher if it is still there
    after FALLBACK_AFTER seconds (it leaves as soon as the launcher is gone)."""
    try:
        pid = os.fork()
    except OSError:
        return  # MPI_Abort alone, then
    if pid:
        return
    try:
        os.setsid()  # out of the rank's process group: the launcher kills that one
        set_name("pmc-jobend")
        # Nothing of the rank's kept open (stdio pipes, PMI's socket): the launcher
        # waits for those to close.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 65536)
        deadline = time.monotonic() + FALLBACK_AFTER
        while _alive(launcher):
            if time.monotonic() > deadline:
                _end(launcher)
                break
            time.sleep(0.2)
    finally:
        os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return pid > 1


def _end(launcher: int) -> None:
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if job and step and step.isdigit():
        subprocess.run(["scancel", f"{job}.{step}"], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
                       check=False)
    else:
        os.kill(launcher, signal.SIGKILL)
