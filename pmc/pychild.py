"""How pmc starts Python processes of its own: embedded-mode workers and the DAG
parser's edge helper.

``python -S``, told where pmc and everything the parent can import are, calling
``main(argv)`` of one pmc module: without ``site`` (and the .pth files it reads:
editable installs, certifi...) a child is running in about half the time, which a run
waits for. The import path travels on the command line, not in PYTHONPATH, which the
tasks a worker starts would inherit.
"""

from __future__ import annotations

import functools
import os
import sys

_BOOT = (
    "import sys; sys.path[:0] = sys.argv[1].split({sep!r}); "
    "sys.exit(__import__(sys.argv[2], fromlist=['main']).main(sys.argv[3:]))"
)


@functools.cache
def _prefix() -> tuple[str, ...]:
    import pmc

    root = os.path.dirname(os.path.dirname(os.path.abspath(pmc.__file__)))
    paths = list(dict.fromkeys([root, *(p for p in sys.path if p)]))
    return (sys.executable, "-S", "-c", _BOOT.format(sep=os.pathsep), os.pathsep.join(paths))


def python_command(module: str, *args: str) -> list[str]:
    """The command that runs ``module.main(list(args))`` in a fresh interpreter."""
    return [*_prefix(), module, *args]
