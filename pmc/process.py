"""What a pmc process does to itself around a fork or a quick exit: its standard streams
flushed (a forked child would write again what waits in them; ``os._exit`` would lose
it), and its name in ``ps -o comm`` and top."""

from __future__ import annotations

import sys


def flush_stdio() -> None:
    """Flush stdout and stderr; one closed, gone or whose reader left is passed over."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: started without one
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def set_name(name: str) -> None:
    """This process's name (the kernel keeps 15 bytes of it): a forked process would
    otherwise show its parent's, a fresh Python the interpreter's."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    except OSError:
        pass  # no /proc: the name is all it costs
