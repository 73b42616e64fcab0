"""Prefetching: each busy slot also holds the next task, started the moment the running
one ends. The master's side is driven here by simulated workers that follow the worker's
rules step by step (deterministic, no processes); real runs check what users see."""

from __future__ import annotations

import json
import logging
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest
from fakes import SimWorkers, run_sim, starts
from pmctest import pmc, pmc_mpi, rescue_done, write_dag

from pmc import log
from pmc.core import protocol
from pmc.core.chains import Chains
from pmc.core.engine import Engine
from pmc.core.events import Observer
from pmc.core.protocol import TaskSpec
from pmc.core.resources import Resources
from pmc.dag import Task, parse_dag
from pmc.logsetup import LogOutput
from pmc.outputs.eventlog import EventLog
from pmc.outputs.metrics import make_registry
from pmc.outputs.tally import Tally
from pmc.runtime.placement import Placer
from pmc.runtime.summary import Counts


def tasks(n: int, prefix: str = "s") -> str:
    return "".join(f"TASK {prefix}{i} /bin/true\n" for i in range(n))


def test_each_busy_slot_holds_the_next_task(tmp_path: Path) -> None:
    sim = SimWorkers(2, {})
    _m, watch, summary = run_sim(tmp_path, tasks(40), sim)
    assert summary.ok and summary.succeeded == 40
    assert sorted(starts(sim)) == sorted(f"s{i}" for i in range(40)), "each task runs once"
    assert starts(sim) == [f"s{i}" for i in range(40)], "in DAG order"
    assert any(s.after >= 0 for s in sim.specs), "tasks were queued"
    assert watch.matches(sim)
    # Queued tasks travelled while their slot was busy: fewer TASKS messages than tasks
    # would be needed one by one, and none was recalled (nothing ever waited).
    assert not any(tag == protocol.RECALL for _r, tag in sim.sent)


def test_results_travel_together_and_chains_refill(tmp_path: Path) -> None:
    sim = SimWorkers(2, {})
    _m, watch, summary = run_sim(tmp_path, tasks(60), sim)
    assert summary.ok and summary.succeeded == 60
    assert starts(sim) == [f"s{i}" for i in range(60)]
    assert any(s.after >= 0 and s.after in {t.id for t in sim.specs if t.after >= 0}
               for s in sim.specs), "a task was queued behind a queued one"
    assert watch.matches(sim)


def test_recall_in_the_middle_of_a_chain(tmp_path: Path) -> None:
    # s0 runs 6 steps with two tasks queued behind it on worker 1, and worker 2 runs
    # out of work first: both are taken back, or the second only once the first has
    # started in s0's place; either way every task runs once and the run ends.
    sim = SimWorkers(2, {"s0": 6, "s1": 1, "s2": 4})
    _m, watch, summary = run_sim(tmp_path, tasks(8), sim)
    assert summary.ok and summary.succeeded == 8
    assert sorted(starts(sim)) == sorted(f"s{i}" for i in range(8))
    assert any(tag == protocol.RECALL for _r, tag in sim.sent)
    assert watch.matches(sim)


def test_no_prefetch_sends_tasks_to_free_slots_only(tmp_path: Path) -> None:
    sim = SimWorkers(2, {})
    _m, _w, summary = run_sim(tmp_path, tasks(10), sim, prefetch=False)
    assert summary.ok
    # SimWorkers asserts a direct task always finds a free slot; with no prefetching
    # every task is direct.
    assert len(starts(sim)) == 10


def test_tasks_queued_behind_a_long_task_are_taken_back(tmp_path: Path) -> None:
    sim = SimWorkers(2, {"long": 100})
    text = "TASK long -p 10 /bin/sleep 100\n" + tasks(20)
    _m, watch, summary = run_sim(tmp_path, text, sim)
    assert summary.ok and summary.succeeded == 21
    assert watch.matches(sim)
    ends = [name for what, name, _r in sim.log if what == "end"]
    assert ends[-1] == "long", "no short task waited for the long one to end"
    assert sorted(starts(sim)) == sorted(["long", *(f"s{i}" for i in range(20))])
    assert any(tag == protocol.RECALL for _r, tag in sim.sent)


