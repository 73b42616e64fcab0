"""Snakemake executor plugin ``pmc``: a workflow's jobs become tasks of one pmc open run.

The run is one ``pmc run --open`` (a pmc extension) that this plugin starts inside the
current allocation (embedded on this host, or across the allocation's nodes with
``--pmc-launcher 'srun --mpi=pmi2'``), or joins when it is already running
(``--pmc-dag``). To pack a workflow into one batch job, run Snakemake itself in that
job (``sbatch --wrap 'snakemake --executor pmc ...'``). Each job is
added to it through ``pmc.client`` with its threads, ``mem_mb`` and GPUs as the task's
cpus, memory and GPUs; its output goes to a log file per job, which Snakemake is shown
when the job fails.
"""

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import (
    CommonSettings,
    ExecutorSettingsBase,
)

from pmc.client import ChannelError, Client, SubmitError

STATUS_CHECK = 0.5  # seconds between looks at the run: a look is one local request
START_TIMEOUT = 120.0  # seconds for a run (or warm process) started here to be ready
WARM = str(Path(__file__).with_name("warm.py"))  # run as a script: see its docstring


@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    dag: Optional[str] = field(
        default=None,
        metadata={"help": "join the open run of this DAG, already running (pmc run --open "
                  "DAG); it is left open at the end", "env_var": False, "required": False})
    workers: Optional[int] = field(
        default=None,
        metadata={"help": "embedded workers of the run started here (default: Snakemake's "
                  "--cores, else one per cpu)", "env_var": False, "required": False})
    launcher: Optional[str] = field(
        default=None,
        metadata={"help": "start the run under this launcher, e.g. 'srun --mpi=pmi2' in a "
                  "Slurm allocation (default: embedded on this host)",
                  "env_var": False, "required": False})
    warm: bool = field(
        default=False,
        metadata={"help": "warm starts (an extension of this plugin): each job's Snakemake "
                  "forked from one process on this host that imported Snakemake once, not "
                  "a new interpreter per job (most of a short job's cpu); pmc's records "
                  "then count a job's cpu and memory as its client's, not its Snakemake's",
                  "env_var": False, "required": False})
    args: Optional[str] = field(
        default=None,
        metadata={"help": "more 'pmc run' options for the run started here, e.g. "
                  "'--tries 2 --log-format json'", "env_var": False, "required": False})


common_settings = CommonSettings(
    non_local_exec=True,
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    pass_default_storage_provider_args=True,
    pass_default_resources_args=True,
    pass_envvar_declarations_to_cmd=True,
    auto_deploy_default_storage_provider=False,
    init_seconds_before_status_checks=0,
)


def _number(value: object) -> int:
    try:
        return max(0, int(float(str(value))))
    except ValueError:
        return 0


