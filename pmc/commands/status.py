"""``pmc status workflow.dag``: how far a running or finished workflow has got.

How status learns what it shows:
- ``DAG.status.json`` — the snapshot the master keeps next to the DAG
  (``pmc.outputs.status``). It is replaced atomically at most once a second.
- The rescue log (``DAG.rescue`` or ``-r``): the durable record of which tasks are done.
  It decides the "done" count whatever the snapshot says.
- ``jobstate.log`` next to the DAG (``--jobstate-log``): read when there is no snapshot
  (e.g. a run by another PMC implementation), for running and failed tasks.

Exit codes are those of ``pmc run``: 0 finished ok, 1 finished failed, 3 incomplete
(running, stopped, or not run yet), 2 usage (no such DAG, unreadable files).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from pmc.commands.textout import write_out
from pmc.core.rescue import RescueError, read_records
from pmc.dag import DAG, DagError, parse_dag
from pmc.errors import ExitCode
from pmc.outputs.progress import clock
from pmc.outputs.status import NAMES_KEPT, snapshot_path
from pmc.runtime.journal import journal_path, replay


@dataclass
class Status:
    dag: str
    tasks: int
    done: int
    recovered: int = 0
    running: int = 0
    queued: int = 0  # on workers, not started yet (part of "remaining")
    failed: int = 0
    # not started, running, succeeded, failed, incomplete, aborted (fatal error),
    # interrupted (master gone without finishing)
    state: str = "not started"
    live: bool = False
    note: str = ""
    source: str = "rescue log"
    rate: float | None = None  # tasks per second in the current / last run
    running_tasks: list[str] = field(default_factory=list)
    failed_tasks: list[str] = field(default_factory=list)
    # pmc extensions, while live: host -> [busy, total] GPUs; multi-rank tasks' hosts
    gpus: dict[str, list[int]] = field(default_factory=dict)
    multirank_tasks: dict[str, list[str]] = field(default_factory=dict)
    metrics: str = ""  # the live run's metrics endpoint, if it serves one
    # pmc extension: each worker host (name, cpus, memory_mb, tasks, task_seconds)
    hosts: list[dict[str, Any]] = field(default_factory=list)
    # pmc extensions: tasks reused (--reuse; part of "done"), and each task array's
    # progress (name, members, done, running, failed, failed_members)
    reused: int = 0
    arrays: list[dict[str, Any]] = field(default_factory=list)

    @property
    def remaining(self) -> int:
        return max(0, self.tasks - self.done - self.running - self.failed)

    @property
    def exit_code(self) -> int:
        if not self.live and (self.state == "succeeded" or
                              (self.tasks > 0 and self.done == self.tasks)):
            return ExitCode.OK
        if not self.live and self.state in ("failed", "aborted"):
            return ExitCode.FAILED
        return ExitCode.INCOMPLETE


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_snapshot(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # unreadable or torn: fall back to the logs
    return data if isinstance(data, dict) else None


def _from_jobstate(path: str, st: Status) -> bool:
    """Running and failed tasks of the last run recorded in jobstate.log."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    start = 0
    for i, line in enumerate(lines):
        if "*** PMC_STARTED ***" in line:
            start = i
    running: dict[str, None] = {}
    failed: dict[str, None] = {}
    finished_code: int | None = None
    for line in lines[start:]:
        parts = line.split()
        if len(parts) < 3:
            continue
        if parts[1] == "INTERNAL":
            if "PMC_FINISHED" in line and len(parts) >= 5:
                try:
                    finished_code = int(parts[4])
                except ValueError:
                    finished_code = 1
            continue
        name, what = parts[1], parts[2]
        if what == "EXECUTE":
            running[name] = None
            failed.pop(name, None)
        elif what == "JOB_TERMINATED":
            running.pop(name, None)
        elif what == "JOB_FAILURE":
            failed[name] = None
        elif what == "JOB_SUCCESS":
            failed.pop(name, None)
    st.source = "jobstate.log"
    st.failed = len(failed)
    st.failed_tasks = list(failed)[:NAMES_KEPT]
    if finished_code is None:
        st.state = "running"
        st.running = len(running)
        st.running_tasks = list(running)[:NAMES_KEPT]
        st.note = "from jobstate.log; cannot tell whether the master is still alive"
    else:
        st.state = "succeeded" if finished_code == 0 and st.done == st.tasks else \
            "failed" if finished_code else "incomplete"
    return True


