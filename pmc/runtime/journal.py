"""The journal of an open run (a pmc extension): every batch of tasks added to it,
beside the DAG as ``DAG.added``, durable before the batch is acknowledged.

Each batch is one record: a line ``# pmc batch BYTES SHA`` (SHA: the first 16 hex
digits of the batch's SHA-256) and the batch's text, written with one ``write()`` and
``fsync``ed. A run of the DAG reads the DAG, then the journal's batches in order
(``replay``), then the rescue log: it knows the added tasks and which of them are
done. A torn last record (the master killed mid-write, never acknowledged) is ignored
with a warning.
"""

from __future__ import annotations

import os

from pmc.dag.extend import Batch, extend, parse_batch
from pmc.dag.model import DAG, DagError

_MAGIC = b"# pmc batch "


def journal_path(dag: str) -> str:
    return f"{dag}.added"


def _digest(data: bytes) -> str:
    import hashlib  # only where a journal is: not in every run's start-up

    return hashlib.sha256(data).hexdigest()[:16]


class Journal:
    """The journal open for appending (created 0600 if missing)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.lines = _count_lines(path)  # lines in the file: where the next batch starts

    def append(self, text: str) -> None:
        """Make a batch durable (raises OSError if it could not be)."""
        data = text.encode("utf-8")
        if not data.endswith(b"\n"):
            data += b"\n"
        record = _MAGIC + f"{len(data)} {_digest(data)}\n".encode() + data
        written = os.write(self.fd, record)
        if written != len(record):
            raise OSError(f"short write to {self.path}: {written} of {len(record)} bytes")
        os.fsync(self.fd)
        self.lines += 1 + data.count(b"\n")

    def close(self) -> None:
        os.close(self.fd)


def _count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return f.read().count(b"\n")


def replay(dag: DAG, path: str) -> tuple[int, list[str]]:
    """Add the journal's batches to ``dag``: (tasks added, warnings). A batch that no
    longer fits the DAG raises DagError naming the journal's line."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return 0, []
    except OSError as e:
        raise DagError(path, None, f"cannot read the journal of added tasks: {e.strerror}"
                       ) from None
    pos, lineno, added = 0, 0, 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        head = data[pos:end].split() if end >= 0 else []
        torn = f"{path}:{lineno + 1}: ignoring a torn last batch (never acknowledged)"
        if len(head) != 5 or data[pos:end].startswith(_MAGIC) is False or not head[3].isdigit():
            if end < 0 or data.find(_MAGIC, end) < 0:
                return added, [torn]
            raise DagError(path, lineno + 1, "not a batch record of the journal")
        size = int(head[3])
        body = data[end + 1 : end + 1 + size]
        if len(body) < size or _digest(body) != head[4].decode():
            if end + 1 + size >= len(data):
                return added, [torn]
            raise DagError(path, lineno + 1, "a batch of the journal does not match its sum")
        batch: Batch = parse_batch(dag, path, body.decode("utf-8"), lineno + 1)
        extend(dag, batch)
        added += len(batch.tasks)
        lineno += 1 + body.count(b"\n")
        pos = end + 1 + size
    return added, []
