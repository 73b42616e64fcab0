"""Chains of jobs (``--until-done``) read back as one thing.

Owns the chain file's format and the job-id index. The batch script (``base.py``)
appends one line per event to ``DAG.chain`` beside the DAG::

    2026-11-23T20:30:00Z chain=123 link=1 job=123 event=started scheduler=slurm host=n1
    2026-11-23T20:30:01Z chain=123 link=2 job=124 event=submitted by=123
    2026-11-23T20:31:00Z chain=123 link=1 job=123 event=ended status=3 outcome=continued next=124

(a link queued ahead is submitted as the link before it starts; one the workflow did
not need is ``cancelled``, or ``ended`` with outcome ``skipped`` should it have started;
see ``chainscript.py``)
and writes ``INDEX/JOB_ID`` (``$PMC_CHAINS_DIR``, default
``$XDG_STATE_HOME/pmc/chains``) holding the chain file's path, for every link it runs
or submits, so that ``pmc jobs status`` given any link's id finds the whole chain. The
chain id is the first link's job id. Lines are appended (no rewrite), so a link killed
mid-way leaves the lines before; the scheduler's answer fills in what the file lacks.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from .base import AdapterError, JobState, JobStatus, chain_file_of

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

# pmc run's exit status and what the script did with it, in words.
OUTCOMES = {
    "succeeded": "workflow succeeded",
    "failed": "workflow failed (a task failed permanently)",
    "usage-error": "pmc run refused its arguments or the DAG",
    "continued": "incomplete by design, continued",
    "max-jobs": "incomplete; the chain reached --max-jobs and ends",
    "stopped": "stopped by the batch system (SIGTERM); no follow-up",
    "no-follow-up": "incomplete; the follow-up could not be submitted",
    # Links queued ahead that the workflow did not need (no pmc run in them).
    "cancelled": "cancelled before it started: the workflow ended in the link before",
    "skipped": "started after the workflow had ended in the link before; did nothing",
}
NOT_RUN = ("cancelled", "skipped")


@dataclass
class Link:
    index: int
    job_id: str
    scheduler: str | None = None
    host: str | None = None
    started: str | None = None
    ended: str | None = None
    status: str | None = None  # pmc run's exit status
    outcome: str | None = None
    next_job: str | None = None

    def outcome_text(self) -> str | None:
        if self.outcome is None:
            return None
        if self.outcome in NOT_RUN:
            return OUTCOMES[self.outcome]
        words = OUTCOMES.get(self.outcome, f"ended with status {self.status}")
        if self.outcome == "continued" and self.next_job:
            words += f" as job {self.next_job}"
        return f"pmc run exit {self.status}: {words}"


@dataclass
class Chain:
    chain_id: str
    path: Path
    links: dict[int, Link] = field(default_factory=dict)

    def ordered(self) -> list[Link]:
        return [self.links[i] for i in sorted(self.links)]

    def link_of(self, job_id: str) -> Link | None:
        return next((ln for ln in self.links.values() if ln.job_id == job_id), None)

    @property
    def scheduler(self) -> str | None:
        return next((ln.scheduler for ln in self.ordered() if ln.scheduler), None)

    def left_over(self) -> set[int]:
        """Links queued ahead behind the one the workflow ended in, that have recorded
        nothing yet (their cancel failed, or the link died before it): should one
        start, it ends at once."""
        return {ln.index for before, ln in itertools.pairwise(self.ordered())
                if before.outcome not in (None, "continued") and ln.outcome is None
                and ln.started is None}


def index_dir() -> Path:
    if os.environ.get("PMC_CHAINS_DIR"):
        return Path(os.environ["PMC_CHAINS_DIR"])
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state) / "pmc" / "chains"


def index_name(job_id: str) -> str:
    """The index file of a job id, as the script names it (``${id//[^A-Za-z0-9._-]/_}``)."""
    return _UNSAFE.sub("_", job_id)


def _fields(line: str) -> tuple[str, dict[str, str]]:
    words = line.split()
    stamp = words[0] if words else ""
    fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    return stamp, fields


def read_chains(path: Path) -> dict[str, Chain]:
    """Every chain recorded in ``path``, in the order they began."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise AdapterError(f"{path}: cannot read the chain file: {e.strerror or e}") from e
    chains: dict[str, Chain] = {}
    for line in text.splitlines():
        stamp, f = _fields(line)
        chain_id, job = f.get("chain"), f.get("job")
        if not chain_id or not job or not f.get("link", "").isdigit():
            continue  # not ours, or cut short: skip rather than guess
        chain = chains.setdefault(chain_id, Chain(chain_id, path))
        index = int(f["link"])
        link = chain.links.setdefault(index, Link(index, job))
        link.job_id = job
        event = f.get("event")
        if event == "started":
            link.started = stamp
            link.scheduler = f.get("scheduler", link.scheduler)
            link.host = f.get("host", link.host)
        elif event == "cancelled":
            link.ended = stamp
            link.outcome = "cancelled"
        elif event == "ended":
            link.ended = stamp
            link.status = f.get("status")
            link.outcome = f.get("outcome")
            nxt = f.get("next")
            link.next_job = nxt if nxt and nxt != "-" else None
    return chains


def record(path: Path, chain_id: str, index: int, job_id: str, event: str, **extra: str) -> None:
    """Append one line to the chain file and index the job (what ``pmc submit`` knows
    about the first link before it starts)."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    words = [stamp, f"chain={chain_id}", f"link={index}", f"job={job_id}", f"event={event}"]
    words += [f"{k}={v}" for k, v in extra.items()]
    with open(path, "a", encoding="utf-8") as f:
        f.write(" ".join(words) + "\n")
    link_job(job_id, path)


def link_job(job_id: str, chain_file: Path) -> None:
    directory = index_dir()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / index_name(job_id)).write_text(f"{chain_file.resolve()}\n", encoding="utf-8")


def chain_of_job(job_id: str) -> Chain | None:
    """The chain a job id belongs to, through the index; None when it is not a link."""
    try:
        target = (index_dir() / index_name(job_id)).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    path = Path(target)
    if not path.is_file():
        return None
    for chain in read_chains(path).values():
        if chain.link_of(job_id) is not None:
            return chain
    return None


def chain_of_dag(arg: str) -> Chain:
    """The latest chain of a DAG (or of a chain file given directly)."""
    path = Path(arg if arg.endswith(".chain") else chain_file_of(arg))
    if not path.is_file():
        raise AdapterError(f"{arg}: no chain recorded ({path} does not exist)")
    chains = read_chains(path)
    if not chains:
        raise AdapterError(f"{path}: no chain links recorded in it")
    return list(chains.values())[-1]


def summary(chain: Chain, statuses: dict[str, JobStatus | str]) -> str:
    """The chain's state in a few words, from its last link; a link the workflow did
    not need (cancelled, skipped) says nothing of it, and one queued behind a running
    link is named beside it."""
    left_over = chain.left_over()
    links = [ln for ln in chain.ordered()
             if ln.outcome not in NOT_RUN and ln.index not in left_over] or chain.ordered()
    last = links[-1]
    behind = None
    if len(links) > 1 and last.started is None and last.outcome is None \
            and links[-2].outcome is None and links[-2].started:
        behind, last = last, links[-2]  # queued ahead, behind the link that runs
    answer = statuses.get(last.job_id)
    if last.outcome is not None and last.outcome != "continued":
        return {
            "succeeded": "succeeded",
            "failed": "failed",
        }.get(last.outcome, f"ended incomplete ({last.outcome})")
    if isinstance(answer, JobStatus):
        if answer.state in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED):
            state = f"{answer.state.value.lower()} (link {last.index})"
            if behind is not None:
                state += f"; link {behind.index} (job {behind.job_id}) queued behind it"
            return state
        if answer.state.finished:
            return f"ended: link {last.index} is {answer.state.value} and left no record"
    if last.outcome == "continued":
        return f"waiting for link {last.index + 1} (job {last.next_job}) to be recorded"
    return f"unknown (link {last.index})"


def render(chain: Chain, statuses: dict[str, JobStatus | str]) -> str:
    links = chain.ordered()
    left_over = chain.left_over()
    n = len(links)
    head = (
        f"chain {chain.chain_id} ({chain.path}): {n} link{'s' if n != 1 else ''}, "
        f"{summary(chain, statuses)}"
    )
    lines = [head]
    for ln in links:
        answer = statuses.get(ln.job_id)
        if isinstance(answer, JobStatus):
            sched = f"{answer.state.value} ({answer.details()})"
        else:
            sched = f"UNKNOWN ({answer or 'not asked'})"
        text = f"  link {ln.index}: job {ln.job_id} {sched}"
        outcome = ln.outcome_text()
        if outcome:
            text += f"; {outcome}"
        elif ln.index in left_over:
            text += ("; not started, not needed: the workflow ended in the link before "
                     "(it does nothing should it start)")
        elif ln.started:
            text += "; pmc run has not ended"
        else:
            text += "; not started"
        lines.append(text)
    return "\n".join(lines)
