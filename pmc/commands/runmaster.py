"""The master's side of ``pmc run``: read and lock the DAG, read the rescue log, build the
observers, and hand them with the workers to a ``Run`` (``commands/lifecycle.py``).

Apart from ``commands/run.py`` because a worker rank, which runs that module too, needs
none of this: ``run.py`` imports it only where a run's master starts (the outputs, the
DAG reader, the master: ~60 modules a worker rank does without).
"""

from __future__ import annotations

import errno
import fcntl
import os

from pmc import log
from pmc.commands.lifecycle import Run
from pmc.commands.taskoutput import TaskOutput
from pmc.core.events import Fanout
from pmc.core.rescue import RescueError, read_records
from pmc.dag import DagError, parse_dag
from pmc.errors import ExitCode, FatalError
from pmc.logsetup import LogOutput, open_log_file
from pmc.options import RunOptions, without_effect
from pmc.outputs import assemble
from pmc.runtime import openrun
from pmc.runtime.workers import Workers


def read_and_run(opts: RunOptions, workers: Workers, mode: str, output: LogOutput) -> int:
    """The master's run of ``opts.dag`` over ``workers``: the exit code."""
    # The log file first: every line after this one goes there.
    try:
        open_log_file(output)
    except OSError as e:
        log.fatal(f"Unable to open log file: {opts.log_file}: {e.strerror}")
        return ExitCode.FAILED
    if opts.site_profile:
        log.info(f"Site profile: {opts.site_profile}")
    for text in without_effect(opts, mode):
        log.warn(text)
    if log.enabled(log.DEBUG):
        log.debug(f"Using old rescue file: {'' if opts.skip_rescue else opts.rescue_path}")
        log.debug(f"Using new rescue file: {opts.rescue_path}")
    try:
        dag = parse_dag(opts.dag)
        opened = openrun.prepare(opts, dag)  # the tasks added before, an open run's side
    except DagError as e:
        log.fatal(str(e))
        return ExitCode.USAGE
    workers.started()
    lock_fd = -1
    if not opts.nolock:
        log.debug("Locking DAG file...")
        try:
            lock_fd = _lock(opts.dag)
        except FatalError as e:
            log.fatal(str(e))
            return ExitCode.FAILED
    sink = TaskOutput(opts)
    try:
        done: set[int] = set()
        reused: set[int] = set()
        if not opts.skip_rescue:
            try:
                done, reused, warnings = read_records(opts.rescue_path, dag)
            except RescueError as e:
                log.fatal(str(e))
                return ExitCode.FAILED
            for w in warnings:
                log.warn(w)
        done |= reused  # reused in a run before: done, unless --reuse judges again
        if opts.reuse:
            # Only --reuse needs it (three modules a run without it does not import).
            from pmc.runtime.reuse import reusable

            done, reused = reusable(dag, done)
        else:
            reused = set()
        # Files the run will write, checked before any task runs: a run that cannot keep
        # its rescue log or deliver its tasks' output stops here, with nothing done.
        try:
            _check_rescue_dir(opts.rescue_path)
            sink.open()
            outputs = assemble.outputs(opts, output)  # opens nothing (but a metrics endpoint)
        except FatalError as e:
            log.fatal(str(e))
            return ExitCode.FAILED
        out = Fanout([*outputs.observers, *([opened] if opened else [])])
        return Run(opts, dag, workers.take(), out, mode, done=done, reused=reused,
                   progress=outputs.progress, sink=sink, opened=opened).execute()
    finally:
        sink.close()
        if lock_fd >= 0:
            log.debug("Unlocking DAG file...")
            os.close(lock_fd)


def _lock(path: str) -> int:
    """An exclusive POSIX record lock (fcntl F_SETLK, F_WRLCK) on the whole DAG file, as
    PMC takes: two runs of either program on one DAG exclude each other.

    POSIX locks belong to the process and go the moment it closes *any* descriptor of the
    file, so the DAG is parsed before the lock is taken and nothing in this process opens
    it again while the run holds the lock (the edge helper reads it in a process of its
    own, and only while parsing). Like PMC's, the lock needs the file open for writing."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise FatalError(f"Unable to open DAG file: {path}: {e.strerror} "
                         "(use -n/--nolock to run without the lock)") from e
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES):
            # The reference's words, then how to go on regardless.
            raise FatalError(f"DAG file is already locked by another process: {path}: "
                             f"{os.strerror(e.errno)} (another run of this workflow holds "
                             "it; use -n/--nolock to skip locking)") from None
        raise FatalError(f"Unable to lock DAG file: {path}: {e.strerror}") from e
    return fd


def _check_rescue_dir(path: str) -> None:
    """Fail now if the rescue log cannot be written where it goes: the run writes it by
    way of a temporary file beside it, so create and remove one there."""
    probe = f"{path}.tmp.{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        os.unlink(probe)
    except OSError as e:
        raise FatalError(f"Unable to open rescue file: {path}: {e.strerror}") from e
