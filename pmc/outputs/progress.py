"""Progress of a run while it runs (a pmc extension; the drop-in command shows none).

- On a terminal (stderr a tty, text log at the default level): one live line at the
  bottom of stderr — done/total, running, failed, rate, ETA — redrawn twice a second.
  Log lines written meanwhile clear it and it is drawn again below them (``pmc.log``
  orders the two); it is cleared when the workflow's loop ends, before the end-of-run
  lines.
- Otherwise (a batch job's output file, a pipe): every ``--progress-interval`` seconds
  (default 60; 0 is off) the same figures as a log line, ``[info] Progress: ...``, so
  ``tail -f`` of the job's output shows movement.

The figures are read from the run's ``Tally`` by a thread: the master's loop pays
nothing for them.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time

from pmc import log
from pmc.core.events import Observer, RunInfo, Summary
from pmc.options import RunOptions
from pmc.outputs.tally import Tally

LIVE_EVERY = 0.5  # seconds between redraws of the live line


def text(t: Tally, now: float | None = None) -> str:
    """``12/200 done, 4 running, 1 failed, 3.2 tasks/s, ETA 00:59``: done counts tasks
    done in earlier runs and reused (--reuse) too; the rate is of tries that ended in
    this run."""
    info = t.info
    total = info.tasks if info is not None else 0
    done = (info.recovered + info.reused if info is not None else 0) + t.succeeded
    ended = t.succeeded + t.failed
    now = time.time() if now is None else now
    elapsed = now - t.start
    rate = ended / elapsed if elapsed > 0 else 0.0
    left = max(0, total - done - t.failed)
    parts = [f"{done}/{total} done", f"{len(t.running)} running", f"{t.failed} failed",
             f"{rate:.1f} tasks/s"]
    if left == 0:
        parts.append("ETA 00:00")
    elif rate > 0:
        parts.append(f"ETA {clock(left / rate)}")
    else:
        parts.append("ETA --:--")
    return ", ".join(parts)


def clock(seconds: float) -> str:
    """``MM:SS``, or ``H:MM:SS`` from an hour: an ETA."""
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def wants_live(opts: RunOptions) -> bool:
    """The live line: asked for, a terminal, and plain text lines at the default level
    (JSON lines must stay one object a line; -v's task lines would bury it; -q is quiet)."""
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    return (opts.live_progress and tty and opts.log_format == "text"
            and opts.log_level == log.INFO and opts.progress_interval != 0)


class Progress(Observer):
    """Draws the live line or logs a progress line now and then (module docstring)."""

    def __init__(self, tally: Tally, live: bool, interval: float) -> None:
        self.tally = tally
        self.live = live
        self.interval = interval
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def started(self, info: RunInfo) -> None:
        if self.thread is None and (self.live or self.interval > 0):
            self.thread = threading.Thread(target=self._run, name="pmc-progress",
                                           daemon=True)
            self.thread.start()

    def _run(self) -> None:
        every = LIVE_EVERY if self.live else self.interval
        while not self.stopping.wait(every):
            line = text(self.tally)
            if self.live:
                log.set_live(_fit(line))
            else:
                log.info(f"Progress: {line}")

    def stop(self) -> None:
        """End the line (idempotent): the thread first, then the live line goes."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.live:
            log.set_live("")

    def finished(self, summary: Summary) -> None:
        self.stop()

    def close(self) -> None:
        self.stop()


def _fit(line: str) -> str:
    """Cut to the terminal's width: a line that wrapped could not be cleared with \\r."""
    try:
        cols = os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        cols = 0
    if cols <= 0:  # a pty nobody gave a size (script, ssh -t): $COLUMNS, else 80
        cols = shutil.get_terminal_size((80, 24)).columns or 80
    return line[:max(1, cols - 1)]


def progress_observer(opts: RunOptions, observers: list[Observer]) -> Progress | None:
    """The run's Progress (None when there is none to show), reading the tally among
    ``observers``."""
    live = wants_live(opts)
    interval = opts.progress_interval or 0.0
    if not live and interval <= 0:
        return None
    tally = next((o for o in observers if isinstance(o, Tally)), None)
    if tally is None:
        return None
    return Progress(tally, live, interval)
