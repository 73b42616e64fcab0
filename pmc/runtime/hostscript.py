"""A worker's host script (``--host-script``): started before any task, waited for (up
to its timeout, then SIGALRM), its process group killed at the end of the run."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from pmc import log
from pmc.runtime.guard import Guard
from pmc.runtime.launch import KILL_GRACE, group_alive, signal_group

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    import subprocess


class HostScript:
    def __init__(self, path: str, rank: int, env: dict[str, str], guard: Guard) -> None:
        self.path = path
        self.rank = rank
        self.env = env  # with PMC_HOST_RANK and PMC_RANK
        self.guard = guard
        self.proc: subprocess.Popen[bytes] | None = None

    def run(self, timeout: float, stop_asked: Callable[[], bool],
            hostname: str) -> tuple[bool, str]:
        """Start the script and wait for it to exit 0 (SIGALRM after ``timeout`` s, or
        when ``stop_asked()``: the run is stopping). (ok, the message for the master)."""
        import subprocess  # here: a run without a host script never needs it

        path = self.path
        rank = self.rank
        log.debug(f"Worker {rank}: Launching host script {path}")
        self.guard.spawning()
        try:
            # Its stdout goes to stderr, as the reference's: the run's stdout carries the
            # records. Its own process group (killed at the end), but the job's session,
            # so that batch systems that account by session see it.
            self.proc = subprocess.Popen(
                [path], stdin=subprocess.DEVNULL, stdout=2, process_group=0, env=self.env,
            )
        except OSError as e:
            self.guard.spawned_none()
            # PMC's child writes this and exits 1 (wait status 256).
            log.error(f"Unable to exec host script: {e.strerror}")
            return False, f"Worker {rank}: Host script failed with status 256"
        proc = self.proc
        self.guard.hold(proc.pid)  # its group lives until the end of the run
        deadline = time.monotonic() + timeout
        code: int | None = None
        while code is None:
            try:
                code = proc.wait(0.1)
            except subprocess.TimeoutExpired:
                pass
            else:
                break
            # The master may stop the run meanwhile (a signal): do not make it wait for
            # the rest of the script's 60 s.
            stop = stop_asked()
            if stop or time.monotonic() >= deadline:
                proc.send_signal(signal.SIGALRM)
                try:
                    proc.wait(KILL_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                if stop:
                    return False, f"Worker {rank}: Host script interrupted: the run is stopping"
                return False, f"Worker {rank}: Host script timed out after {timeout:g} seconds"
        status = -code if code < 0 else code << 8  # the raw wait status, as PMC reports it
        if code < 0:
            log.debug(f"Worker {rank}: Host script exited on signal {-code} ({status})")
        else:
            log.debug(f"Worker {rank}: Host script exited with status {code} ({status})")
        if code != 0:
            return False, f"Worker {rank}: Host script failed with status {status}"
        return True, f"Worker {rank}: Host script {path} finished on {hostname}"

    def stop(self) -> None:
        """SIGTERM to the script's process group, SIGKILL a few seconds later."""
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        pgid = proc.pid
        log.debug(f"Worker {self.rank}: Terminating host script process group with SIGTERM")
        if not signal_group(pgid, signal.SIGTERM):
            return
        deadline = time.monotonic() + KILL_GRACE
        while time.monotonic() < deadline:
            proc.poll()
            if not group_alive(pgid):
                return
            time.sleep(0.05)
        if signal_group(pgid, signal.SIGKILL):
            log.warn(f"Worker {self.rank}: Sent SIGKILL to resilient host script processes")
        proc.poll()
