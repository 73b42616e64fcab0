"""``pmc report EVENTLOG``: what a run did, from its JSON event log (``--log-format json``).

Figures (definitions as in the RADICAL-Pilot paper and PMC's end-of-run lines):
- TTX, time to execution: the run's wall time (the ``workflow.finished`` event's "wall";
  for a run that never finished, from its start to the last task's end).
- RU, resource utilisation: what the cpus were busy with — the summed runtime of all task
  tries, failed ones included, each times the cpus it held (-c, times its ranks),
  divided by TTX x the hosts' cpus: a task holding every core of its host counts in
  full whatever the host's slots. Beside it the slots' share, summed runtime / (TTX x
  slots): PMC's "Resource utilization (without master)" line.
- Throughput over time: task tries that ended in each time bin, per second.
- Concurrency over time: tasks running, averaged over each time bin (exact, from each
  try's start and duration), and its maximum.
- Slowest tries, the tries that did not succeed, and per-host utilisation (per cpu and
  per slot, as above; a host that shared a multi-rank try with others has no per-cpu
  figure, as the log does not say how many of its ranks ran there).
- Each task array's members (a pmc extension): done before the run, succeeded and
  failed in it, and the failed ones' names; the tasks reused (``--reuse``).

Every try is counted and drawn as what it was (``OUTCOMES``): succeeded; retried (failed,
tried again); failed (failed for good); stopped (killed by a stop of the run — wall time,
a signal, the failure limit — not the task's fault, and run again by the next run).

Plain text by default; ``--plot out.png`` also draws concurrency and throughput over time
with matplotlib (the optional ``plot`` extra).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from pmc.commands.textout import write_out
from pmc.core.protocol import describe
from pmc.errors import ExitCode

TERMINAL = ("task.finished", "task.failed")
# Outcomes of a try, in the order they are listed and stacked, with their plot colours.
OUTCOMES = ("succeeded", "retry", "failed", "stopped")
OUTCOME_WORDS = {"succeeded": "succeeded", "retry": "retried", "failed": "failed",
                 "stopped": "stopped"}
COLOURS = {"succeeded": "tab:green", "retry": "tab:orange", "failed": "tab:red",
           "stopped": "tab:grey"}


class ReportError(Exception):
    """The log cannot be reported on; the message says why and where."""


@dataclass
class Try:
    task: str
    attempt: int
    host: str
    rank: int
    start: float
    duration: float
    status: int
    outcome: str
    cpu_time: float = 0.0
    max_rss_kb: int = 0
    error: str | None = None
    stderr_tail: str | None = None
    gpus: int = 0  # per rank (pmc extension)
    ranks: int = 1  # its host is a comma list when its ranks ran on several
    cpus: int = 1  # per rank

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass
class Run:
    start: float
    dag: str = ""
    slots: int = 0
    cpus: int = 0
    tasks: int = 0
    recovered: int = 0
    tries: list[Try] = field(default_factory=list)
    host_slots: dict[str, int] = field(default_factory=dict)
    host_cpus: dict[str, int] = field(default_factory=dict)
    host_gpus: dict[str, int] = field(default_factory=dict)
    finished: dict[str, Any] | None = None
    reused: int = 0  # tasks not run: declared outputs up to date (--reuse)
    arrays: list[dict[str, Any]] = field(default_factory=list)  # workflow.started's


def read_runs(path: str) -> list[Run]:
    """The runs in an event log, in order (a resumed workflow appends a run per start)."""
    runs: list[Run] = []
    try:
        f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError as e:
        raise ReportError(f"{path}: {e.strerror or e}") from e
    with f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue  # text lines of worker ranks, blank lines
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a torn last line of a killed run
            if not isinstance(ev, dict):
                continue
            name = ev.get("event")
            if name == "workflow.started":
                runs.append(Run(start=float(ev.get("start") or ev.get("timestamp") or 0.0),
                                dag=str(ev.get("dag", "")), slots=int(ev.get("slots", 0)),
                                cpus=int(ev.get("cpus", 0)), tasks=int(ev.get("tasks", 0)),
                                recovered=int(ev.get("recovered", 0)),
                                reused=int(ev.get("reused") or 0),
                                arrays=[a for a in ev.get("arrays") or []
                                        if isinstance(a, dict) and "name" in a]))
                continue
            if not runs:
                if name in TERMINAL:
                    raise ReportError(f"{path}:{lineno}: task event before any "
                                      "workflow.started event")
                continue
            run = runs[-1]
            if name in TERMINAL:
                try:
                    run.tries.append(Try(
                        task=str(ev["task"]), attempt=int(ev.get("try", 1)),
                        host=str(ev.get("host", "")), rank=int(ev.get("rank", -1)),
                        start=float(ev["start"]), duration=float(ev["duration"]),
                        status=int(ev.get("status", 0)),
                        outcome=str(ev.get("outcome", "succeeded" if name == "task.finished"
                                           else "failed")),
                        cpu_time=float(ev.get("cpu_time") or 0.0),
                        max_rss_kb=int(ev.get("max_rss_kb") or 0), error=ev.get("error"),
                        stderr_tail=ev.get("stderr_tail"), gpus=int(ev.get("gpus") or 0),
                        ranks=int(ev.get("ranks") or 1), cpus=int(ev.get("cpus", 1))))
                except (KeyError, TypeError, ValueError) as e:
                    raise ReportError(f"{path}:{lineno}: {name} event without a usable "
                                      f"{e}") from None
            elif name == "host":
                run.host_slots[str(ev.get("host", ""))] = int(ev.get("slots", 0))
                run.host_cpus[str(ev.get("host", ""))] = int(ev.get("cpus", 0))
                if ev.get("gpus"):
                    run.host_gpus[str(ev.get("host", ""))] = int(ev["gpus"])
            elif name == "workflow.tasks_added":  # an open run's (pmc run --open)
                run.tasks = int(ev.get("tasks", run.tasks))
            elif name == "workflow.finished":
                run.finished = ev
    return runs


@dataclass
class HostFigures:
    host: str
    tries: int
    runtime: float
    slots: int
    slot_util: float  # runtime / (TTX x slots)
    cpus: int
    util: float | None  # runtime x cpus / (TTX x cpus); None: unknown (see the docstring)


@dataclass
class Figures:
    ttx: float
    runtime: float
    slots: int
    cpus: int
    ru: float  # per cpu
    slot_ru: float  # per slot: PMC's "without master" line
    tries: int
    succeeded: int
    failed_tries: int  # every try that did not succeed (see by_outcome)
    by_outcome: dict[str, int]  # outcome -> tries
    throughput: float  # ended tries per second over TTX
    max_concurrency: int
    mean_concurrency: float
    bin_width: float
    bins: list[tuple[float, int, float]]  # (bin start offset, tries ended, mean running)
    ended_by_outcome: dict[str, list[int]]  # outcome -> tries ended in each bin
    per_host: list[HostFigures]
    # Hosts with GPUs: host, GPUs, GPU-seconds of tries, their share of TTX x GPUs (None:
    # unknown, a GPU try ran there with ranks on several hosts, split not logged)
    per_host_gpus: list[tuple[str, int, float, float | None]] = field(default_factory=list)


def _nice_width(span: float, target_bins: int = 20) -> float:
    """A round bin width (1, 2, 5 x 10^k seconds) giving about ``target_bins`` bins."""
    if span <= 0:
        return 1.0
    raw = span / target_bins
    exp = math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        w = m * 10.0 ** exp
        if w >= raw:
            return w
    return 10.0 ** (exp + 1)


def compute(run: Run, bin_width: float | None = None) -> Figures:
    tries = run.tries
    if run.finished is not None and "wall" in run.finished:
        ttx = float(run.finished["wall"])
    else:
        ttx = max((t.end for t in tries), default=run.start) - run.start
    slots, cpus = run.slots, run.cpus
    if run.finished is not None:
        slots = int(run.finished.get("slots") or slots)
        cpus = int(run.finished.get("cpus") or cpus)
    runtime = sum(t.duration for t in tries)
    cpu_seconds = sum(t.duration * t.cpus * t.ranks for t in tries)
    span = max(ttx, max((t.end - run.start for t in tries), default=0.0))
    width = bin_width if bin_width and bin_width > 0 else _nice_width(span)
    bins, ended_by = _bins(run, width, span)
    # Maximum concurrency: sweep over starts (+1) and ends (-1); an end at the same
    # instant as a start frees the slot first.
    points = sorted([(t.start, 1) for t in tries] + [(t.end, -1) for t in tries],
                    key=lambda p: (p[0], p[1]))
    cur = peak = 0
    for _when, delta in points:
        cur += delta
        peak = max(peak, cur)
    per_host, per_host_gpus = _per_host(run, ttx)
    succeeded = sum(1 for t in tries if t.outcome == "succeeded")
    by_outcome = {o: 0 for o in OUTCOMES}
    for t in tries:
        by_outcome[t.outcome] = by_outcome.get(t.outcome, 0) + 1
    return Figures(
        ttx=ttx, runtime=runtime, slots=slots, cpus=cpus, ru=_share(cpu_seconds, ttx, cpus),
        slot_ru=_share(runtime, ttx, slots), tries=len(tries), succeeded=succeeded,
        failed_tries=len(tries) - succeeded, by_outcome=by_outcome, ended_by_outcome=ended_by,
        throughput=len(tries) / ttx if ttx > 0 else 0.0, max_concurrency=peak,
        mean_concurrency=runtime / ttx if ttx > 0 else 0.0, bin_width=width, bins=bins,
        per_host=per_host, per_host_gpus=per_host_gpus)


def _share(seconds: float, ttx: float, units: int) -> float:
    """``seconds`` over TTX x ``units`` (0 when either is 0)."""
    return seconds / (ttx * units) if ttx > 0 and units > 0 else 0.0


def _bins(run: Run, width: float, span: float
          ) -> tuple[list[tuple[float, int, float]], dict[str, list[int]]]:
    """Per time bin: tries ended and mean tasks running; tries ended by outcome."""
    nbins = max(1, math.ceil(span / width - 1e-9))
    ended = [0] * nbins
    ended_by: dict[str, list[int]] = {o: [0] * nbins for o in OUTCOMES}
    busy = [0.0] * nbins  # task-seconds inside each bin
    for t in run.tries:
        s = t.start - run.start
        e = t.end - run.start
        i = min(nbins - 1, max(0, int(e // width)))
        ended[i] += 1
        ended_by.setdefault(t.outcome, [0] * nbins)[i] += 1
        b = max(0, int(s // width))
        while b < nbins and b * width < e:
            lo = max(s, b * width)
            hi = min(e, (b + 1) * width)
            if hi > lo:
                busy[b] += hi - lo
            b += 1
    return [(i * width, ended[i], busy[i] / width) for i in range(nbins)], ended_by


def _per_host(run: Run, ttx: float
              ) -> tuple[list[HostFigures], list[tuple[str, int, float, float | None]]]:
    """Each host's tries, runtime and utilisation, and the GPUs' of those that have
    some. A multi-rank try counts on each of its hosts; where it ran on several, the
    cpu- and GPU-seconds of each are unknown (the log does not split its ranks)."""
    hosts: dict[str, tuple[int, float, float]] = {}  # tries, runtime, cpu-seconds
    gpu_secs: dict[str, float] = {}
    unknown: set[str] = set()  # hosts of multi-host tries: their cpu-seconds unknown
    gpus_unknown: set[str] = set()  # and GPU-seconds, for those with GPUs
    for t in run.tries:
        names = t.host.split(",")
        for host in names:
            n, secs, cpu_secs = hosts.get(host, (0, 0.0, 0.0))
            hosts[host] = (n + 1, secs + t.duration,
                           cpu_secs + t.duration * t.cpus * t.ranks)
            if len(names) > 1:
                unknown.add(host)
                if t.gpus:
                    gpus_unknown.add(host)
            elif t.gpus:
                gpu_secs[host] = gpu_secs.get(host, 0.0) + t.duration * t.gpus * t.ranks
    per_host_gpus: list[tuple[str, int, float, float | None]] = []
    for host, ngpus in sorted(run.host_gpus.items()):
        secs = gpu_secs.get(host, 0.0)
        per_host_gpus.append((host, ngpus, secs,
                              None if host in gpus_unknown else _share(secs, ttx, ngpus)))
    per_host = []
    for host in sorted(set(hosts) | set(run.host_slots)):
        n, secs, cpu_secs = hosts.get(host, (0, 0.0, 0.0))
        hslots, hcpus = run.host_slots.get(host, 0), run.host_cpus.get(host, 0)
        per_host.append(HostFigures(
            host, n, secs, hslots, _share(secs, ttx, hslots), hcpus,
            None if host in unknown else _share(cpu_secs, ttx, hcpus)))
    return per_host, per_host_gpus


def render(run: Run, fig: Figures, top: int = 10) -> str:
    out: list[str] = []
    w = out.append
    w(f"Workflow: {run.dag or '?'}")
    state = "finished" if run.finished is not None else "did not finish (no end event)"
    if run.finished is not None:
        state = f"{run.finished.get('outcome', 'finished')}"
    w(f"Outcome: {state}")
    reused = f", {run.reused} reused" if run.reused else ""
    w(f"Tasks in DAG: {run.tasks} ({run.recovered} done before this run{reused})")
    counts = ", ".join(f"{n} {OUTCOME_WORDS.get(o, o)}" for o, n in fig.by_outcome.items()
                       if n or o in ("succeeded", "failed"))
    w(f"Task tries: {fig.tries} ({counts})")
    w(f"TTX (time to execution): {fig.ttx:.3f} s")
    w(f"Summed task runtime: {fig.runtime:.3f} s")
    w(f"Slots: {fig.slots}, cpus: {fig.cpus}")
    w(f"RU (resource utilisation): {fig.ru:.3f} of the cpus' time "
      f"({fig.slot_ru:.3f} of the slots')")
    w(f"Throughput: {fig.throughput:.3f} tasks/s")
    w(f"Concurrency: max {fig.max_concurrency}, mean {fig.mean_concurrency:.3f}")
    w("")
    w(f"Over time (bins of {fig.bin_width:g} s from the start):")
    w(f"  {'from_s':>10} {'ended':>7} {'tasks/s':>9} {'running':>8}")
    for start, n, running in fig.bins:
        w(f"  {start:10.3f} {n:7d} {n / fig.bin_width:9.3f} {running:8.3f}")
    w("")
    w("Per host:")
    w(f"  {'host':<20} {'tries':>7} {'runtime_s':>10} {'slots':>6} {'slot_util':>9} "
      f"{'cpus':>5} {'util':>6}")
    for h in fig.per_host:
        util = "?" if h.util is None else f"{h.util:6.3f}"
        w(f"  {h.host:<20} {h.tries:7d} {h.runtime:10.3f} {h.slots:6d} {h.slot_util:9.3f} "
          f"{h.cpus:5d} {util:>6}")
    if fig.per_host_gpus:
        w("")
        w("GPUs per host (busy: GPU-seconds of tries / (TTX x GPUs)):")
        w(f"  {'host':<20} {'gpus':>5} {'gpu_s':>10} {'busy':>6}")
        for host, ngpus, secs, share in fig.per_host_gpus:
            busy = "?" if share is None else f"{share:6.3f}"
            w(f"  {host:<20} {ngpus:5d} {secs:10.3f} {busy:>6}")
    if run.arrays:
        _render_arrays(run, w, top)
    w("")
    slow = sorted(run.tries, key=lambda t: (-t.duration, t.start))[:top]
    w(f"Slowest tries (top {len(slow)}):")
    for t in slow:
        w(f"  {t.task} try {t.attempt}: {t.duration:.3f} s on {t.host or '?'} "
          f"(status {_status(t.status)})")
    failed = [t for t in run.tries if t.outcome != "succeeded"]
    w("")
    w(f"Tries that did not succeed: {len(failed)}")
    for t in failed:
        why = f": {t.error}" if t.error else ""
        w(f"  {t.task} try {t.attempt}: status {_status(t.status)}, "
          f"{OUTCOME_WORDS.get(t.outcome, t.outcome)}{why}")
        if t.stderr_tail:
            w(f"    stderr: {t.stderr_tail.splitlines()[-1]}")
    return "\n".join(out) + "\n"


def _render_arrays(run: Run, w: Callable[[str], None], top: int) -> None:
    """Each task array's members: done before the run, and what its tries did."""
    counts = {str(a["name"]): {"succeeded": 0, "failed": 0, "tries": 0} for a in run.arrays}
    failed: dict[str, list[str]] = {name: [] for name in counts}
    for t in run.tries:
        cut = t.task.rfind("[")
        got = counts.get(t.task[:cut]) if cut > 0 and t.task.endswith("]") else None
        if got is None:
            continue
        got["tries"] += 1
        if t.outcome in ("succeeded", "failed"):
            got[t.outcome] += 1
        if t.outcome == "failed":
            failed[t.task[:cut]].append(t.task)
    w("")
    w("Task arrays (members):")
    w(f"  {'array':<20} {'members':>8} {'before':>8} {'reused':>7} {'succeeded':>10} "
      f"{'failed':>7} {'tries':>7}")
    for a in run.arrays:
        name = str(a["name"])
        got = counts[name]
        w(f"  {name:<20} {int(a.get('members', 0)):8d} {int(a.get('recovered', 0)):8d} "
          f"{int(a.get('reused', 0)):7d} {got['succeeded']:10d} {got['failed']:7d} "
          f"{got['tries']:7d}")
        if failed[name]:
            more = " ..." if len(failed[name]) > top else ""
            w(f"    failed: {' '.join(failed[name][:top])}{more}")


