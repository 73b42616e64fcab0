"""A task's I/O as its worker handles it: the stdout/stderr files (the worker's shared
ones, or per task), the stderr tail of a failed try, what the task forwards to the master
through its ``-f`` pipes, and the ``-F`` files it leaves behind.

Pipe forwarding has no limit (as the manual promises). A task's pipe data waits in memory
up to PIPE_MEMORY, all pipes together; beyond it each growing pipe goes on in an unlinked
temporary file, and reaches the master in FORWARD_CHUNK pieces before the try's result.
(The master's side, appending forwarded data to its files, is ``pmc.runtime.forward``.)
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from pmc import log
from pmc.core import protocol
from pmc.core.protocol import TaskSpec

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import Any

FILE_FORWARD_LIMIT = 1 << 20  # the reference's limit for -F files
PIPE_MEMORY = 8 << 20
FORWARD_CHUNK = 4 << 20
# A failed try's stderr tail sent to the master: at most this many lines and bytes.
TAIL_LINES = 10
TAIL_BYTES = 2048
_READ = 1 << 16


# -- standard files ---------------------------------------------------------------------


def open_append(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)


def open_task_stdio(base: str) -> tuple[int, int]:
    """--per-task-stdio: ``base.out.NNN`` and ``base.err.NNN`` for the first NNN (000,
    001, ...) whose .out file does not exist yet, as the reference numbers them: a retry,
    and a restarted run, take the next number instead of overwriting. O_EXCL finds it
    in one open() in the usual case, and two workers cannot take the same."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    seq = 0
    while True:
        try:
            out = os.open(f"{base}.out.{seq:03d}", flags, 0o666)
            break
        except FileExistsError:
            seq += 1
    try:
        err = os.open(f"{base}.err.{seq:03d}", flags & ~os.O_EXCL | os.O_TRUNC, 0o666)
    except OSError:
        os.close(out)
        raise
    return out, err


def append(fd: int, text: str) -> None:
    """Write a record (or the message of a failed start) to a task's output file."""
    try:
        os.write(fd, text.encode())
    except OSError as e:
        log.error(f"Cannot write task record: {e.strerror}")


def tail(path: str, offset: int) -> str | None:
    """The last lines a failed try wrote to its stderr (from ``offset`` on), bounded by
    TAIL_LINES and TAIL_BYTES; None if there are none."""
    try:
        with open(path, "rb") as f:
            end = os.fstat(f.fileno()).st_size
            start = max(offset, end - TAIL_BYTES)
            data = os.pread(f.fileno(), end - start, start) if end > start else b""
    except OSError:
        return None
    lines = data.decode(errors="replace").splitlines()[-TAIL_LINES:]
    return "\n".join(lines) or None


# -- pipe forwards (-f) -----------------------------------------------------------------


class Pipe:
    """One -f forward of a running task: what it read so far, in memory or spilled."""

    __slots__ = ("data", "dest", "spill", "var")

    def __init__(self, var: str, dest: str) -> None:
        self.var = var
        self.dest = dest
        self.data = bytearray()
        self.spill: Any = None  # an unlinked temporary file, once spilled


