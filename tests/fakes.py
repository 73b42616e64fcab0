"""Fake transports for driving the real master without worker processes:
``InstantWorkers`` (every task ends the moment it is sent) and ``SimWorkers`` (the
worker's rules step by step: prefetched successors, recalls, losses), and ``run_sim``,
which runs a DAG against them.

Shared by the tests and ``benchmarks/scale.py`` (which puts this directory on its path).
Two, not one, because they answer different questions: ``InstantWorkers`` costs the
master's loop next to nothing (``scale.py`` measures the master's cpu per task through
it, and a simulation's bookkeeping would be counted in that figure), ``SimWorkers``
plays the worker's rules out over time, which is what the prefetching and loss tests
check. Both speak the protocol's records and say hello with ``hello`` below.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pmc.commands.lifecycle import Run
from pmc.core import protocol
from pmc.core.events import Fanout, Observer
from pmc.core.protocol import TaskResult, TaskSpec
from pmc.dag import Task, parse_dag
from pmc.options import RunOptions
from pmc.runtime.master import Master


def hello(host: str, cpus: int, memory: int, slots: int, pid: int) -> protocol.Hello:
    """The HELLO a worker sends, as a worker on a host without GPUs that measures its
    tasks by rusage sends it (``runtime.worker.Worker.hello``)."""
    return protocol.Hello(protocol.HELLO, protocol.VERSION, host, cpus, memory, slots, pid,
                          dict.fromkeys(range(cpus), 0), "rusage", "rlimit", "", (), ())


class InstantWorkers:
    """The master's end of a transport whose workers exist only as their answers: they
    register (HELLO) at the master's first look, in the order given by ``hosts`` ((rank,
    host name) pairs: the order of registration need not be the ranks'), finish every
    task the moment they are sent it, and say BYE to SHUTDOWN. Deterministic, no
    processes, no clock but the one start time every result carries."""

    rank = 0

    def __init__(self, hosts: Sequence[tuple[int, str]], cpus: int = 4,
                 memory: int = 1000, slots: int = 1) -> None:
        self.size = len(hosts) + 1
        self.cpus = cpus
        self.memory = memory  # MB
        self.slots = slots
        self.inbox: deque[tuple[int, protocol.Message]] = deque(
            (rank, hello(host, cpus, memory, slots, 100 + rank)) for rank, host in hosts)
        self.now = time.time()

    @classmethod
    def on_one_host(cls, workers: int, host: str = "bench", cpus: int = 4,
                    memory: int = 1000, slots: int = 1) -> InstantWorkers:
        """``workers`` workers on one host, registering in rank order."""
        return cls([(rank, host) for rank in range(1, workers + 1)], cpus, memory, slots)

    def send(self, dest: int, msg: protocol.Message) -> None:
        if isinstance(msg, protocol.Tasks):
            now = self.now
            self.inbox.append((dest, protocol.results([
                TaskResult(s.id, s.attempt, 0, now, 0.001, 0.0, 0, None, None)
                for s in msg.specs], [])))
        elif isinstance(msg, protocol.Shutdown):
            self.inbox.append((dest, protocol.bye(None)))
        elif isinstance(msg, protocol.Ping):
            self.inbox.append((dest, protocol.ping()))

    def poll(self, timeout: float | None) -> list[tuple[int, protocol.Message]]:
        out = list(self.inbox)
        self.inbox.clear()
        return out

    def fileno(self) -> int | None:
        return None

    def lost(self) -> list[int]:
        return []

    def abandon(self, rank: int) -> None:
        pass

    def close(self) -> None:
        pass


class SimWorkers:
    """The master's transport, with workers that obey the worker's rules: a task with
    ``after`` waits for that task to end, RECALL gives queued tasks back (RETURNED at
    once, before results still held), KILL gives them back and kills the running ones,
    results wait (up to 2 steps) while every running task has a successor. Each poll is
    one step of time: tasks whose ``steps`` ran out end, and their successors start."""

    rank = 0

    def __init__(self, workers: int, steps: dict[str, int], slots: int = 1,
                 lose: dict[int, int] | None = None,
                 hosts: dict[int, str] | None = None) -> None:
        self.size = workers + 1
        self.slots = slots
        self.hosts = hosts or {}  # rank -> host name (default "sim")
        self.steps = steps  # task name -> steps it runs (default 1)
        self.lose = lose or {}  # rank -> step at which the worker dies
        self.running: dict[int, dict[int, list[Any]]] = {r: {} for r in range(1, self.size)}
        self.queued: dict[int, dict[int, TaskSpec]] = {r: {} for r in range(1, self.size)}
        self.out: deque[tuple[int, protocol.Message]] = deque()
        self.log: list[tuple[str, str, int]] = []  # (what, task name, rank)
        self.sent: list[tuple[int, int]] = []  # (rank, tag) of every master message
        self.specs: list[TaskSpec] = []  # every task sent
        self.lost_queued: list[str] = []  # tasks queued on a worker when it died
        self.dead: set[int] = set()
        self.held: dict[int, list[TaskResult]] = {r: [] for r in range(1, self.size)}
        self.held_since: dict[int, int] = {}
        self._lost: list[int] = []
        self.step = 0

    def send(self, dest: int, msg: protocol.Message) -> None:
        self.sent.append((dest, msg.tag))
        if dest in self.dead:
            return
        if isinstance(msg, protocol.Config):
            self.out.append((dest, hello(self.hosts.get(dest, "sim"), 64, 1 << 20,
                                         self.slots, 0)))
        elif isinstance(msg, protocol.Tasks):
            self.specs.extend(msg.specs)
            for spec in msg.specs:
                if spec.after in self.running[dest] or any(
                        s.id == spec.after for s in self.queued[dest].values()):
                    assert spec.after not in self.queued[dest], "one successor per task"
                    self.queued[dest][spec.after] = spec
                else:
                    assert len(self.running[dest]) < self.slots, "no slot for a direct task"
                    self.start(dest, spec)
        elif isinstance(msg, (protocol.Recall, protocol.Kill)):
            returned = [s.id for s in self.queued[dest].values()]
            self.queued[dest].clear()
            if returned:
                self.out.append((dest, protocol.returned(returned)))
            if isinstance(msg, protocol.Kill):
                for spec, _left in list(self.running[dest].values()):
                    self.end(dest, spec, -15)
                self.flush(dest)
        elif isinstance(msg, protocol.Shutdown):
            self.out.append((dest, protocol.bye(None)))

    def start(self, rank: int, spec: TaskSpec) -> None:
        self.log.append(("start", spec.name, rank))
        self.running[rank][spec.id] = [spec, self.steps.get(spec.name, 1)]

    def end(self, rank: int, spec: TaskSpec, status: int = 0) -> None:
        del self.running[rank][spec.id]
        self.log.append(("end", spec.name, rank))
        self.held[rank].append(
            TaskResult(spec.id, spec.attempt, status, 0.0, 0.0, 0.0, 0, None, None))
        self.held_since.setdefault(rank, self.step)
        succ = self.queued[rank].pop(spec.id, None)
        if succ is not None:
            self.start(rank, succ)

    def flush(self, rank: int) -> None:
        hungry = any(tid not in self.queued[rank] for tid in self.running[rank])
        if self.held[rank] and (hungry or not self.queued[rank]
                                or self.step - self.held_since[rank] >= 2):
            self.out.append((rank, protocol.results(self.held[rank], [])))
            self.held[rank] = []
            del self.held_since[rank]

    def poll(self, timeout: float | None) -> list[tuple[int, protocol.Message]]:
        self.step += 1
        for rank, running in self.running.items():
            if rank in self.dead:
                continue
            if self.lose.get(rank) == self.step:
                self.dead.add(rank)
                self._lost.append(rank)
                self.lost_queued.extend(s.name for s in self.queued[rank].values())
                continue
            for spec, _left in [v for v in running.values() if v[1] <= 1]:
                self.end(rank, spec)
            for entry in running.values():
                entry[1] -= 1
            self.flush(rank)
        out = [m for m in self.out if m[0] not in self.dead]
        self.out.clear()
        return out

    def fileno(self) -> int | None:
        return None

    def lost(self) -> list[int]:
        lost, self._lost = self._lost, []
        return lost

    def abandon(self, rank: int) -> None:
        pass

    def close(self) -> None:
        pass


class Watch(Observer):
    """The tasks observers saw dispatched, to compare with those that really started."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def dispatched(self, task: Task, seq: int, attempt: int, rank: int, host: str) -> None:
        self.names.append(task.name)

    def matches(self, sim: SimWorkers) -> bool:
        """One dispatched event per start: none for tasks queued and given back."""
        return Counter(self.names) == Counter(starts(sim))


def run_sim(tmp_path: Path, dag_text: str, sim: SimWorkers,
            observers: Sequence[Observer] = (), **opts: Any) -> tuple[Master, Watch, Any]:
    """A run of ``dag_text`` over ``sim``, as ``pmc run`` takes it (``Run``) up to the
    workers' shutdown: the observers hear everything but ``finished`` and ``close``."""
    dag_path = tmp_path / "sim.dag"
    dag_path.write_text(dag_text)
    watch = Watch()
    run = Run(RunOptions(dag=str(dag_path), nolock=True, **opts), parse_dag(str(dag_path)),
              sim, Fanout([watch, *observers]), "local")
    try:
        run.started(run.start())
        summary = run.loop()
    finally:
        run.shutdown()
    return run.master, watch, summary


def starts(sim: SimWorkers) -> list[str]:
    return [name for what, name, _rank in sim.log if what == "start"]
