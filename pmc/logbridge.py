"""pmc.log's side in the standard ``logging`` module: the handler that writes pmc's lines
on the "pmc" logger, and the fast ``LogRecord`` made for other handlers. Imported once
pmc.log binds to that logger (``setup``, or a message before it), never by an MPI worker
rank (``pmc.log.standalone``). It imports nothing of pmc: what the handler writes
through, the lock it takes and the TRACE level's number are given to ``install``."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class Handler(logging.Handler):
    """pmc's own output on the "pmc" logger: ``write(levelno, message, created)`` for
    each record that reaches it, under ``lock``."""

    def __init__(self, write: Callable[[int, str, float], None], lock: Any) -> None:
        self.write = write
        self.given_lock = lock
        super().__init__(logging.NOTSET)  # which calls createLock

    def createLock(self) -> None:  # logging calls it by this name
        self.lock = self.given_lock  # pmc.log's: orders writes with the live progress line

    def emit(self, record: logging.LogRecord) -> None:
        self.write(record.levelno, record.getMessage(), record.created)


def install(logger: logging.Logger, write: Callable[[int, str, float], None], lock: Any,
            threshold: int, trace_level: int) -> Handler:
    """Put a handler calling ``write`` under ``lock`` on ``logger`` in place of the one
    an earlier call installed (handlers added by others stay), at ``threshold``; name
    ``trace_level`` TRACE; and stop propagation to the root logger: pmc's output is
    exactly the reference's whatever the root logger does."""
    global _process_name
    mp = sys.modules.get("multiprocessing")
    if mp is not None:  # as LogRecord finds it
        _process_name = mp.current_process().name
    logging.addLevelName(trace_level, "TRACE")
    _LEVEL_NAMES[trace_level] = "TRACE"
    for h in list(logger.handlers):
        if isinstance(h, Handler):
            logger.removeHandler(h)
    handler = Handler(write, lock)
    logger.addHandler(handler)
    logger.setLevel(threshold)
    logger.propagate = False
    return handler


class Record(logging.LogRecord):
    """A ``LogRecord`` with every standard attribute, made in a fraction of the time:
    ``LogRecord.__init__`` (and ``Logger.log``, which also walks the stack for the
    caller's file and line, shown by no pmc output) cost ~20 times a pmc line's writing.
    Source location fields are empty."""

    def __init__(self, levelno: int, msg: str) -> None:
        now = time.time()
        self.name = "pmc"
        self.msg = msg
        self.args = None
        self.levelno = levelno
        self.levelname = _LEVEL_NAMES[levelno] if levelno in _LEVEL_NAMES else \
            logging.getLevelName(levelno)
        self.pathname = self.filename = self.module = ""
        self.lineno = 0
        self.funcName = ""
        self.exc_info = None
        self.exc_text = None
        self.stack_info = None
        self.created = now
        self.msecs = (now - int(now)) * 1000
        self.relativeCreated = (now - _START) * 1000
        thread = threading.current_thread()
        self.thread = thread.ident
        self.threadName = thread.name
        self.processName = _process_name
        self.process = os.getpid()
        self.taskName = None


_LEVEL_NAMES = {logging.CRITICAL: "CRITICAL", logging.ERROR: "ERROR",
                logging.WARNING: "WARNING", logging.INFO: "INFO", logging.DEBUG: "DEBUG"}
_START = time.time()
_process_name = "MainProcess"
