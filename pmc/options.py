"""RunOptions: everything ``pmc run`` / ``pegasus-mpi-cluster`` was asked to do.

Filled by the CLI (with the PMC_* environment aliases), read by the master; workers get
the part they need as a ``WorkerConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pmc import log


@dataclass
class RunOptions:
    dag: str
    stdout: str | None = None
    stderr: str | None = None
    max_failures: int = 0
    tries: int = 1
    skip_rescue: bool = False
    nolock: bool = False
    rescue: str | None = None
    host_script: str | None = None
    host_script_timeout: float = 60.0  # seconds
    host_memory: int | None = None  # MB
    host_cpus: int | None = None
    strict_limits: bool = False
    max_wall_time: float | None = None  # minutes
    per_task_stdio: bool = False
    jobstate_log: bool = False
    monitord_hack: bool = False
    no_resource_log: bool = False
    no_sleep_on_recv: bool = False
    maxfds: int | None = None
    keep_affinity: bool = False
    set_affinity: bool = False
    log_level: int = log.INFO
    mode: str = "auto"  # "auto", "local" or "mpi"
    workers: int | None = None  # embedded mode; None: one per cpu
    worker_slots: int = 1
    prefetch: bool = True  # queue the next task behind each running one
    host_sockets: bool = True  # MPI: workers on the master's host use a Unix socket
    # Observability
    log_format: str = "text"  # "text" or "json"
    log_file: str | None = None
    metrics_port: int | None = None
    metrics_bind: str = "127.0.0.1"
    metrics_textfile: str | None = None
    metrics_pushgateway: str | None = None
    site: str = ""
    # Progress while running (pmc.outputs.progress): a line every so many seconds when stderr is
    # not a terminal (None or 0: none), and the live line on a terminal.
    progress_interval: float | None = None
    live_progress: bool = False

    @property
    def prefetching(self) -> bool:
        """Whether tasks queue behind running ones: not with --max-failures, where a
        queued task could start before the failure that should stop it is counted."""
        return self.prefetch and not self.max_failures

    @property
    def rescue_path(self) -> str:
        return self.rescue or f"{self.dag}.rescue"
