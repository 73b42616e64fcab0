"""The rescue log: format, replay, rewrite, torn records."""

from __future__ import annotations

import time
from pathlib import Path

from pmc.core.rescue import RescueLog, read_rescue
from pmc.dag import DAG, parse_dag


def dag(tmp_path: Path) -> DAG:
    p = tmp_path / "w.dag"
    p.write_text("TASK A /bin/true\nTASK B /bin/true\nTASK C /bin/true\nTASK t1 /bin/true\n")
    return parse_dag(str(p))


def test_records_are_newline_first(tmp_path: Path) -> None:
    d = dag(tmp_path)
    path = tmp_path / "w.rescue"
    log = RescueLog(str(path), d, set())
    log.record(["A"])
    log.record(["B", "C"])
    log.close()
    assert path.read_bytes() == b"\nDONE A\nDONE B\nDONE C"


def test_new_log_starts_with_tasks_already_done(tmp_path: Path) -> None:
    d = dag(tmp_path)
    path = tmp_path / "w.rescue"
    path.write_text("\nDONE C\nDONE A")
    done, warnings = read_rescue(str(path), d)
    assert done == {d.index["A"], d.index["C"]} and warnings == []
    log = RescueLog(str(path), d, done)
    log.record(["B"])
    log.close()
    assert path.read_bytes() == b"\nDONE A\nDONE C\nDONE B"
    assert not list(tmp_path.glob("*.tmp.*"))


def test_missing_log_means_nothing_done(tmp_path: Path) -> None:
    assert read_rescue(str(tmp_path / "nope"), dag(tmp_path)) == (set(), [])


def test_torn_last_record_is_ignored_with_a_warning(tmp_path: Path) -> None:
    d = dag(tmp_path)
    path = tmp_path / "w.rescue"
    path.write_bytes(b"\nDONE A\nDONE B\nDON")
    done, warnings = read_rescue(str(path), d)
    assert done == {d.index["A"], d.index["B"]}
    assert len(warnings) == 1 and "torn last record" in warnings[0] and ":4:" in warnings[0]


def test_unknown_tasks_and_garbage_are_warnings_not_errors(tmp_path: Path) -> None:
    d = dag(tmp_path)
    path = tmp_path / "w.rescue"
    path.write_bytes(b"\nDONE ghost\nhello world\n\xff\xfe\nDONE A\nDONE B")
    done, warnings = read_rescue(str(path), d)
    assert done == {d.index["A"], d.index["B"]}
    assert any("unknown task 'ghost'" in w for w in warnings)
    assert len(warnings) == 3


def test_old_style_trailing_newline_records_are_read(tmp_path: Path) -> None:
    d = dag(tmp_path)
    path = tmp_path / "w.rescue"
    path.write_text("DONE A\nDONE t1\n")
    assert read_rescue(str(path), d)[0] == {d.index["A"], d.index["t1"]}


def test_group_commit_tickets(tmp_path: Path) -> None:
    d = dag(tmp_path)
    path = tmp_path / "w.rescue"
    log = RescueLog(str(path), d, set())
    assert log.synced() == 0
    log.write(["A"])
    first = log.request_sync()
    log.write(["B"])
    second = log.request_sync()
    assert second > first
    log.wait_synced(second)
    assert log.synced() >= second
    log.close()
    assert path.read_bytes() == b"\nDONE A\nDONE B"


def test_lazy_syncs_are_made_durable_unasked_or_when_waited_for(tmp_path: Path) -> None:
    d = dag(tmp_path)
    path = tmp_path / "w.rescue"
    log = RescueLog(str(path), d, set())
    log.write(["A"])
    first = log.request_sync(urgent=False)
    deadline = time.monotonic() + 30
    while log.synced() < first:  # nobody waits: it still happens, on the syncer's own
        assert time.monotonic() < deadline, "a lazy sync never happened"
        time.sleep(0.001)
    log.write(["B"])
    second = log.request_sync(urgent=False)
    log.wait_synced(second)  # waiting makes it urgent
    assert log.synced() >= second
    log.write(["t1"])
    third = log.request_sync(urgent=False)
    syncer = log._syncer
    assert syncer is not None
    log.close()  # the end syncs what is pending
    assert syncer.done >= third
    assert path.read_bytes() == b"\nDONE A\nDONE B\nDONE t1"


def test_names_holding_other_blanks_read_back_whole(tmp_path: Path) -> None:
    # Fields split at space, tab and CR only, as in the DAG: a vertical tab, a form feed or
    # an NBSP belongs to the name (the reference reads DONE records the same way).
    p = tmp_path / "w.dag"
    p.write_text("TASK a\x0bb /bin/true\nTASK c\x0cd /bin/true\nTASK e\u00a0f /bin/true\n")
    d = parse_dag(str(p))
    path = tmp_path / "w.rescue"
    log = RescueLog(str(path), d, set())
    log.record(["a\x0bb", "c\x0cd", "e\u00a0f"])
    log.close()
    done, warnings = read_rescue(str(path), d)
    assert done == {0, 1, 2} and warnings == []


def test_comment_lines_are_skipped_silently(tmp_path: Path) -> None:
    d = dag(tmp_path)
    path = tmp_path / "w.rescue"
    path.write_text("# written by hand\nDONE A\n")
    assert read_rescue(str(path), d) == ({d.index["A"]}, [])
