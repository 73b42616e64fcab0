"""Where log lines go and how they look: ``--log-format``, ``--log-file``, -v / -q.

``setup_logging`` (called by the command-line entry, never at import) makes the run's
``LogOutput`` and hands ``pmc.log`` its destination: text keeps PMC's ``[level] message``
lines (dated in a log file, as the reference writes them); JSON turns them into one JSON
object per line, as structlog renders them. ``LogOutput`` is also where the event log
(``pmc.outputs.eventlog``) writes: it can hold lines back and render them together, in
time order, before anything else is written. Nothing here registers or opens anything at
import: the log file is opened at its first write (or by ``open_log_file``), and the
exit hook that renders lines still held back is registered by the first output to hold
any (``flush_at_exit``). structlog is imported when a line first goes through it (JSON
mode, the event log): text mode writes through ``pmc.log`` alone, and the master rank
imports this module, where structlog's import cost ~0.05 s of cpu.
"""

from __future__ import annotations

import atexit
import functools
import sys
import threading
import time
import weakref
from collections.abc import Callable, MutableMapping
from typing import IO, Any, Protocol

from pmc import log


class LogOptions(Protocol):
    """The three run options this module reads (``RunOptions`` has them): the base
    layer names what it needs rather than importing the option table above it."""

    @property
    def log_format(self) -> str: ...
    @property
    def log_file(self) -> str | None: ...
    @property
    def log_level(self) -> int: ...

# pmc.log level -> structlog method (the "level" value written is pmc.log's name)
_METHODS = ("critical", "error", "warning", "info", "debug", "debug")


