"""``NamedTuple`` for the records every rank imports, without the ``typing`` module.

An MPI worker rank imports no ``typing``: with what ``typing.NamedTuple`` does on top of
``collections.namedtuple`` (each field's type checked, a string compiled), it was ~16 M
instructions of every worker rank's start (callgrind), and the worker needs none of it.
The type checker reads ``typing.NamedTuple`` instead, behind ``TYPE_CHECKING``, which
modules on a worker's path set to False themselves rather than import it::

    TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
    if TYPE_CHECKING:
        from typing import NamedTuple
    else:
        from pmc.core.record import NamedTuple

What a class statement makes is the same: a ``collections.namedtuple`` with the fields
in order, the defaults of the last ones, the annotations as written, the docstring and
the methods and properties of its body.
"""

from __future__ import annotations

from collections import namedtuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_OWN = frozenset(("__module__", "__qualname__", "__annotations__", "__doc__"))


class _Record(type):
    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> Any:
        if not bases:  # NamedTuple itself
            return super().__new__(mcs, name, bases, ns)
        fields = ns.get("__annotations__", {})
        defaults = [ns[f] for f in fields if f in ns]
        # The type checker reads typing.NamedTuple, never this.
        cls = namedtuple(name, fields, defaults=defaults, module=ns["__module__"])  # type: ignore[misc]
        cls.__annotations__ = fields
        if ns.get("__doc__"):
            cls.__doc__ = ns["__doc__"]
        for key, value in ns.items():
            if key not in fields and key not in _OWN:
                setattr(cls, key, value)
        return cls


class NamedTuple(metaclass=_Record):
    """Subclassed only: ``class Point(NamedTuple): x: int; y: int = 0``."""
