"""Prometheus metrics: scraped over real HTTP during real runs (embedded and under mpiexec),
the node_exporter textfile, a Pushgateway-compatible receiver, and the Grafana dashboard's
queries checked against the metric names the code exports."""

from __future__ import annotations

import http.server
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pmctest import REPO, clean_env, dashboard_queries, mpiexec, pmc, write_dag
from prometheus_client.parser import text_string_to_metric_families

from pmc.core.events import RunInfo, Summary
from pmc.outputs.metrics import IDENTITY, make_registry, metric_names
from pmc.outputs.tally import Tally

N_TASKS = 16
SECRET = "s3cr3t-argument"

# --- helpers ----------------------------------------------------------------------------


def parse(text: str, **ident: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Exposition text -> {(sample name, sorted labels but the run's identity): value}.

    Every sample must carry the identity labels (dag, site, batch_job, chain), all with
    the same values (``ident`` gives some of them; the rest are those of a run of
    sleepy.dag outside a batch job)."""
    expected = {"dag": "sleepy.dag", "site": "", "batch_job": "", "chain": ""} | ident
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = dict(s.labels)
            got = {k: labels.pop(k, None) for k in IDENTITY}
            assert got == expected, (s.name, got)
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def sleep_dag(tmp_path: Path, n: int = N_TASKS) -> Path:
    # The comment-like argument must never reach the metrics (no command lines exported).
    return write_dag(tmp_path / "sleepy.dag", "".join(
        f"TASK t{i} /bin/sh -c 'sleep 0.2' {SECRET}\n" for i in range(n)))


class Receiver:
    """A Pushgateway stand-in on 127.0.0.1: records the method, path and body of pushes."""

    def __init__(self) -> None:
        self.pushes: list[tuple[str, str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _record(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length).decode()
                outer.pushes.append((self.command, self.path, body))
                self.send_response(200)
                self.end_headers()

            do_PUT = do_POST = _record

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def scrape_run(cmd: list[str], cwd: Path, n: int) -> tuple[int, list[dict], str]:  # type: ignore[type-arg]
    """Start a run, find its metrics URL in the log, scrape it until the final numbers are
    in; return the exit code, every scrape, and the run's stderr."""
    env = clean_env(PMC_METRICS_LINGER="120")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    url_box: list[str] = []
    err_lines: list[str] = []
    found = threading.Event()

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line)
            m = re.search(r"Metrics: serving (http://[^\s\"]+)", line)
            if m and not url_box:
                url_box.append(m.group(1))
                found.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    out_reader = threading.Thread(target=lambda: proc.stdout and proc.stdout.read(),
                                  daemon=True)
    out_reader.start()
    scrapes: list[dict] = []  # type: ignore[type-arg]
    try:
        assert found.wait(120), "no metrics URL logged:\n" + "".join(err_lines)
        url = url_box[0]
        assert url.startswith("http://127.0.0.1:")
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    body = resp.read().decode()
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
                continue
            assert SECRET not in body and "/bin/sh" not in body
            samples = parse(body)
            scrapes.append(samples)
            if value(samples, "pmc_workflow_running") == 0 and \
                    ("pmc_workflow_exit_code", ()) in samples:
                break  # the final numbers: the master now stops lingering
            time.sleep(0.05)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    return code, scrapes, "".join(err_lines)


def check_scrapes(scrapes: list[dict], n: int) -> None:  # type: ignore[type-arg]
    assert scrapes, "never scraped"
    mid = [s for s in scrapes if value(s, "pmc_workflow_running") == 1]
    assert mid, "no scrape while the workflow ran"
    # Counters never go down between scrapes.
    prev = 0.0
    for s in scrapes:
        cur = value(s, "pmc_tasks_total", outcome="succeeded")
        assert cur >= prev
        prev = cur
    assert any(value(s, "pmc_tasks_running") > 0 for s in mid)
    # A task queued on a worker behind a running one is queued, not running: running
    # never exceeds the slots, in any scrape.
    for s in scrapes:
        assert value(s, "pmc_tasks_running") <= value(s, "pmc_slots"), s
        assert value(s, "pmc_slots_busy") <= value(s, "pmc_slots"), s
    final = scrapes[-1]
    assert value(final, "pmc_workflow_running") == 0
    assert value(final, "pmc_workflow_exit_code") == 0
    assert value(final, "pmc_tasks_total", outcome="succeeded") == n
    assert value(final, "pmc_tasks_total", outcome="failed") == 0
    assert value(final, "pmc_task_tries_total", outcome="succeeded") == n
    assert value(final, "pmc_task_tries_total", outcome="retry") == 0
    assert value(final, "pmc_tasks_dispatched_total") == n
    assert value(final, "pmc_workflow_tasks") == n
    assert value(final, "pmc_tasks_running") == 0
    assert value(final, "pmc_tasks_queued") == 0
    assert value(final, "pmc_tasks_ready") == 0
    assert value(final, "pmc_task_duration_seconds_count") == n
    assert value(final, "pmc_task_duration_seconds_bucket", le="+Inf") == n
    # Each task sleeps 0.2 s: the summed runtime is at least that.
    assert value(final, "pmc_task_duration_seconds_sum") >= 0.2 * n
    assert 0 < value(final, "pmc_slot_utilization_ratio") <= 1.0
    assert 0 < value(final, "pmc_cpu_utilization_ratio") <= 1.0
    hosts = {dict(k[1])["host"] for k in final if k[0] == "pmc_host_task_seconds_total"}
    assert hosts == {socket.gethostname()}


def summary_record(stdout: str) -> dict[str, str]:
    m = re.search(r"^\[cluster-summary (.*)\]$", stdout, re.M)
    assert m, stdout
    return dict(re.findall(r'(\w+)="?([^",]*)"?', m.group(1)))


# --- real runs --------------------------------------------------------------------------


def test_endpoint_textfile_and_push_during_embedded_run(tmp_path: Path,
                                                        receiver: Receiver) -> None:
    dag = sleep_dag(tmp_path)
    prom = tmp_path / "pmc.prom"
    code, scrapes, err = scrape_run(
        [sys.executable, "-m", "pmc", "run", "--workers", "2", "--metrics-port", "0",
         "--metrics-textfile", str(prom), "--metrics-pushgateway", receiver.url,
         dag.name], tmp_path, N_TASKS)
    assert code == 0, err
    check_scrapes(scrapes, N_TASKS)
    final = scrapes[-1]
    assert value(final, "pmc_workflow_info", mode="local") == 1
    assert value(final, "pmc_slots") == 2

    # The textfile has the same final numbers, and no temporary file is left behind.
    text = parse(prom.read_text())
    for key in (("pmc_tasks_total", (("outcome", "succeeded"),)),
                ("pmc_task_duration_seconds_count", ()), ("pmc_workflow_tasks", ()),
                ("pmc_task_duration_seconds_sum", ()), ("pmc_slot_utilization_ratio", ()),
                ("pmc_cpu_utilization_ratio", ())):
        assert text[key] == final[key], key
    assert sorted(p.name for p in tmp_path.glob("pmc.prom*")) == ["pmc.prom"]

    # The last push (at exit) has them too, grouped by job, workflow and instance.
    assert receiver.pushes, "nothing was pushed"
    method, path, body = receiver.pushes[-1]
    assert method == "PUT"
    parts = path.split("/")
    assert parts[:4] == ["", "metrics", "job", "pmc"]
    assert dict(zip(parts[4::2], parts[5::2], strict=True)) == {
        "workflow": "sleepy.dag", "instance": socket.gethostname()}
    pushed = parse(body)
    for key in (("pmc_tasks_total", (("outcome", "succeeded"),)),
                ("pmc_task_duration_seconds_count", ()), ("pmc_workflow_tasks", ())):
        assert pushed[key] == final[key], key
    assert SECRET not in body and SECRET not in prom.read_text()


@pytest.mark.mpi
def test_endpoint_during_mpi_run(tmp_path: Path) -> None:
    dag = sleep_dag(tmp_path)
    prom = tmp_path / "mpi.prom"
    code, scrapes, err = scrape_run(
        [mpiexec(), "-n", "3", sys.executable, "-m", "pmc", "run", "--metrics-port", "0",
         "--metrics-textfile", str(prom), dag.name], tmp_path, N_TASKS)
    assert code == 0, err
    check_scrapes(scrapes, N_TASKS)
    assert value(scrapes[-1], "pmc_workflow_info", mode="mpi") == 1
    assert value(scrapes[-1], "pmc_workers") == 2
    text = parse(prom.read_text())
    assert text[("pmc_tasks_total", (("outcome", "succeeded"),))] == N_TASKS


def test_failures_and_retries_are_counted(tmp_path: Path) -> None:
    flaky = tmp_path / "flaky.sh"
    flaky.write_text("#!/bin/sh\nif [ -e seen ]; then exit 0; fi\ntouch seen\nexit 3\n")
    flaky.chmod(0o755)
    dag = write_dag(tmp_path / "f.dag", f"TASK ok /bin/true\nTASK flaky {flaky}\n"
                    "TASK bad /bin/false\nTASK child /bin/true\nEDGE bad child\n")
    r = pmc(["run", "--workers", "1", "-t", "2", "--metrics-textfile", "f.prom", dag.name],
            tmp_path)
    assert r.returncode == 1, r.stderr
    s = parse((tmp_path / "f.prom").read_text(), dag="f.dag")
    # Tasks by their final outcome; tries by what ended each.
    assert value(s, "pmc_tasks_total", outcome="succeeded") == 2
    assert value(s, "pmc_tasks_total", outcome="failed") == 1
    assert ("pmc_tasks_total", (("outcome", "retry"),)) not in s
    assert value(s, "pmc_task_tries_total", outcome="succeeded") == 2
    assert value(s, "pmc_task_tries_total", outcome="failed") == 1
    assert value(s, "pmc_task_tries_total", outcome="retry") == 2  # flaky once, bad once
    assert value(s, "pmc_task_duration_seconds_count") == 5
    assert value(s, "pmc_workflow_exit_code") == 1
    rec = summary_record(r.stdout)
    # The record counts tries, as the reference: 5 submitted, 3 of them failed.
    assert (rec["submitted"], rec["succeeded"], rec["failed"], rec["extra"]) == (
        "5", "2", "3", "0")


def busy_port_with_a_free_next() -> socket.socket:
    """A listening socket on a port whose next port is free (as far as can be told)."""
    while True:
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                busy.close()
                continue
        busy.listen()
        return busy


def test_a_taken_port_never_stops_the_run(tmp_path: Path) -> None:
    """The port asked for is taken: the run says so, serves on a free one (the next of a
    range first), tells where in its log, its status snapshot and ``pmc status`` while
    it runs, and finishes."""
    # The task waits for the file "go", so that pmc status sees the run live.
    dag = write_dag(tmp_path / "a.dag",
                    "TASK A /bin/sh -c 'while [ ! -e go ]; do sleep 0.1; done'\n")
    with busy_port_with_a_free_next() as busy:
        port = busy.getsockname()[1]
        with subprocess.Popen([sys.executable, "-m", "pmc", "run", "--workers", "1",
                               "--metrics-port", str(port), dag.name], cwd=tmp_path,
                              env=clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as proc:
            try:
                shown = ""
                deadline = time.monotonic() + 60
                while not shown and time.monotonic() < deadline and proc.poll() is None:
                    st = pmc(["status", dag.name], tmp_path)  # exit 3: not over
                    shown = "".join(line for line in st.stdout.splitlines(keepends=True)
                                    if line.startswith("metrics:"))
                    time.sleep(0.2)
                (tmp_path / "go").touch()
                _, err = proc.communicate(timeout=60)
            finally:
                proc.kill()
        assert proc.returncode == 0, err
        m = re.search(r"\[warn\] Metrics: cannot have port (\d+) on 127.0.0.1 \(in use or not "
                      r"allowed\); serving on free port (\d+) instead\n", err)
        assert m and m.group(1) == str(port), err
        url = f"http://127.0.0.1:{m.group(2)}/metrics"
        assert f"[info] Metrics: serving {url}\n" in err
        assert shown == f"metrics: {url}\n", f"pmc status while the run ran: {st.stdout}"
        snapshot = json.loads((tmp_path / "a.dag.status.json").read_text())
        assert snapshot["metrics"] == url
        # A range whose first port is taken: the next one, without a word.
        r = pmc(["run", "--workers", "1", "-s", "--metrics-port", f"{port}-{port + 1}",
                 dag.name], tmp_path)  # the file "go" is there: the task ends at once
        assert r.returncode == 0, r.stderr
        assert f"[info] Metrics: serving http://127.0.0.1:{port + 1}/metrics\n" in r.stderr
        assert "[warn]" not in r.stderr


def test_a_task_holding_every_cpu_keeps_them_busy(tmp_path: Path) -> None:
    """A -c 2 task on a host of 2 cpus and 2 slots: the cpus were busy all along (0.95
    of the run at least: its start and end take a moment), the slots half of it, in the
    metrics and in the report; while it runs a scrape shows the utilisation so far above
    0, the memory it asked for of its host's, and its cpus busy."""
    dag = write_dag(tmp_path / "sleepy.dag", "TASK big -c 2 -m 100 /bin/sleep 6\n")
    code, scrapes, err = scrape_run(
        [sys.executable, "-m", "pmc", "run", "--workers", "2", "--host-cpus", "2",
         "--metrics-port", "0", "--log-format", "json", dag.name], tmp_path, 1)
    assert code == 0, err
    host = socket.gethostname()
    mid = [s for s in scrapes if value(s, "pmc_tasks_running") == 1]
    assert mid, "no scrape while the task ran"
    for s in mid:
        assert value(s, "pmc_cpu_utilization_ratio") > 0
        assert value(s, "pmc_host_cpus_busy", host=host) == 2
        assert value(s, "pmc_host_cpus", host=host) == 2
        assert value(s, "pmc_host_memory_requested_bytes", host=host) == 100 << 20
        assert value(s, "pmc_host_memory_bytes", host=host) > 0
    final = scrapes[-1]
    per_cpu = value(final, "pmc_cpu_utilization_ratio")
    assert per_cpu >= 0.95
    assert value(final, "pmc_slot_utilization_ratio") == pytest.approx(per_cpu / 2)
    assert value(final, "pmc_host_memory_requested_bytes", host=host) == 0
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    [end] = [e for e in events if e["event"] == "workflow.finished"]
    assert end["cpu_utilization"] == pytest.approx(per_cpu)
    [task] = [e for e in events if e["event"] == "task.finished"]
    # The peak memory histogram holds the try whose peak is known.
    known = task["max_rss_kb"] is not None
    assert value(final, "pmc_task_max_rss_bytes_count") == (1 if known else 0)
    if known:
        assert value(final, "pmc_task_max_rss_bytes_sum") == task["max_rss_kb"] * 1024
    (tmp_path / "ev.jsonl").write_text(err)
    r = pmc(["report", "ev.jsonl"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (f"RU (resource utilisation): {per_cpu:.3f} of the cpus' time "
            f"({per_cpu / 2:.3f} of the slots')") in r.stdout


def test_unreachable_pushgateway_warns_but_run_succeeds(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    dag = write_dag(tmp_path / "a.dag", "TASK A /bin/true\n")
    r = pmc(["run", "--workers", "1", "--metrics-pushgateway", f"http://127.0.0.1:{port}",
             dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"[warn] Cannot push metrics to http://127.0.0.1:{port}" in r.stderr


# --- names, configs ---------------------------------------------------------------------


def finished_registry_names() -> set[str]:
    tally = Tally("w.dag", "site")
    tally.started(RunInfo(dag_path="w.dag", tasks=1, recovered=0, workers=1, slots=1,
                          cpus=1, hosts=["h"], start=time.time(), mode="local"))
    tally.host_runtime["h"] = 1.0
    tally.host_slots["h"] = 1
    tally.finished(Summary(ok=True, outcome="succeeded", reason="", tasks=1, submitted=1,
                           succeeded=1, failed=0, extra=0, recovered=0, start=0.0, wall=1.0,
                           pid=1, app="pmc", runtime=1.0, cpu_time=0.0, slots=1, cpus=1,
                           workers=1, makespan=1.0))
    return metric_names(make_registry(tally))


def test_metric_names_follow_prometheus_conventions() -> None:
    names = finished_registry_names()
    assert names, "no metrics"
    for name in names:
        assert re.fullmatch(r"pmc_[a-z0-9_]+", name), name
    text = ""
    tally = Tally("w.dag")
    from prometheus_client import generate_latest

    text = generate_latest(make_registry(tally)).decode()
    for fam in text_string_to_metric_families(text):
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), fam.name
        if "seconds" in fam.name:
            assert fam.name.endswith("_seconds") or "_seconds_" in fam.name
    for expected in ("pmc_tasks_total", "pmc_tasks_running", "pmc_tasks_ready",
                     "pmc_task_duration_seconds_bucket", "pmc_slots", "pmc_slots_busy",
                     "pmc_cpus", "pmc_cpus_busy", "pmc_cpu_utilization_ratio",
                     "pmc_slot_utilization_ratio", "pmc_task_tries_total",
                     "pmc_host_memory_bytes", "pmc_host_memory_requested_bytes",
                     "pmc_task_max_rss_bytes_bucket",
                     "pmc_forwarded_bytes_total", "pmc_workflow_wall_seconds",
                     "pmc_workflow_info", "pmc_workers", "pmc_workers_lost_total",
                     "pmc_workers_replaced_total", "pmc_hosts_quarantined"):
        assert expected in names


_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                 "unless", "bool", "offset", "le", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions, keywords,
    label names in by/on/... clauses, label matchers, strings or durations."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in _PROMQL_WORDS:
            continue
        names.add(word)
    return names


def test_every_dashboard_query_uses_exported_metrics() -> None:
    names = finished_registry_names()
    exprs = dashboard_queries()
    assert len(exprs) >= 10
    used: set[str] = set()
    for expr in exprs:
        found = promql_metric_names(expr)
        assert found, f"no metric in {expr!r}"
        unknown = found - names
        assert not unknown, f"{expr!r} uses {sorted(unknown)}, not exported"
        used |= found
    assert {"pmc_tasks_total", "pmc_cpu_utilization_ratio", "pmc_host_memory_bytes",
            "pmc_task_duration_seconds_bucket"} <= used


def test_promql_name_extraction() -> None:
    assert promql_metric_names(
        'sum by (host) (rate(pmc_x_total{a="b c", outcome=~"x|y"}[1m])) / on(host) pmc_y'
    ) == {"pmc_x_total", "pmc_y"}
    assert promql_metric_names("histogram_quantile(0.5, sum by (le) (rate(m_bucket[5m])))") \
        == {"m_bucket"}


def test_prometheus_scrape_config() -> None:
    cfg = yaml.safe_load((REPO / "configs" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert "pmc" in jobs
    targets = jobs["pmc"]["static_configs"][0]["targets"]
    assert all(re.fullmatch(r"[\w.-]+:\d+", t) for t in targets)


def test_forwarded_bytes_are_counted(tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    dag = write_dag(tmp_path / "fw.dag",
                    f"TASK pipe -f OUT={tmp_path}/piped.txt /bin/sh -c 'printf 12345 >&$OUT'\n"
                    f"TASK file -F {src}={tmp_path}/copied.txt "
                    f"/bin/sh -c 'printf abcdefghij > {src}'\n")
    r = pmc(["run", "--workers", "1", "--metrics-textfile", "fw.prom", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "piped.txt").read_text() == "12345"
    assert (tmp_path / "copied.txt").read_text() == "abcdefghij"
    s = parse((tmp_path / "fw.prom").read_text(), dag="fw.dag")
    assert value(s, "pmc_forwarded_bytes_total") == 15


# --- identity -----------------------------------------------------------------------------


def test_batch_job_identity_on_every_series_and_one_textfile_per_job(tmp_path: Path) -> None:
    """Two jobs of one workflow on one node, both given the textfile directory: each
    writes its own file, every series says whose it is, and no two files hold a series
    with the same name and labels (node_exporter refuses those)."""
    dag = sleep_dag(tmp_path, 3)
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    for job in ("101", "102"):
        env = clean_env(PMC_JOB_ID=job, PMC_SITE_NAME="cluster-a", PMC_CHAIN_ID="100",
                        SLURM_JOB_ID="999")
        r = pmc(["run", "--workers", "2", "--metrics-textfile", f"{textdir}/", dag.name],
                tmp_path, env=env)
        assert r.returncode == 0, r.stderr
    files = sorted(p.name for p in textdir.iterdir())
    assert files == ["pmc_sleepy_101.prom", "pmc_sleepy_102.prom"]
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for name, job in zip(files, ("101", "102"), strict=True):
        text = (textdir / name).read_text()
        s = parse(text, site="cluster-a", batch_job=job, chain="100")
        # The second job finds every task in the rescue log: the next link of a chain.
        done_here = 3 if job == "101" else 0
        assert value(s, "pmc_tasks_total", outcome="succeeded") == done_here
        assert value(s, "pmc_workflow_recovered_tasks") == 3 - done_here
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                assert key not in seen, key
                seen.add(key)


def test_scheduler_job_id_and_site_option(tmp_path: Path) -> None:
    """Outside pmc's scripts the scheduler's own variable names the job; --site-name (what
    pmc's scripts pass) names the site."""
    dag = sleep_dag(tmp_path, 1)
    env = clean_env(PBS_JOBID="55.server")
    r = pmc(["run", "--workers", "1", "--site-name", "pbs-site", "--metrics-textfile", "x.prom",
             dag.name], tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    s = parse((tmp_path / "x.prom").read_text(), site="pbs-site", batch_job="55.server")
    assert value(s, "pmc_workflow_info", mode="local") == 1
