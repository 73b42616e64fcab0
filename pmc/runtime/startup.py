"""The master's hand-shake with its workers, before any task runs.

CONFIG to every worker and a HELLO back from each (protocol version, host, cpus, memory,
slots, how it measures tasks), host ranks in rank order, the check that every task fits
some host, then START, with the host script run by the first worker of each host. Also
how a worker's WORKER_FAILED is told, here or later in the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import compress

from pmc import log
from pmc.core import protocol
from pmc.core.engine import State
from pmc.core.events import ArrayInfo
from pmc.core.protocol import WorkerConfig
from pmc.core.resources import Resources
from pmc.dag import DAG
from pmc.dag.model import options_among, options_of
from pmc.errors import FatalError, Interrupted
from pmc.options import RunOptions, worker_values
from pmc.runtime import ranklaunch
from pmc.transport import Transport, TransportError

HELLO_TIMEOUT = 120.0
SIGNAL_CHECK = 0.25  # longest wait before noticing a signal

# Asked between waits: the reason the run is being stopped (a signal), or None.
StopCheck = Callable[[], str | None]


def worker_config(o: RunOptions, out_template: str, err_template: str) -> WorkerConfig:
    return WorkerConfig(
        dag_path=o.dag,
        out_path="" if o.per_task_stdio else out_template,
        err_path="" if o.per_task_stdio else err_template,
        log_level=log.level(),
        **worker_values(o),
    )


def gather_workers(t: Transport, ranks: set[int], resources: Resources,
                   stopped: StopCheck) -> tuple[set[str], set[str]]:
    """Wait for every rank's HELLO (after the CONFIG the caller sent) and add the workers
    to ``resources``; a rank that cannot start leaves ``ranks``. Returns the workers'
    accounting methods and how they enforce --strict-limits memory."""
    accounting: set[str] = set()
    memory_limits: set[str] = set()
    waiting = set(ranks)
    deadline = time.monotonic() + HELLO_TIMEOUT
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FatalError(f"Workers {sorted(waiting)} did not report within "
                             f"{HELLO_TIMEOUT:.0f} s")
        for rank, msg in t.poll(min(left, SIGNAL_CHECK)):
            if msg[0] == protocol.HELLO:  # of any version: add_worker checks
                method, limits = add_worker(rank, msg, resources)
                accounting.add(method)
                memory_limits.add(limits)
                waiting.discard(rank)
            elif isinstance(msg, protocol.Error):
                ranks.discard(rank)  # it has said why it ends: no shutdown, no "lost"
                raise FatalError(str(msg.message))
            elif isinstance(msg, protocol.WorkerFailed):
                ranks.discard(rank)
                raise FatalError(log_failure(rank, msg.hostname, msg.traceback, quiet=True))
        for rank in t.lost():
            ranks.discard(rank)
            raise FatalError(f"Worker {rank} exited before it reported")
        reason = stopped()
        if reason:
            raise Interrupted(reason)
    # Host ranks in rank order on each host (the lowest rank is 0), as the reference
    # gives them, whatever order the workers registered in.
    for host in resources.hosts.values():
        host.workers.sort(key=lambda w: w.rank)
        for i, w in enumerate(host.workers):
            w.host_rank = i
    if log.enabled(log.DEBUG):
        for host in resources.hosts.values():
            log.debug(f"Got new host: name={host.name}, mem={host.memory}, "
                      f"threads/cpus={host.cpus}")
        workers = sorted(resources.workers.values(), key=lambda w: w.rank)
        for w in workers:
            log.debug(f"Slot {w.rank} on host {w.host.name}")
        for w in workers:
            log.debug(f"Host rank of worker {w.rank} is {w.host_rank}")
    return accounting, memory_limits


def add_worker(rank: int, msg: protocol.Message, resources: Resources) -> tuple[str, str]:
    """A worker's HELLO: the worker added to ``resources`` (its host rank the next on its
    host). Returns how it measures tasks and how it enforces --strict-limits memory."""
    if msg[1] != protocol.VERSION or not isinstance(msg, protocol.Hello):
        raise FatalError(f"Worker {rank} speaks protocol {msg[1]}, "
                         f"the master {protocol.VERSION}")
    if msg.why:
        log.debug(f"Worker {rank}: task accounting through {msg.accounting}: {msg.why}")
    resources.add_worker(rank, msg.hostname, msg.cpus, msg.memory, msg.slots, msg.pid,
                         msg.cpu_socket, msg.gpus, dict(msg.gpu_numa))
    return msg.accounting, msg.memory_limits


def check_capable(dag: DAG, state: bytearray, resources: Resources) -> None:
    """Abort before anything runs if some task not done yet can never fit on any host
    (for a multi-rank task: on all of them together). One look per distinct
    ``TaskOptions`` (tasks with the same option text share one, an array's members
    theirs), not per task: those of every task as the DAG counted them, or with a rescue
    log those of the tasks not done."""
    done = int(State.DONE)
    rescued = done in state  # a rescue log (or an array's join): those done need not fit
    kinds = (set(options_among(compress(dag.tasks, map(done.__ne__, state)))) if rescued
             else dag.option_kinds())
    bad = {o for o in kinds
           if not resources.can_ever_run(o.cpus, o.memory, o.gpus, o.ranks, o.ranks_per_host)}
    if bad:
        # The first such task in DAG order names it.
        for task_id, task in enumerate(dag.tasks):
            if state[task_id] != done and options_of(task) in bad:
                raise FatalError("FATAL ERROR: No host is capable of running task "
                                 f"{dag.name_of(task_id)}")


def array_info(dag: DAG, state: bytearray) -> tuple[ArrayInfo, ...]:
    """The task arrays (pmc extension), with their members done and reused at the start."""
    done, reused = bytes((State.DONE,)), bytes((State.REUSED,))
    return tuple(ArrayInfo(a.name, a.n, state.count(done, a.first, a.end),
                           state.count(reused, a.first, a.end))
                 for a in dag.arrays.values())


def check_launcher(template: str | None) -> None:
    """A --task-launcher template that cannot be used stops the run before it starts."""
    if template is not None:
        try:
            ranklaunch.check_template(template)
        except ValueError as e:
            raise FatalError(f"--task-launcher: {e}") from None


def start_hosts(t: Transport, resources: Resources, host_script: bool,
                wall_left: float | None, lost: Callable[[int], None],
                stopped: StopCheck) -> None:
    """START every worker; the first worker on each host runs the host script (if any),
    and the run goes on once every script has succeeded."""
    scripts: set[int] = set()
    for host in resources.hosts.values():
        for w in host.workers:
            run_script = host_script and w.host_rank == 0
            if run_script:
                scripts.add(w.rank)
            try:
                t.send(w.rank, protocol.start(w.host_rank, run_script, wall_left))
            except TransportError:
                lost(w.rank)
    failures: list[str] = []
    while scripts:
        for rank, msg in t.poll(SIGNAL_CHECK):
            if isinstance(msg, protocol.HostScript):
                scripts.discard(rank)
                if not msg.ok:
                    failures.append(msg.message)
        for rank in t.lost():
            scripts.discard(rank)
            failures.append(f"Worker {rank} was lost while running the host script")
        reason = stopped()
        if reason:
            raise Interrupted(reason)
    if failures:
        raise FatalError("; ".join(failures))


def log_failure(rank: int, host: str, trace: str, quiet: bool = False) -> str:
    """A worker's WORKER_FAILED: the whole traceback at debug level, its last line (the
    exception) at error level unless ``quiet`` (the caller says it). Returns that line."""
    lines = str(trace).strip().splitlines()
    line = f"Worker {rank} on {host} failed: {lines[-1] if lines else 'unknown error'}"
    if not quiet:
        log.error(line)
    log.debug(f"Worker {rank} on {host} failed:\n{trace}")
    return line