class _LazyFile:
    """``--log-file``, opened for append at the first write.

    Under MPI every rank runs the command-line entry, but only the master writes this
    file (workers switch to their own text logging before they log anything), so the
    file must not be opened — let alone truncated — just because a rank started."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.f: IO[str] | None = None

    def write(self, text: str, /) -> int:
        if self.f is None:
            self.open()
            assert self.f is not None
        return self.f.write(text)

    def open(self) -> None:
        """Open for append now (OSError if it cannot be): the master calls this before
        the run starts, so that a log file that cannot be written stops the run at once
        rather than losing every line."""
        if self.f is None:
            self.f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def flush(self) -> None:
        if self.f is not None:
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


class _Writer:
    """The structlog "logger" at the end of the chain: appends the rendered line."""

    def __init__(self, out: LogOutput) -> None:
        self.out = out

    def msg(self, line: str) -> None:
        self.out.write(line + "\n")

    debug = info = warning = error = critical = msg


@functools.cache
def json_encoder() -> Callable[[Any], str]:
    """What writes each JSON log line's object. ``json`` is imported at the first call:
    every rank runs this module, and a text log needs none."""
    import json

    return json.JSONEncoder(separators=(",", ":"), default=str, ensure_ascii=False).encode


def render_json(_logger: Any, method: str, ed: MutableMapping[str, Any]) -> str:
    """The structlog renderer of JSON mode (the event log's direct lines match it)."""
    ts = ed.pop("timestamp", None)
    lvl = ed.pop("level", None)
    event = ed.pop("event")
    return json_encoder()({"timestamp": time.time() if ts is None else ts,
                           "level": lvl or ("warn" if method == "warning" else method),
                           "event": event, **ed})


def _render_text(logger: Any, method: str, ed: MutableMapping[str, Any]) -> str:
    lvl = ed.pop("level", None) or ("warn" if method == "warning" else method)
    event = ed.pop("event")
    ed.pop("timestamp", None)
    fields = " ".join(f"{k}={_text_value(v)}" for k, v in ed.items() if v is not None)
    line = f"[{lvl}] {event} {fields}" if fields else f"[{lvl}] {event}"
    # The same date in front as pmc.log's lines in a log file.
    return f"{log.timestamp()} {line}" if logger.out.file is not None else line


def _text_value(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, str) and (" " in v or not v):
        import json  # rare: not worth an import on every rank

        return json.dumps(v)
    return str(v)


def _held_time(ev: tuple[Any, ...]) -> float:
    ts = ev[1]
    return ts if type(ts) is float else float(ts) if isinstance(ts, int | float) else 0.0


class LogOutput:
    """Where log lines and task events go (``--log-file`` or stderr) and how they look.

    Lines may be held back in ``pending`` as tuples ``(render, time, values...)``, where
    ``render(tuple)`` returns the tuple's text (one or more whole lines): the event log
    holds its JSON task events so (a list append on the master's loop). They are
    rendered together, in time order, just before anything else is written and at each
    flush: the file gets exactly the lines it would have got one by one, for a fraction
    of the cost."""

    def __init__(self, fmt: str = "text", path: str | None = None,
                 level: int = log.INFO) -> None:
        if fmt not in ("text", "json"):
            raise ValueError(f"unknown log format {fmt!r}")
        self.fmt = fmt
        self.level = level
        self.file = _LazyFile(path) if path else None
        self._logger: Any = None
        self.pending: list[tuple[Any, ...]] = []  # (render, timestamp, values...)
        # Rendering takes the events in order: the master's loop and a thread that logs
        # (the metrics exporter's warnings) must not write two halves the wrong way round.
        self.lock = threading.RLock()

    @property
    def logger(self) -> Any:
        """The structlog logger writing here, made at its first use."""
        if self._logger is None:
            import structlog

            renderer = render_json if self.fmt == "json" else _render_text
            self._logger = structlog.wrap_logger(
                _Writer(self), processors=[renderer],
                wrapper_class=structlog.make_filtering_bound_logger(0),
            )
        return self._logger

    @logger.setter
    def logger(self, logger: Any) -> None:
        self._logger = logger

    @property
    def json(self) -> bool:
        return self.fmt == "json"

    def stream(self) -> log.Stream:
        # sys.stderr looked up at each write: tests and callers may swap it.
        return self.file if self.file is not None else sys.stderr

    def write(self, text: str) -> None:
        """Append rendered lines (each ending in a newline), after the held-back events."""
        with self.lock:
            if self.pending:
                self.render_pending()
            self._write(text)

    def _write(self, text: str) -> None:
        try:
            if self.file is not None:
                self.file.write(text)
            else:
                sys.stderr.write(text)
        except (OSError, ValueError):
            pass  # a closed stderr must not take the run down

    def render_pending(self) -> None:
        """Write the held-back lines (see the class docstring)."""
        with self.lock:
            pending = self.pending
            events = pending[:]
            del pending[:len(events)]  # appended meanwhile (by another thread): kept
            # In the order things happened: a worker's starts and ends reach the master
            # a little after they happened, beside events of the master's own.
            events.sort(key=_held_time)
            self._write("".join([ev[0](ev) for ev in events]))

    def message(self, lvl: int, msg: str) -> None:
        """A pmc.log message in JSON mode."""
        getattr(self.logger, _METHODS[lvl])(msg, level=log.NAMES[lvl])
        self.flush()

    def flush(self) -> None:
        if self.pending:
            self.render_pending()
        try:
            self.stream().flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        if self.pending:
            self.render_pending()
        if self.file is not None:
            self.file.close()


# Outputs that hold lines back: flushed at exit too, should a run end without closing its
# observers (an unexpected exception). The hook is registered with the first of them.
_holding: weakref.WeakSet[LogOutput] = weakref.WeakSet()


def flush_at_exit(out: LogOutput) -> None:
    """Render ``out``'s held-back lines at exit, if any are left by then."""
    if not _holding:
        atexit.unregister(_flush_held)  # once, however often the set empties
        atexit.register(_flush_held)
    _holding.add(out)


def _flush_held() -> None:
    for out in list(_holding):
        if out.pending:
            out.flush()


def setup_logging(opts: LogOptions) -> LogOutput:
    """Configure pmc.log from ``--log-format``, ``--log-file`` and -v/-q (CLI entry only);
    the output made, for the run to hand to what writes there."""
    out = LogOutput(opts.log_format, opts.log_file, opts.log_level)
    log.setup(opts.log_level, stream=out.file, sink=out.message if out.json else None,
              dated=out.file is not None)
    return out


def open_log_file(out: LogOutput) -> None:
    """Open ``--log-file`` now (the master, before the run). Should it fail, log to
    stderr from here on and raise the OSError: the caller reports it there."""
    if out.file is None:
        return
    try:
        out.file.open()
    except OSError:
        out.file = None
        log.setup(out.level, sink=out.message if out.json else None)
        raise


def log_output(opts: LogOptions) -> LogOutput:
    """An output made from ``opts`` alone, for a run whose caller set up none (library
    use: the benchmarks, the tests)."""
    return LogOutput(opts.log_format, opts.log_file, opts.log_level)
