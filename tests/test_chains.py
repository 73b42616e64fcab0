"""The chains of prefetched tasks alone: what each slot holds, without messages."""

from __future__ import annotations

from pmc.core.chains import COVER, FIRST_DEPTH, PREFETCH_DEPTH, Chains, depth_for
from pmc.core.resources import Resources, Worker


def workers(n: int) -> list[Worker]:
    res = Resources()
    return [res.add_worker(rank, "h", 8, 0, 1) for rank in range(1, n + 1)]


def test_a_started_task_is_a_chain_of_its_own() -> None:
    (w,) = workers(1)
    c = Chains()
    c.start(1, w, None)
    assert c.running == {1: (w, None)} and c.unstarted == {1}
    assert c.open_tails() == [(1, 0)]
    assert c.started(1) is w and not c.unstarted
    assert c.holder(1) == (w, None)
    assert c.busy_workers() == {w}


def test_queued_tasks_follow_the_chain_up_to_its_depth() -> None:
    (w,) = workers(1)
    c = Chains()
    c.limit = PREFETCH_DEPTH
    c.start(1, w, (0, 1))
    tail = 1
    for task in range(2, 2 + PREFETCH_DEPTH):
        assert c.open_tails() == [(tail, c.depth(tail))]
        assert c.queue(task, tail) is w
        tail = task
    assert c.open_tails() == [], "the chain is full"
    assert c.depth(tail) == PREFETCH_DEPTH
    assert c.holder(2) == (w, None), "queued tasks are bound to no cpus"


def test_promote_moves_the_chain_up() -> None:
    (w,) = workers(1)
    c = Chains()
    c.start(1, w, None)
    c.queue(2, 1)
    c.queue(3, 2)
    assert c.end(1) == (w, None)
    assert c.promote(1) == 2
    assert set(c.running) == {2} and c.unstarted == {2} and set(c.queued) == {3}
    assert c.open_tails() == [(3, 1)], "room for one more behind 3"
    c.end(2)
    assert c.promote(2) == 3
    c.end(3)
    assert c.promote(3) == -1, "nothing behind: the slot is free"
    assert not c.running and not c.queued and c.open_tails() == []


def test_recall_asks_each_worker_once_per_task() -> None:
    w1, w2 = workers(2)
    c = Chains()
    c.start(1, w1, None)
    c.start(2, w2, None)
    c.queue(3, 1)
    c.queue(4, 2)
    assert c.recall([3, 4]) == {w1, w2}
    assert c.recall([3]) == set(), "already asked"


def test_returned_cuts_the_chain_behind_its_predecessor() -> None:
    (w,) = workers(1)
    c = Chains()
    c.start(1, w, None)
    c.queue(2, 1)
    c.queue(3, 2)
    c.recall([2, 3])
    back, refused = c.returned([2, 3])
    assert back == [2, 3] and refused == []
    assert not c.queued and c.open_tails() == [(1, 0)]
    assert c.recall([]) == set()


def test_returned_in_the_middle_keeps_the_head() -> None:
    (w,) = workers(1)
    c = Chains()
    c.start(1, w, None)
    c.queue(2, 1)
    c.queue(3, 2)
    back, _refused = c.returned([3])
    assert back == [3]
    assert c.open_tails() == [(2, 1)], "2 is the chain's last task again"


def test_a_task_refused_before_it_started_frees_its_slot() -> None:
    (w,) = workers(1)
    c = Chains()
    c.start(1, w, (2, 3))
    back, refused = c.returned([1])
    assert back == [] and refused == [(1, w, (2, 3))]
    assert not c.running and not c.unstarted and c.open_tails() == []
    # A task that started is not given back.
    c.start(4, w, None)
    c.started(4)
    assert c.returned([4]) == ([], [])
    assert 4 in c.running


def test_drop_worker_forgets_its_tasks_only() -> None:
    w1, w2 = workers(2)
    c = Chains()
    c.start(1, w1, (0,))
    c.queue(2, 1)
    c.start(3, w2, None)
    c.queue(4, 3)
    running, queued = c.drop_worker(w1.rank)
    assert running == [(1, (0,))] and queued == [2]
    assert set(c.running) == {3} and set(c.queued) == {4}
    assert c.open_tails() == [(4, 1)]
    assert c.busy_workers() == {w2}


def test_clear_gives_up_on_everything() -> None:
    w1, _w2 = workers(2)
    c = Chains()
    c.start(1, w1, None)
    c.queue(2, 1)
    assert c.clear() == [1, 2]
    assert not c.running and not c.queued and not c.unstarted and c.open_tails() == []


def test_the_next_task_waits_behind_the_shallowest_chain_that_had_room_first() -> None:
    w1, w2, w3 = workers(3)
    c = Chains()
    c.start(1, w1, None, (1, 0))
    c.start(2, w2, None, (1, 0))
    c.start(3, w3, None, (1, 0))
    assert c.open_tail(1, 0) == 1
    c.queue(4, 1, (1, 0))
    assert c.open_tail(1, 0) == 2, "every chain gets one before any gets two"
    c.queue(5, 2, (1, 0))
    c.queue(6, 3, (1, 0))
    assert c.open_tail(1, 0) == 4, "then the second places, in the same order"
    c.end(1)
    assert c.promote(1) == 4
    assert c.open_tail(1, 0) == 4, "4 runs now with nothing behind it: shallowest"


