"""Records as pegasus-mpi-cluster writes them, pinned without the reference.

Statuses are raw wait statuses (exit code 2 is 512, SIGKILL is 9) in the task records,
jobstate.log and dagman.out; a retry is a new submission with a new sequence number; a
-F source that is not a file fails the task with status 256; --per-task-stdio numbers
files on from what is there.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import pytest
from pmctest import pmc, write_dag

from pmc.core import records as record_format

RECORD = re.compile(r"^\[cluster-task name=(\w+), .*status=(\d+), app=", re.M)


def records(text: str) -> list[tuple[str, str]]:
    return RECORD.findall(text)


def test_statuses_are_raw_wait_statuses(launch, tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag",
                    "TASK two /bin/sh -c 'exit 2'\n"
                    "TASK killed /bin/sh -c 'kill -KILL $$'\n"
                    "TASK ok /bin/true\n")
    r = launch(["--jobstate-log", "--monitord-hack", dag.name], tmp_path)
    assert r.returncode == 1, r.stderr
    # --monitord-hack implies per-task stdio: the records are in the tasks' .out files.
    got = {name: status for f in tmp_path.glob("*.out.000")
           for name, status in records(f.read_text())}
    assert got == {"two": "512", "killed": "9", "ok": "0"}
    jobstate = (tmp_path / "jobstate.log").read_text()
    assert re.search(r"^\d+\.\d{6} two JOB_FAILURE 512 - - \d+$", jobstate, re.M), jobstate
    assert re.search(r"^\d+\.\d{6} killed JOB_FAILURE 9 - - \d+$", jobstate, re.M), jobstate
    assert re.search(r"^\d+\.\d{6} ok JOB_SUCCESS 0 - - \d+$", jobstate, re.M), jobstate
    dagman = (tmp_path / "w.dag.dagman.out").read_text()
    assert re.search(r"Node two job proc \(\d+\.0\) failed with status 512\.$", dagman, re.M)
    assert re.search(r"Node killed job proc \(\d+\.0\) failed with status 9\.$", dagman, re.M)
    assert "[error] Task two failed with exitcode 512\n" in r.stderr
    assert "[error] Task killed failed with exitcode 9\n" in r.stderr


def test_a_retry_is_a_new_submission(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK A -t 2 /bin/sh -c 'exit 3'\nTASK B /bin/true\n"
                    "EDGE A B\n")
    r = pmc(["run", "--workers", "1", "--jobstate-log", "--monitord-hack", dag.name], tmp_path)
    assert r.returncode == 1, r.stderr
    lines = [line.split(maxsplit=1)[1] for line in
             (tmp_path / "jobstate.log").read_text().splitlines()]
    assert lines == [
        "INTERNAL *** PMC_STARTED ***",
        "A SUBMIT 1.0 - - 1", "A EXECUTE 1.0 - - 1",
        "A JOB_TERMINATED 1.0 - - 1", "A JOB_FAILURE 768 - - 1",
        "A SUBMIT 2.0 - - 2", "A EXECUTE 2.0 - - 2",
        "A JOB_TERMINATED 2.0 - - 2", "A JOB_FAILURE 768 - - 2",
        "INTERNAL *** PMC_FINISHED 1 ***",
    ]
    dagman = [line[18:] for line in (tmp_path / "w.dag.dagman.out").read_text().splitlines()]
    assert "Event: ULOG_SUBMIT for Condor Node A (2.0)" in dagman
    assert "Node A job proc (2.0) failed with status 768." in dagman
    # Each try has its own output files, numbered as the reference numbers them.
    assert records((tmp_path / "A.out.000").read_text()) == [("A", "768")]
    assert records((tmp_path / "A.out.001").read_text()) == [("A", "768")]


def test_a_forwarded_source_that_is_not_a_file_fails_the_task(launch, tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "y").write_text("gone afterwards\n")
    dag = write_dag(tmp_path / "w.dag",
                    "TASK A -F x=dest.txt -F y=dest.txt /bin/true\nTASK B /bin/true\n"
                    "EDGE A B\n")
    r = launch([dag.name], tmp_path)
    assert r.returncode == 1, r.stderr
    assert "[error] Task A: x is not a file\n" in r.stderr
    assert records(r.stdout) == [("A", "256")]
    assert "[error] Task A failed with exitcode 256\n" in r.stderr
    assert not (tmp_path / "dest.txt").exists(), "a failed try forwards nothing"
    # The reference removes the sources whatever happened to the try.
    assert not (tmp_path / "y").exists()
    assert (tmp_path / "w.dag.rescue").read_text().split() == []


def test_per_task_stdio_takes_the_next_free_number(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "w.dag", "TASK A /bin/sh -c 'echo run; echo err >&2'\n")
    (tmp_path / "A.out.001").write_text("kept\n")  # a gap below is not refilled later
    for _ in range(3):
        r = pmc(["run", "-s", "--per-task-stdio", dag.name], tmp_path)
        assert r.returncode == 0, r.stderr
    outs = sorted(p.name for p in tmp_path.glob("A.out.*"))
    assert outs == ["A.out.000", "A.out.001", "A.out.002", "A.out.003"]
    assert (tmp_path / "A.out.001").read_text() == "kept\n"
    for n in ("000", "002", "003"):
        text = (tmp_path / f"A.out.{n}").read_text()
        assert text.startswith("run\n[cluster-task name=A,") and text.count("\n") == 2
        assert (tmp_path / f"A.err.{n}").read_text() == "err\n"


@pytest.mark.parametrize("zone", ["UTC0", "IST-5:30", "NST+3:30", "CET-1CEST,M3.5.0,M10.5.0/3",
                                  "LMT-0:19:32"])
def test_record_start_times_are_local_isoformat_with_milliseconds(
        zone: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record's start="..." is the local time as datetime's isoformat writes it, to the
    millisecond, with the zone's offset (minutes and, where a zone has them, seconds)."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    monkeypatch.setattr(record_format, "_second", [None, "", ""])
    try:
        for t in (0.0, 1_700_000_000.1234, 1_750_000_000.9999996, 1_711_846_799.5,
                  1_729_990_800.25, 2_000_000_000.0005):
            want = datetime.fromtimestamp(t).astimezone().isoformat(timespec="milliseconds")
            assert record_format.iso_time(t) == want, (zone, t)
    finally:
        monkeypatch.undo()
        time.tzset()
