"""Hosts, worker slots, cpus and memory: which worker can take which task.

A host's cpus and memory are shared by every worker rank on it (PMC's model); a worker
owns one task slot by default, or several (``--worker-slots``). Memory 0 means the task
does not ask for memory. With ``--set-affinity`` multi-core tasks get a compact set of
cpu ids on one socket where possible, and none when fragmentation makes that impossible.
"""

from __future__ import annotations

import math


class Host:
    __slots__ = (
        "cpu_free",
        "cpu_socket",
        "cpus",
        "free_cpus",
        "free_memory",
        "free_slots",
        "idle",
        "memory",
        "name",
        "workers",
    )

    def __init__(self, name: str, cpus: int, memory: int, cpu_socket: dict[int, int]) -> None:
        self.name = name
        self.cpus = cpus
        self.memory = memory  # MB
        self.free_cpus = cpus
        self.free_memory = memory
        self.free_slots = 0  # over all its workers
        self.workers: list[Worker] = []
        # Workers with a free slot, in the order they got one (a dict as an ordered set:
        # taking a worker out is O(1) however many share the host).
        self.idle: dict[Worker, None] = {}
        self.cpu_socket = cpu_socket  # cpu id -> socket id, for --set-affinity
        self.cpu_free = set(cpu_socket)

    def fits(self, cpus: int, memory: int) -> bool:
        return self.free_cpus >= cpus and self.free_memory >= memory

    def can_ever_run(self, cpus: int, memory: int) -> bool:
        return self.cpus >= cpus and self.memory >= memory

    def take_cpu_set(self, n: int) -> list[int] | None:
        """Lowest free cpus on the fewest sockets possible, or None (let the task float)."""
        if n <= 1 or len(self.cpu_free) < n or not self.cpu_socket:
            return None
        per_socket: dict[int, list[int]] = {}
        for cpu in sorted(self.cpu_free):
            per_socket.setdefault(self.cpu_socket[cpu], []).append(cpu)
        sizes: dict[int, int] = {}
        for sock in self.cpu_socket.values():
            sizes[sock] = sizes.get(sock, 0) + 1
        minimal = math.ceil(n / max(sizes.values()))
        chosen: list[int] = []
        used = 0
        # Fullest sockets first so a small task does not split a socket a big one needs.
        for _sock, cpus in sorted(per_socket.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            take = cpus[: n - len(chosen)]
            chosen.extend(take)
            used += 1
            if len(chosen) == n:
                break
        if used > minimal:
            return None
        self.cpu_free.difference_update(chosen)
        return chosen

    def give_cpu_set(self, cpus: list[int]) -> None:
        self.cpu_free.update(cpus)


class Worker:
    __slots__ = ("free_slots", "host", "host_rank", "pid", "rank", "slots")

    def __init__(self, rank: int, host: Host, host_rank: int, slots: int, pid: int) -> None:
        self.rank = rank
        self.host = host
        self.host_rank = host_rank
        self.slots = slots
        self.free_slots = slots
        self.pid = pid


class Resources:
    """The pool of hosts and worker slots, and the matching of tasks to them."""

    def __init__(self) -> None:
        self.hosts: dict[str, Host] = {}
        self.workers: dict[int, Worker] = {}
        self._idle_hosts: dict[str, Host] = {}  # insertion-ordered set
        self.total_slots = 0  # of the workers still here

    def add_worker(
        self,
        rank: int,
        hostname: str,
        cpus: int,
        memory: int,
        slots: int,
        pid: int = 0,
        cpu_socket: dict[int, int] | None = None,
    ) -> Worker:
        host = self.hosts.get(hostname)
        if host is None:
            host = self.hosts[hostname] = Host(hostname, cpus, memory, cpu_socket or {})
        worker = Worker(rank, host, len(host.workers), slots, pid)
        host.workers.append(worker)
        host.free_slots += slots
        self.workers[rank] = worker
        self.total_slots += slots
        if slots > 0:
            host.idle[worker] = None
            self._idle_hosts[hostname] = host
        return worker

    def remove_worker(self, rank: int) -> Worker | None:
        """A worker that is gone: its slots vanish (running tasks are the caller's)."""
        worker = self.workers.pop(rank, None)
        if worker is None:
            return None
        self.total_slots -= worker.slots
        host = worker.host
        if worker in host.idle:
            del host.idle[worker]
            if not host.idle:
                self._idle_hosts.pop(host.name, None)
        host.workers.remove(worker)
        host.free_slots -= worker.free_slots
        worker.free_slots = 0
        return worker

    @property
    def total_cpus(self) -> int:
        return sum(h.cpus for h in self.hosts.values())

    def free_slots(self) -> int:
        return sum(w.free_slots for h in self._idle_hosts.values() for w in h.idle)

    def any_idle(self) -> bool:
        return bool(self._idle_hosts)

    def can_ever_run(self, cpus: int, memory: int) -> bool:
        return any(h.can_ever_run(cpus, memory) for h in self.hosts.values())

    def find(self, cpus: int, memory: int) -> Worker | None:
        """A worker with a free slot on a host with enough free cpus and memory."""
        for host in self._idle_hosts.values():
            if host.free_cpus >= cpus and host.free_memory >= memory:
                return next(iter(host.idle))
        return None

    def allocate(self, worker: Worker, cpus: int, memory: int) -> None:
        host = worker.host
        host.free_cpus -= cpus
        host.free_memory -= memory
        host.free_slots -= 1
        worker.free_slots -= 1
        if worker.free_slots == 0:
            del host.idle[worker]
            if not host.idle:
                del self._idle_hosts[host.name]

    def release(self, worker: Worker, cpus: int, memory: int) -> None:
        host = worker.host
        host.free_cpus += cpus
        host.free_memory += memory
        if worker.rank not in self.workers:
            return
        host.free_slots += 1
        worker.free_slots += 1
        if worker.free_slots == 1:
            host.idle[worker] = None
            self._idle_hosts[host.name] = host