def workflow_status(dag_path: str, rescue_path: str | None = None) -> Status:
    """Raises DagError / RescueError for an unreadable DAG or rescue log."""
    dag = parse_dag(dag_path)
    replay(dag, journal_path(dag_path))  # tasks added to an open run (pmc run --open)
    done, reused, _warnings = read_records(rescue_path or f"{dag_path}.rescue", dag)
    st = Status(dag=dag_path, tasks=dag.ntasks, done=len(done) + len(reused),
                reused=len(reused))
    snap = _read_snapshot(snapshot_path(dag_path))
    st.arrays = _arrays(dag, done | reused, snap)
    if snap is None:
        jobstate = os.path.join(os.path.dirname(os.path.abspath(dag_path)), "jobstate.log")
        if not _from_jobstate(jobstate, st) and st.done:
            st.state = "succeeded" if st.done == st.tasks else "incomplete"
        return st
    st.source = "status snapshot"
    st.state = str(snap.get("state", "unknown"))
    st.recovered = int(snap.get("recovered", 0))
    st.failed = int(snap.get("failed", 0))
    st.reused = int(snap.get("reused", st.reused))
    st.failed_tasks = [str(n) for n in snap.get("failed_tasks", [])]
    updated = float(snap.get("updated", 0.0))
    start = float(snap.get("start", 0.0))
    pid = int(snap.get("pid", 0))
    host = str(snap.get("host", ""))
    if st.state in ("running", "starting"):
        if host == socket.gethostname() and pid and not _pid_alive(pid):
            # Killed (e.g. by the batch system): resumable from the rescue log.
            st.state = "interrupted"
            st.note = f"the master (pid {pid}) is gone without finishing"
        else:
            st.live = True
            st.running = int(snap.get("running", 0))
            st.queued = int(snap.get("queued", 0))
            st.running_tasks = [str(n) for n in snap.get("running_tasks", [])]
            st.gpus = {str(h): [int(g.get("busy", 0)), int(g.get("total", 0))]
                       for h, g in (snap.get("gpus") or {}).items()}
            st.multirank_tasks = {str(m.get("task", "")): [str(h) for h in m.get("hosts", [])]
                                  for m in snap.get("multirank_tasks") or []}
            st.metrics = str(snap.get("metrics") or "")
            age = time.time() - updated
            where = f"pid {pid} on {host}"
            st.note = f"{where}, updated {age:.1f} s ago" if age < 10 else \
                f"{where}, but no update for {age:.0f} s: the master may be gone"
    elif st.state == "incomplete" and snap.get("reason"):
        st.note = str(snap["reason"])
    st.hosts = [h for h in snap.get("hosts") or [] if isinstance(h, dict)]
    ended = int(snap.get("succeeded", 0)) + st.failed
    if updated > start and ended:
        st.rate = ended / (updated - start)
    return st


