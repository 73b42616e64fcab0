"""The rescue log: which tasks finished, durable before the task counts as done.

Format (FORMATS.md): each record is ``"\\nDONE <name>"`` — newline first — so a complete
log of the diamond DAG is an empty first line followed by ``DONE A`` .. ``DONE D``.
On start the old log is read (unless ``-s``), then replaced atomically by a new log that
begins with a DONE record for every task already done. Each batch of records is written
with one ``write()`` (a killed process cannot tear it); one ``fdatasync()``, run by a
thread so the master keeps working, covers every batch written before it.

A task not run because its declared outputs are up to date (``--reuse``, a pmc
extension, in DAGs that only pmc runs) has a ``REUSED <name>`` record instead, read
back as done.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable

from pmc.dag import DAG
from pmc.files import atomic_write

_BLANKS = b" \t\r"
_RECORDS = (b"DONE", b"REUSED")
_BLANK_RUN = re.compile(b"[ \t\r]+")


class RescueError(Exception):
    pass


def read_rescue(path: str, dag: DAG) -> tuple[set[int], list[str]]:
    """Task ids recorded DONE (or REUSED) in an existing log, and warnings about lines
    ignored.

    A missing file means nothing is done. A torn last line (a crash mid-write) or a
    record naming a task the DAG does not have is ignored with a warning, never fatal.
    """
    done, reused, warnings = read_records(path, dag)
    return done | reused, warnings


def read_records(path: str, dag: DAG) -> tuple[set[int], set[int], list[str]]:
    """``read_rescue``, with the REUSED records apart: (done, reused, warnings)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return set(), set(), []
    except OSError as e:
        raise RescueError(f"{path}: cannot read rescue log: {e.strerror}") from e
    done: set[int] = set()
    reused: set[int] = set()
    warnings: list[str] = []
    index = dag.index
    lines = data.split(b"\n")
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip(_BLANKS)
        if not line or line.startswith(b"#"):
            continue
        # Fields split where the DAG's do (space, tab, CR), so a name that holds another
        # blank (a vertical tab, an NBSP) is read back whole.
        fields = _BLANK_RUN.split(line)
        last = lineno == len(lines)
        if len(fields) != 2 or fields[0] not in _RECORDS:
            what = "torn last record" if last else "unrecognised record"
            warnings.append(f"{path}:{lineno}: ignoring {what}: {raw[:80]!r}")
            continue
        name = fields[1].decode("utf-8", "replace")
        task_id = index.get(name)
        if task_id is None:
            task_id = dag.id_of(name)  # an array member (its name is no index key)
            if task_id is None:
                what = "torn last record" if last else "unknown task"
                warnings.append(f"{path}:{lineno}: ignoring {what} {name!r}")
                continue
        (done if fields[0] == b"DONE" else reused).add(task_id)
    reused -= done
    return done, reused, warnings


