"""Transitional: what ``pmc.commands.run`` and the worker's JSON logging reached through
here before they called ``pmc.outputs.assemble.outputs`` and ``pmc.outputs.logsetup``
themselves. Defines nothing of its own; to be removed once nothing imports it."""

from __future__ import annotations

from pmc.core.events import Observer
from pmc.options import RunOptions
from pmc.outputs.assemble import outputs
from pmc.outputs.logsetup import LogOutput, open_log_file
from pmc.outputs.progress import Progress
from pmc.outputs.recordfiles import _RecordFile

__all__ = ["LogOutput", "observers", "open_log_file"]


def observers(opts: RunOptions) -> list[Observer]:
    """``assemble.outputs`` less the record files and progress, which the caller adds."""
    return [o for o in outputs(opts).observers
            if not isinstance(o, _RecordFile | Progress)]
