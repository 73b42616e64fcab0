"""``FreeHosts``: the hosts with a free slot, in the order they got one, and the first
of them whose free cpus and memory fit a task, found without looking at the others.
The order is the reference's (PMC's list of free slots); ``pmc.core.resources`` keeps
this index in step with every change of a host's free slots, cpus and memory.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class Host(Protocol):
    """A host as the index sees it (``pmc.core.resources.Host``)."""

    pos: int  # its position here, -1 while it has no free slot
    free_cpus: int
    free_memory: int


H = TypeVar("H", bound=Host)


class FreeHosts(Generic[H]):
    """The hosts with a free slot, in the order they got one, searchable by free cpus and
    memory.

    Each host holds a position (later ones to the right) in a segment tree that keeps,
    for each node, the most free cpus and the most free memory among the hosts below it
    (-1 where there is none). The first host that fits a task is found by going down
    from the root into the leftmost child that could fit it: O(log hosts), and a task
    nothing fits costs one look at the root. A host taking a task or getting one back
    is only marked; the marked leaves are brought up to date before the next search, so
    a round of results costs one update per host, not per task. Positions only grow:
    when they run out, the hosts present are packed to the left in their order.

    Between two gains (a host getting cpus or memory back: ``gained``) no host can come
    to fit a request that it did not fit, except one joining at the end: the host a
    search found stays the first that fits the same request for as long as it fits it.
    So a round of dispatch, which only takes, goes down the tree once per request and
    host filled, not once per task (``hint``)."""

    __slots__ = ("cpus", "dirty", "front", "hint", "hosts", "memory", "next", "size")

    def __init__(self) -> None:
        self.size = 4  # leaves, a power of two
        self.cpus = [-1] * (2 * self.size)  # node i's children: 2i, 2i + 1; leaves from size
        self.memory = [-1] * (2 * self.size)
        self.hosts: list[H | None] = [None] * self.size  # by position
        self.next = 0  # the next position to hand out
        self.front = 0  # no host left of it
        self.dirty: set[int] = set()  # positions whose leaf is out of date
        # (cpus, memory) -> the position of the first host that fitted it, no host left of
        # it fitting since (forgotten at every gain and every packing).
        self.hint: dict[tuple[int, int], int] = {}

    def add(self, host: H) -> None:
        """``host`` got a free slot (it had none): last in the order."""
        if self.next == self.size:
            self._pack()
        host.pos = pos = self.next
        self.next += 1
        self.hosts[pos] = host
        self.dirty.add(pos)

    def remove(self, host: H) -> None:
        """``host`` has no free slot left."""
        pos = host.pos
        host.pos = -1
        self.hosts[pos] = None
        self.dirty.add(pos)

    def gained(self, host: H) -> None:
        """``host`` got cpus or memory back."""
        if host.pos >= 0:
            self.dirty.add(host.pos)
        if self.hint:
            self.hint.clear()  # a host left of a hint may fit its request now

    def first(self, cpus: int, memory: int) -> H | None:
        """The first host with ``cpus`` free cpus and ``memory`` MB free, or None."""
        hosts = self.hosts
        front = self.front
        while front < self.next and hosts[front] is None:
            front += 1  # hosts only join at the end: the first one moves right only
        self.front = front
        if front < self.next:
            host = hosts[front]
            assert host is not None
            if host.free_cpus >= cpus and host.free_memory >= memory:
                return host  # the usual case, without the tree
        key = (cpus, memory)
        pos = self.hint.get(key, -1)
        if pos >= 0:
            host = hosts[pos]
            if host is not None and host.free_cpus >= cpus and host.free_memory >= memory:
                return host
        if self.dirty:
            self._update()
        tc = self.cpus
        tm = self.memory
        if tc[1] < cpus or tm[1] < memory:
            return None
        size = self.size
        i = 1
        while i < size:
            i <<= 1
            if tc[i] >= cpus and tm[i] >= memory:
                continue
            i |= 1
            if tc[i] >= cpus and tm[i] >= memory:
                continue
            # Neither child fits although their parent's most cpus and most memory did
            # (two hosts' figures): on to the next subtree to the right that may fit.
            i >>= 1
            while True:
                while i & 1:
                    i >>= 1
                if i <= 1:
                    return None
                i |= 1
                if tc[i] >= cpus and tm[i] >= memory:
                    break
        self.hint[key] = i - size
        return hosts[i - size]

    def _update(self) -> None:
        tc = self.cpus
        tm = self.memory
        size = self.size
        hosts = self.hosts
        for pos in self.dirty:
            host = hosts[pos]
            i = pos + size
            if host is None:
                tc[i] = tm[i] = -1
            else:
                tc[i] = host.free_cpus
                tm[i] = host.free_memory
            i >>= 1
            while i:
                left = i << 1
                c = tc[left] if tc[left] >= tc[left | 1] else tc[left | 1]
                m = tm[left] if tm[left] >= tm[left | 1] else tm[left | 1]
                if tc[i] == c and tm[i] == m:
                    break  # nothing above changes either
                tc[i] = c
                tm[i] = m
                i >>= 1
        self.dirty.clear()

    def _pack(self) -> None:
        """Positions ran out: the hosts present move left, in their order, into a tree
        with room for as many again."""
        present = [h for h in self.hosts if h is not None]
        size = 4
        while size < 2 * len(present):
            size *= 2
        self.size = size
        self.hosts = [None] * size
        for pos, host in enumerate(present):
            host.pos = pos
            self.hosts[pos] = host
        self.next = len(present)
        self.front = 0
        self.hint.clear()
        tc = self.cpus = [-1] * (2 * size)
        tm = self.memory = [-1] * (2 * size)
        for pos, host in enumerate(present):
            tc[size + pos] = host.free_cpus
            tm[size + pos] = host.free_memory
        for i in range(size - 1, 0, -1):
            tc[i] = max(tc[2 * i], tc[2 * i + 1])
            tm[i] = max(tm[2 * i], tm[2 * i + 1])
        self.dirty.clear()
