"""Declared files (``--inputs``/``--outputs``, pmc extensions) as the file system has them.

Paths are as written in the DAG, relative to the DAG's directory. A worker checks a try
that exited 0 for its declared outputs (``missing_output``: on the host that ran it,
which sees what the task wrote); the master reads the times of every declared file
before a ``--reuse`` run (``FileTimes``), for ``pmc.core.reuse`` to decide what is up to
date. Only ``os`` here: every worker imports this at start.
"""

from __future__ import annotations

import os


def missing_output(dag_dir: str, outputs: tuple[str, ...]) -> str | None:
    """Why a try that exited 0 failed all the same: the first declared output that is not
    there; None when all are."""
    for path in outputs:
        full = os.path.join(dag_dir, path)
        try:
            os.stat(full)
        except OSError as e:
            where = "" if os.path.isabs(path) else f" (no {full}: {e.strerror})"
            return f"declared output {path} is missing{where}"
    return None


class FileTimes:
    """Modification times of declared files (nanoseconds), each file looked at once."""

    __slots__ = ("dag_dir", "seen")

    def __init__(self, dag_dir: str) -> None:
        self.dag_dir = dag_dir
        self.seen: dict[str, int] = {}  # -1: missing

    def mtime(self, path: str) -> int:
        """The file's modification time; -1 if it is missing."""
        found = self.seen.get(path)
        if found is None:
            try:
                found = os.stat(os.path.join(self.dag_dir, path)).st_mtime_ns
            except OSError:
                found = -1
            self.seen[path] = found
        return found

    def oldest(self, paths: tuple[str, ...]) -> int:
        """The oldest of the files; -1 if one is missing."""
        return min(map(self.mtime, paths))

    def newest(self, paths: tuple[str, ...] | None) -> int:
        """The newest of the files that exist; -1 if none does (or none is given)."""
        return max(map(self.mtime, paths or ()), default=-1)
