"""The DAG: the package face of ``pmc.dag``.

Rooms, bottom to top: ``model`` (Task, DAG, DagError), ``parsed`` (a parse's tasks
and their placeholders), ``words`` (shell words of a
command), ``lines`` (a file's lines and a line's fields), ``taskline`` (TASK options),
``graph`` (edges to CSR, cycle check), ``helperindex`` (the edge helper's reading of
bytes and its index of names), ``edgehelper`` (the second process for a big file's EDGE
lines), ``reader`` (``parse_dag``).

Every worker imports ``pmc.dag.words`` (``split_command``) and nothing else of the
package: the face imports each room when one of its names is first asked for, so that a
worker does not build the model's classes (~5 M instructions of its start).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import Any

    from pmc.dag.model import DAG, DagError, Task
    from pmc.dag.words import split_command

_ROOMS = {"DAG": "model", "DagError": "model", "Task": "model", "split_command": "words"}


def __getattr__(name: str) -> Any:
    room = _ROOMS.get(name)
    if room is None:
        raise AttributeError(f"module 'pmc.dag' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"pmc.dag.{room}"), name)
    globals()[name] = value
    return value


def parse_dag(path: str) -> DAG:
    """``pmc.dag.reader.parse_dag``: the reader's rooms are imported when a DAG is read,
    not by every worker (which needs only ``split_command``)."""
    from pmc.dag.reader import parse_dag as parse

    return parse(path)

__all__ = ["DAG", "DagError", "Task", "parse_dag", "split_command"]