class Pipes:
    """A running task's -f pipes: the read ends still open, and those at EOF."""

    __slots__ = ("drained", "error", "memory", "name", "open")

    def __init__(self, name: str) -> None:
        self.name = name  # the task's
        self.open: dict[int, Pipe] = {}  # read fd -> pipe
        self.drained: list[Pipe] = []  # pipes at EOF, in close order
        self.memory = 0  # bytes held in memory, all pipes together
        self.error: str | None = None  # why the data could not be kept, if it could not

    def read(self, fd: int) -> bool:
        """Read what pipe ``fd`` holds; False at EOF (the caller then ``close``s it)."""
        pipe = self.open[fd]
        while True:
            try:
                chunk = os.read(fd, _READ)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            if self.error is not None:
                continue  # the try has failed: keep the pipe flowing, keep nothing
            if pipe.spill is not None:
                try:
                    pipe.spill.write(chunk)
                except OSError as e:
                    self.failed(pipe, e)
                continue
            pipe.data += chunk
            self.memory += len(chunk)
            if self.memory > PIPE_MEMORY:
                self.spill(pipe)

    def close(self, fd: int) -> None:
        os.close(fd)
        self.drained.append(self.open.pop(fd))

    def spill(self, pipe: Pipe) -> None:
        """Move a pipe's data from memory to an unlinked temporary file ($TMPDIR), where
        the rest of it goes too."""
        import tempfile  # here: few runs ever spill, and every worker imports this module

        try:
            f = tempfile.TemporaryFile(prefix="pmc-forward-")  # noqa: SIM115 - kept open
        except OSError as e:
            self.failed(pipe, e)
            return
        pipe.spill = f
        try:
            f.write(pipe.data)
        except OSError as e:
            self.failed(pipe, e)
            return
        self.memory -= len(pipe.data)
        pipe.data = bytearray()

    def failed(self, pipe: Pipe, e: OSError) -> None:
        """Forwarded data could not be kept: the try fails, its data is dropped."""
        self.error = (f"Task {self.name}: Unable to keep the data forwarded through "
                      f"{pipe.var}: {e.strerror or e}")
        self.drop()
        self.memory = 0

    def in_memory(self) -> list[tuple[str, bytes]]:
        """(destination, data) of the drained pipes whose data is in memory."""
        return [(p.dest, bytes(p.data)) for p in self.drained if p.data]

    def spilled(self) -> bool:
        return any(p.spill is not None for p in self.drained)

    def send_spilled(self, spec: TaskSpec,
                     send: Callable[[protocol.Message], None]) -> str | None:
        """Send spilled pipe data to the master in pieces, before the try's result; the
        problem, if one of them could not be read."""
        for pipe in self.drained:
            f = pipe.spill
            if f is None:
                continue
            try:
                f.seek(0)
                while chunk := f.read(FORWARD_CHUNK):
                    send(protocol.forward(spec.id, pipe.dest, chunk))
            except OSError as e:
                return (f"Task {spec.name}: Unable to read the data forwarded through "
                        f"{pipe.var}: {e.strerror or e}")
        return None

    def drop(self) -> None:
        """Free the forwarded data (memory and temporary files)."""
        for pipe in (*self.open.values(), *self.drained):
            pipe.data = bytearray()
            if pipe.spill is not None:
                pipe.spill.close()
                pipe.spill = None


# -- file forwards (-F) -----------------------------------------------------------------


def read_forward_file(name: str, src: str) -> tuple[bytes, str | None]:
    """Read a -F source of task ``name`` (removed by the caller, whatever happens).
    Missing is not an error; anything but a regular file, or more than 1 MiB, is (with
    PMC's message)."""
    try:
        st = os.stat(src)
    except FileNotFoundError:
        log.debug(f"Task {name}: file {src} does not exist")
        return b"", None
    except OSError as e:
        return b"", f"Task {name}: stat failed on file {src}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return b"", f"Task {name}: {src} is not a file"
    if st.st_size > FILE_FORWARD_LIMIT:
        return b"", f"Task {name}: File {src} is too large"
    try:
        with open(src, "rb") as f:
            data = f.read(FILE_FORWARD_LIMIT + 1)
    except OSError as e:
        return b"", f"Task {name}: Unable to read {src}: {e.strerror}"
    if len(data) > FILE_FORWARD_LIMIT:
        return b"", f"Task {name}: File {src} is too large"
    return data, None


def remove_forward_files(name: str, file_forwards: tuple[tuple[str, str], ...]) -> None:
    for src, _dest in file_forwards:
        try:
            os.unlink(src)
        except OSError as e:
            log.debug(f"Task {name}: Error unlinking forwarded file {src}: {e.strerror}")
