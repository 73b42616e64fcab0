"""Each host's tries and seconds, as every output shows them: the master counts them once
(``runtime.summary.Counts``) and the summary, the event log, ``pmc status`` and the
metrics read that; ``pmc report`` counts them from the event log's task events by the
same rule. A multi-rank task with ranks on two hosts held both for its whole try: it
counts in full on each, its seconds once in the run's runtime.

The run is the real master over simulated workers on two hosts (``fakes.SimWorkers``:
one machine cannot have two host names), its observers those ``pmc run`` builds."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fakes import SimWorkers, run_sim
from pmctest import pmc

from pmc.core.events import Fanout
from pmc.core.protocol import TaskSpec
from pmc.logsetup import LogOutput
from pmc.options import RunOptions
from pmc.outputs.assemble import outputs
from pmc.outputs.tally import Tally


class TimedWorkers(SimWorkers):
    """SimWorkers whose tries last as many seconds as their steps."""

    def end(self, rank: int, spec: TaskSpec, status: int = 0) -> None:
        super().end(rank, spec, status)
        steps = float(self.steps.get(spec.name, 1))
        res = self.held[rank][-1]
        self.held[rank][-1] = res._replace(start=1000.0 + self.step - steps, duration=steps)


def test_a_task_on_two_hosts_counts_in_full_on_each_in_every_output(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from pmc.outputs.metrics import make_registry

    sim = TimedWorkers(2, {"wide": 3, "solo": 2}, hosts={1: "a", 2: "b"})
    dag = tmp_path / "sim.dag"
    log = tmp_path / "events.jsonl"
    opts = RunOptions(dag=str(dag), log_format="json", log_file=str(log))
    observers = outputs(opts, LogOutput("json", str(log))).observers
    _m, _w, summary = run_sim(
        tmp_path, "TASK wide --ranks 2 --ranks-per-host 1 /bin/true\n"
        "TASK solo /bin/true\nEDGE wide solo\n", sim, observers,
        log_format="json", log_file=str(log))
    fan = Fanout(observers)
    fan.finished(summary)
    fan.close()
    assert summary.ok and summary.succeeded == 2
    assert summary.runtime == 5.0, "the two-host try's 3 s counted once in the run's runtime"
    solo_host = next(sim.hosts[rank] for what, name, rank in sim.log
                     if (what, name) == ("start", "solo"))
    other = "b" if solo_host == "a" else "a"
    want_seconds = {solo_host: 5.0, other: 3.0}
    want_tries = {solo_host: 2, other: 1}

    # The summary, as the event log's workflow.finished carries it.
    events = [json.loads(line) for line in log.read_text().splitlines()]
    finished = next(e for e in events if e.get("event") == "workflow.finished")
    assert finished["per_host_runtime"] == want_seconds

    # pmc status (the snapshot the run left).
    r = pmc(["status", "--json", dag.name], tmp_path)
    hosts = {h["name"]: h for h in json.loads(r.stdout)["hosts"]}
    assert {n: h["task_seconds"] for n, h in hosts.items()} == want_seconds, r.stdout
    assert {n: h["tasks"] for n, h in hosts.items()} == want_tries
    r = pmc(["status", dag.name], tmp_path)
    assert "ran 2 tasks (5.0 s)" in r.stdout and "ran 1 tasks (3.0 s)" in r.stdout, r.stdout

    # The metrics.
    tally = next(o for o in observers if isinstance(o, Tally))
    samples: dict[str, Any] = {
        s.labels["host"]: s.value for fam in make_registry(tally).collect()
        for s in fam.samples if s.name == "pmc_host_task_seconds_total"}
    assert samples == want_seconds

    # pmc report, from the task events.
    r = pmc(["report", log.name], tmp_path)
    assert r.returncode == 0, r.stderr
    for host, tries in want_tries.items():
        assert re.search(rf"^  {host} +{tries} +{want_seconds[host]:.3f} ", r.stdout, re.M), \
            r.stdout
