"""An open run (``pmc run --open``, a pmc extension): the master's side of tasks added
while it runs.

``OpenRun`` owns the run's channel (``pmc.runtime.channel``) and journal
(``pmc.runtime.journal``) and answers their requests on the master's loop, the only
place the DAG and the engine change: ``add`` (a batch of TASK/EDGE lines: read, made
durable in the journal, then joined to the DAG and the engine, its ready tasks queued;
or refused whole), ``close`` (the run ends once what it has is done), ``state`` (tasks'
states and their last try's record). It hears results as an observer, to keep the
records of added tasks for ``state``.
"""

from __future__ import annotations

import select
import time
from array import array
from typing import TYPE_CHECKING, Any, Protocol

from pmc import log
from pmc.core.engine import Engine, State
from pmc.core.events import Observer
from pmc.core.protocol import Message, TaskResult, exit_code_of, signal_of
from pmc.core.resources import Resources
from pmc.dag.extend import extend, parse_batch
from pmc.dag.model import DAG, DagError, Task, options_of
from pmc.options import RunOptions
from pmc.optiontypes import Listen
from pmc.runtime.journal import Journal, journal_path, replay
from pmc.transport import Transport

if TYPE_CHECKING:
    from pmc.runtime.channel import Channel, Request



class Owner(Protocol):
    """What the open run reads and calls of the master that owns it."""

    t: Transport
    dag: DAG
    engine: Engine
    out: Observer
    resources: Resources
    seq: array[int]
    stop_reason: str | None
    open: OpenRun | None

    def mark_ready(self, task_id: int) -> None: ...


OPS = frozenset({"add", "close", "state", "info"})
MAX_NAMES = 100_000  # tasks one ``state`` request may ask about


def prepare(opts: RunOptions, dag: DAG) -> OpenRun | None:
    """Add to ``dag`` the tasks added to it before (its journal); the open run's side
    when the run is open. Raises DagError for a journal that no longer fits the DAG."""
    base = len(dag)
    path = journal_path(opts.dag)
    added, warnings = replay(dag, path)
    for text in warnings:
        log.warn(text)
    if added:
        log.info(f"Read {added} task(s) added to the DAG before from {path}")
    return OpenRun(opts.dag, base, opts.open_tcp) if opts.open_run else None


