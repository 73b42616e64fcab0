"""How site profile errors name things: ``SiteError`` (the one message for the user),
the YAML path of a value (``pmc.tries``, ``modules[1]``), a short rendering of a bad
value, and ``Where``: the file and path of a value, or the command-line option that set
it."""

from __future__ import annotations

import json
import reprlib
from collections.abc import Sequence
from typing import Any


class SiteError(Exception):
    """A profile that cannot be used; ``str()`` is the one message for the user."""


def path(parts: list[Any]) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text or "(top level)"


# Short, bounded renderings of bad values: an aliased structure may be enormous.
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80


def show(value: object) -> str:
    if isinstance(value, bool | type(None)):
        return json.dumps(value)
    return _REPR.repr(value)


class Where:
    """How an error names a value: ``FILE: yaml.path``, or the command-line option that
    set it (``--set pmc.tries``, ``--walltime``)."""

    def __init__(self, source: str, origins: dict[tuple[str, ...], str]) -> None:
        self.source = source
        self.origins = origins

    def __call__(self, parts: Sequence[Any]) -> str:
        key = tuple(str(p) for p in parts)
        for n in range(len(key), 0, -1):
            label = self.origins.get(key[:n])
            if label is not None:
                return label if n == len(key) else f"{label}: {path(list(parts))}"
        return f"{self.source}: {path(list(parts))}"
