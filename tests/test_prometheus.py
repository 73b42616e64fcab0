"""The shipped Prometheus config and Grafana dashboard against a real Prometheus server
(Debian's ``prometheus`` package) scraping a live ``pmc run --metrics-port``, and — when
node_exporter is installed too — the same run's textfile by a second path: the
dashboard's queries, evaluated by Prometheus, count every task once."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pmctest import REPO, clean_env, dashboard_queries, write_dag

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
N = 12
IDENT = {"dag": "flow.dag", "site": "test-site", "batch_job": "4242", "chain": "4240"}

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="no prometheus binary (Debian: apt-get install prometheus)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body: bytes = resp.read()
        return body


def wait_for(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        try:
            get(url, timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{what} never answered at {url}")


class Prom:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = repr(at)
        body = json.loads(get(f"{self.base}/api/v1/query?{urllib.parse.urlencode(params)}"))
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def scalar(self, expr: str, at: float | None = None) -> float:
        result = self.query(expr, at)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start_run(tmp_path: Path, textdir: Path) -> tuple[subprocess.Popen[bytes], str, list[str]]:
    dag = write_dag(tmp_path / "flow.dag", "".join(
        f"TASK t{i} /bin/sleep 0.6\n" for i in range(N)))
    env = clean_env(PMC_METRICS_LINGER="120", PMC_JOB_ID=IDENT["batch_job"],
                    PMC_SITE_NAME=IDENT["site"], PMC_CHAIN_ID=IDENT["chain"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "pmc", "run", "--workers", "2", "--metrics-port", "0",
         "--metrics-textfile", f"{textdir}/", dag.name],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            lines.append(raw.decode())
            if "Metrics: serving" in lines[-1]:
                found.set()

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(60), "".join(lines)
    m = re.search(r"Metrics: serving http://(\S+)/metrics", "".join(lines))
    assert m
    return proc, m.group(1), lines


def start_prometheus(tmp_path: Path, cfg: dict[str, Any],
                     procs: list[subprocess.Popen[bytes]]) -> Prom:
    assert PROMETHEUS is not None
    cfg_path = tmp_path / "prometheus.yml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    procs.append(subprocess.Popen(
        [PROMETHEUS, f"--config.file={cfg_path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait_for(f"http://127.0.0.1:{port}/-/ready", procs[-1], "prometheus")
    return Prom(port)


def prometheus_config(target: str, node: str | None) -> dict[str, Any]:
    """The shipped config, pointed at this run (and at node_exporter as a second path)."""
    cfg = yaml.safe_load((REPO / "configs" / "prometheus.yml").read_text())
    jobs = cfg["scrape_configs"]
    assert [j["job_name"] for j in jobs] == ["pmc"], "the shipped config keeps one path"
    pmc_job = jobs[0]
    pmc_job["static_configs"] = [{"targets": [target]}]
    pmc_job.pop("file_sd_configs")
    pmc_job["scrape_interval"] = "1s"
    if node is not None:
        jobs.append({"job_name": "node", "scrape_interval": "1s",
                     "static_configs": [{"targets": [node]}]})
    cfg["global"]["scrape_interval"] = "1s"
    return cfg


def substitute(expr: str, source: str) -> str:
    # Grafana puts the selected values in; ours hold no regex characters but ".", which
    # matches itself too.
    values = {"source": source, **IDENT}
    return re.sub(r"\$(\w+)", lambda m: values[m.group(1)], expr)


def test_dashboard_queries_on_a_real_prometheus(tmp_path: Path,
                                                procs: list[subprocess.Popen[bytes]]) -> None:
    assert PROMETHEUS is not None
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    run, target, run_log = start_run(tmp_path, textdir)
    procs.append(run)
    node = None
    if NODE_EXPORTER is not None:
        node = f"127.0.0.1:{free_port()}"
        procs.append(subprocess.Popen(
            [NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
             f"--collector.textfile.directory={textdir}", f"--web.listen-address={node}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for(f"http://{node}/metrics", procs[-1], "node_exporter")
    prom = start_prometheus(tmp_path, prometheus_config(target, node), procs)

    # The run lingers until a scrape has read its final numbers; the sample of that
    # scrape is the moment the endpoint's queries are evaluated at (once the master has
    # gone, its series are stale).
    assert run.wait(timeout=180) == 0, "".join(run_log)
    [final] = prom.query('pmc_workflow_exit_code{job="pmc"}')
    at = float(final["value"][0])
    assert final["metric"] | IDENT == final["metric"], final["metric"]
    assert final["value"][1] == "0"

    if node:
        # node_exporter reads the textfile when Prometheus scrapes it: wait for the first
        # scrape after the run wrote its final file (bounded), then query as of now.
        final_text = f'pmc_workflow_exit_code{{job="node", batch_job="{IDENT["batch_job"]}"}}'
        deadline = time.monotonic() + 60
        while not prom.query(final_text) and time.monotonic() < deadline:
            time.sleep(0.5)
    sources = ["pmc"] + (["node"] if node else [])
    for source in sources:
        when = at if source == "pmc" else None
        for expr in dashboard_queries():
            prom.query(substitute(expr, source), when)  # every query is valid PromQL
        panel = {p["title"]: p["targets"][0]["expr"] for p in
                 json.loads((REPO / "configs" / "grafana-dashboard.json").read_text())
                 ["panels"]}
        assert prom.scalar(substitute(panel["Succeeded"], source), when) == N, source
        assert prom.scalar(substitute(panel["Failed"], source), when) == 0
        assert prom.scalar(substitute(panel["Progress"], source), when) == 1.0
        [wf] = prom.query(substitute(panel["Workflows"], source), when)
        assert {k: wf["metric"][k] for k in IDENT} == IDENT
        assert (wf["metric"]["job"], wf["metric"]["mode"]) == (source, "local")
    if node:
        # Both paths hold the run: a query that ignores the source counts it twice,
        # which is what the dashboard's Source variable is for.
        # (Over the last minute: the endpoint's series go stale once the run has gone.)
        both = 'sum(last_over_time(pmc_tasks_total{outcome="succeeded"}[1m]))'
        assert prom.scalar(both) == 2 * N
        errors = prom.query('node_textfile_scrape_error{job="node"}')
        assert [e["value"][1] for e in errors] == ["0"]


def targets(prom: Prom) -> list[dict[str, Any]]:
    body = json.loads(get(f"{prom.base}/api/v1/targets?state=active"))
    found: list[dict[str, Any]] = body["data"]["activeTargets"]
    return [t for t in found if t["labels"].get("job") == "pmc"]


def until(what: str, check: Any, limit: float = 60) -> Any:
    deadline = time.monotonic() + limit
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def test_file_sd_discovers_two_runs_on_one_port_and_forgets_them(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """Two runs asked for the same port, each writing its target into the directory the
    shipped config's file_sd reads: the second serves on a free port, Prometheus finds
    and scrapes both (their identity labels on the targets and the series), each run
    ends once a scrape has seen its final numbers, and Prometheus drops both targets
    when their files go. A live scrape is clean to promtool."""
    sd = tmp_path / "targets"
    sd.mkdir()
    cfg = yaml.safe_load((REPO / "configs" / "prometheus.yml").read_text())
    [job] = cfg["scrape_configs"]
    assert job["honor_labels"] is True
    job.pop("static_configs")
    job["file_sd_configs"] = [{"files": [f"{sd}/*.json"], "refresh_interval": "1s"}]
    job["scrape_interval"] = "1s"
    prom = start_prometheus(tmp_path, cfg, procs)
    port = free_port()
    runs: list[tuple[subprocess.Popen[bytes], Path]] = []
    for job_id in ("501", "502"):
        cwd = tmp_path / job_id
        cwd.mkdir()
        # Running until the test opens the gate: discovery takes what it takes.
        write_dag(cwd / "flow.dag", "TASK wait /bin/sh -c 'until [ -e ../gate ]; do sleep "
                  "0.1; done'\nTASK t1 /bin/true\nEDGE wait t1\n")
        env = clean_env(PMC_METRICS_LINGER="60", PMC_JOB_ID=job_id, PMC_SITE_NAME="sd-site")
        runs.append((subprocess.Popen(
            [sys.executable, "-m", "pmc", "run", "--workers", "1", "--metrics-port", str(port),
             "--metrics-file-sd", str(sd), "flow.dag"],
            cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), cwd))
        procs.append(runs[-1][0])
    # Both discovered and scraped while they run, each under its own identity.
    found = until("both runs scraped", lambda: (
        ts := targets(prom), len(ts) == 2 and all(t["health"] == "up" for t in ts))[-1]
        and ts)
    assert sorted(t["labels"]["batch_job"] for t in found) == ["501", "502"]
    assert {t["labels"]["site"] for t in found} == {"sd-site"}
    assert len({t["scrapeUrl"] for t in found}) == 2, "two endpoints"
    series = until("two runs' series", lambda: (
        rs := prom.query('pmc_workflow_running{job="pmc"}'), len(rs) == 2)[-1] and rs)
    assert sorted(r["metric"]["batch_job"] for r in series) == ["501", "502"]
    assert all("exported_dag" not in r["metric"] for r in series)
    # Debian's prometheus package ships promtool beside it: one without the other is a
    # broken install, not a reason to leave the check out.
    assert PROMTOOL is not None, "prometheus is installed but promtool is not"
    body = get(found[0]["scrapeUrl"])
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=body,
                           capture_output=True, check=False)
    assert (check.returncode, check.stdout + check.stderr) == (0, b""), check
    (tmp_path / "gate").touch()
    errors = []
    for proc, _cwd in runs:
        assert proc.wait(timeout=120) == 0
        assert proc.stderr is not None
        errors.append(proc.stderr.read().decode())
    assert sum("[warn] Metrics: cannot have port" in e for e in errors) == 1, errors
    # Each run lingered until a scrape saw its end.
    finals = prom.query('last_over_time(pmc_workflow_exit_code{job="pmc"}[5m])')
    assert sorted((r["metric"]["batch_job"], r["value"][1]) for r in finals) == [
        ("501", "0"), ("502", "0")]
    assert list(sd.iterdir()) == [], "target files left behind"
    until("both targets forgotten", lambda: not targets(prom))
