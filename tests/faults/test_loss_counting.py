"""How lost workers count against tasks, driven by simulated workers (deterministic; the
real kills are in test_rank_loss.py): a task that kills its worker the moment it starts
from the worker's queue, before the worker could tell the master, still counts the
losses, and fails; the task it was queued behind, and those queued beside it, do not."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fakes import SimWorkers, run_sim

from pmc import log
from pmc.core.protocol import TaskSpec

pytestmark = pytest.mark.faults


class KillerWorkers(SimWorkers):
    """A task named ``killer*`` kills its worker as it starts: nothing more is heard of
    that worker (the result of the task before it, still held, is lost with it)."""

    def start(self, rank: int, spec: TaskSpec) -> None:
        super().start(rank, spec)
        if spec.name.startswith("killer") and rank not in self.dead:
            self.dead.add(rank)
            self._lost.append(rank)


def test_a_task_that_kills_its_worker_from_the_queue_fails(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # 6 workers of one slot: "a0".."a5" start at once, "killer" waits behind "a0" (the
    # first to end): the master never knows it ran there.
    dag = "".join(f"TASK a{i} /bin/true\n" for i in range(6))
    dag += "TASK killer /bin/true\n"
    dag += "".join(f"TASK s{i} /bin/true\n" for i in range(30))
    sim = KillerWorkers(6, {"a0": 1, **{f"a{i}": 3 for i in range(1, 6)}})
    # pmc's logger stops propagating once a run in this process has set logging up: set
    # it up, and hear it directly.
    log.setup(log.INFO)
    logger = logging.getLogger("pmc")
    logger.addHandler(caplog.handler)
    try:
        _master, _watch, summary = run_sim(tmp_path, dag, sim)
    finally:
        logger.removeHandler(caplog.handler)
    starts = [(name, rank) for what, name, rank in sim.log if what == "start"]
    # The first loss counts as one while it was queued there, and from then on the
    # killer starts only on a free slot, where the master knows it runs: the second loss
    # (--max-worker-losses) fails it. Without counting them it would take every worker.
    assert sorted(rank for name, rank in starts if name == "killer") == sorted(sim.dead), \
        starts
    assert len(sim.dead) == 2
    killer = [spec for spec in sim.specs if spec.name == "killer"]
    assert killer[0].after >= 0, "queued the first time"
    assert [spec.after for spec in killer[1:]] == [-1], "sent to start at once the second"
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(e.startswith("Task killer failed: 2 workers were lost while it ran or was "
                            "queued on them (the last, worker ") and
               e.endswith("); --max-worker-losses is 2") for e in errors), errors
    # Every other task succeeded, among them those the master thought running on the
    # killed workers (their results died with them) and those queued behind the killer.
    assert summary.failed == 1 and summary.succeeded == 36, summary
