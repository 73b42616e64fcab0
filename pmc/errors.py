"""The exit codes of every pmc command and the errors that stop a run.

One place: ``pmc run`` / ``pegasus-mpi-cluster``, ``pmc status``, ``pmc report`` and the
batch adapters (whose job scripts test ``pmc run``'s code) all answer with these.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1  # a task failed for good, or the run could not go on
    USAGE = 2  # bad command line, DAG or profile
    INCOMPLETE = 3  # stopped before the end with nothing failed for good: run again
    INTERRUPTED = 130  # Ctrl-C outside a run (128 + SIGINT)


class FatalError(Exception):
    """Stops the run before or while it runs; the message is logged as FATAL."""


class Interrupted(Exception):
    """A signal arrived before the first task could start: nothing ran, nothing failed."""