def _arrays(dag: DAG, done: set[int], snap: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each task array's progress: done from the rescue log, running and failed from the
    snapshot of a live or finished run (pmc extension)."""
    if not dag.arrays:
        return []
    ids = sorted(done)
    seen = {str(a.get("name")): a for a in (snap or {}).get("arrays") or []
            if isinstance(a, dict)}
    found = []
    for name, owner in dag.arrays.items():
        got = seen.get(name, {})
        found.append({
            "name": name, "members": owner.n,
            "done": bisect_left(ids, owner.end) - bisect_left(ids, owner.first),
            "running": int(got.get("running", 0)) if snap and snap.get("state") == "running"
            else 0,
            "failed": int(got.get("failed", 0)),
            "failed_members": [str(m) for m in got.get("failed_members", [])]})
    return found


def _bar(fraction: float, width: int) -> str:
    filled = round(fraction * width)
    return "#" * filled + "." * (width - filled)


def render(st: Status, tty: bool, width: int = 80) -> str:
    lines: list[str] = []
    head = f"{st.dag}: {st.state}"
    if st.note:
        head += f" ({st.note})"
    lines.append(head)
    eta = None
    if st.live and st.rate and st.rate > 0:
        eta = (st.remaining + st.running) / st.rate
    if tty:
        frac = st.done / st.tasks if st.tasks else 1.0
        bar_width = max(10, min(50, width - 30))
        lines.append(f"[{_bar(frac, bar_width)}] {100 * frac:5.1f}%  {st.done}/{st.tasks}")
        parts = [f"{st.done} done", f"{st.running} running",
                 *([f"{st.queued} queued"] if st.live else []),
                 f"{st.failed} failed", f"{st.remaining} remaining"]
        if st.rate is not None:
            parts.append(f"{st.rate:.2f} tasks/s")
        if eta is not None:
            parts.append(f"ETA {clock(eta)}")
        lines.append(", ".join(parts))
    else:
        lines.append(f"tasks: {st.tasks}")
        done = f"done: {st.done}"
        notes = [f"{st.recovered} from earlier runs"] if st.recovered else []
        if st.reused:
            notes.append(f"{st.reused} reused")
        if notes:
            done += f" ({', '.join(notes)})"
        lines.append(done)
        lines.append(f"running: {st.running}")
        if st.live:
            lines.append(f"queued: {st.queued}")
        lines.append(f"failed: {st.failed}")
        lines.append(f"remaining: {st.remaining}")
        if st.rate is not None:
            lines.append(f"rate: {st.rate:.3f} tasks/s")
        if eta is not None:
            lines.append(f"eta: {eta:.0f} s")
    if st.running_tasks:
        lines.append("running tasks: " + " ".join(st.running_tasks)
                     + (" ..." if st.running > len(st.running_tasks) else ""))
    for name, hosts in st.multirank_tasks.items():
        lines.append(f"multi-rank task {name} on: {' '.join(hosts)}")
    if st.gpus:
        lines.append("gpus busy/total: " + " ".join(
            f"{host} {busy}/{total}" for host, (busy, total) in sorted(st.gpus.items())))
    for h in st.hosts:
        lines.append(f"host {h.get('name')}: {h.get('cpus')} cpus, {h.get('memory_mb')} MB memory, "
                     f"ran {h.get('tasks', 0)} tasks ({float(h.get('task_seconds', 0)):.1f} s)")
    if st.metrics:
        lines.append(f"metrics: {st.metrics}")
    if st.failed_tasks:
        lines.append("failed tasks: " + " ".join(st.failed_tasks)
                     + (" ..." if st.failed > len(st.failed_tasks) else ""))
    for a in st.arrays[:NAMES_KEPT]:
        line = (f"array {a['name']}: {a['done']}/{a['members']} done, {a['running']} "
                f"running, {a['failed']} failed")
        if a["failed_members"]:
            line += ": " + " ".join(a["failed_members"]) + (
                " ..." if a["failed"] > len(a["failed_members"]) else "")
        lines.append(line)
    if len(st.arrays) > NAMES_KEPT:
        lines.append(f"... and {len(st.arrays) - NAMES_KEPT} more arrays (--json lists "
                     "every one)")
    return "\n".join(lines) + "\n"


def to_json(st: Status) -> str:
    """``pmc status --json``: one object a line, the figures of ``render`` by name."""
    fields = asdict(st)
    fields.update(remaining=st.remaining, exit_code=st.exit_code)
    return json.dumps(fields, separators=(",", ":")) + "\n"


def main(dag_path: str, rescue_path: str | None = None, out: TextIO | None = None,
         watch: float | None = None, as_json: bool = False) -> int:
    """Print the status once, or with ``watch`` every so many seconds until the run is
    no longer live (on a terminal the previous status is replaced; otherwise, and in
    JSON, each one follows the last)."""
    out = out or sys.stdout
    tty = out.isatty() and not as_json
    shown_lines = 0
    while True:
        try:
            st = workflow_status(dag_path, rescue_path)
        except (DagError, RescueError) as e:
            sys.stderr.write(f"pmc status: {e}\n")
            return ExitCode.USAGE
        except OSError as e:
            sys.stderr.write(f"pmc status: {dag_path}: {e.strerror or e}\n")
            return ExitCode.USAGE
        if as_json:
            text = to_json(st)
        else:
            width = 80
            if tty:
                try:
                    width = os.get_terminal_size(out.fileno()).columns
                except OSError:
                    pass
            text = render(st, tty, width)
        if tty and shown_lines:
            # Back up over the last status and clear from there down: redrawn in place.
            text = f"\x1b[{shown_lines}F\x1b[J{text}"
        write_out(out, text)
        shown_lines = text.count("\n")
        if watch is None or not st.live:
            return st.exit_code
        time.sleep(watch)