class Executor(RemoteExecutor):
    def __post_init__(self) -> None:
        settings: ExecutorSettings = self.workflow.executor_settings
        self.settings = settings
        self.nonce = uuid.uuid4().hex[:8]
        self.logdir = Path(".snakemake", "pmc_logs").resolve()
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.owned = settings.dag is None
        self.warm: Optional[subprocess.Popen[bytes]] = None
        self.warm_socket = ""
        try:
            if settings.warm:
                self._start_warm()
            if settings.dag is not None:
                self.dag = str(Path(settings.dag).resolve())
            else:
                self.dag = self._start_run()
            self.client = Client.connect(self.dag)
        except (ChannelError, WorkflowError) as e:
            self._stop_started()  # nothing started here outlives the error
            raise WorkflowError(f"pmc: {e}" if isinstance(e, ChannelError) else e) from e
        self.next_seconds_between_status_checks = min(
            STATUS_CHECK, self.workflow.remote_execution_settings.seconds_between_status_checks)

    # -- the run -------------------------------------------------------------------------

    def _start_run(self) -> str:
        rundir = Path(".snakemake", "pmc", self.nonce).resolve()
        rundir.mkdir(parents=True, exist_ok=True)
        dag = rundir / "run.dag"
        dag.write_text("# tasks are added by Snakemake (snakemake-executor-plugin-pmc)\n")
        s = self.settings
        extra = shlex.split(s.args or "")
        workers = s.workers
        cores = self.workflow.resource_settings.cores
        if workers is None and isinstance(cores, int) and 0 < cores < sys.maxsize:
            workers = cores
        argv = [*shlex.split(s.launcher or ""), sys.executable, "-m", "pmc", "run", "--open",
                *(["--workers", str(workers)] if workers and not s.launcher else []),
                *extra, str(dag)]
        self.logger.info(f"pmc: {shlex.join(argv)} (its output in {rundir})")
        with open(rundir / "pmc.out", "wb") as out, open(rundir / "pmc.err", "wb") as err:
            self.proc = subprocess.Popen(argv, cwd=rundir, stdout=out, stderr=err,
                                         start_new_session=True)
        token = Path(f"{dag}.token")
        end = time.monotonic() + START_TIMEOUT
        while not token.exists():
            code = self.proc.poll()
            if code is not None:
                raise WorkflowError(f"pmc: the run ended before it started (exit {code}): "
                                    f"{_tail(rundir / 'pmc.err')}")
            if time.monotonic() > end:
                raise WorkflowError(f"pmc: the run did not open {token} in "
                                    f"{START_TIMEOUT:g} s: {_tail(rundir / 'pmc.err')}")
            time.sleep(0.1)
        return str(dag)

    def _start_warm(self) -> None:
        """The warm process of this host (see ``warm``), ready to fork jobs."""
        rundir = Path(".snakemake", "pmc", self.nonce).resolve()
        rundir.mkdir(parents=True, exist_ok=True)
        self.warm_socket = str(rundir / "warm.sock")
        argv = [sys.executable, WARM, "--serve", self.warm_socket]
        with open(rundir / "warm.err", "wb") as err:
            self.warm = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err,
                                         start_new_session=True)
        end = time.monotonic() + START_TIMEOUT
        while not Path(self.warm_socket).exists():
            code = self.warm.poll()
            if code is not None or time.monotonic() > end:
                raise WorkflowError(f"pmc: the warm process did not start (exit {code}): "
                                    f"{_tail(rundir / 'warm.err')}")
            time.sleep(0.1)
        self.logger.info(f"pmc: warm starts through {self.warm_socket}")

    def get_python_executable(self) -> str:
        if not self.warm_socket:
            return sys.executable
        return shlex.join([sys.executable, WARM, self.warm_socket])

    def shutdown(self) -> None:
        super().shutdown()
        self._stop_warm()
        if not self.owned:
            self.client.close()
            return
        with contextlib.suppress(ChannelError, SubmitError, OSError):
            self.client.close_run()
        self.client.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                self.proc.wait()

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        # A task of a run cannot be stopped alone: the run started here is stopped
        # (pmc stops its running tasks on SIGTERM); a joined run is left as it is.
        if active_jobs and self.owned and self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    # -- jobs ----------------------------------------------------------------------------

    def run_job(self, job: JobExecutorInterface) -> None:
        name = f"smk{job.jobid}-{self.nonce}"
        log = self.logdir / f"{job.name}-{job.jobid}-{self.nonce}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = f"cd {shlex.quote(os.getcwd())} && exec >{shlex.quote(str(log))} 2>&1 && " \
            + self.format_job_exec(job)
        res = job.resources
        info = SubmittedJobInfo(job=job, external_jobid=name, aux={"log": str(log)})
        try:
            self.client.submit(
                ["/bin/sh", "-c", command], name=name, cpus=max(0, job.threads),
                memory=_number(res.get("mem_mb", 0)),
                gpus=_number(res.get("gpu", res.get("gpus", 0))), tries=1)
        except (SubmitError, ChannelError) as e:
            self.report_job_error(info, msg=f"pmc refused the job: {e}. ")
            return
        self.report_job_submission(info)

    async def check_active_jobs(
        self, active_jobs: list[SubmittedJobInfo]
    ) -> AsyncGenerator[SubmittedJobInfo, None]:
        if not active_jobs:
            return
        async with self.status_rate_limiter:
            try:
                states = self.client.states(str(j.external_jobid) for j in active_jobs)
            except (ChannelError, OSError) as e:
                for info in active_jobs:
                    self.report_job_error(info, msg=f"the pmc run is gone: {e}. ")
                return
        for info in active_jobs:
            state = states[str(info.external_jobid)]
            if state.ok:
                self.report_job_success(info)
            elif state.finished:
                record = state.record or {}
                why = f"exit code {state.exit_code}" if state.exit_code is not None else \
                    f"signal {record.get('signal')}" if record.get("signal") else \
                    str(record.get("error") or state.state)
                log = info.aux["log"] if info.aux else None
                self.report_job_error(info, msg=f"pmc task {info.external_jobid} failed "
                                      f"({why}). ", aux_logs=[log] if log else [])
            else:
                yield info


    def _stop_started(self) -> None:
        self._stop_warm()
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def _stop_warm(self) -> None:
        if self.warm is not None and self.warm.poll() is None:
            self.warm.terminate()
            try:
                self.warm.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.warm.kill()
                self.warm.wait()


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
