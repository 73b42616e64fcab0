"""Writing a file whole or not at all: the one write-then-rename of the project."""

from __future__ import annotations

import os


def atomic_write(path: str | os.PathLike[str], data: str | bytes, mode: int = 0o666,
                 durable: bool = False) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path``: a
    reader sees the old content or the new, never a part. ``durable``: the data and the
    rename reach the disk before this returns (fsync of the file and its directory).
    Raises OSError; the temporary file is removed then."""
    path = os.fspath(path)
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.tmp{os.getpid()}")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
            if mode & ~0o666:  # the umask may have taken bits a script needs
                os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        # The rename must survive a crash too. Some file systems refuse to sync a
        # directory: the data is durable, the rename as durable as they make it.
        try:
            dfd = os.open(head or ".", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)