class OpenRun(Observer):
    """The open run of a DAG whose first ``base`` ids were its own at the start (ids
    from ``base`` on were added, in this run or, read from the journal, an earlier)."""

    def __init__(self, dag_path: str, base: int, tcp: Listen | None = None) -> None:
        self.dag_path = dag_path
        self.base = base
        self.tcp = tcp
        self.closed = False
        self.master: Owner | None = None
        self.channel: Channel | None = None
        self.journal: Journal | None = None
        self.records: dict[int, dict[str, Any]] = {}  # added tasks' last tries

    def open(self, master: Owner) -> None:
        """Start taking requests (once the master has started)."""
        from pmc.runtime.channel import Channel  # secrets, hmac: only for an open run

        self.master = master
        master.open = self
        self.journal = Journal(journal_path(self.dag_path))
        self.channel = Channel(self.dag_path, OPS, self.tcp)
        log.info(f"Open run: tasks may be added through {self.channel.path} "
                 f"(pmc add / pmc close / pmc.client)")
        if self.channel.tcp_where:
            log.info(f"Open run: listening on TCP at {self.channel.tcp_where} "
                     f"(written to {self.channel.tcp_file})")

    def may_end(self) -> bool:
        """Whether the run may end when nothing is left to run: closed, or stopped
        starting tasks (--max-failures)."""
        assert self.master is not None
        return self.closed or not self.master.engine.accepting()

    def poll(self, timeout: float) -> list[tuple[int, Message]]:
        """The transport's ``poll``, returning early when a request is waiting; the
        requests waiting are answered first."""
        assert self.channel is not None and self.master is not None
        t = self.master.t
        wake = self.channel.fileno()
        fd = t.fileno()
        if fd is not None:
            ready, _, _ = select.select([fd, wake], [], [], timeout)
            msgs = t.poll(0) if fd in ready else []
        else:
            end = time.monotonic() + timeout
            while True:
                msgs = t.poll(min(0.01, max(0.0, end - time.monotonic())))
                if msgs or time.monotonic() >= end or select.select([wake], [], [], 0)[0]:
                    break
        self.serve()
        return msgs

    def serve(self) -> None:
        """Answer the requests that wait (on the master's loop)."""
        assert self.channel is not None
        for req in self.channel.take():
            try:
                req.answer(self.answer(req))
            except Exception as e:  # a bug must not leave a client waiting for ever
                req.answer({"ok": False, "error": f"internal error: {e}"})
                raise

    def answer(self, req: Request) -> dict[str, Any]:
        if req.op == "add":
            return self.add(req.body)
        if req.op == "close":
            if not self.closed:
                log.info("Open run closed: the run ends once its tasks are done")
            self.closed = True
            return {"ok": True}
        if req.op == "state":
            return self.state(req.body)
        assert self.master is not None
        engine = self.master.engine
        return {"ok": True, "tasks": engine.ntasks, "done": engine.ndone,
                "failed": engine.nfailed, "closed": self.closed}

    def add(self, body: dict[str, Any]) -> dict[str, Any]:
        master = self.master
        assert master is not None and self.journal is not None
        text, source = body.get("text"), body.get("source", "batch")
        if not isinstance(text, str) or not isinstance(source, str):
            return {"ok": False, "error": "an add request needs the text of TASK/EDGE lines"}
        if self.closed:
            return {"ok": False, "error": "the open run is closed: no task can be added"}
        if master.stop_reason is not None or not master.engine.accepting():
            return {"ok": False, "error": "the run is stopping: no task can be added"}
        dag = master.dag
        try:
            batch = parse_batch(dag, source[:200], text)
        except DagError as e:
            log.warn(f"Open run: refused a batch: {e}")
            return {"ok": False, "error": str(e)}
        for task in batch.tasks:
            o = options_of(task)
            if not master.resources.can_ever_run(o.cpus, o.memory, o.gpus, o.ranks,
                                                 o.ranks_per_host):
                why = f"No host is capable of running task {task.name}"
                log.warn(f"Open run: refused a batch: {why}")
                return {"ok": False, "error": why}
        try:
            self.journal.append(text)
        except OSError as e:
            log.error(f"Open run: cannot write {self.journal.path}: {e}")
            return {"ok": False, "error": f"the batch could not be made durable: {e}"}
        first = len(dag)
        extend(dag, batch)
        master.seq.extend(array("i", bytes(4 * len(batch.tasks))))
        newly = master.engine.add(first, batch.edges)
        master.out.tasks_added(batch.tasks, dag.ntasks)
        for task_id in newly:
            master.mark_ready(task_id)
        log.info(f"Open run: added {len(batch.tasks)} task(s) and {len(batch.edges)} "
                 f"edge(s) from {source[:200]}")
        return {"ok": True, "tasks": [t.name for t in batch.tasks]}

    def state(self, body: dict[str, Any]) -> dict[str, Any]:
        names = body.get("names")
        if not isinstance(names, list) or len(names) > MAX_NAMES or not all(
                isinstance(n, str) for n in names):
            return {"ok": False, "error": f"a state request needs a list of at most "
                    f"{MAX_NAMES} task names"}
        assert self.master is not None
        dag, engine = self.master.dag, self.master.engine
        out: dict[str, Any] = {}
        for name in names:
            task_id = dag.id_of(name)
            if task_id is None:
                out[name] = {"state": "unknown"}
                continue
            out[name] = {"state": State(engine.state[task_id]).name.lower(),
                         "tries": engine.attempts[task_id],
                         "record": self.records.get(task_id)}
        return {"ok": True, "tasks": out}

    def result(self, task: Task, seq: int, res: TaskResult, outcome: str) -> None:
        if task.id >= self.base:
            self.records[task.id] = {
                "outcome": outcome, "attempt": res.attempt, "status": res.status,
                "exit_code": exit_code_of(res.status), "signal": signal_of(res.status),
                "start": res.start, "duration": res.duration, "cpu_time": res.cpu_time,
                "max_rss_kb": res.max_rss_kb, "error": res.error,
                "stderr_path": res.stderr_path}

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.journal is not None:
            self.journal.close()
            self.journal = None
