"""``pmc add DAG MORE`` and ``pmc close DAG``: tasks added to an open run, and its end
(pmc extensions), through ``pmc.client``."""

from __future__ import annotations

import sys
from collections.abc import Callable

from pmc.client import ChannelError, Client, SubmitError
from pmc.errors import ExitCode


def add(dag: str, more: str) -> int:
    """Add the TASK/EDGE lines of ``more`` (a file, or ``-``: stdin), all or none."""
    try:
        if more == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            with open(more, encoding="utf-8") as f:
                text, source = f.read(), more
    except (OSError, UnicodeDecodeError) as e:
        print(f"pmc add: cannot read {more}: {getattr(e, 'strerror', None) or e}",
              file=sys.stderr)
        return ExitCode.USAGE
    return _with_client(dag, lambda c: print(f"added {len(c.add(text, source))} task(s)"))


def close(dag: str) -> int:
    return _with_client(dag, lambda c: c.close_run())


def _with_client(dag: str, act: Callable[[Client], object]) -> int:
    try:
        with Client.connect(dag) as client:
            act(client)
    except SubmitError as e:
        print(f"pmc: refused: {e}", file=sys.stderr)
        return ExitCode.USAGE
    except (ChannelError, OSError) as e:
        print(f"pmc: {e}", file=sys.stderr)
        return ExitCode.FAILED
    return ExitCode.OK