class RescueLog:
    """The log being written by this run."""

    def __init__(self, path: str, dag: DAG, done: Iterable[int],
                 reused: Iterable[int] = ()) -> None:
        self.path = path
        self._syncer: _Syncer | None = None
        name_of = dag.name_of
        data = _records(map(name_of, sorted(done)))
        if reused:
            data += _records(map(name_of, sorted(reused)), "REUSED")
        try:
            atomic_write(path, data, durable=True)
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as e:
            raise RescueError(f"{path}: cannot write rescue log: {e.strerror}") from e

    def record(self, names: Iterable[str]) -> None:
        """Append DONE records and make them durable before returning."""
        if self.write(names):
            self.sync()

    def write(self, names: Iterable[str]) -> bool:
        """Append DONE records with one write(), not yet durable; False if none.

        The master lets other work (sending ready tasks to freed slots) overlap the
        ``sync()`` that must follow before the tasks count as done."""
        data = _records(names)
        if not data:
            return False
        _write_all(self.fd, data)
        return True

    def sync(self) -> None:
        os.fdatasync(self.fd)

    # Group commit: the master asks for a sync and goes on working; a thread runs
    # fdatasync (which releases the GIL) and one sync covers every write before it.

    def request_sync(self, urgent: bool = True) -> int:
        """Ask for everything written so far to become durable; returns a ticket that
        ``synced()`` reaches once it is. ``urgent``: someone waits for it (finished tasks
        whose children are wanted), so sync within SYNC_SPACING; otherwise within
        LAZY_SPACING, together with whatever comes meanwhile."""
        if self._syncer is None:
            self._syncer = _Syncer(self.fd)
            self._syncer.start()
        return self._syncer.request(urgent)

    def synced(self) -> int:
        """The highest ticket known durable. Raises RescueError if a sync failed."""
        syncer = self._syncer
        if syncer is None:
            return 0
        if syncer.error is not None:
            raise RescueError(f"{self.path}: cannot sync rescue log: {syncer.error}")
        return syncer.done

    def wait_synced(self, ticket: int) -> None:
        if self._syncer is not None:
            self._syncer.wait(ticket)
        self.synced()

    def close(self) -> None:
        if self._syncer is not None:
            self._syncer.stop()
            self._syncer = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# Syncs start at most this often: at thousands of results a second, each sync covers
# several batches (and a task waits at most this much longer to count as done), instead
# of one sync per batch keeping the disk's journal and a core busy.
SYNC_SPACING = 0.002
# ... and when nobody waits for them (every slot busy with work ready), this often: each
# sync costs the master wake-ups and a journal commit on a core the tasks need. 500 syncs
# a second took ~7 % of the cpu of a run of short tasks on two cores.
LAZY_SPACING = 0.02


class _Syncer(threading.Thread):
    def __init__(self, fd: int) -> None:
        super().__init__(name="rescue-sync", daemon=True)
        self.fd = fd
        self.cond = threading.Condition()
        self.requested = 0
        self.done = 0
        self.urgent = False  # a request since the last sync wants it soon
        self.error: str | None = None
        self.stopping = False
        self.idle = False  # waiting for a request (only then does a request wake it)
        self.lazing = False  # holding lazy requests back (an urgent one wakes it)

    def request(self, urgent: bool) -> int:
        with self.cond:
            self.requested += 1
            if urgent:
                self.urgent = True
            if self.idle or (urgent and self.lazing):
                self.cond.notify_all()
            return self.requested

    def wait(self, ticket: int) -> None:
        with self.cond:
            if self.done < ticket and not self.urgent:
                self.urgent = True
                self.cond.notify_all()
            while self.done < ticket and self.error is None and self.is_alive():
                self.cond.wait(1.0)

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.join()

    def run(self) -> None:
        last = -LAZY_SPACING
        while True:
            with self.cond:
                self.idle = True
                while self.requested == self.done and not self.stopping:
                    self.cond.wait()
                self.idle = False
                if self.requested == self.done:
                    return
                # Lazy requests gather until LAZY_SPACING after the last sync, unless an
                # urgent one (or the end) comes first.
                self.lazing = True
                while not (self.urgent or self.stopping):
                    pause = last + LAZY_SPACING - time.monotonic()
                    if pause <= 0:
                        break
                    self.cond.wait(pause)
                self.lazing = False
            pause = last + SYNC_SPACING - time.monotonic()
            if pause > 0 and not self.stopping:
                time.sleep(pause)  # requests meanwhile join this sync
            with self.cond:
                target = self.requested
                self.urgent = False
            last = time.monotonic()
            try:
                os.fdatasync(self.fd)
            except OSError as e:
                with self.cond:
                    self.error = e.strerror or str(e)
                    self.cond.notify_all()
                return
            with self.cond:
                self.done = target
                self.cond.notify_all()


def _records(names: Iterable[str], record: str = "DONE") -> bytes:
    return "".join(f"\n{record} {n}" for n in names).encode()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]

