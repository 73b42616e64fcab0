"""Fake transports for driving the real master without worker processes.

Shared by the tests and ``benchmarks/scale.py`` (which puts this directory on its path).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from pmc.core import protocol
from pmc.core.protocol import TaskResult


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
            (rank, (protocol.HELLO, protocol.VERSION, host, cpus, memory, slots, 100 + rank,
                    {}))
            for rank, host in hosts)
        self.now = time.time()

    @classmethod
    def on_one_host(cls, workers: int, host: str = "bench", cpus: int = 4,
                    memory: int = 1000, slots: int = 1) -> InstantWorkers:
        """``workers`` workers on one host, registering in rank order."""
        return cls([(rank, host) for rank in range(1, workers + 1)], cpus, memory, slots)

    def send(self, dest: int, msg: protocol.Message) -> None:
        tag = msg[0]
        if tag == protocol.TASKS:
            now = self.now
            self.inbox.append((dest, (protocol.RESULTS, [
                TaskResult(s.id, s.attempt, 0, now, 0.001, 0.0, 0, None, None)
                for s in msg[1]])))
        elif tag == protocol.SHUTDOWN:
            self.inbox.append((dest, (protocol.BYE, None)))
        elif tag == protocol.PING:
            self.inbox.append((dest, (protocol.PING,)))

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
