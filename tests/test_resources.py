"""Matching tasks to worker slots by host cpus and memory; cpu sets for --set-affinity."""

from __future__ import annotations

from pmc.core.resources import Host, Resources


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
