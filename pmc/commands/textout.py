"""A command's text on stdout, for the commands that print some (``pmc status``,
``pmc report``): a reader that goes away early is not an error."""

from __future__ import annotations

import os
from typing import TextIO


def write_out(out: TextIO, text: str) -> bool:
    """Write and flush; False when the reader has gone (``pmc report log | head``), which
    is not an error: further output is dropped instead of raising at exit."""
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
        return False
    return True
