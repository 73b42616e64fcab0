"""Snakemake executor plugin ``pmc``: a workflow's jobs become tasks of one pmc open run.

The run is one ``pmc run --open`` (a pmc extension) that this plugin starts inside the
current allocation (embedded on this host, or across the allocation's nodes with
``--pmc-launcher 'srun --mpi=pmi2'``), joins when it is already running (``--pmc-dag``),
or has pmc's batch wing submit as one batch job from a site profile (``--pmc-site``, an
extension of this plugin: Snakemake on a login node, the run in the job; see ``batch``).
Each job is added to it through ``pmc.client`` with its threads, ``mem_mb`` and GPUs as
the task's cpus, memory and GPUs; its output goes to a log file per job, which
Snakemake is shown when the job fails.
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
from typing import Any, Optional

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import (
    CommonSettings,
    ExecutorSettingsBase,
)

from pmc.client import CHANNELS, ChannelError, Client, SubmitError

from .batch import BatchJob

STATUS_CHECK = 0.5  # seconds between looks at the run: a look is one local request
START_TIMEOUT = 120.0  # seconds for a run (or warm process) started here to be ready
UNREACHED = 60  # status checks a started batch job's run may not answer before jobs fail
GONE_WAIT = 30.0  # seconds to hear that a batch job whose run stopped answering ended
END_WAIT = 600.0  # seconds a closed run's batch job may take to end before it is cancelled
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
    site: Optional[str] = field(
        default=None,
        metadata={"help": "an extension of this plugin: run the jobs in ONE batch job that "
                  "pmc's batch wing submits from this site profile (pmc submit --site "
                  "PROFILE, the run open), e.g. from a login node; Snakemake follows it, "
                  "closes it at the end and cancels it when interrupted; its jobs fail "
                  "with the reason if the batch job ends first", "env_var": False,
                  "required": False})
    submit_args: Optional[str] = field(
        default=None,
        metadata={"help": "with --pmc-site: more 'pmc submit' options, e.g. '--walltime "
                  "2:00:00 --nodes 4 --set pmc.tries=2'", "env_var": False,
                  "required": False})
    channel: Optional[str] = field(
        default=None,
        metadata={"help": "how Snakemake reaches the run: auto (default: its Unix socket, "
                  "else TCP when the run is on another host), unix or tcp",
                  "env_var": False, "required": False})
    tcp: Optional[str] = field(
        default=None,
        metadata={"help": "with --pmc-site: where the run listens on TCP for a Snakemake "
                  "on another host (pmc run --open-tcp [HOST][:PORT]; default: the "
                  "profile's pmc.open_tcp, else * (every interface, any free port))",
                  "env_var": False, "required": False})


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
        self.batch: Optional[BatchJob] = None
        self.client: Optional[Client] = None
        self.waiting: list[tuple[SubmittedJobInfo, dict[str, object]]] = []
        self.gone: Optional[str] = None  # why a batch job's run stopped answering
        self.unreached = 0  # tries to connect to a batch job's run that has started
        try:
            if settings.site is not None:
                self._submit_batch()
            else:
                if settings.warm:
                    self._start_warm()
                if settings.dag is not None:
                    self.dag = str(Path(settings.dag).resolve())
                else:
                    self.dag = self._start_run()
                self.client = self._connect()
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

    def _connect(self) -> Client:
        channel = self.settings.channel or "auto"
        if channel not in CHANNELS:
            raise WorkflowError(f"pmc: --pmc-channel must be one of {', '.join(CHANNELS)}, "
                                f"not {channel!r}")
        return Client.connect(self.dag, channel=channel)

    def _submit_batch(self) -> None:
        """Have pmc's batch wing submit the run as one batch job (``--pmc-site``);
        Snakemake's jobs wait for it to start (``_reach_run``)."""
        s = self.settings
        given = [f"--pmc-{name}" for name, value in (
            ("dag", s.dag), ("launcher", s.launcher), ("workers", s.workers),
            ("args", s.args)) if value is not None] + (["--pmc-warm"] if s.warm else [])
        if given:
            raise WorkflowError(f"pmc: --pmc-site cannot be combined with {', '.join(given)}"
                                ": the site profile says how the run runs (more "
                                "'pmc submit' options with --pmc-submit-args)")
        assert s.site is not None
        rundir = Path(".snakemake", "pmc", self.nonce).resolve()
        rundir.mkdir(parents=True, exist_ok=True)
        dag = rundir / "run.dag"
        dag.write_text("# tasks are added by Snakemake (snakemake-executor-plugin-pmc)\n")
        self.dag = str(dag)
        self.batch = BatchJob(s.site, dag, s.tcp, s.submit_args or "")
        said = self.batch.submit()
        self.logger.info(f"pmc: {said}")
        self.logger.info(f"pmc: Snakemake's jobs go to the open run of {dag} once batch job "
                         f"{self.batch.job_id} has started it")

    def _reach_run(self) -> Optional[str]:
        """Connect to the batch job's run once it listens, and hand it the jobs that
        waited; why it cannot be reached (None: connected, or not yet started)."""
        assert self.batch is not None
        if not Path(f"{self.dag}.token").exists():
            why = self.batch.ended()
            return None if why is None else f"{why}, before its open run started " \
                f"(the batch script and its output: {Path(self.dag).parent})"
        try:
            self.client = self._connect()
        except ChannelError as e:
            self.unreached += 1
            why = self.batch.ended(fresh=True)
            if why is None and self.unreached < UNREACHED:
                return None  # (a run just starting, or ending)
            return why or f"the open run of batch job {self.batch.job_id} cannot be " \
                f"reached: {e}"
        via = "TCP" if self.client.channel == "tcp" else "its Unix socket"
        self.logger.info(f"pmc: batch job {self.batch.job_id}'s open run reached over {via}; "
                         f"{len(self.waiting)} job(s) handed to it")
        waiting, self.waiting = self.waiting, []
        for info, request in waiting:
            self._submit(info, request)
        return None

    def _gone(self, error: Exception) -> str:
        """Why a run stopped answering, in words for a failed job (a batch job's end,
        which the scheduler may take a few seconds to tell, is waited for)."""
        if self.batch is None:
            return f"the pmc run is gone: {error}"
        if self.gone is None:
            why = self.batch.wait(GONE_WAIT)
            self.gone = f"the pmc run is gone ({error}): " + (
                why or f"its batch job {self.batch.job_id} has not ended yet")
        return self.gone

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
        if self.batch is not None:
            self._end_batch()
            return
        assert self.client is not None
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

    def _end_batch(self) -> None:
        """Close the batch job's run and wait for the job to end (cancelled if it
        does not, or if its run was never reached)."""
        assert self.batch is not None
        if self.client is None:
            note = self.batch.cancel()
        else:
            with contextlib.suppress(ChannelError, SubmitError, OSError):
                self.client.close_run()
            self.client.close()
            note = self.batch.wait(END_WAIT)
            if note is None:
                note = f"not ended {END_WAIT:g} s after its run was closed: " \
                    f"{self.batch.cancel()}"
        if note:
            self.logger.info(f"pmc: {note}")

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        # A task of a run cannot be stopped alone: the run started here is stopped
        # (pmc stops its running tasks on SIGTERM), a batch job cancelled; a joined run
        # is left as it is.
        if active_jobs and self.batch is not None:
            note = self.batch.cancel()
            if note:
                self.logger.info(f"pmc: {note}")
            return
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
        request: dict[str, Any] = {
            "argv": ["/bin/sh", "-c", command], "name": name, "cpus": max(0, job.threads),
            "memory": _number(res.get("mem_mb", 0)),
            "gpus": _number(res.get("gpu", res.get("gpus", 0))), "tries": 1}
        if self.client is None:  # a batch job's run not yet started: the job waits
            self.waiting.append((info, request))
            self.report_job_submission(info)
        elif self._submit(info, request):
            self.report_job_submission(info)

    def _submit(self, info: SubmittedJobInfo, request: dict[str, Any]) -> bool:
        assert self.client is not None
        try:
            self.client.submit(request.pop("argv"), **request)
        except SubmitError as e:
            self.report_job_error(info, msg=f"pmc refused the job: {e}. ")
        except (ChannelError, OSError) as e:
            self.report_job_error(info, msg=f"{self._gone(e)}. ")
        else:
            return True
        info.aux["failed"] = True
        return False

    async def check_active_jobs(
        self, active_jobs: list[SubmittedJobInfo]
    ) -> AsyncGenerator[SubmittedJobInfo, None]:
        if not active_jobs:  # (also: called before __post_init__ has run)
            return
        if self.client is None and self.batch is not None:
            why = self._reach_run()
            if self.client is None:
                for info in active_jobs:
                    if why is None:
                        yield info
                    else:
                        self.report_job_error(info, msg=f"{why}. ")
                return
        active_jobs = [j for j in active_jobs if not j.aux.get("failed")]
        if not active_jobs:
            return
        assert self.client is not None
        async with self.status_rate_limiter:
            try:
                states = self.client.states(str(j.external_jobid) for j in active_jobs)
            except (ChannelError, OSError, SubmitError) as e:  # refused: the run ended
                why = self._gone(e)
                for info in active_jobs:
                    self.report_job_error(info, msg=f"{why}. ")
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
