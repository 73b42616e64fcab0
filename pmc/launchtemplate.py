"""The task launcher template's grammar (``--task-launcher``, a profile's
``pmc.task_launcher``): shell words (shlex rules, never run through a shell) with
``{placeholder}`` fields, ``{{`` and ``}}`` for literal braces. Checked here for the
command line and site profiles alike; filled in by ``pmc.runtime.ranklaunch``.
"""

from __future__ import annotations

import shlex
import string

PLACEHOLDERS = ("ranks", "nhosts", "hosts", "ranks_per_host", "cpus_per_rank", "nodefile")

_FORMATTER = string.Formatter()


def words(template: str) -> list[str]:
    """The template's words, as a POSIX shell would split them."""
    try:
        out = shlex.split(template, comments=False, posix=True)
    except ValueError as exc:  # shlex says "No closing quotation" / "No escaped character"
        raise ValueError(f"task launcher template {template!r}: {exc}") from None
    if not out:
        raise ValueError("task launcher template is empty")
    return out


def fields(template: str, word: str) -> list[str]:
    """The placeholders of one word of ``template`` (ValueError for an unknown one)."""
    try:
        parsed = list(_FORMATTER.parse(word))
    except ValueError as exc:
        raise ValueError(f"task launcher template {template!r}: in {word!r}: {exc} "
                         "(write a literal brace as {{ or }})") from None
    names: list[str] = []
    for _text, field, spec, conv in parsed:
        if field is None:
            continue
        if field not in PLACEHOLDERS or spec or conv:
            known = " ".join("{" + p + "}" for p in PLACEHOLDERS)
            shown = "{" + field + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"task launcher template {template!r}: unknown placeholder "
                             f"{shown} (known: {known})")
        names.append(field)
    return names


def check_template(template: str) -> None:
    """ValueError with a clear message when the template cannot be used."""
    for word in words(template):
        fields(template, word)