def test_priorities_still_decide_the_order(tmp_path: Path) -> None:
    text = "".join(f"TASK t{i} -p {i} /bin/true\n" for i in range(12))
    sim = SimWorkers(1, {})
    _m, _w, summary = run_sim(tmp_path, text, sim)
    assert summary.ok
    assert starts(sim) == [f"t{i}" for i in reversed(range(12))]


def test_a_bigger_task_is_not_queued_behind_a_smaller_one(tmp_path: Path) -> None:
    text = "TASK small -c 1 -p 5 /bin/true\nTASK big -c 4 /bin/true\n" + tasks(4)
    sim = SimWorkers(1, {}, slots=1)
    _m, _w, summary = run_sim(tmp_path, text, sim)
    assert summary.ok and summary.succeeded == 6
    # "big" asks for more cpus than "small" holds: it is never queued behind it, and
    # nothing jumps the queue in its place while it waits for a free slot.
    assert all(s.after == -1 for s in sim.specs if s.name == "big")
    assert starts(sim)[:2] == ["small", "big"]


def test_lost_worker_gives_its_queued_tasks_to_the_others(tmp_path: Path) -> None:
    sim = SimWorkers(3, {"s0": 5}, lose={1: 3})
    _m, watch, summary = run_sim(tmp_path, tasks(30), sim)
    assert summary.ok and summary.succeeded == 30
    assert watch.matches(sim)
    assert sim.lost_queued, "the lost worker held a queued task"
    for name in sim.lost_queued:
        ranks = [r for what, n, r in sim.log if what == "start" and n == name]
        assert len(ranks) == 1 and ranks[0] != 1, "it ran once, elsewhere"


class FailingWorkers(SimWorkers):
    """A worker whose loop dies says why (WORKER_FAILED) before its link breaks."""

    def poll(self, timeout: float | None) -> list[tuple[int, protocol.Message]]:
        dying = [r for r, step in self.lose.items() if step == self.step + 1]
        out = super().poll(timeout)
        return out + [(r, protocol.worker_failed(
            "simhost", "Traceback (most recent call last):\n  ...\nOSError: boom\n"))
                      for r in dying]


