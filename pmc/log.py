"""PMC's log levels and the ``[level] message`` lines users and scripts grep for.

Messages go through the standard ``logging`` module, logger ``"pmc"``, so Python code can
hook them: ``logging.getLogger("pmc").addHandler(h)`` receives every message as a
``LogRecord`` (levels CRITICAL for fatal, ERROR, WARNING, INFO, DEBUG and 5, "TRACE"),
and ``logging.getLogger("pmc").setLevel(...)`` moves the threshold, which ``enabled``
follows. Nothing is configured or registered at import: the command-line entry calls
``setup`` (or ``pmc.logsetup.setup_logging``, which also handles ``--log-format``
/ ``--log-file``), which installs pmc's own handler on that logger and stops propagation
to the root logger, so that pmc's output is exactly the reference's whatever the root
logger does. The one exception is an MPI worker rank, where no code but pmc's runs, so
nothing could hook the logger: it writes its lines without importing ``logging``
(``standalone``), whose import and what it brings (traceback, threading, string, weakref)
were ~30 M instructions of every worker rank's start (callgrind). Elsewhere ``logging`` is
imported at ``setup`` or the first message (``_bind``; the handler is ``pmc.logbridge``).

pmc's handler writes a message as the reference writes it: ``[level] message`` on
stderr, the level in lower case (``fatal``, ``error``, ``warn``, ``info``, ``debug``,
``trace``), with a date in front (``2024-05-01 12:00:00.123 UTC [info] ...``) when the
log goes to a file. In JSON mode ``pmc.logsetup`` gives it a structured sink
(structlog) and the same messages become JSON objects with "level" and "event". Task
events (JSON lines, metrics) hang off the master's observers, not this module.

The live progress line (``pmc.outputs.progress``) shares the handler's lock: a log line written
to stderr first clears the live line, then draws it again below itself, so the two never
mix within a line.

As in the reference, each ``-q`` lowers the threshold by one below INFO and each ``-v``
raises it: ``-qqqq`` silences even fatal lines (level ``SILENT``), levels above TRACE
log as TRACE. Callers that would build a message on a hot path test ``enabled`` first.
"""

from __future__ import annotations

import _thread
import sys
import time
from collections.abc import Callable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    import logging
    from typing import Protocol

    from pmc.logbridge import Handler

    class Stream(Protocol):
        def write(self, text: str, /) -> int: ...

        def flush(self) -> None: ...



FATAL, ERROR, WARN, INFO, DEBUG, TRACE = range(6)
SILENT = FATAL - 1  # below every level: nothing is logged
NAMES = ("fatal", "error", "warn", "info", "debug", "trace")
TRACE_LEVEL = 5  # the logging module's number for TRACE (below DEBUG's 10)
# pmc level -> logging level (logging's CRITICAL, ERROR, WARNING, INFO, DEBUG: numbers
# its documentation fixes), and the threshold that shows nothing at all.
_PY = (50, 40, 30, 20, 10, TRACE_LEVEL)
_PY_SILENT = _PY[FATAL] + 10
_FROM_PY = {py: lvl for lvl, py in enumerate(_PY)}

LOGGER: logging.Logger | None = None  # logging.getLogger("pmc"), once bound (_bind)
_handlers: list[logging.Handler] = []  # LOGGER's list itself, once bound
_alone = False  # standalone(): no logging module in this process's log
_threshold = _PY[WARN]  # standalone: the lowest logging level shown (logging's default)

_prefix = ""
# Set by setup(), None before: kept for the checks that importing configures nothing.
_stream: Stream | None = None
_sink: Callable[[int, str], None] | None = None
# The live progress line now on stderr ("" none), and the lock that orders it with the
# handler's writes (the handler uses it as its own lock).
_live = ""
_lock = _thread.RLock()
_own: Writer | None = None  # the writer setup() installed
_hook: Handler | None = None  # and the handler on LOGGER that writes through it


def from_py(levelno: int) -> int:
    """The pmc level of a logging level: the nearest at or above it."""
    lvl = _FROM_PY.get(levelno)
    if lvl is not None:
        return lvl
    for lvl in range(FATAL, TRACE + 1):
        if levelno >= _PY[lvl]:
            return lvl
    return TRACE


