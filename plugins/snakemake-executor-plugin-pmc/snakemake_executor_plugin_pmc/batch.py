"""The one batch job of a run that the plugin has pmc's batch wing submit (``--pmc-site
PROFILE``, an extension of this plugin): ``pmc submit`` from the site profile, with the
run open (``pmc.open``) and listening on TCP (``pmc.open_tcp``: the profile's, else
every interface) for a Snakemake on another host; how the job is (the profile's
scheduler, through ``pmc.adapters``), and its cancel.

What Snakemake's side needs to know of the job: whether it has ended (``ended``: why,
in words for a failed Snakemake job; None while it is queued or runs).
"""

import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from pmc.adapters import AdapterError, scheduler_for
from pmc.adapters.base import JobState, JobStatus
from pmc.adapters.site import SiteError, load_site
from snakemake_interface_common.exceptions import WorkflowError

POLL = 5.0  # seconds between questions to the scheduler while nothing else is heard
UNANSWERED = 3  # questions in a row the scheduler does not answer before giving up
SUBMIT_TIMEOUT = 300.0  # seconds for pmc submit


class BatchJob:
    """The batch job running the open run of ``dag`` (submitted by ``submit``)."""

    def __init__(self, profile: str, dag: Path, tcp: Optional[str], submit_args: str) -> None:
        self.profile = str(Path(profile).resolve())
        self.dag = dag
        try:
            site = load_site(self.profile)
            self.scheduler = scheduler_for(site.scheduler)
        except (SiteError, AdapterError) as e:
            raise WorkflowError(f"pmc: {e}") from None
        self.tcp = tcp if tcp is not None else site.pmc.get("open_tcp", "*")
        self.extra = shlex.split(submit_args)
        self.job_id = ""
        self.last: Optional[JobStatus] = None
        self.asked = 0.0
        self.unanswered = 0

    def submit(self) -> str:
        """``pmc submit`` the run (in the DAG's directory); the job's id and what pmc
        said of it."""
        argv = [sys.executable, "-m", "pmc", "submit", "--site", self.profile,
                "--set", "pmc.open=true", "--set", f"pmc.open_tcp={self.tcp}", *self.extra,
                str(self.dag)]
        try:
            proc = subprocess.run(argv, cwd=self.dag.parent, capture_output=True, text=True,
                                  timeout=SUBMIT_TIMEOUT, stdin=subprocess.DEVNULL,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise WorkflowError(f"pmc: {shlex.join(argv)} did not end in "
                                f"{SUBMIT_TIMEOUT:g} s") from None
        said = proc.stderr.strip()
        if proc.returncode != 0 or not proc.stdout.strip():
            raise WorkflowError(f"pmc: the batch job was not submitted: {said}")
        self.job_id = proc.stdout.split()[-1]
        return said

    def status(self, fresh: bool = False) -> Optional[JobStatus]:
        """The job's status, asked at most every POLL seconds unless ``fresh`` (None:
        the scheduler did not answer)."""
        if not fresh and self.last is not None and time.monotonic() - self.asked < POLL:
            return self.last
        self.asked = time.monotonic()
        try:
            self.last = self.scheduler.status(self.job_id)
            self.unanswered = 0
        except AdapterError:
            self.unanswered += 1
            self.last = None
        return self.last

    def ended(self, fresh: bool = False) -> Optional[str]:
        """Why the job is over, in words; None while it is queued or runs (or the
        scheduler has not answered a few times in a row yet)."""
        st = self.status(fresh)
        if st is None:
            if self.unanswered < UNANSWERED:
                return None
            return (f"{self.scheduler.name} no longer knows the pmc batch job {self.job_id}"
                    f" ({UNANSWERED} questions unanswered)")
        if st.state.finished or st.state is JobState.UNKNOWN:
            return f"the pmc batch job {self.job_id} ended: {st}"
        return None

    def cancel(self) -> Optional[str]:
        """Cancel the job if it is not over; what was done, in words (None: nothing)."""
        if not self.job_id or self.ended(fresh=True) is not None:
            return None
        try:
            before = self.scheduler.cancel(self.job_id)
        except AdapterError as e:
            return f"the pmc batch job {self.job_id} could not be cancelled: {e}"
        return f"cancelled the pmc batch job {self.job_id} (was {before.state.value})"

    def wait(self, limit: float) -> Optional[str]:
        """Wait up to ``limit`` seconds for the job to end; why it ended (None: not
        within the limit)."""
        end = time.monotonic() + limit
        while True:
            why = self.ended(fresh=True)
            if why is not None or time.monotonic() >= end:
                return why
            time.sleep(min(2.0, max(0.0, end - time.monotonic())))
