"""Open runs as real processes, for the tests of open runs (test_openrun,
test_opentcp): ``OpenRun`` (a ``pmc run --open`` of a DAG), the task lines they add and
what the tasks left."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pmctest import clean_env, pmc, rescue_done

# A task that waits for a file: it ends when the test says so (no timing assumed).
WAIT_FOR = "/bin/sh -c 'echo {name} >> ran.txt; while [ ! -e {gate} ]; do sleep 0.05; done'"
LOG = "/bin/sh -c 'echo {name} >> ran.txt'"


def wait_until(cond, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class OpenRun:
    """``pmc run --open`` of a DAG, as a real process."""

    def __init__(self, dag: Path, *extra: str, launcher: Sequence[str] = ()) -> None:
        self.dag = dag
        self.cwd = dag.parent
        workers = [] if launcher else ["--workers", "2"]
        self.proc = subprocess.Popen(
            [*launcher, sys.executable, "-m", "pmc", "run", "--open", *workers, *extra,
             dag.name], cwd=self.cwd, env=clean_env(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        # The token is written once the socket listens: the run is ready.
        wait_until(lambda: Path(f"{dag}.token").exists() or self.proc.poll() is not None,
                   "the run's token")
        assert self.proc.poll() is None, self.proc.communicate()

    def add(self, more: str, text: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pmc", "add", self.dag.name, more],
                              cwd=self.cwd, env=clean_env(), input=text,
                              capture_output=True, text=True, timeout=60)

    def done(self) -> list[str]:
        return rescue_done(Path(f"{self.dag}.rescue"), missing_ok=True)

    def finish(self) -> tuple[int, str, str]:
        r = pmc(["close", self.dag.name], self.cwd)
        assert r.returncode == 0, r.stderr
        out, err = self.proc.communicate(timeout=120)
        return self.proc.returncode, out, err

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def ran(cwd: Path) -> list[str]:
    path = cwd / "ran.txt"
    return path.read_text().split() if path.exists() else []
