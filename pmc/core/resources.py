"""Hosts, worker slots, cpus and memory: which worker can take which task.

A host's cpus and memory are shared by every worker rank on it (PMC's model); a worker
owns one task slot by default, or several (``--worker-slots``). Memory 0 means the task
does not ask for memory. Multi-core tasks get a compact set of cpu ids on one socket (NUMA
node) where possible, and none when fragmentation makes that impossible: they see it in
PMC_AFFINITY, and ``--set-affinity`` binds them to it.

A task goes to the first host, in the order hosts got a free slot, whose free cpus and
memory fit it, and there to its worker that got a free slot first. ``FreeHosts`` finds
that host in O(log hosts), without looking at the hosts that do not fit: a cluster of
1,000 hosts whose free slots lack the cpus for the next task costs the master no more
per task than one host does (``pmc.core.freehosts``).

GPUs and multi-rank tasks (pmc extensions): a host holds its GPU ids (as the job sees
them) and the free ones; a task asking for GPUs or ranks (a ``request``: cpus, memory,
gpus, ranks, ranks per host, see ``pmc.dag.model.request_of``) is placed by
``find_request``, which looks at every host with a free slot (such tasks are few). The
launching worker's slot takes one rank's cpus and memory as any task; the rest (its GPU
ids, the other ranks' cpus, memory and GPUs, on its own host and others) is the task's
``Grant``, kept in ``grants`` by task id and given back by ``release``.
"""

from __future__ import annotations

import math

from pmc.core.freehosts import FreeHosts