def test_a_failed_worker_is_lost_and_its_tasks_run_elsewhere(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sim = FailingWorkers(3, {"s0": 5}, lose={1: 3})
    # pmc's logger stops propagating once a run in this process has set logging up, and
    # an earlier test may have left it quiet: set it up, and hear it directly.
    log.setup(log.INFO)
    logger = logging.getLogger("pmc")
    logger.addHandler(caplog.handler)
    try:
        master, watch, summary = run_sim(tmp_path, tasks(30), sim)
    finally:
        logger.removeHandler(caplog.handler)
    assert summary.ok and summary.succeeded == 30
    assert watch.matches(sim)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors[:2] == ["Worker 1 on simhost failed: OSError: boom",
                          "Worker 1 was lost; 1 task(s) it was running will run again "
                          "elsewhere"]
    # Its slots went with it; every cpu of the host is free again.
    host = master.resources.hosts["sim"]
    assert host.free_cpus == host.cpus and host.free_slots == 2


class Losses(Observer):
    """The lost workers, replacements and quarantined hosts observers hear of."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def worker_lost(self, rank: int, host: str, slots: int, reason: str,
                    rerun: int) -> None:
        self.events.append(("lost", rank, host, slots, reason, rerun))

    def worker_joined(self, rank: int, host: str, slots: int, replaces: int) -> None:
        self.events.append(("joined", rank, host, slots, replaces))

    def host_quarantined(self, host: str, reason: str, slots: int) -> None:
        self.events.append(("quarantined", host, reason, slots))


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sample(registry: Any, name: str) -> float:
    value = registry.get_sample_value(name, {"dag": "sim.dag", "site": "", "batch_job": "",
                                             "chain": ""})
    assert value is not None, name
    return float(value)


def test_a_lost_worker_is_an_event_a_count_and_a_metric(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("PMC_SITE_NAME", "PMC_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID", "LOADL_STEP_ID",
                "PMC_CHAIN_ID"):
        monkeypatch.delenv(var, raising=False)
    sim = SimWorkers(3, {"s0": 5}, lose={1: 3})
    seen, tally = Losses(), Tally(str(tmp_path / "sim.dag"))
    events = LogOutput("json", str(tmp_path / "ev.jsonl"))
    _m, _w, summary = run_sim(tmp_path, tasks(30), sim, [seen, tally, EventLog(events)])
    events.close()
    assert summary.ok and summary.succeeded == 30
    assert seen.events == [("lost", 1, "sim", 1, "its connection broke", 1)]
    assert (tally.workers_lost, tally.workers, tally.slots) == (1, 2, 2)
    registry = make_registry(tally)
    assert sample(registry, "pmc_workers_lost_total") == 1
    assert sample(registry, "pmc_workers_replaced_total") == 0
    assert sample(registry, "pmc_hosts_quarantined") == 0
    assert (sample(registry, "pmc_workers"), sample(registry, "pmc_slots")) == (2, 2)
    lost = [e for e in read_events(tmp_path / "ev.jsonl") if e["event"] == "worker.lost"]
    assert [(e["rank"], e["host"], e["slots"], e["reason"], e["tasks_rerun"])
            for e in lost] == [(1, "sim", 1, "its connection broke", 1)]


def test_a_host_that_loses_two_workers_is_quarantined(tmp_path: Path) -> None:
    hosts = {1: "a", 2: "a", 3: "a", 4: "b", 5: "b"}
    sim = SimWorkers(5, {"s0": 4, "s1": 8}, lose={1: 3, 2: 6}, hosts=hosts)
    seen, tally = Losses(), Tally(str(tmp_path / "sim.dag"))
    events = LogOutput("json", str(tmp_path / "ev.jsonl"))
    _m, _w, summary = run_sim(tmp_path, tasks(60), sim, [seen, tally, EventLog(events)])
    events.close()
    assert summary.ok and summary.succeeded == 60
    assert [e[:2] for e in seen.events] == [("lost", 1), ("lost", 2), ("quarantined", "a")]
    assert seen.events[2] == ("quarantined", "a", "lost 2 workers", 1)
    recalled = max(i for i, sent in enumerate(sim.sent) if sent == (3, protocol.RECALL))
    assert (3, protocol.TASKS) not in sim.sent[recalled:], "no more tasks go to host a"
    assert tally.hosts_quarantined == ["a"] and tally.slots == 2
    assert sample(make_registry(tally), "pmc_hosts_quarantined") == 1
    quarantined = [e for e in read_events(tmp_path / "ev.jsonl")
                   if e["event"] == "host.quarantined"]
    assert [(e["host"], e["reason"], e["slots"]) for e in quarantined] == [
        ("a", "lost 2 workers", 1)]


class SpawningWorkers(SimWorkers):
    """Simulated workers whose transport starts one in place of a lost one, as the
    embedded one does: the next rank."""

    def spawn(self) -> int:
        rank = self.size
        self.size += 1
        for per_rank in (self.running, self.queued, self.held):
            per_rank[rank] = {} if per_rank is not self.held else []  # type: ignore[index]
        return rank


def test_a_lost_worker_is_replaced_as_often_as_there_were_workers(tmp_path: Path) -> None:
    # Two workers, four losses: the first two are replaced (ranks 3 and 4), then no more.
    sim = SpawningWorkers(2, {}, lose={1: 3, 3: 8, 4: 14, 2: 20})
    seen, tally = Losses(), Tally(str(tmp_path / "sim.dag"))
    master, _w, summary = run_sim(tmp_path, tasks(80), sim, [seen, tally])
    assert [e[:2] for e in seen.events] == [("lost", 1), ("joined", 3), ("lost", 3),
                                            ("joined", 4), ("lost", 4), ("lost", 2)]
    assert seen.events[1] == ("joined", 3, "sim", 1, 1)
    assert master.losses.replacements_left == 0
    # The last worker lost with no replacement left: the run stops with tasks to do.
    assert not summary.ok
    ran_on = {r for what, _n, r in sim.log if what == "start"}
    assert {3, 4} <= ran_on
    assert (tally.workers_joined, tally.workers_lost) == (2, 4)


def test_a_replacement_keeps_the_slots(tmp_path: Path) -> None:
    sim = SpawningWorkers(2, {"s0": 5}, lose={1: 3})
    tally = Tally(str(tmp_path / "sim.dag"))
    master, watch, summary = run_sim(tmp_path, tasks(40), sim, [tally])
    assert summary.ok and summary.succeeded == 40
    assert watch.matches(sim)
    assert tally.slots == 2 and tally.workers == 2
    assert sorted(master.resources.workers) == [2, 3]
    assert master.resources.workers[3].host_rank == 0, "the lost worker's host rank"
    for name in sim.lost_queued:
        assert len([n for what, n, _r in sim.log if what == "start" and n == name]) == 1


class ScriptWorkers(SpawningWorkers):
    """... whose host-rank-0 worker runs the host script when START says so."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.starts: list[tuple[int, int, bool]] = []  # (rank, host rank, run the script)

    def send(self, dest: int, msg: protocol.Message) -> None:
        super().send(dest, msg)
        if isinstance(msg, protocol.Start) and dest not in self.dead:
            self.starts.append((dest, msg.host_rank, msg.run_host_script))
            if msg.run_host_script:
                self.out.append((dest, protocol.host_script(True, "")))


def test_a_replacement_runs_the_host_script_of_the_worker_it_replaces(
        tmp_path: Path) -> None:
    sim = ScriptWorkers(2, {"s0": 5}, lose={1: 3})
    master, _w, summary = run_sim(tmp_path, tasks(30), sim, host_script="/bin/true")
    assert summary.ok and summary.succeeded == 30
    assert sim.starts == [(1, 0, True), (2, 1, False), (3, 0, True)]
    assert master.resources.workers[3].host_rank == 0
    assert any(r == 3 for what, _n, r in sim.log if what == "start")


def test_a_replacement_whose_host_script_fails_gets_no_task(tmp_path: Path) -> None:
    sim = ScriptWorkers(2, {"s0": 5}, lose={1: 3})
    sim_send = sim.send

    def send(dest: int, msg: protocol.Message) -> None:
        sim_send(dest, msg)
        if dest == 3 and sim.out and isinstance(sim.out[-1][1], protocol.HostScript):
            sim.out[-1] = (3, protocol.host_script(False, "Host script failed"))

    sim.send = send  # type: ignore[method-assign]
    seen = Losses()
    master, _w, summary = run_sim(tmp_path, tasks(30), sim, [seen], host_script="/bin/true")
    assert summary.ok and summary.succeeded == 30, "worker 2 did it all"
    assert not any(r == 3 for what, _n, r in sim.log if what == "start")
    assert [e[:2] for e in seen.events] == [("lost", 1)]
    assert 3 not in master.resources.workers


def test_max_failures_turns_prefetching_off(tmp_path: Path) -> None:
    text = "TASK bad /bin/false\n" + tasks(10)
    sim = SimWorkers(1, {})
    sim_fail = sim.end

    def end(rank: int, spec: TaskSpec, status: int = 0) -> None:
        sim_fail(rank, spec, 1 if spec.name == "bad" else status)

    sim.end = end  # type: ignore[method-assign]
    _m, _w, summary = run_sim(tmp_path, text, sim, max_failures=1)
    assert summary.failed == 1
    assert starts(sim) == ["bad"], "nothing starts after the failure that reached the limit"


# -- real runs ---------------------------------------------------------------------------


def short_and_long(tmp_path: Path) -> Path:
    # The long task first (priority), so a short one is queued behind it at once.
    return write_dag(tmp_path / "mix.dag", "TASK long -p 10 /bin/sleep 8\n" + "".join(
        f"TASK s{i} {sys.executable} -c pass\n" for i in range(30)))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "mpi"])