class Writer:
    """pmc's own output: ``[level] message`` lines (dated in a file), or the JSON sink."""

    def __init__(self, stream: Stream | None, sink: Callable[[int, str], None] | None,
                 dated: bool) -> None:
        self.stream = stream  # None: sys.stderr, looked up at each write (tests swap it)
        self.sink = sink
        self.dated = dated

    def write(self, lvl: int, msg: str, created: float) -> None:
        if self.sink is not None:
            self.sink(lvl, msg)
            return
        out = self.stream or sys.stderr
        line = f"[{NAMES[lvl]}] {msg}\n"
        if self.dated:
            line = f"{timestamp(created)} {line}"
        if _live and out is sys.stderr:
            line = f"\r\x1b[K{line}{_live}"  # clear the live line, write, draw it again
        try:
            out.write(line)
            out.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must not take the run down

    def write_py(self, levelno: int, msg: str, created: float) -> None:
        """``write`` for a record at a logging level (the handler's side)."""
        self.write(from_py(levelno), msg, created)


def _bind() -> logging.Logger:
    """The "pmc" logger, and pmc.log tied to it: its level decides, its handlers hear."""
    global LOGGER, _is_enabled, _handle, _handlers
    if LOGGER is None:
        import logging

        LOGGER = logging.getLogger("pmc")  # getLogger configures nothing
        if not _alone:
            _is_enabled = LOGGER.isEnabledFor
        _handle = LOGGER.handle
        _handlers = LOGGER.handlers  # the list itself: add/removeHandler change it in place
    return LOGGER


def _bind_then_ask(pylvl: int) -> bool:
    return _bind().isEnabledFor(pylvl)


def _bind_then_handle(record: logging.LogRecord) -> None:
    _bind().handle(record)


def _over_threshold(pylvl: int) -> bool:
    return pylvl >= _threshold


_is_enabled: Callable[[int], bool] = _bind_then_ask
_handle: Callable[[logging.LogRecord], None] = _bind_then_handle


def standalone() -> None:
    """This process runs no code but pmc's (an MPI worker rank): nothing can hook the
    "pmc" logger, so its messages are written from now on without the logging module
    (the threshold is pmc.log's own). Before ``setup``."""
    global _alone, _is_enabled
    _alone = True
    _is_enabled = _over_threshold


def setup(level: int = INFO, stream: Stream | None = None, prefix: str = "",
          sink: Callable[[int, str], None] | None = None, dated: bool = False) -> None:
    """Set the threshold (clamped to SILENT..TRACE), the stream, a prefix for every
    message, whether text lines carry the date (a log file), and optionally a structured
    sink that replaces the text lines. Replaces the handler an earlier call installed;
    handlers added by others stay."""
    global _stream, _prefix, _sink, _own, _hook, _threshold
    level = max(SILENT, min(TRACE, level))
    _stream = stream
    _prefix = prefix
    _sink = sink
    _own = Writer(stream, sink, dated)
    threshold = _PY_SILENT if level == SILENT else _PY[level]
    if _alone:
        _threshold = threshold
        return
    from pmc import logbridge

    _hook = logbridge.install(_bind(), _own.write_py, _lock, threshold, TRACE_LEVEL)


def level() -> int:
    """The threshold as a pmc level (SILENT when nothing at all is logged)."""
    eff = _threshold if _alone else _bind().getEffectiveLevel()
    if eff > _PY[FATAL]:
        return SILENT
    return from_py(eff) if eff in _PY else max(SILENT, from_py(eff) - 1)


def enabled(lvl: int) -> bool:
    return _is_enabled(_PY[lvl])


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
    pylvl = _PY[lvl]
    if _is_enabled(pylvl):
        own = _own
        hook = _hook
        if own is not None and (_alone or (
                hook is not None and len(_handlers) == 1 and _handlers[0] is hook
                and LOGGER is not None and not LOGGER.filters and not hook.filters)):
            # Only pmc's own handler listens: what logging would do, minus making a
            # record nobody else sees (the lock is taken as Handler.handle takes it).
            with _lock:
                own.write(lvl, f"{_prefix}{msg}", time.time())
            return
        from pmc.logbridge import Record

        _handle(Record(pylvl, f"{_prefix}{msg}"))


def set_live(text: str) -> None:
    """Show ``text`` as the live line at the bottom of stderr (a terminal), in place of
    the one before; "" clears it. Log lines written to stderr meanwhile keep it below
    them (see ``Handler.emit``)."""
    global _live
    with _lock:
        if not text and not _live:
            return
        try:
            sys.stderr.write(f"\r\x1b[K{text}")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        _live = text


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
