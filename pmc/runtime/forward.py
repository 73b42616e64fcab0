"""The master's side of I/O forwarding: appending tasks' forwarded output to its files.

A bounded cache of open descriptors, as PMC keeps (its end-of-run "file descriptor
cache hit rate" is this cache's).
"""

from __future__ import annotations

import os
import resource
from collections import OrderedDict


class ForwardFiles:
    """The master's appending writers for I/O forwarding, at most ``maxfds`` open at once
    (least recently used closed first). Files are opened in append mode, never truncated."""

    def __init__(self, maxfds: int) -> None:
        self.maxfds = maxfds
        self.fds: OrderedDict[str, int] = OrderedDict()
        self.hits = 0  # writes to a file already open, for the end-of-run hit rate
        self.misses = 0

    def write(self, path: str, data: bytes) -> None:
        fd = self.fds.get(path)
        if fd is None:
            self.misses += 1
            if len(self.fds) >= self.maxfds:
                _, old = self.fds.popitem(last=False)
                os.close(old)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
            self.fds[path] = fd
        else:
            self.hits += 1
            self.fds.move_to_end(path)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def hitrate(self) -> float:
        """Share of writes that found their file open (1.0 with none, as PMC's)."""
        total = self.hits + self.misses
        return self.hits / total if total else 1.0

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def default_maxfds() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 256
    # Leave room for the master's own files and the transport's sockets.
    return max(1, min(256, soft // 2))