def test_short_tasks_never_wait_for_a_long_one(mode: str, tmp_path: Path) -> None:
    dag = short_and_long(tmp_path)
    args = ["run", dag.name, "--per-task-stdio"]
    r = pmc([*args, "--workers", "2"], tmp_path) if mode == "local" else pmc_mpi(3, args, tmp_path)
    assert r.returncode == 0, r.stderr
    done = rescue_done(tmp_path / "mix.dag.rescue", in_order=True)
    assert sorted(done) == sorted(["long", *(f"s{i}" for i in range(30))])
    assert done[-1] == "long"
    # A task taken back was not a try: every task has exactly one output file, try 0.
    outs = sorted(p.name for p in tmp_path.glob("*.out.*"))
    assert outs == sorted(f"{name}.out.000" for name in done)


class HostFigures(Losses):
    """Losses, and each host's free cpus every time observers hear of the host."""

    def host_changed(self, host: Any) -> None:
        self.events.append(("host", host.name, host.free_cpus))


def test_a_lost_workers_multi_host_task_gives_every_host_back_to_observers(
        tmp_path: Path) -> None:
    # A 2-rank task, one rank on each of two hosts, launched by worker 1 (host a) which
    # dies: host b's reserved cpus are back, and observers hear so before the loss is
    # told; the task then runs on the two hosts left.
    sim = SimWorkers(3, {"wide": 6}, lose={1: 3}, hosts={1: "a", 2: "b", 3: "c"})
    seen = HostFigures()
    _m, _w, summary = run_sim(
        tmp_path, "TASK wide --ranks 2 --ranks-per-host 1 -c 8 /bin/true\n", sim, [seen])
    assert summary.ok and summary.succeeded == 1
    lost = next(i for i, e in enumerate(seen.events) if e[0] == "lost")
    b = [e[2] for e in seen.events[:lost] if e[:2] == ("host", "b")]
    assert b[-2:] == [64 - 8, 64], "host b's cpus taken by the task, then given back"


