"""A chain's record read back (pmc.adapters.chain): links queued ahead while the link
before them runs, and the ones the workflow did not need (cancelled, or skipped should
they have started), as `pmc jobs status` shows them."""

from __future__ import annotations

from pathlib import Path

from pmc.adapters.base import JobState, JobStatus
from pmc.adapters.chain import Chain, read_chains, render

START = "2026-11-23T20:30:00Z chain=123 link=1 job=123 event=started scheduler=slurm host=n1\n"
QUEUED = "2026-11-23T20:30:01Z chain=123 link=2 job=124 event=submitted by=123\n"


Statuses = dict[str, JobStatus | str]


def chain_of(tmp_path: Path, text: str) -> Chain:
    path = tmp_path / "w.dag.chain"
    path.write_text(text)
    [chain] = read_chains(path).values()
    return chain


def test_a_link_queued_behind_a_running_one(tmp_path: Path) -> None:
    chain = chain_of(tmp_path, START + QUEUED)
    statuses: Statuses = {
        "123": JobStatus("123", JobState.RUNNING, "RUNNING"),
        "124": JobStatus("124", JobState.PENDING, "PENDING", reason="Dependency"),
    }
    text = render(chain, statuses)
    assert text.splitlines() == [
        f"chain 123 ({tmp_path / 'w.dag.chain'}): 2 links, running (link 1); link 2 "
        "(job 124) queued behind it",
        "  link 1: job 123 RUNNING (native: RUNNING); pmc run has not ended",
        "  link 2: job 124 PENDING (native: PENDING, reason: Dependency); not started",
    ]


def test_the_link_the_workflow_did_not_need(tmp_path: Path) -> None:
    ended = ("2026-11-23T20:31:00Z chain=123 link=1 job=123 event=ended status=0 "
             "outcome=succeeded next=-\n")
    cancelled = "2026-11-23T20:31:00Z chain=123 link=2 job=124 event=cancelled by=123\n"
    chain = chain_of(tmp_path, START + QUEUED + cancelled + ended)
    statuses: Statuses = {"123": JobStatus("123", JobState.COMPLETED, "COMPLETED", "0:0"),
                "124": JobStatus("124", JobState.CANCELLED, "CANCELLED", "0:0")}
    assert render(chain, statuses).splitlines()[0].endswith(": 2 links, succeeded")
    assert render(chain, statuses).splitlines()[2] == (
        "  link 2: job 124 CANCELLED (native: CANCELLED, exit 0:0); cancelled before it "
        "started: the workflow ended in the link before")
    # The cancel failed (no record of it): still queued, it is not needed all the same.
    chain = chain_of(tmp_path, START + QUEUED + ended)
    statuses["124"] = JobStatus("124", JobState.PENDING, "PENDING", reason="Dependency")
    assert render(chain, statuses).splitlines()[0].endswith(": 2 links, succeeded")
    assert render(chain, statuses).splitlines()[2] == (
        "  link 2: job 124 PENDING (native: PENDING, reason: Dependency); not started, not "
        "needed: the workflow ended in the link before (it does nothing should it start)")
    # Not cancelled in time: it started, saw that link 1 had not handed over, and ended.
    skipped = (START + QUEUED + ended.replace("status=0 outcome=succeeded",
                                              "status=1 outcome=failed")
               + "2026-11-23T20:31:05Z chain=123 link=2 job=124 event=started scheduler=slurm "
               "host=n1\n2026-11-23T20:31:05Z chain=123 link=2 job=124 event=ended status=- "
               "outcome=skipped next=-\n")
    chain = chain_of(tmp_path, skipped)
    statuses["124"] = JobStatus("124", JobState.COMPLETED, "COMPLETED", "0:0")
    lines = render(chain, statuses).splitlines()
    assert lines[0].endswith(": 2 links, failed")
    assert lines[2].endswith("started after the workflow had ended in the link before; "
                             "did nothing")
