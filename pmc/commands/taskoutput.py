"""``-o`` / ``-e``: where the workers' task output files are merged at the end of a run."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from pmc import log
from pmc.errors import FatalError
from pmc.options import RunOptions


class TaskOutput:
    """``-o`` / ``-e``: opened before the run (so a path that cannot be written stops it
    before any task runs), and at the end given each worker's ``DAG.out.R`` /
    ``DAG.err.R``, worker by worker, whatever the outcome; the merged files are removed.

    Without ``-o`` / ``-e`` the output goes to this process's stdout / stderr. With
    ``--per-task-stdio`` there is nothing to merge and nothing is opened, as in PMC."""

    def __init__(self, opts: RunOptions) -> None:
        self.opts = opts
        self.out_fd = -1
        self.err_fd = -1
        self.pending = False  # merge still to do (after the workers are shut down)

    def open(self) -> None:
        o = self.opts
        if o.per_task_stdio:
            return
        if o.stdout:
            self.out_fd = _open_output(o.stdout, "stdout")
        if o.stderr:
            if o.stderr == o.stdout:
                self.err_fd = self.out_fd
            else:
                self.err_fd = _open_output(o.stderr, "stderr")

    def merge(self, size: int, warn_missing: bool = True,
              between: Callable[[], None] = lambda: None) -> bool:
        """Append every worker's files; False (and an error line) if one could not be.
        ``between`` runs before each file (the master's heartbeats)."""
        self.pending = False
        if self.opts.per_task_stdio:
            return True
        log.info("Merging task stdio from workers...")
        ok = True
        dag = self.opts.dag
        for rank in range(1, size):
            log.debug(f"Merging stdio from worker {rank}...")
            for kind, fd, stream in (("stdout", self.out_fd, sys.stdout),
                                     ("stderr", self.err_fd, sys.stderr)):
                path = f"{dag}.{kind[3:]}.{rank}"
                log.trace(f"Merging {kind} file: {path}")
                between()
                try:
                    if fd < 0:
                        stream.flush()
                    _copy_into(path, fd if fd >= 0 else stream.fileno())
                    os.unlink(path)
                except FileNotFoundError:
                    if warn_missing:
                        log.warn(f"No {kind} file: {path}")
                except (OSError, ValueError) as e:
                    ok = False
                    where = self.opts.stdout if kind == "stdout" else self.opts.stderr
                    log.error(f"Unable to merge task {kind} file {path} into "
                              f"{where or kind}: {getattr(e, 'strerror', None) or e}")
        return ok

    def close(self) -> None:
        for fd in {self.out_fd, self.err_fd}:
            if fd >= 0:
                os.close(fd)
        self.out_fd = self.err_fd = -1


def _open_output(path: str, kind: str) -> int:
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise FatalError(f"Unable to open {kind} file: {path}: {e.strerror}") from e


def _copy_into(path: str, out_fd: int) -> None:
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(out_fd, view):]
