"""Matching tasks to worker slots by host cpus and memory; cpu sets for --set-affinity."""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pmc.core.chains import Chains
from pmc.core.engine import Engine
from pmc.core.events import Observer
from pmc.core.resources import Host, Resources, Worker
from pmc.dag import parse_dag
from pmc.runtime import hostinfo
from pmc.runtime.placement import Placer
from pmc.runtime.summary import Counts


def pool() -> Resources:
    r = Resources()
    r.add_worker(1, "big", cpus=8, memory=1000, slots=1)
    r.add_worker(2, "big", cpus=8, memory=1000, slots=1)
    r.add_worker(3, "small", cpus=2, memory=100, slots=1)
    return r


def test_hosts_share_cpus_and_memory_between_their_workers() -> None:
    r = pool()
    assert set(r.hosts) == {"big", "small"}
    assert r.hosts["big"].cpus == 8 and len(r.hosts["big"].workers) == 2
    assert [w.host_rank for w in r.hosts["big"].workers] == [0, 1]
    assert r.total_slots == 3 and r.total_cpus == 10


def test_task_goes_only_where_cpus_and_memory_fit() -> None:
    r = pool()
    w = r.find(4, 500)
    assert w is not None and w.host.name == "big"
    r.allocate(w, 4, 500)
    w2 = r.find(4, 500)
    assert w2 is not None and w2.host.name == "big" and w2 is not w
    r.allocate(w2, 4, 500)
    assert r.find(1, 0) is not None and r.find(1, 0).host.name == "small"
    assert r.find(3, 0) is None  # small has 2 cpus, big has no free slot


def test_cpus_limit_concurrency_even_with_idle_workers() -> None:
    r = Resources()
    for rank in range(1, 5):
        r.add_worker(rank, "h", cpus=2, memory=0, slots=1)
    a = r.find(1, 0)
    assert a is not None
    r.allocate(a, 1, 0)
    b = r.find(1, 0)
    assert b is not None
    r.allocate(b, 1, 0)
    assert r.find(1, 0) is None
    r.release(a, 1, 0)
    assert r.find(1, 0) is not None


def test_memory_zero_is_not_considered() -> None:
    r = Resources()
    r.add_worker(1, "h", cpus=1, memory=0, slots=1)
    assert r.find(1, 0) is not None
    assert r.find(1, 1) is None


def test_can_ever_run() -> None:
    r = pool()
    assert r.can_ever_run(8, 1000)
    assert not r.can_ever_run(9, 0)
    assert not r.can_ever_run(1, 1001)


def test_several_slots_per_worker() -> None:
    r = Resources()
    w = r.add_worker(1, "h", cpus=4, memory=0, slots=3)
    for _ in range(3):
        assert r.find(1, 0) is w
        r.allocate(w, 1, 0)
    assert r.find(1, 0) is None
    r.release(w, 1, 0)
    assert r.find(1, 0) is w


def test_removed_worker_takes_its_slots_away() -> None:
    r = pool()
    r.remove_worker(3)
    assert r.find(1, 0) is not None and r.find(1, 0).host.name == "big"
    assert r.total_slots == 2


