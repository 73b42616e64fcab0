"""Progress while a run runs: the live line on a real terminal (a pty, its byte stream
played back on a small screen model), progress lines when stderr is not a terminal, and
none at all from the drop-in command."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from pmctest import clean_env, pmc, write_dag

LIVE = re.compile(r"\d+/\d+ done, \d+ running, \d+ failed, [\d.]+ tasks/s, ETA [\d:-]+")
PROGRESS_LINE = re.compile(r"\[info\] Progress: " + LIVE.pattern)


def screen(data: bytes) -> list[str]:
    """What a terminal shows after ``data``: text, \\r, \\n and ESC [ K (clear to the end
    of the line) — all the live line uses."""
    rows: list[list[str]] = [[]]
    row = col = 0
    text = data.decode()
    i = 0
    while i < len(text):
        if text.startswith("\x1b[K", i):
            del rows[row][col:]
            i += 3
            continue
        c = text[i]
        if c == "\r":
            col = 0
        elif c == "\n":
            row += 1
            if row == len(rows):
                rows.append([])
        else:
            line = rows[row]
            line.extend(" " * (col - len(line)))
            if col < len(line):
                line[col] = c
            else:
                line.append(c)
            col += 1
        i += 1
    return ["".join(r) for r in rows]


def on_a_terminal(argv: list[str], cwd: Path) -> tuple[int, bytes]:
    """Run with stdout and stderr on a pty; return the exit code and every byte shown."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=clean_env(TERM="xterm", COLUMNS="120"),
                                stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the pty
                break
            if not chunk:
                break
            out += chunk
        code = proc.wait(timeout=120)
    finally:
        os.close(master)
    return code, out


def slow_dag(tmp_path: Path) -> Path:
    # A failure in the middle: its log line comes while the live line is shown.
    return write_dag(tmp_path / "p.dag", "".join(
        f"TASK t{i} /bin/sleep 0.5\n" for i in range(8))
        + "TASK bad /bin/sh -c 'sleep 0.7; exit 1'\n")


def test_live_line_on_a_terminal_ends_cleanly(tmp_path: Path) -> None:
    dag = slow_dag(tmp_path)
    code, out = on_a_terminal([sys.executable, "-m", "pmc", "run", "--workers", "2",
                               dag.name], tmp_path)
    assert code == 1, out
    text = out.decode()
    # The line was drawn while the run ran (the run takes seconds, it redraws twice one).
    frames = LIVE.findall(text)
    assert frames, text
    assert any(f.startswith(("0/9", "1/9", "2/9", "3/9", "4/9")) for f in frames), frames
    shown = [line for line in screen(out) if line]
    # At the end the screen holds the log lines, whole, in order, and no live line.
    assert not any(LIVE.search(line) for line in shown), shown
    assert shown[0].startswith("[info] Setting max cached files = ")
    assert shown[1:3] == ["[info] Master starting with 2 workers",
                          "[info] Starting workflow"]
    assert "[error] Task bad failed with exitcode 256" in shown
    logged = [line for line in shown if not line.startswith("[cluster-")]
    assert logged[-3:] == ["[info] Merging task stdio from workers...",
                          "[info] Sending workers shutdown messages...",
                          "[error] Workflow failed"]
    assert any(line.startswith("[cluster-summary ") for line in shown)
    for line in shown:
        assert re.match(r"\[(info|warn|error)\] |\[cluster-(summary|task) ", line), line


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    dag = slow_dag(tmp_path)
    r = pmc(["run", "--workers", "2", "--progress-interval", "0.4", dag.name], tmp_path)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    progress = [i for i, line in enumerate(lines) if line.startswith("[info] Progress:")]
    assert progress, r.stderr
    assert all(PROGRESS_LINE.fullmatch(lines[i]) for i in progress), r.stderr
    assert "\r" not in r.stderr and "\x1b" not in r.stderr
    # Between the start and the end of the workflow, never after it.
    assert lines.index("[info] Starting workflow") < progress[0]
    assert progress[-1] < lines.index("[info] Workflow finished")
    # The figures only grow: done never goes down between two lines.
    done = [int(lines[i].split()[2].split("/")[0]) for i in progress]
    assert done == sorted(done)


def test_progress_interval_zero_is_off(tmp_path: Path) -> None:
    dag = slow_dag(tmp_path)
    code, out = on_a_terminal([sys.executable, "-m", "pmc", "run", "--workers", "2",
                               "--progress-interval", "0", dag.name], tmp_path)
    assert code == 1
    assert not LIVE.search(out.decode()) and b"\x1b[K" not in out


def test_drop_in_command_shows_no_progress(tmp_path: Path) -> None:
    dag = slow_dag(tmp_path)
    code, out = on_a_terminal(
        [sys.executable, "-c", "import sys; from pmc.commands.cli import pegasus_main; "
         "sys.exit(pegasus_main())", dag.name], tmp_path)
    assert code == 1
    assert not LIVE.search(out.decode()) and b"\x1b[K" not in out and b"Progress" not in out


def test_help_says_it_is_a_pmc_extension(tmp_path: Path) -> None:
    r = pmc(["run", "--help"], tmp_path)
    assert "--progress-interval" in r.stdout
    assert "pmc extension" in " ".join(r.stdout.split())


def test_recovered_and_reused_tasks_count_as_done() -> None:
    from pmc.core.events import RunInfo
    from pmc.outputs.progress import text
    from pmc.outputs.tally import Tally

    tally = Tally("w.dag")
    tally.started(RunInfo(dag_path="w.dag", tasks=10, recovered=2, workers=1, slots=1,
                          cpus=1, hosts=["h"], start=0.0, mode="local", reused=5))
    assert text(tally, now=1.0) == "7/10 done, 0 running, 0 failed, 0.0 tasks/s, ETA --:--"
