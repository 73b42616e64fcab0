"""PMC's log levels and the ``[LEVEL] message`` lines users grep for.

Configured once by the command-line entry (``setup``, or ``pmc.observe.setup_logging``
which also handles ``--log-format`` / ``--log-file``), never at import. In text mode a
message is written as ``[LEVEL] message`` to the configured stream (stderr by default);
in JSON mode ``pmc.observe`` installs a structured sink and the same messages become JSON
objects with "level" and "event". Task events (JSON lines, metrics) hang off the master's
observers, not this module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Protocol


class Stream(Protocol):
    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


FATAL, ERROR, WARN, INFO, DEBUG, TRACE = range(6)
NAMES = ("FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE")

_level = INFO
_stream: Stream | None = None
_prefix = ""
# JSON mode: every message goes here instead of the text line (level, message).
_sink: Callable[[int, str], None] | None = None


def setup(level: int = INFO, stream: Stream | None = None, prefix: str = "",
          sink: Callable[[int, str], None] | None = None) -> None:
    """Set the threshold (clamped to FATAL..TRACE), the stream, a prefix such as the
    worker's rank, and optionally a structured sink that replaces the text lines."""
    global _level, _stream, _prefix, _sink
    _level = max(FATAL, min(TRACE, level))
    _stream = stream
    _prefix = prefix
    _sink = sink


def level() -> int:
    return _level


def enabled(lvl: int) -> bool:
    return lvl <= _level


def stream() -> Stream:
    """Where text lines go now."""
    return _stream or sys.stderr


def log(lvl: int, msg: str) -> None:
    if lvl <= _level:
        if _sink is not None:
            _sink(lvl, f"{_prefix}{msg}")
            return
        out = _stream or sys.stderr
        try:
            out.write(f"[{NAMES[lvl]}] {_prefix}{msg}\n")
            out.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must not take the run down


def fatal(msg: str) -> None:
    log(FATAL, msg)


def error(msg: str) -> None:
    log(ERROR, msg)


def warn(msg: str) -> None:
    log(WARN, msg)


def info(msg: str) -> None:
    log(INFO, msg)


def debug(msg: str) -> None:
    log(DEBUG, msg)


def trace(msg: str) -> None:
    log(TRACE, msg)