def test_compact_cpu_sets_on_one_socket() -> None:
    # 2 sockets x 4 cores: cpus 0-3 on socket 0, 4-7 on socket 1.
    h = Host("h", 8, 0, {c: c // 4 for c in range(8)})
    assert h.take_cpu_set(1) is None  # single-core tasks float
    a = h.take_cpu_set(4)
    b = h.take_cpu_set(4)
    assert sorted([a, b]) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_fragmented_sockets_leave_the_task_unbound() -> None:
    h = Host("h", 8, 0, {c: c // 4 for c in range(8)})
    pairs = [h.take_cpu_set(2) for _ in range(4)]
    assert all(p is not None for p in pairs)
    # Free one pair on each socket: 4 free cpus, but split across two sockets.
    h.give_cpu_set(pairs[0])
    h.give_cpu_set(pairs[3])
    assert h.take_cpu_set(4) is None
    assert h.take_cpu_set(2) is not None


# -- the index of hosts with a free slot, against a scan of them all ----------------------


class ScanPool:
    """The matching rule written as a plain scan: hosts in the order they got a free slot
    (one that had none goes last), the first whose free cpus and memory fit, its first
    worker to get a free slot."""

    def __init__(self) -> None:
        self.cpus: dict[str, int] = {}
        self.memory: dict[str, int] = {}
        self.host_of: dict[int, str] = {}
        self.free: dict[int, int] = {}  # rank -> free slots (workers still here)
        self.idle: dict[str, dict[int, None]] = {}  # host -> workers with a free slot
        self.order: dict[str, None] = {}  # hosts with a free slot, in order

    def add_worker(self, rank: int, host: str, cpus: int, memory: int, slots: int) -> None:
        self.cpus.setdefault(host, cpus)
        self.memory.setdefault(host, memory)
        self.idle.setdefault(host, {})
        self.host_of[rank] = host
        self.free[rank] = slots
        if slots:
            self.idle[host][rank] = None
            self.order.setdefault(host, None)

    def remove_worker(self, rank: int) -> None:
        host = self.host_of[rank]
        del self.free[rank]
        self.idle[host].pop(rank, None)
        if not self.idle[host]:
            self.order.pop(host, None)

    def find(self, cpus: int, memory: int) -> int | None:
        for host in self.order:
            if self.cpus[host] >= cpus and self.memory[host] >= memory:
                return next(iter(self.idle[host]))
        return None

    def allocate(self, rank: int, cpus: int, memory: int) -> None:
        host = self.host_of[rank]
        self.cpus[host] -= cpus
        self.memory[host] -= memory
        self.free[rank] -= 1
        if not self.free[rank]:
            del self.idle[host][rank]
            if not self.idle[host]:
                del self.order[host]

    def release(self, rank: int, cpus: int, memory: int) -> None:
        host = self.host_of[rank]
        self.cpus[host] += cpus
        self.memory[host] += memory
        if rank in self.free:
            self.free[rank] += 1
            if self.free[rank] == 1:
                self.idle[host][rank] = None
                self.order.setdefault(host, None)


ASKS = st.tuples(st.integers(0, 5), st.sampled_from([0, 0, 10, 100, 300]))


@settings(max_examples=300, deadline=None)
@given(hosts=st.lists(st.tuples(st.integers(1, 8), st.sampled_from([0, 100, 500, 1000]),
                                st.integers(1, 4), st.integers(0, 3)),
                      min_size=1, max_size=12),
       steps=st.lists(st.tuples(st.sampled_from("ffffrrx"), ASKS, st.integers(0, 10**6)),
                      max_size=200))
def test_placement_is_that_of_a_scan_of_every_host(
        hosts: list[tuple[int, int, int, int]], steps: list[tuple[str, tuple[int, int], int]]
) -> None:
    """Random hosts (cpus, memory, workers, slots each), then random steps: place a task
    where it fits, end a running one, lose a worker. Every answer is the scan's."""
    r, ref = Resources(), ScanPool()
    rank = 0
    for h, (cpus, memory, workers, slots) in enumerate(hosts):
        for _ in range(workers):
            rank += 1
            r.add_worker(rank, f"h{h}", cpus, memory, slots)
            ref.add_worker(rank, f"h{h}", cpus, memory, slots)
    running: list[tuple[int, int, int]] = []  # (rank, cpus, memory)
    lost: dict[int, Worker] = {}
    for what, (cpus, memory), pick in steps:
        for asked in ((cpus, memory), (1, 0), (0, 0)):
            w = r.find(*asked)
            assert (None if w is None else w.rank) == ref.find(*asked)
        assert r.any_idle() == bool(ref.order)
        assert r.free_slots() == sum(ref.free.values())
        if what == "f":
            w = r.find(cpus, memory)
            if w is not None:
                r.allocate(w, cpus, memory)
                ref.allocate(w.rank, cpus, memory)
                running.append((w.rank, cpus, memory))
        elif what == "r" and running:
            rk, c, m = running.pop(pick % len(running))
            r.release(r.workers[rk] if rk in r.workers else lost[rk], c, m)
            ref.release(rk, c, m)
        elif what == "x" and r.workers:
            rk = sorted(r.workers)[pick % len(r.workers)]
            gone = r.remove_worker(rk)
            assert gone is not None
            lost[rk] = gone
            ref.remove_worker(rk)


# -- GPUs and multi-rank tasks (pmc extensions) ------------------------------------------


def gpu_pool() -> Resources:
    r = Resources()
    r.add_worker(1, "g", cpus=8, memory=0, slots=2, gpus=("2", "3", "5", "7"))
    r.add_worker(2, "plain", cpus=8, memory=0, slots=2)
    return r


def test_gpu_tasks_get_their_own_ids_and_give_them_back() -> None:
    r = gpu_pool()
    found = r.find_request((1, 0, 2, 1, 0))
    assert found is not None
    worker, plan = found
    assert worker.host.name == "g" and [(h.name, n) for h, n in plan] == [("g", 1)]
    a = r.take(10, worker, (1, 0, 2, 1, 0), plan)
    assert a.gpus == ("2", "3") and r.hosts["g"].free_gpus == ["5", "7"]
    found = r.find_request((1, 0, 2, 1, 0))
    assert found is not None
    b = r.take(11, found[0], (1, 0, 2, 1, 0), found[1])
    assert b.gpus == ("5", "7") and not r.hosts["g"].free_gpus
    r.release(worker, 1, 0, 10)
    # Back in the host's order; the plain host never had any to give.
    assert r.hosts["g"].free_gpus == ["2", "3"] and 10 not in r.grants
    assert r.hosts["g"].free_cpus == 7  # task 11's cpu only
    assert not r.can_ever_run(1, 0, 5) and r.can_ever_run(1, 0, 4)


def test_a_gpu_task_waits_for_ids_even_with_free_slots_and_cpus() -> None:
    r = gpu_pool()
    found = r.find_request((1, 0, 3, 1, 0))
    assert found is not None
    r.take(1, found[0], (1, 0, 3, 1, 0), found[1])
    assert r.find_request((1, 0, 2, 1, 0)) is None
    assert r.find(1, 0) is not None  # a task asking for no GPU still fits


def many_hosts(n: int, cpus: int) -> Resources:
    r = Resources()
    for i in range(n):
        r.add_worker(i + 1, f"h{i}", cpus=cpus, memory=1000, slots=1)
    return r


def test_ranks_per_host_spread_over_whole_hosts_launching_host_first() -> None:
    r = many_hosts(4, 4)
    request = (2, 100, 0, 6, 2)  # 6 ranks of 2 cpus, 2 per host: 3 hosts, all their cpus
    found = r.find_request(request)
    assert found is not None
    worker, plan = found
    assert [(h.name, n) for h, n in plan] == [("h0", 2), ("h1", 2), ("h2", 2)]
    grant = r.take(7, worker, request, plan)
    assert grant.hosts() == (("h0", 2), ("h1", 2), ("h2", 2))
    assert [r.hosts[f"h{i}"].free_cpus for i in range(4)] == [0, 0, 0, 4]
    assert [r.hosts[f"h{i}"].free_memory for i in range(4)] == [800, 800, 800, 1000]
    # Only the launching worker's slot is taken: h1's worker still takes a task that
    # asks for no cpus; the other hosts' cpus are the multi-rank task's.
    assert r.free_slots() == 3
    assert r.find(1, 0) is not None and r.find(1, 0).host.name == "h3"
    assert r.find_request(request) is None  # one whole host left, three needed
    r.release(worker, 2, 100, 7)
    assert [r.hosts[f"h{i}"].free_cpus for i in range(4)] == [4, 4, 4, 4]
    assert [r.hosts[f"h{i}"].free_memory for i in range(4)] == [1000] * 4
    assert r.find_request(request) is not None


def test_ranks_without_a_per_host_count_fill_what_is_free() -> None:
    r = many_hosts(3, 4)
    w = r.find(3, 0)
    assert w is not None and w.host.name == "h0"
    r.allocate(w, 3, 0)  # h0: 1 cpu left, and no free slot
    found = r.find_request((1, 0, 0, 6, 0))
    assert found is not None
    worker, plan = found
    # h0 has no free slot: h1 launches and takes what fits, then h0's last cpu, then h2.
    assert worker.host.name == "h1"
    assert [(h.name, n) for h, n in plan] == [("h1", 4), ("h0", 1), ("h2", 1)]


def test_whether_ranks_can_ever_fit() -> None:
    r = many_hosts(3, 4)
    assert r.can_ever_run(1, 0, 0, 12) and not r.can_ever_run(1, 0, 0, 13)
    assert r.can_ever_run(2, 0, 0, 6, 2) and not r.can_ever_run(2, 0, 0, 8, 2)
    assert not r.can_ever_run(1, 0, 0, 10, 5)  # 5 ranks of 1 cpu fit on no host
    assert not r.can_ever_run(1, 0, 1, 2)  # no GPUs anywhere


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(0, 3),
                          st.booleans()), min_size=1, max_size=30))
def test_grants_never_oversubscribe_and_release_restores(
        ops: list[tuple[int, int, int, bool]]) -> None:
    r = Resources()
    for i in range(4):
        r.add_worker(i + 1, f"h{i}", cpus=4, memory=0, slots=2, gpus=tuple("0123"[: i + 1]))
    held: dict[int, object] = {}
    for tid, (cpus, ranks, gpus, per) in enumerate(ops):
        request = (cpus, 0, gpus, ranks, ranks if per else 0)
        found = r.find_request(request)
        if found is not None:
            worker, plan = found
            assert sum(n for _h, n in plan) == ranks
            grant = r.take(tid, worker, request, plan)
            held[tid] = worker
            ids = [g for _h, _n, _c, _m, gs in grant.parts for g in gs]
            assert len(ids) == ranks * gpus
        for h in r.hosts.values():
            assert 0 <= h.free_cpus <= h.cpus
            assert len(set(h.free_gpus)) == len(h.free_gpus) and set(h.free_gpus) <= set(h.gpus)
        busy = [(h.name, g) for t in r.grants.values() for h, _n, _c, _m, ids in t.parts
                for g in ids]
        assert len(busy) == len(set(busy)), "no GPU held twice"
    for tid, worker in held.items():
        o = ops[tid]
        r.release(worker, o[0], 0, tid)  # type: ignore[arg-type]
    for h in r.hosts.values():
        assert h.free_cpus == h.cpus and h.free_gpus == list(h.gpus)
    assert r.free_slots() == 8


def test_a_gpu_tasks_cpus_go_on_its_gpus_numa_node_where_they_fit() -> None:
    # Two NUMA nodes of 4 cpus; the task's GPU is on node 1.
    h = Host("h", 8, 0, {c: c // 4 for c in range(8)})
    assert h.take_cpu_set(2, near=1) == [4, 5]
    assert h.take_cpu_set(2, near=1) == [6, 7]
    # Node 1 is full: the cpus go where the fewest nodes hold them, as without a GPU.
    assert h.take_cpu_set(2, near=1) == [0, 1]
    assert h.take_cpu_set(4, near=0) is None  # 2 left on node 0, none elsewhere


def test_placement_binds_a_gpu_task_near_its_gpus(tmp_path: Path) -> None:
    """Through the placer: --set-affinity and a GPU whose node the worker reported."""
    dag_path = tmp_path / "g.dag"
    dag_path.write_text("TASK g -c 2 --request-gpus 1 /bin/true\n")
    dag = parse_dag(str(dag_path))
    r = Resources()
    r.add_worker(1, "h", cpus=8, memory=0, slots=1, cpu_socket={c: c // 4 for c in range(8)},
                 gpus=("0", "1"), gpu_numa={"0": 1, "1": 0})
    engine = Engine(dag)
    placer = Placer(dag, engine, r, Chains(), array("i", [0]), Counts(), Observer(),
                    prefetch=False, set_affinity=True)
    batches = placer.place(None)
    (spec,) = batches[1]
    assert spec.gpus == ("0",) and spec.affinity == (4, 5)  # GPU 0 is on node 1


def test_a_queued_gpu_task_is_not_called_back_while_its_gpus_are_held(
        tmp_path: Path) -> None:
    # The master takes queued tasks back for an idle slot only if they could start there:
    # a free slot and cpus are not enough for a task whose GPUs are all held.
    dag_path = tmp_path / "g.dag"
    dag_path.write_text("TASK a --request-gpus 2 /bin/true\nTASK b --request-gpus 2 /bin/true\n"
                        "TASK c /bin/true\n")
    dag = parse_dag(str(dag_path))
    r = Resources()
    r.add_worker(1, "h", cpus=4, memory=0, slots=1, gpus=("0", "1"))
    r.add_worker(2, "h", cpus=4, memory=0, slots=1, gpus=("0", "1"))
    r.add_worker(3, "h", cpus=4, memory=0, slots=1, gpus=("0", "1"))
    placer = Placer(dag, Engine(dag), r, Chains(), array("i", [0, 0, 0]), Counts(),
                    Observer(), prefetch=True, set_affinity=False)
    batches = placer.place(None)
    specs = {s.name: s for specs in batches.values() for s in specs}
    assert specs["a"].gpus == ("0", "1") and specs["a"].after == -1
    # b waits behind a, with a's ids; c took another slot; the third is idle.
    assert specs["b"].after == specs["a"].id and specs["b"].gpus == ("0", "1")
    assert specs["c"].gpus is None and specs["c"].after == -1
    assert r.find(1, 0) is not None, "an idle slot, with cpus"
    assert not placer.fits_now(specs["b"].id)


def test_a_queued_gpu_task_given_back_holds_no_ids(tmp_path: Path) -> None:
    # b queued behind a with a's GPU ids, then given back unstarted: the placer keeps
    # nothing of it (a long run recalls many queued tasks), and b later starts on its
    # own with the ids free at that time.
    dag_path = tmp_path / "g.dag"
    dag_path.write_text("TASK a --request-gpus 2 /bin/true\nTASK b --request-gpus 2 /bin/true\n")
    dag = parse_dag(str(dag_path))
    r = Resources()
    r.add_worker(1, "h", cpus=4, memory=0, slots=1, gpus=("0", "1"))
    engine, chains = Engine(dag), Chains()
    placer = Placer(dag, engine, r, chains, array("i", [0, 0]), Counts(), Observer(),
                    prefetch=True, set_affinity=False)
    engine.take_initial()
    specs = {s.name: s for s in placer.place(None)[1]}
    b = specs["b"].id
    assert specs["b"].after == specs["a"].id and placer.queued_gpus == {b: ("0", "1")}
    back, _refused = chains.returned([b])
    placer.unqueued(back)
    engine.requeue(b)
    assert placer.queued_gpus == {}
    assert placer.promote(specs["a"].id, r.workers[1]) == -1  # a ends, nothing behind it
    (again,) = placer.place(None)[1]
    assert (again.name, again.gpus, again.after) == ("b", ("0", "1"), -1)


def test_cgroup_memory_limit_v1_hierarchical(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    own = tmp_path / "memory" / "a" / "b"
    own.mkdir(parents=True)
    (own / "memory.stat").write_text(f"cache 0\nhierarchical_memory_limit {3 << 30}\n")
    cgroup = tmp_path / "self-cgroup"
    cgroup.write_text("4:memory:/a/b\n3:cpuset:/\n0::/\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: real_open(
        cgroup if f == "/proc/self/cgroup" else f, *a, **k))
    assert hostinfo.cgroup_memory_limit(str(tmp_path)) == 3 << 30
    (own / "memory.stat").write_text("hierarchical_memory_limit 9223372036854771712\n")
    assert hostinfo.cgroup_memory_limit(str(tmp_path)) is None


def test_cgroup_memory_limit_v2_lowest_on_the_path(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "memory.max").write_text(f"{2 << 30}\n")
    (tmp_path / "a" / "b" / "memory.max").write_text("max\n")
    cgroup = tmp_path / "self-cgroup"
    cgroup.write_text("0::/a/b\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: real_open(
        cgroup if f == "/proc/self/cgroup" else f, *a, **k))
    assert hostinfo.cgroup_memory_limit(str(tmp_path)) == 2 << 30

