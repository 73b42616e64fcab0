"""The master's one observer: every hook passed on to the observers that override it."""

from __future__ import annotations

from typing import Any

from pmc.core.events import HOOKS, Fanout, Observer


class Calls(Observer):
    def __init__(self, name: str, log: list[tuple[str, str, tuple[Any, ...]]]) -> None:
        self.name = name
        self.log = log

    def ready(self, task: Any, seq: int) -> None:
        self.log.append((self.name, "ready", (task, seq)))

    def close(self) -> None:
        self.log.append((self.name, "close", ()))


class FlushOnly(Observer):
    def __init__(self) -> None:
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def test_each_hook_reaches_the_overriding_observers_in_order() -> None:
    log: list[tuple[str, str, tuple[Any, ...]]] = []
    flush = FlushOnly()
    fan = Fanout([Calls("a", log), Observer(), flush, Calls("b", log)])
    fan.ready("t", 3)
    fan.flush()
    fan.close()
    fan.held("t", "why")  # nobody overrides it
    assert log == [("a", "ready", ("t", 3)), ("b", "ready", ("t", 3)),
                   ("a", "close", ()), ("b", "close", ())]
    assert flush.flushes == 1


def test_hooks_are_bound_once() -> None:
    flush = FlushOnly()
    fan = Fanout([Calls("a", []), flush])
    # One override: the observer's own method; none: a no-op.
    assert fan.flush == flush.flush
    assert fan.started is fan.held
    assert set(HOOKS) >= {"started", "ready", "dispatched", "task_started", "ended",
                          "result", "queue_changed", "held", "host_changed", "flush",
                          "finished", "close"}


def test_a_fanout_of_fanouts() -> None:
    log: list[tuple[str, str, tuple[Any, ...]]] = []
    fan = Fanout([Fanout([Calls("a", log)]), Calls("b", log)])
    fan.ready("t", 1)
    assert [who for who, _h, _a in log] == ["a", "b"]


class Counts(Observer):
    def __init__(self) -> None:
        self.ready_at_once = 0

    def ready_run(self, tasks: Any, seq: int, count: int) -> None:
        self.ready_at_once += count


def test_members_ready_together_reach_per_task_observers_one_by_one() -> None:
    """An observer overriding ``ready`` only hears each member of a ready run (numbered
    from the run's first number); one overriding ``ready_run`` hears the run at once."""
    log: list[tuple[str, str, tuple[Any, ...]]] = []
    counts = Counts()
    fan = Fanout([Calls("a", log), counts, FlushOnly()])
    fan.ready_run(["m0", "m1", "m2"], 7, 3)
    assert log == [("a", "ready", ("m0", 7)), ("a", "ready", ("m1", 8)),
                   ("a", "ready", ("m2", 9))]
    assert counts.ready_at_once == 3
    assert Fanout([FlushOnly()]).ready_run.__name__ == "_noop"