def test_with_runtimes_expected_the_next_task_waits_behind_the_chain_to_free_first() -> None:
    w1, w2, w3 = workers(3)
    c = Chains()
    c.start(1, w1, None, (1, 0), takes=30.0, now=100.0)  # expected to end at 130
    c.start(2, w2, None, (1, 0), takes=5.0, now=101.0)  # at 106
    c.start(3, w3, None, (1, 0), takes=10.0, now=102.0)  # at 112
    assert c.open_tail(1, 0) == 2, "not 1, which had room first but runs on"
    c.queue(4, 2, (1, 0), takes=20.0)  # behind 2: expected to end at 126
    assert c.open_tail(1, 0) == 3, "every chain gets one before any gets two"
    c.queue(5, 3, (1, 0), takes=1.0)  # at 113
    c.queue(6, 1, (1, 0), takes=1.0)  # at 131
    assert c.open_tail(1, 0) == 5, "then by when each chain's last task ends"
    c.end(2)
    assert c.promote(2, now=120.0) == 4, "2 ran long: 4 starts at 120, to end at 140"
    assert c.open_tail(1, 0) == 4, "4 runs now with nothing behind it: shallowest"
    c.queue(7, 4, (1, 0), takes=1.0)  # at 141
    assert c.open_tail(1, 0) == 5, "113 first, then 131, then 141"
    c.queue(8, 5, (1, 0), takes=1.0)
    assert c.open_tail(1, 0) == 6
    c.returned([8])
    assert c.open_tail(1, 0) == 5, "a chain cut by a returned task is expected as before"


def test_a_task_waits_only_behind_one_asking_for_at_least_as_much() -> None:
    w1, w2, w3 = workers(3)
    c = Chains()
    c.start(1, w1, None, (1, 100))
    c.start(2, w2, None, (4, 0))
    c.start(3, w3, None, (4, 500))
    assert c.open_tail(2, 0) == 2
    assert c.open_tail(2, 200) == 3
    assert c.open_tail(1, 100) == 1
    assert c.open_tail(8, 0) == -1, "no chain's task asks for that many cpus"


def test_nothing_waits_behind_a_task_bound_to_cpus() -> None:
    w1, w2, w3 = workers(3)
    c = Chains()
    c.start(1, w1, (0, 1), None)  # bound (--set-affinity): no kind
    assert c.open_tail(1, 0) == -1
    c.start(2, w2, None, (2, 0))
    assert c.open_tail(1, 0) == 2
    # Cpus it only knows of (PMC_AFFINITY): a task may wait behind it, and take them over.
    c.start(3, w3, (2, 3), (2, 0))
    c.queue(4, 2, (1, 0))
    assert c.open_tail(2, 0) == 3
    c.queue(5, 3, (2, 0))
    c.end(3)
    assert c.promote(3) == 5
    c.hold_cpus(5, (2, 3))
    assert c.holder(5) == (w3, (2, 3))


def test_a_chain_cut_by_returned_tasks_has_room_again() -> None:
    (w,) = workers(1)
    c = Chains()
    c.limit = PREFETCH_DEPTH
    c.start(1, w, None, (1, 0))
    last = 1 + PREFETCH_DEPTH
    for task in range(2, last + 1):
        c.queue(task, task - 1, (1, 0))
    assert c.open_tail(1, 0) == -1, "the chain is full"
    c.returned([last])
    assert c.open_tail(1, 0) == last - 1
    c.returned([2])
    assert c.open_tail(1, 0) == 1
    c.drop_worker(w.rank)
    assert c.open_tail(1, 0) == -1, "the worker and its chains are gone"


def test_the_depth_follows_the_tasks_durations() -> None:
    assert Chains().limit == FIRST_DEPTH, "before any task has ended"
    assert depth_for(0.0) == depth_for(0.0005) == PREFETCH_DEPTH, "/bin/true: the most"
    assert depth_for(COVER / 4) == 4, "as many as hold COVER seconds of work"
    assert depth_for(COVER) == depth_for(60.0) == 1, "long tasks: one queued each"


def test_a_lower_depth_stops_deeper_chains_only() -> None:
    (w,) = workers(1)
    c = Chains()
    c.limit = 3
    c.start(1, w, None, (1, 0))
    c.queue(2, 1, (1, 0))
    c.queue(3, 2, (1, 0))
    assert c.open_tail(1, 0) == 3
    c.limit = 2
    assert c.open_tail(1, 0) == -1, "2 queued already: full at the new depth"
    assert c.open_tails() == []
    c.limit = 3
    assert c.open_tail(1, 0) == 3, "room again as the depth grows back"
    c.queue(4, 3, (1, 0))
    assert c.open_tail(1, 0) == -1, "full at 3"
    c.limit = 4
    assert c.open_tail(1, 0) == 4, "a chain that filled up at a lower depth has room"


def test_a_long_run_of_full_chains_keeps_no_bookkeeping_per_task() -> None:
    """Two slots kept full, 20,000 tasks through them: what the chains hold to find
    room stays a few entries (it grew by one a task, for as long as the run lasted)."""
    c = Chains()
    c.limit = 20
    heads = []
    for n, w in enumerate(workers(2)):
        c.start(n, w, None, (1, 0))
        heads.append(n)
    task = len(heads)

    def fill() -> None:
        nonlocal task
        while (tail := c.open_tail(1, 0)) >= 0:
            c.queue(task, tail, (1, 0))
            task += 1

    fill()
    for i in range(20_000):
        c.end(heads[i % 2])
        heads[i % 2] = c.promote(heads[i % 2])
        fill()
    assert len(c.queued) == 40
    assert sum(len(h) for by_kind in c._open for h in by_kind.values()) <= 4

