"""Tasks that misbehave must not take the runtime down.

- one leaves a child running that holds its stdout (and one its forwarding pipe): the run
  does not wait for them, embedded or under mpiexec;
- one closes its stdin, stdout and stderr;
- one writes 1 GB to stdout: the data goes straight to a file, the master's and the
  workers' peak RSS stays small;
- one forwards more than the 1 MiB limit of file forwarding (-F): a clean task failure
  whose message says why, while every other task runs; pipe forwarding (-f) has no
  limit: 300 MB through a pipe arrive whole, and no process holds them in memory.
(A task that ignores SIGTERM is in test_signals.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from faultkit import PeakRss, finish, mpi_argv, pmc_argv, start
from pmctest import rescue_done

pytestmark = pytest.mark.faults

GB = 1_000_000_000
RSS_LIMIT_KB = 200 * 1024  # a Python interpreter with pmc loaded is ~40 MB


def lingering(marker: str) -> str:
    # Background children outlive the task and keep its stdout / forwarding pipe open.
    child = f'/bin/sh -c "sleep 60; :" {marker}-child'
    return f"""\
TASK lingers /bin/sh -c 'echo lingers; {child} &' {marker}
TASK lingerpipe -f X=fwd.txt /bin/sh -c 'echo forwarded >&$X; {child} &' {marker}
TASK closes /bin/sh -c 'exec 0<&- 1>&- 2>&-; sleep 0.2; exit 0' {marker}
""" + "".join(f"TASK ok{i} /bin/echo ok{i}\n" for i in range(6))


def test_lingering_children_and_closed_stdio_embedded(tmp_path: Path, marker: str) -> None:
    (tmp_path / "w.dag").write_text(lingering(marker) +
                                    f"TASK bigout /bin/sh -c 'head -c {GB} /dev/zero'\n")
    proc = start(pmc_argv(["run", "w.dag", "--workers", "2", "-o", "/dev/null"]), tmp_path)
    sampler = PeakRss(proc.pid)
    # The children sleep 60 s: finishing well before that shows nobody waited for them.
    code = finish(proc, 45, "a run whose tasks left children behind")
    peaks = sampler.stop()
    err = (tmp_path / "run.stderr").read_text()
    assert code == 0, err
    assert len(rescue_done(tmp_path / "w.dag.rescue")) == 10
    assert (tmp_path / "fwd.txt").read_text() == "forwarded\n"
    assert {"master", "worker 1", "worker 2"} <= set(peaks), peaks
    for role, kb in peaks.items():
        assert kb < RSS_LIMIT_KB, f"{role}: peak RSS {kb} kB after 1 GB of task stdout"
    print(f"\n[misbehaving] 1 GB of stdout: peak RSS (kB) {peaks}")


def test_lingering_children_and_closed_stdio_mpi(tmp_path: Path, marker: str) -> None:
    (tmp_path / "w.dag").write_text(lingering(marker))
    proc = start(mpi_argv(3, ["run", "w.dag", "-o", "out.txt"]), tmp_path)
    # mpiexec waits for every holder of the ranks' stdout: no task may hold it.
    code = finish(proc, 45, "mpiexec with tasks that left children behind")
    assert code == 0, (tmp_path / "run.stderr").read_text()
    out = (tmp_path / "out.txt").read_text()
    assert "lingers\n" in out and "ok5\n" in out
    assert (tmp_path / "fwd.txt").read_text() == "forwarded\n"


@pytest.mark.parametrize("mode", ["local", "mpi"])
def test_forwarding_over_the_limits_fails_cleanly(mode: str, tmp_path: Path) -> None:
    (tmp_path / "w.dag").write_text(
        "TASK bigfile -F big.dat=ffwd.txt /bin/sh -c 'head -c 2000000 /dev/zero > big.dat'\n"
        "TASK bigpipe -f X=bigpfwd.txt /bin/sh -c 'head -c 17000000 /dev/zero >&$X'\n"
        "TASK smallfile -F s.dat=ffwd.txt /bin/sh -c 'echo small > s.dat'\n"
        "TASK smallpipe -f X=pfwd.txt /bin/sh -c 'echo small >&$X'\n"
        + "".join(f"TASK ok{i} /bin/echo ok{i}\n" for i in range(4)))
    args = ["run", "w.dag"]
    argv = pmc_argv([*args, "--workers", "2"]) if mode == "local" else mpi_argv(3, args)
    code = finish(start(argv, tmp_path), 60)
    err = (tmp_path / "run.stderr").read_text()
    assert code == 1, err
    assert "[error] Task bigfile: File big.dat is too large" in err
    assert "bigpipe" not in err, "pipe forwarding has no limit"
    assert "[error] Workflow failed\n" in err
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == [
        "bigpipe", "ok0", "ok1", "ok2", "ok3", "smallfile", "smallpipe"]
    assert (tmp_path / "bigpfwd.txt").read_bytes() == bytes(17_000_000)
    # Nothing of the failed tasks' data was forwarded; the small ones arrived whole.
    assert (tmp_path / "ffwd.txt").read_text() == "small\n"
    assert (tmp_path / "pfwd.txt").read_text() == "small\n"


@pytest.mark.parametrize("mode", ["local", "mpi"])
def test_pipe_forwarding_has_no_limit_and_holds_little_memory(mode: str, tmp_path: Path) -> None:
    size = 300_000_000
    (tmp_path / "w.dag").write_text(
        f"TASK big -f X=big.txt -f Y=small.txt /bin/sh -c "
        f"'echo before >&$Y; head -c {size} /dev/zero >&$X; echo after >&$Y'\n"
        "TASK ok /bin/echo ok\n")
    args = ["run", "w.dag"]
    argv = pmc_argv([*args, "--workers", "2"]) if mode == "local" else mpi_argv(3, args)
    proc = start(argv, tmp_path)
    sampler = PeakRss(proc.pid) if mode == "local" else None
    code = finish(proc, 120, "a run forwarding 300 MB through a pipe")
    err = (tmp_path / "run.stderr").read_text()
    assert code == 0, err
    assert sorted(rescue_done(tmp_path / "w.dag.rescue")) == ["big", "ok"]
    with open(tmp_path / "big.txt", "rb") as f:
        data = f.read()
    assert len(data) == size and data.count(0) == size
    assert (tmp_path / "small.txt").read_text() == "before\nafter\n"
    if sampler is not None:
        peaks = sampler.stop()
        assert {"master", "worker 1", "worker 2"} <= set(peaks), peaks
        for role, kb in peaks.items():
            assert kb < RSS_LIMIT_KB, f"{role}: peak RSS {kb} kB forwarding 300 MB"
        print(f"\n[misbehaving] 300 MB through a pipe: peak RSS (kB) {peaks}")
