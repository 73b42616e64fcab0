"""The ways pmc's metrics leave the master, and how a Prometheus finds them.

``MetricsExport`` is the observer that serves, writes and pushes the families of
``pmc.outputs.metrics`` (every name is defined there), any combination of:

- HTTP endpoint on the master (``--metrics-port``, ``--metrics-bind``). A port that
  cannot be had (taken by another run on the node, say) never stops the workflow: the
  next of a range (``--metrics-port 9466-9475``) is tried, then any free port, with a
  warning; the URL is logged at INFO and written into the status snapshot. With
  ``PMC_METRICS_LINGER=SECONDS`` the endpoint stays up after the workflow ends until one
  scrape has seen the final numbers or the time is up, so a scraper does not miss the
  end of a short job.
- Discovery (``--metrics-file-sd DIR``): a Prometheus file_sd target file for the
  endpoint (its address and port, the run's identity labels) in DIR while the run runs,
  removed at the end; a Prometheus watching ``DIR/*.json`` scrapes every running job
  wherever the batch system put it. It asks for an endpoint on a free port when
  ``--metrics-port`` is not given.
- node_exporter textfile (``--metrics-textfile``), replaced atomically (tmp + rename)
  every few seconds and once more at the end.
- Pushgateway (``--metrics-pushgateway URL``): pushed every few seconds and once more at
  the end, so a short job's numbers are not lost.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app, push_to_gateway
from prometheus_client.exposition import ThreadingWSGIServer, write_to_textfile

from pmc import log
from pmc.core.events import Observer, RunInfo, Summary
from pmc.errors import FatalError
from pmc.files import atomic_write
from pmc.options import RunOptions
from pmc.outputs.metrics import identity, make_registry
from pmc.outputs.tally import Tally

TEXTFILE_EVERY = 5.0  # seconds
PUSH_EVERY = 15.0  # seconds
PUSH_TIMEOUT = 10.0  # seconds, per push
LINGER_ENV = "PMC_METRICS_LINGER"
# Why a port cannot be had that a free one cures: taken, or privileged.
_PORT_TAKEN = (errno.EADDRINUSE, errno.EACCES)
_WILDCARDS = ("", "0.0.0.0", "::")  # noqa: S104 - what the user bound to


def _run_file_name(prefix: str, labels: Mapping[str, str], *who: str) -> str:
    """``prefix_DAG_WHO...``, in characters every file system takes."""
    stem = os.path.splitext(labels.get("dag", ""))[0] or "dag"
    name = "_".join((prefix, stem, *(w for w in who if w)))
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def textfile_path(path: str, labels: Mapping[str, str]) -> str:
    """``--metrics-textfile``: a file, or — given a directory (existing, or ending in
    "/") — a file in it named after the run, so that jobs sharing a node and its textfile
    directory never write the same file: ``pmc_DAG_JOB.prom`` in a batch job,
    ``pmc_DAG_HOST_PID.prom`` outside one."""
    if not (path.endswith("/") or os.path.isdir(path)):
        return path
    who = labels.get("batch_job") or f"{socket.gethostname()}_{os.getpid()}"
    # node_exporter reads *.prom.
    return os.path.join(path, _run_file_name("pmc", labels, who) + ".prom")


def file_sd_path(directory: str, labels: Mapping[str, str]) -> str:
    """``--metrics-file-sd``: this run's target file in the directory,
    ``pmc_DAG[_JOB]_HOST_PID.json`` (host and pid: unique on a shared file system)."""
    return os.path.join(directory, _run_file_name(
        "pmc", labels, labels.get("batch_job", ""), socket.gethostname(),
        str(os.getpid())) + ".json")


def file_sd_text(address: str, labels: Mapping[str, str]) -> str:
    """A file_sd target group: the endpoint and the run's identity (empty labels left
    out: to Prometheus an empty label is none)."""
    group = {"targets": [address], "labels": {k: v for k, v in labels.items() if v}}
    return json.dumps([group], indent=1) + "\n"


class _SilentHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # no per-scrape lines on the master's stderr


class _V6Server(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _Notify:
    """Response body whose close() — called by wsgiref after the body was sent — tells the
    master that a scrape saw the final numbers."""

    def __init__(self, body: Iterable[bytes], done: Callable[[], None]) -> None:
        self.body = body
        self.done = done

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        self.done()


class MetricsExport(Observer):
    """Serves, writes and pushes the metrics of one run (see the module docstring)."""

    def __init__(self, opts: RunOptions, tally: Tally) -> None:
        self.tally = tally
        self.labels = identity(opts.dag, opts.site)
        self.registry = make_registry(tally, self.labels)
        self.textfile = textfile_path(opts.metrics_textfile, self.labels) \
            if opts.metrics_textfile else None
        self.gateway = opts.metrics_pushgateway
        # One group per run: a second job of the same workflow on the same host must not
        # replace the first one's numbers.
        self.grouping = {"workflow": os.path.basename(opts.dag) or "dag",
                         "instance": socket.gethostname()}
        if self.labels["batch_job"]:
            self.grouping["batch_job"] = self.labels["batch_job"]
        self.linger = _linger_seconds()
        self.final_scraped = threading.Event()
        self.server: WSGIServer | None = None
        self.url = ""
        self.target = ""  # host:port as another machine reaches it
        self.file_sd = file_sd_path(opts.metrics_file_sd, self.labels) \
            if opts.metrics_file_sd else None
        self.file_sd_written = False
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        # The endpoint now, so that an address that cannot be used stops the run before it
        # begins; the textfile, pushes and target file once it has started (``started``).
        ports = opts.metrics_port
        if ports is None and self.file_sd:
            ports = 0
        if ports is not None:
            first, last = (ports, ports) if isinstance(ports, int) else ports
            self._serve(opts.metrics_bind, first, last)

    def started(self, info: RunInfo) -> None:
        if (self.textfile or self.gateway) and self.thread is None:
            self.thread = threading.Thread(target=self._periodic, name="pmc-metrics",
                                           daemon=True)
            self.thread.start()
        if self.file_sd and self.target:
            self._write_file_sd()

    # -- HTTP --------------------------------------------------------------------------

    def _serve(self, bind: str, first: int, last: int) -> None:
        inner = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            body: Iterable[bytes] = inner(environ, start_response)
            if self.tally.summary is not None:
                return _Notify(body, self.final_scraped.set)
            return body

        for port in (*range(first, last + 1), *((0,) if first else ())):
            try:
                self.server = self._bind(bind, port, app)
                break
            except OSError as e:
                if port == 0 or e.errno not in _PORT_TAKEN:
                    raise FatalError(f"Cannot serve metrics on {bind}:{port}: "
                                     f"{e.strerror or e}") from e
        assert self.server is not None
        actual = self.server.server_port
        if first and not first <= actual <= last:
            tried = str(first) if first == last else f"{first}-{last}"
            log.warn(f"Metrics: cannot have port {tried} on {bind} (in use or not "
                     f"allowed); serving on free port {actual} instead")
        host = socket.gethostname() if bind in _WILDCARDS else bind
        host = f"[{host}]" if ":" in host else host
        self.target = f"{host}:{actual}"
        self.url = f"http://{self.target}/metrics"
        threading.Thread(target=self.server.serve_forever, args=(0.1,),
                         name="pmc-metrics-http", daemon=True).start()
        where = f" (bound to {bind or '*'})" if bind in _WILDCARDS else ""
        log.info(f"Metrics: serving {self.url}{where}")

    @staticmethod
    def _bind(bind: str, port: int, app: Callable[..., Iterable[bytes]]) -> WSGIServer:
        server_class = _V6Server if ":" in bind else ThreadingWSGIServer
        return make_server(bind, port, app, server_class, handler_class=_SilentHandler)

    # -- discovery ---------------------------------------------------------------------

    def _write_file_sd(self) -> None:
        assert self.file_sd is not None
        try:
            atomic_write(self.file_sd, file_sd_text(self.target, self.labels))
            self.file_sd_written = True
            log.info(f"Metrics: target file {self.file_sd}")
        except OSError as e:
            log.warn(f"Cannot write metrics target file {self.file_sd}: {e}")

    def _remove_file_sd(self) -> None:
        if self.file_sd_written and self.file_sd is not None:
            self.file_sd_written = False
            try:
                os.unlink(self.file_sd)
            except OSError as e:
                log.warn(f"Cannot remove metrics target file {self.file_sd}: {e}")

    # -- textfile and Pushgateway ------------------------------------------------------

    def _periodic(self) -> None:
        next_push = time.monotonic() + PUSH_EVERY
        while not self.stop.wait(TEXTFILE_EVERY):
            self._write_textfile()
            if self.gateway and time.monotonic() >= next_push:
                next_push = time.monotonic() + PUSH_EVERY
                self._push()

    def _write_textfile(self) -> None:
        if not self.textfile:
            return
        try:
            # Written to PATH.<pid>.<thread> beside it, then renamed: readers never see a
            # half-written file.
            write_to_textfile(self.textfile, self.registry)
        except OSError as e:
            log.warn(f"Cannot write metrics textfile {self.textfile}: {e}")

    def _push(self) -> None:
        assert self.gateway is not None
        try:
            push_to_gateway(self.gateway, job="pmc", registry=self.registry,
                            grouping_key=self.grouping, timeout=PUSH_TIMEOUT)
        except Exception as e:
            log.warn(f"Cannot push metrics to {self.gateway}: {e}")

    # -- the end -----------------------------------------------------------------------

    def finished(self, summary: Summary) -> None:
        self._stop_thread()
        self._write_textfile()
        if self.gateway:
            self._push()
        if self.server is not None and self.linger > 0:
            log.info(f"Metrics: waiting up to {self.linger:g} s for a final scrape of "
                     f"{self.url}")
            self.final_scraped.wait(self.linger)

    def _stop_thread(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def close(self) -> None:
        self._stop_thread()
        self._remove_file_sd()  # before the endpoint goes: no scrape of a closed port
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _linger_seconds() -> float:
    text = os.environ.get(LINGER_ENV, "")
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        log.warn(f"Ignoring {LINGER_ENV}={text!r}: not a number of seconds")
        return 0.0
    return max(0.0, value)