class SecondTasks(SimWorkers):
    """Tasks whose results say they took a second each; records when a task was sent to
    wait behind a queued one (two deep), and when the first results went out."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, {})
        self.deep: list[int] = []  # steps
        self.first_results = -1

    def send(self, dest: int, msg: protocol.Message) -> None:
        if isinstance(msg, protocol.Tasks):
            queued = {s.id for s in self.queued[dest].values()}
            for spec in msg.specs:
                if spec.after in queued:
                    self.deep.append(self.step)
                if spec.after >= 0:
                    queued.add(spec.id)
        super().send(dest, msg)

    def end(self, rank: int, spec: TaskSpec, status: int = 0) -> None:
        super().end(rank, spec, status)
        self.held[rank][-1] = self.held[rank][-1]._replace(duration=1.0)

    def flush(self, rank: int) -> None:
        if self.held[rank] and self.first_results < 0:
            self.first_results = self.step
        super().flush(rank)


def test_long_tasks_queue_one_behind_each_running_one(tmp_path: Path) -> None:
    sim = SecondTasks(2)
    master, _watch, summary = run_sim(tmp_path, tasks(40), sim)
    assert summary.ok and summary.succeeded == 40
    assert master.chains.limit == 1
    assert sim.deep, "two deep at first, before any task's length was known"
    assert max(sim.deep) <= sim.first_results, "one deep once results told"


def outranked_dag(tmp_path: Path) -> Path:
    # a and b first (priority 5); c, a's child, outranks the fillers (priority 1) queued
    # meanwhile. Each task writes its name to `starts` as it starts.
    def task(name: str, priority: int, seconds: float) -> str:
        return f"TASK {name} -p {priority} /bin/sh -c 'echo {name} >> starts; sleep {seconds}'\n"
    return write_dag(tmp_path / "rank.dag", task("a", 5, 0.5) + task("b", 5, 3) +
                     task("c", 9, 0) + "".join(task(f"f{i}", 1, 1) for i in range(6)) +
                     "EDGE a c\n")


def two_slots_start_order(mode: str, tmp_path: Path, dag: Path, *args: str) -> list[str]:
    """Run ``dag`` on two slots (embedded or under MPI); the names its tasks wrote to
    ``starts`` as they started, in that order."""
    argv = ["run", dag.name, *args]
    r = pmc([*argv, "--workers", "2"], tmp_path) if mode == "local" else pmc_mpi(3, argv, tmp_path)
    assert r.returncode == 0, r.stderr
    return (tmp_path / "starts").read_text().split()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "mpi"])
def test_a_task_ready_later_that_outranks_queued_ones_takes_the_first_free_slot(
        mode: str, tmp_path: Path) -> None:
    # Two slots: a and b run with fillers queued behind them. When a ends, f0 starts in
    # its place and c becomes ready, outranking the fillers still queued: they are taken
    # back, and c starts on the first slot to free up (when f0 ends), not behind a
    # filler queued there, nor behind b.
    started = two_slots_start_order(mode, tmp_path, outranked_dag(tmp_path), "--per-task-stdio")
    assert sorted(started) == sorted(["a", "b", "c", *(f"f{i}" for i in range(6))])
    assert sorted(started[:started.index("c")]) == ["a", "b", "f0"]
    outs = sorted(p.name for p in tmp_path.glob("*.out.*"))
    assert outs == sorted(f"{name}.out.000" for name in started), "taken back: no try"


def expected_task(name: str, expected: float, seconds: float) -> str:
    """A task expected to run ``expected`` seconds that runs ``seconds`` and writes its
    name to ``starts`` as it starts."""
    return (f"TASK {name} --expected-runtime {expected} "
            f"/bin/sh -c 'echo {name} >> starts; sleep {seconds}'\n")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "mpi"])
def test_with_runtimes_expected_the_next_task_waits_behind_the_slot_to_free_first(
        mode: str, tmp_path: Path) -> None:
    # Two slots, critical-path order: long and short start; next, the first in the order
    # of those left, is queued behind short (expected to end first), not behind long,
    # which had room first. It starts when short ends, before any filler; behind long it
    # would have waited while fillers took short's slot.
    dag = write_dag(tmp_path / "expected.dag", "".join(
        expected_task(name, s, s) for name, s in
        [("long", 3), ("short", 0.5), ("next", 0.4), *((f"f{i}", 0.3) for i in range(6))]))
    started = two_slots_start_order(mode, tmp_path, dag, "--schedule", "critical-path")
    assert sorted(started) == sorted(["long", "short", "next", *(f"f{i}" for i in range(6))])
    assert started.index("next") < min(started.index(f"f{i}") for i in range(6)), started


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "mpi"])
def test_by_the_longest_path_a_task_ready_later_takes_the_first_free_slot(
        mode: str, tmp_path: Path) -> None:
    # Two slots, critical-path order, paths from the runtimes given: a (then c, 5 s),
    # x, y, z. a and x start, y is queued behind a (expected to end first), z behind x.
    # When a ends, y starts in its place (it runs 3 s, not the 0.3 expected) and c
    # becomes ready, its path the longest. A chain has room, behind y, which has just
    # started, but c takes the first slot to free up, x's at 2 s, where z was queued
    # (taken back): c before z.
    dag = write_dag(tmp_path / "longer.dag", expected_task("a", 0.5, 0.5) +
                    expected_task("x", 2, 2) + expected_task("y", 0.3, 3) +
                    expected_task("z", 0.2, 0.2) + expected_task("c", 5, 0) + "EDGE a c\n")
    started = two_slots_start_order(mode, tmp_path, dag, "--schedule", "critical-path")
    assert sorted(started) == ["a", "c", "x", "y", "z"]
    assert started.index("c") < started.index("z"), started


def two_slots_with_fillers(tmp_path: Path, children: str) -> tuple[Placer, Engine, Chains,
                                                                    dict[str, int]]:
    """a and b running on two slots, two fillers (priority 1) queued behind each, as
    before any task's length is known; then tasks known to be long (one queued a slot),
    a ends, f0 starts in its place, and a's ``children`` become ready."""
    dag = parse_dag(str(write_dag(tmp_path / "q.dag", "TASK a -p 5 /bin/true\n"
                                  "TASK b -p 5 /bin/true\n" + "".join(
                                      f"TASK f{i} -p 1 /bin/true\n" for i in range(4))
                                  + children)))
    ids = {dag.task(i).name: i for i in range(len(dag))}
    r = Resources()
    for rank in (1, 2):
        r.add_worker(rank, "h", cpus=4, memory=0, slots=1)
    engine, chains = Engine(dag), Chains()
    placer = Placer(dag, engine, r, chains, array("i", [0] * len(dag)), Counts(),
                    Observer(), prefetch=True, set_affinity=False)
    engine.take_initial()
    placer.place(None)
    assert {dag.task(t).name for t in chains.queued} == {"f0", "f1", "f2", "f3"}
    chains.limit = 1
    chains.end(ids["a"])
    assert placer.promote(ids["a"], r.workers[1]) == ids["f0"]
    _outcome, newly = engine.complete(ids["a"], True)
    for task_id in newly:
        placer.readied(task_id)
    return placer, engine, chains, ids


