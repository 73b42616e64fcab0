"""``DAG.status.json``: the snapshot of a run that ``pmc status`` reads.

``StatusFile`` is the observer that keeps it next to the DAG from the run's tally: counts
of done / running / failed / ready tasks, the names of running and failed tasks, pid and
host of the master, the URL of its metrics endpoint (if it serves one) and the run's
state. It is replaced atomically (tmp + rename) at most once a second, by a thread, and
once more at the end, so it costs nothing per task and needs no log option. Nothing is
written before the run has started.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from itertools import islice
from typing import Any

from pmc import log
from pmc.core.events import Observer, RunInfo, Summary
from pmc.files import atomic_write
from pmc.outputs.tally import Tally

SNAPSHOT_EVERY = 1.0  # seconds, at most
NAMES_KEPT = 20  # running / failed task names in the snapshot
SNAPSHOT_VERSION = 1


def snapshot_path(dag_path: str) -> str:
    return f"{dag_path}.status.json"


class StatusFile(Observer):
    """Keeps ``DAG.status.json`` up to date from the tally (see the module docstring).

    Snapshots during the run are written by a thread: on ext4, replacing a file first
    flushes the new one's data to disk (``auto_da_alloc``), ~30 ms in which a master
    writing it itself would leave every slot without its next task. The last one is
    written on the spot, after any still in flight."""

    def __init__(self, dag_path: str, tally: Tally, metrics_url: str = "") -> None:
        self.path = snapshot_path(dag_path)
        self.tally = tally
        self.metrics_url = metrics_url  # the run's metrics endpoint, if it serves one
        self.host = socket.gethostname()
        self.next_write = float("inf")  # no snapshot before the run has started
        self.state = "starting"
        self.reason = ""
        self.failed_to_write = False
        self.writer: _Writer | None = None

    def started(self, info: RunInfo) -> None:
        self.state = "running"
        self.next_write = 0.0
        self.write_later()

    def flush(self) -> None:
        now = time.monotonic()
        if now >= self.next_write:
            self.next_write = now + SNAPSHOT_EVERY
            self.write_later()

    def finished(self, summary: Summary) -> None:
        self.state = summary.outcome
        self.reason = summary.reason
        self.write()

    def close(self) -> None:
        if self.state == "running":
            # Closed without a summary: the run stopped on a fatal error. (Closed before
            # it started, there is no run to tell of, and nothing is written.)
            self.state = "aborted"
            self.write()
        self.stop_writer()

    def snapshot(self) -> dict[str, Any]:
        t = self.tally
        info = t.info
        s = t.summary
        # The first few only (on the master's thread, so the dict holds still): a copy of
        # every running task's entry would cost a pass over all slots each second.
        running = [entry[0].name for entry in islice(t.running.values(), NAMES_KEPT)]
        return {
            "version": SNAPSHOT_VERSION,
            "dag": os.path.abspath(t.dag),
            "state": self.state,
            "reason": self.reason,
            "pid": os.getpid(),
            "host": self.host,
            "start": t.start,
            "updated": time.time(),
            "wall": t.wall(),
            "tasks": info.tasks if info else 0,
            "recovered": info.recovered if info else 0,
            "succeeded": t.succeeded,
            "failed": t.failed,
            "retries": t.retried,
            "running": len(t.running),
            "queued": t.queued,
            "ready": t.ready_now,
            "held": t.held_n if s is None else s.held,
            "slots": t.slots,
            "running_tasks": running,
            "failed_tasks": t.failed_names[:NAMES_KEPT],
            # pmc extensions: GPUs of each host that has some, and the multi-rank tasks
            # running with their hosts.
            "gpus": {host: {"busy": busy, "total": total}
                     for host, (busy, total) in t.host_gpus.copy().items()},
            "multirank_tasks": [{"task": name, "hosts": hosts.split(",")}
                                for name, hosts in islice(t.multirank.copy().values(),
                                                          NAMES_KEPT)],
            "metrics": self.metrics_url,
            # pmc extension: each worker host, its cpus and memory as its worker found
            # them, and the tasks it ran.
            "hosts": [{"name": name, "cpus": h.cpus, "memory_mb": h.memory,
                       "tasks": t.host_tasks.get(name, 0),
                       "task_seconds": round(t.host_runtime.get(name, 0.0), 3)}
                      for name, h in sorted(t.hosts.copy().items())],
            # pmc extensions: tasks reused (--reuse), and each task array's members.
            "reused": t.reused_n,
            "arrays": [{"name": name, "members": a.members, "done": a.done,
                        "reused": a.reused, "running": a.running, "failed": a.failed,
                        "failed_members": a.failed_names}
                       for name, a in t.arrays.items()],
        }

    def text(self) -> str:
        return json.dumps(self.snapshot(), separators=(",", ":")) + "\n"

    def write_later(self) -> None:
        if self.writer is None:
            self.writer = _Writer(self)
            self.writer.start()
        self.writer.submit(self.text())

    def stop_writer(self) -> None:
        if self.writer is not None:
            self.writer.stop()
            self.writer = None

    def write(self) -> None:
        self.stop_writer()  # nothing older may land after this one
        self.put(self.text())

    def put(self, text: str) -> None:
        try:
            atomic_write(self.path, text)
        except OSError as e:
            if not self.failed_to_write:
                # Once: a read-only DAG directory must not flood the log or stop the run.
                self.failed_to_write = True
                log.warn(f"Cannot write status snapshot {self.path}: {e}")


class _Writer(threading.Thread):
    """Puts the latest snapshot submitted; older ones not yet written are skipped."""

    def __init__(self, status: StatusFile) -> None:
        super().__init__(name="status-snapshot", daemon=True)
        self.status = status
        self.cond = threading.Condition()
        self.pending: str | None = None
        self.stopping = False

    def submit(self, text: str) -> None:
        with self.cond:
            self.pending = text
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.join()

    def run(self) -> None:
        while True:
            with self.cond:
                while self.pending is None and not self.stopping:
                    self.cond.wait()
                text, self.pending = self.pending, None
            if text is None:
                return
            self.status.put(text)