class Host:
    __slots__ = (
        "cpu_free",
        "cpu_socket",
        "cpus",
        "free_cpus",
        "free_gpus",
        "free_memory",
        "free_slots",
        "gpu_numa",
        "gpus",
        "idle",
        "memory",
        "name",
        "pos",
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
        self.pos = -1  # in FreeHosts while it has a worker with a free slot
        self.cpu_socket = cpu_socket  # cpu id -> socket (NUMA node) id, for PMC_AFFINITY
        self.cpu_free = set(cpu_socket)
        self.gpus: tuple[str, ...] = ()  # GPU ids as the job sees them
        self.free_gpus: list[str] = []  # in the host's order
        self.gpu_numa: dict[str, int] = {}  # GPU id -> its NUMA node, where sysfs says

    def can_ever_run(self, cpus: int, memory: int, gpus: int = 0) -> bool:
        return self.cpus >= cpus and self.memory >= memory and len(self.gpus) >= gpus

    def room(self, cpus: int, memory: int, gpus: int, free: bool = True) -> int:
        """How many ranks of (cpus, memory, gpus) each fit here: now, or ever."""
        c, m, g = ((self.free_cpus, self.free_memory, len(self.free_gpus)) if free
                   else (self.cpus, self.memory, len(self.gpus)))
        n = 1 << 62
        if cpus:
            n = min(n, c // cpus)
        if memory:
            n = min(n, m // memory)
        if gpus:
            n = min(n, g // gpus)
        return max(n, 0)

    def take_gpus(self, n: int) -> tuple[str, ...]:
        taken = self.free_gpus[:n]
        del self.free_gpus[:n]
        return tuple(taken)

    def give_gpus(self, ids: tuple[str, ...]) -> None:
        back = set(ids)
        back.update(self.free_gpus)
        self.free_gpus = [g for g in self.gpus if g in back]  # the host's order again

    def take_cpu_set(self, n: int, near: int | None = None) -> list[int] | None:
        """Lowest free cpus on the fewest NUMA nodes (sockets where the nodes are unknown)
        possible, or None (let the task float). On node ``near`` (its GPUs' node) when
        its free cpus are enough."""
        if n <= 1 or len(self.cpu_free) < n or not self.cpu_socket:
            return None
        per_socket: dict[int, list[int]] = {}
        for cpu in sorted(self.cpu_free):
            per_socket.setdefault(self.cpu_socket[cpu], []).append(cpu)
        if near is not None and len(per_socket.get(near, ())) >= n:
            on_node = per_socket[near][:n]
            self.cpu_free.difference_update(on_node)
            return on_node
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

    def claim_cpu_set(self, cpus: tuple[int, ...]) -> None:
        """These cpu ids (a queued task's, from the task it followed) are taken."""
        self.cpu_free.difference_update(cpus)


class Grant:
    """What a task holds beyond its slot's one rank: per host (the launching worker's
    first), its ranks there, the cpus and memory reserved beyond that slot's, and the
    GPU ids given to it."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[tuple[Host, int, int, int, tuple[str, ...]]]) -> None:
        self.parts = parts  # (host, ranks, extra cpus, extra memory, gpu ids)

    @property
    def gpus(self) -> tuple[str, ...]:
        """The GPU ids on the launching worker's host."""
        return self.parts[0][4]

    def hosts(self) -> tuple[tuple[str, int], ...]:
        """(host name, ranks) of each host the task runs on, the launching one first."""
        return tuple((h.name, n) for h, n, _c, _m, _g in self.parts)


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
    """The pool of hosts and worker slots, and the matching of tasks to them.

    A host is in ``free_hosts`` while one of its workers has a free slot; every change
    of a host's free slots, cpus or memory goes through the methods here, which keep
    the index in step."""

    def __init__(self) -> None:
        self.hosts: dict[str, Host] = {}
        self.workers: dict[int, Worker] = {}
        self.free_hosts: FreeHosts[Host] = FreeHosts()
        self.nfree_hosts = 0  # hosts with a free slot
        self.nfree_slots = 0  # free slots of the workers still here
        self.total_slots = 0  # of the workers still here
        self.grants: dict[int, Grant] = {}  # task id -> what it holds beyond its slot

    def add_worker(
        self,
        rank: int,
        hostname: str,
        cpus: int,
        memory: int,
        slots: int,
        pid: int = 0,
        cpu_socket: dict[int, int] | None = None,
        gpus: tuple[str, ...] = (),
        gpu_numa: dict[str, int] | None = None,
    ) -> Worker:
        host = self.hosts.get(hostname)
        if host is None:
            host = self.hosts[hostname] = Host(hostname, cpus, memory, cpu_socket or {})
            host.gpus = tuple(gpus)
            host.free_gpus = list(gpus)
            host.gpu_numa = gpu_numa or {}
        worker = Worker(rank, host, len(host.workers), slots, pid)
        host.workers.append(worker)
        host.free_slots += slots
        self.workers[rank] = worker
        self.total_slots += slots
        self.nfree_slots += slots
        if slots > 0:
            host.idle[worker] = None
            self._has_free_slot(host)
        return worker

    def _has_free_slot(self, host: Host) -> None:
        if host.pos < 0:
            self.free_hosts.add(host)
            self.nfree_hosts += 1

    def _no_free_slot(self, host: Host) -> None:
        self.free_hosts.remove(host)
        self.nfree_hosts -= 1

    def remove_worker(self, rank: int) -> Worker | None:
        """A worker that is gone: its slots vanish (running tasks are the caller's)."""
        worker = self.workers.pop(rank, None)
        if worker is None:
            return None
        self.total_slots -= worker.slots
        self.nfree_slots -= worker.free_slots
        host = worker.host
        if worker in host.idle:
            del host.idle[worker]
            if not host.idle:
                self._no_free_slot(host)
        host.workers.remove(worker)
        host.free_slots -= worker.free_slots
        worker.free_slots = 0
        return worker

    @property
    def total_cpus(self) -> int:
        return sum(h.cpus for h in self.hosts.values())

    def free_slots(self) -> int:
        return self.nfree_slots

    def any_idle(self) -> bool:
        return self.nfree_hosts > 0

    def can_ever_run(self, cpus: int, memory: int, gpus: int = 0, ranks: int = 1,
                     per_host: int = 0) -> bool:
        """Whether the hosts could ever give a task this (each rank ``cpus``, ``memory``
        and ``gpus``; ``per_host`` ranks on each host used, 0: any split)."""
        hosts = self.hosts.values()
        if ranks == 1:
            return any(h.can_ever_run(cpus, memory, gpus) for h in hosts)
        if per_host:
            whole = sum(1 for h in hosts if h.room(cpus, memory, gpus, free=False) >= per_host)
            return whole >= ranks // per_host
        return sum(min(h.room(cpus, memory, gpus, free=False), ranks) for h in hosts) >= ranks

    def find_request(self, request: tuple[int, ...]
                     ) -> tuple[Worker, list[tuple[Host, int]]] | None:
        """For a task asking for GPUs or ranks: the launching worker (a free slot, on the
        first host in the free-slot order where its first ranks fit) and the ranks on each
        host (that worker's first), or None if the hosts cannot give it all now."""
        cpus, memory, gpus, ranks, per_host = request
        for first in self.free_hosts.hosts:
            if first is None or not first.idle:
                continue
            here = min(first.room(cpus, memory, gpus), ranks)
            if here < (per_host or 1):
                continue
            if per_host:
                here = per_host
            plan = [(first, here)]
            left = ranks - here
            for host in self.hosts.values():
                if not left:
                    break
                if host is first or not host.workers:
                    continue  # (a host without workers: lost, or quarantined)
                n = min(host.room(cpus, memory, gpus), left)
                if per_host:
                    if n < per_host:
                        continue
                    n = per_host
                if n:
                    plan.append((host, n))
                    left -= n
            if not left:
                return next(iter(first.idle)), plan
        return None

    def take(self, task_id: int, worker: Worker, request: tuple[int, ...],
             plan: list[tuple[Host, int]]) -> Grant:
        """Allocate a ``find_request`` result: the worker's slot as ``allocate``, the rest
        as the task's grant."""
        cpus, memory, gpus = request[0], request[1], request[2]
        self.allocate(worker, cpus, memory)
        parts = []
        for host, n in plan:
            extra = n - 1 if host is worker.host else n
            host.free_cpus -= extra * cpus
            host.free_memory -= extra * memory
            parts.append((host, n, extra * cpus, extra * memory, host.take_gpus(n * gpus)))
            if host.pos >= 0:
                self.free_hosts.dirty.add(host.pos)
        grant = self.grants[task_id] = Grant(parts)
        return grant

    def claim(self, task_id: int, worker: Worker, gpus: tuple[str, ...]) -> None:
        """A task promoted in its predecessor's place takes these ids of its host (given
        back by the predecessor's release)."""
        host = worker.host
        taken = set(gpus)
        host.free_gpus = [g for g in host.free_gpus if g not in taken]
        self.grants[task_id] = Grant([(host, 1, 0, 0, gpus)])

    def find(self, cpus: int, memory: int) -> Worker | None:
        """A worker with a free slot on a host with enough free cpus and memory: the first
        such host in the order hosts got a free slot, its first worker to get one."""
        host = self.free_hosts.first(cpus, memory)
        return None if host is None else next(iter(host.idle))

    def allocate(self, worker: Worker, cpus: int, memory: int) -> None:
        host = worker.host
        host.free_cpus -= cpus
        host.free_memory -= memory
        host.free_slots -= 1
        worker.free_slots -= 1
        self.nfree_slots -= 1
        if worker.free_slots == 0:
            del host.idle[worker]
            if not host.idle:
                self._no_free_slot(host)
                return
        if host.pos >= 0 and (cpus or memory):
            self.free_hosts.dirty.add(host.pos)

    def release(self, worker: Worker, cpus: int, memory: int, task_id: int = -1) -> None:
        """A task's slot back (and its grant, if ``task_id`` has one)."""
        if self.grants and task_id in self.grants:
            for h, _n, extra_cpus, extra_memory, ids in self.grants.pop(task_id).parts:
                h.free_cpus += extra_cpus
                h.free_memory += extra_memory
                if ids:
                    h.give_gpus(ids)
                if extra_cpus or extra_memory:
                    self.free_hosts.gained(h)
        host = worker.host
        host.free_cpus += cpus
        host.free_memory += memory
        if worker.rank in self.workers:
            host.free_slots += 1
            worker.free_slots += 1
            self.nfree_slots += 1
            if worker.free_slots == 1:
                host.idle[worker] = None
                self._has_free_slot(host)
        if cpus or memory:
            self.free_hosts.gained(host)