def _status(status: int) -> str:
    """A try's raw wait status with what it means: ``512 (exit code 2)``."""
    return "0" if status == 0 else f"{status} ({describe(status)})"


def write_plot(run: Run, fig: Figures, path: str) -> None:
    """Concurrency (step line, exact) and throughput (bars per bin) over time."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    points = sorted([(t.start - run.start, 1) for t in run.tries]
                    + [(t.end - run.start, -1) for t in run.tries],
                    key=lambda p: (p[0], p[1]))
    xs, ys = [0.0], [0]
    cur = 0
    for when, delta in points:
        cur += delta
        xs.append(when)
        ys.append(cur)
    xs.append(max(fig.ttx, xs[-1]))
    ys.append(cur)
    figure, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    ax1.step(xs, ys, where="post", color="tab:blue")
    if fig.slots:
        ax1.axhline(fig.slots, color="grey", linestyle="--", linewidth=1, label="slots")
        ax1.legend(loc="upper right")
    ax1.set_ylabel("tasks running")
    ax1.set_title(f"{run.dag or 'workflow'}: TTX {fig.ttx:.1f} s, RU {fig.ru:.2f}")
    # Tries ended per second, stacked by outcome, each in its own colour.
    lefts = [b[0] for b in fig.bins]
    bottom = [0.0] * len(lefts)
    for outcome, counts in fig.ended_by_outcome.items():
        if not any(counts):
            continue
        heights = [n / fig.bin_width for n in counts]
        ax2.bar(lefts, heights, width=fig.bin_width, align="edge", bottom=bottom,
                color=COLOURS.get(outcome, "tab:purple"),
                label=OUTCOME_WORDS.get(outcome, outcome))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax2.legend(loc="upper right")
    ax2.set_ylabel("tries/s ended")
    ax2.set_xlabel("seconds since start")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(path: str, plot: str | None = None, bin_width: float | None = None,
         top: int = 10, run: int | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.stderr.write("pmc report: --plot needs matplotlib: "
                             "pip install 'pmc[plot]'\n")
            return ExitCode.USAGE
    try:
        runs = read_runs(path)
    except ReportError as e:
        sys.stderr.write(f"pmc report: {e}\n")
        return ExitCode.USAGE
    if not runs:
        sys.stderr.write(f"pmc report: {path}: no workflow.started event: not a pmc JSON "
                         "event log (run with --log-format json --log-file PATH)\n")
        return ExitCode.USAGE
    index = len(runs) if run is None else run
    if not 1 <= index <= len(runs):
        sys.stderr.write(f"pmc report: {path} holds {len(runs)} run(s), no run {index}\n")
        return ExitCode.USAGE
    chosen = runs[index - 1]
    fig = compute(chosen, bin_width)
    text = render(chosen, fig, top)
    if len(runs) > 1:
        text = f"Run {index} of {len(runs)} in {path}\n" + text
    if not write_out(out, text):
        return ExitCode.OK
    if plot:
        try:
            write_plot(chosen, fig, plot)
        except OSError as e:
            sys.stderr.write(f"pmc report: cannot write {plot}: {e.strerror or e}\n")
            return ExitCode.USAGE
        write_out(out, f"Plot written to {plot}\n")
    return ExitCode.OK
