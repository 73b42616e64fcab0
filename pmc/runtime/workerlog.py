"""What a worker says of itself: its own log lines, in the master's log format (text as
PMC's workers write them, or JSON objects with a rank field, structlog set up only at
the first), and why it dies, should an unexpected exception end it (to the master)."""

from __future__ import annotations

import socket
from collections.abc import Callable

from pmc import log
from pmc.core import protocol
from pmc.core.protocol import WorkerConfig

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from pmc.transport import Transport

# The most of a failure's traceback sent to the master (its end: the exception).
FAILURE_BYTES = 8192


def setup(cfg: WorkerConfig, rank: int) -> None:
    """The master's log format for this worker's own messages (on its stderr): text lines
    as PMC's workers write them (those about the worker itself say "Worker R:"), or JSON
    objects with a rank field."""
    if cfg.log_format != "json":
        log.setup(cfg.log_level)
        return
    sink: list[Callable[[int, str], None]] = []

    def json_message(level: int, msg: str) -> None:
        # structlog is set up at the first message, not at start: its import takes
        # ~0.1 s of cpu, and a worker that runs its tasks without a word needs none.
        if not sink:
            from pmc.logsetup import LogOutput

            out = LogOutput("json", None, cfg.log_level)
            out.logger = out.logger.bind(rank=rank)
            sink.append(out.message)
        sink[0](level, msg)

    log.setup(cfg.log_level, sink=json_message)


def report_failure(transport: Transport, text: str) -> None:
    """Tell the master why this worker dies (best effort: the end of the traceback)."""
    data = text.encode(errors="replace")[-FAILURE_BYTES:].decode(errors="replace")
    try:
        transport.send(0, protocol.worker_failed(socket.gethostname(), data))
    except Exception:  # noqa: S110 - the worker is dying anyway
        pass
