"""No resource leaks under load: 100,000 short tasks (embedded, 2 workers) leave the
master's and the workers' RSS and open descriptors flat after warm-up.

Progress is read from the rescue log (fixed-size records), and /proc/PID/status VmRSS and
/proc/PID/fd are sampled at 20 % and 90 % of the tasks.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from faultkit import (
    descendants,
    fd_count,
    finish,
    is_worker,
    pmc_argv,
    start,
    status_kb,
    wait_for,
    worker_rank,
)

pytestmark = pytest.mark.faults

TASKS = int(os.environ.get("PMC_FAULTS_LEAK_TASKS", "100000"))
RECORD = len("\nDONE t000000")
RSS_GROWTH_KB = 20 * 1024
FD_GROWTH = 2


def sample(pids: dict[str, int]) -> dict[str, tuple[int, int]]:
    return {role: (status_kb(pid, "VmRSS"), fd_count(pid)) for role, pid in pids.items()}


@pytest.mark.slow
def test_rss_and_fds_stay_flat(tmp_path: Path) -> None:
    (tmp_path / "w.dag").write_text("".join(f"TASK t{i:06d} /bin/true\n" for i in range(TASKS)))
    rescue = tmp_path / "w.dag.rescue"

    def done() -> int:
        try:
            return rescue.stat().st_size // RECORD
        except FileNotFoundError:
            return 0

    proc = start(pmc_argv(["run", "w.dag", "--workers", "2", "-o", "/dev/null"]), tmp_path)
    try:
        wait_for(lambda: done() >= TASKS // 5 or proc.poll() is not None, 600, "20 % done")
        pids = {"master": proc.pid}
        for pid in descendants(proc.pid):
            if is_worker(pid, proc.pid):
                pids[f"worker{worker_rank(pid)}"] = pid
        assert len(pids) == 3, pids
        first = sample(pids)
        wait_for(lambda: done() >= TASKS * 9 // 10 or proc.poll() is not None, 600, "90 % done")
        last = sample(pids)
        code = finish(proc, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, (tmp_path / "run.stderr").read_text()[-2000:]
    assert done() == TASKS
    lines = []
    for role in pids:
        (rss0, fds0), (rss1, fds1) = first[role], last[role]
        lines.append(f"{role}: RSS {rss0} -> {rss1} kB ({rss1 - rss0:+d}), "
                     f"fds {fds0} -> {fds1} ({fds1 - fds0:+d})")
        assert rss1 - rss0 < RSS_GROWTH_KB, lines[-1]
        assert fds1 - fds0 <= FD_GROWTH, lines[-1]
    print(f"\n[leaks] {TASKS} tasks, 20 % -> 90 %: " + "; ".join(lines))
