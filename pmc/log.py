"""PMC's log levels and the ``[level] message`` lines users and scripts grep for.

Configured once by the command-line entry (``setup``, or ``pmc.observe.setup_logging``
which also handles ``--log-format`` / ``--log-file``), never at import. In text mode a
message is written as the reference writes it: ``[level] message`` on stderr, the level
in lower case (``fatal``, ``error``, ``warn``, ``info``, ``debug``, ``trace``), and with
a date in front (``2024-05-01 12:00:00.123 UTC [info] ...``) when the log goes to a file.
In JSON mode ``pmc.observe`` installs a structured sink and the same messages become JSON
objects with "level" and "event". Task events (JSON lines, metrics) hang off the master's
observers, not this module.

As in the reference, each ``-q`` lowers the threshold by one below INFO and each ``-v``
raises it: ``-qqqq`` silences even fatal lines (level ``SILENT``), levels above TRACE
log as TRACE. Callers that would build a message on a hot path test ``enabled`` first.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Protocol


class Stream(Protocol):
    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


FATAL, ERROR, WARN, INFO, DEBUG, TRACE = range(6)
SILENT = FATAL - 1  # below every level: nothing is logged
NAMES = ("fatal", "error", "warn", "info", "debug", "trace")

_level = INFO
_stream: Stream | None = None
_prefix = ""
_dated = False
# JSON mode: every message goes here instead of the text line (level, message).
_sink: Callable[[int, str], None] | None = None


def setup(level: int = INFO, stream: Stream | None = None, prefix: str = "",
          sink: Callable[[int, str], None] | None = None, dated: bool = False) -> None:
    """Set the threshold (clamped to SILENT..TRACE), the stream, a prefix for every
    message, whether text lines carry the date (a log file), and optionally a structured
    sink that replaces the text lines."""
    global _level, _stream, _prefix, _sink, _dated
    _level = max(SILENT, min(TRACE, level))
    _stream = stream
    _prefix = prefix
    _sink = sink
    _dated = dated


def level() -> int:
    return _level


def enabled(lvl: int) -> bool:
    return lvl <= _level


def stream() -> Stream:
    """Where text lines go now."""
    return _stream or sys.stderr


def timestamp(now: float | None = None) -> str:
    """The reference's log-file date: ``YYYY-MM-DD HH:MM:SS.mmm ZONE``, local time."""
    now = time.time() if now is None else now
    t = time.localtime(now)
    ms = int((now - int(now)) * 1000)
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', t)}.{ms:03d} {t.tm_zone}"


def log(lvl: int, msg: str) -> None:
    if lvl <= _level:
        if _sink is not None:
            _sink(lvl, f"{_prefix}{msg}")
            return
        out = _stream or sys.stderr
        line = f"[{NAMES[lvl]}] {_prefix}{msg}\n"
        if _dated:
            line = f"{timestamp()} {line}"
        try:
            out.write(line)
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
