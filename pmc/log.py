"""PMC's log levels and the ``[LEVEL] message`` lines users grep for, on stderr.

Configured once by the command-line entry (``setup``), never at import. Other outputs of
the same events (JSON lines, metrics) hang off the master's observers, not this module.
"""

from __future__ import annotations

import sys
from typing import TextIO

FATAL, ERROR, WARN, INFO, DEBUG, TRACE = range(6)
NAMES = ("FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE")

_level = INFO
_stream: TextIO | None = None
_prefix = ""


def setup(level: int = INFO, stream: TextIO | None = None, prefix: str = "") -> None:
    """Set the threshold (clamped to FATAL..TRACE), the stream and a prefix such as the
    worker's rank."""
    global _level, _stream, _prefix
    _level = max(FATAL, min(TRACE, level))
    _stream = stream
    _prefix = prefix


def level() -> int:
    return _level


def enabled(lvl: int) -> bool:
    return lvl <= _level


def log(lvl: int, msg: str) -> None:
    if lvl <= _level:
        stream = _stream or sys.stderr
        try:
            stream.write(f"[{NAMES[lvl]}] {_prefix}{msg}\n")
            stream.flush()
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