def test_a_ready_task_outranking_queued_ones_takes_them_back_and_waits_for_a_free_slot(
        tmp_path: Path) -> None:
    placer, engine, chains, ids = two_slots_with_fillers(
        tmp_path, "TASK c -p 9 /bin/true\nEDGE a c\n")
    assert placer.place(None) == {}, "no slot free, no chain with room"
    back = placer.outranked()
    assert sorted(back) == sorted(ids[f] for f in ("f1", "f2", "f3"))
    returned, _refused = chains.returned(back)
    for task_id in returned:
        engine.requeue(task_id)
    # c is the next to start: nothing is queued while it waits for a free slot.
    assert placer.place(None) == {}
    chains.end(ids["f0"])
    assert placer.promote(ids["f0"], placer.resources.workers[1]) == -1
    batches = placer.place(None)
    first = batches[1][0]
    assert (first.id, first.after) == (ids["c"], -1)
    # Then queueing goes on as before: the next fillers, one behind c, one behind b.
    queued = {s.id: s.after for specs in batches.values() for s in specs if s.after >= 0}
    assert sorted(queued) == [ids["f1"], ids["f2"]]
    assert sorted(queued.values()) == sorted([ids["c"], ids["b"]])


def test_a_ready_task_of_the_queued_tasks_rank_takes_nothing_back(tmp_path: Path) -> None:
    # s is a's child of the fillers' priority: it came later and waits its turn.
    placer, _engine, _chains, _ids = two_slots_with_fillers(
        tmp_path, "TASK s -p 1 /bin/true\nEDGE a s\n")
    assert placer.place(None) == {}
    assert placer.outranked() == []
    assert not placer.for_free_slot


def test_every_task_made_to_run_is_let_go_by_its_end(tmp_path: Path) -> None:
    # A parsed task is made when it is taken to run (queued behind another too), an
    # array member as well, and let go after its last try: at the end the DAG holds its
    # placeholders alone, whatever took the tasks' slots and however long they ran.
    sim = SimWorkers(2, {"s3": 4, "s7": 2})
    text = tasks(12) + "TASK q -m 1 /bin/echo 'a b'\nTASK a --array 0-4 /bin/true {}\nEDGE s0 q\n"
    m, watch, summary = run_sim(tmp_path, text, sim)
    assert summary.ok and summary.succeeded == 18
    assert any(s.after >= 0 for s in sim.specs), "tasks were queued"
    assert watch.matches(sim)
    assert not any(isinstance(t, Task) for t in m.dag.tasks)
