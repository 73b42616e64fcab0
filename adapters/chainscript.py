"""The shell lines that make a batch script one link of a chain (``--until-done``).

Each link records itself in the chain file beside the DAG (read back by ``chain.py``)
and hands over to the next link, this same script submitted again (the batch system's
copy of it, ``$0``), when ``pmc run`` exits incomplete (3). How the next link is
submitted (``FOLLOW_UPS``):

- ``ahead`` (where the scheduler can hold a job until another has ended: Slurm's
  ``--dependency=afterany``, PBS's ``-W depend=afterany``): a link queues its successor
  behind itself as it starts, so that the successor waits in the queue while the link
  runs rather than after it. When the workflow ends in a link (succeeded, failed, a
  usage error, stopped by a SIGTERM, the last of ``--max-jobs``), it cancels the queued
  successor; should that fail (or the link die first), the successor finds that the
  link before it did not hand over, records itself ``skipped`` and ends at once. A
  submission that fails at the start is tried again at the end.
- ``at-end``: a link submits its successor when it ends incomplete (LoadLeveler, which
  has no dependency on another job, and the local scheduler, which has no queue to wait
  in, always work this way).

Pure text: the scheduler's submit lines (setting ``pmc_next``) and cancel command come
in as arguments.
"""

from __future__ import annotations

import shlex

from pmc.errors import ExitCode

CHAIN_MARK = "# pmc chain script: each follow-up job is this script, submitted again."
FOLLOW_UPS = ("ahead", "at-end")


def chain_start(chain_file: str, scheduler: str, max_jobs: int, submit: list[str],
                script_path: str | None, ahead: bool) -> list[str]:
    """Lines before ``pmc run``: the chain's bookkeeping, and (``ahead``) the check that
    the link before handed over, then the successor queued behind this job."""
    lines = [
        "# The chain's id is its first job's id; the chain file beside the DAG lists",
        "# every link (`pmc jobs status` reads it), the index maps job ids to it.",
        'PMC_CHAIN_ID="${PMC_CHAIN_ID:-$PMC_JOB_ID}"',
        "export PMC_CHAIN_ID",
        f"pmc_chain_file={shlex.quote(chain_file)}",
        'case "$pmc_chain_file" in /*) ;; *) pmc_chain_file="$PWD/$pmc_chain_file" ;; esac',
        'pmc_chain_index="${PMC_CHAINS_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}'
        '/pmc/chains}"',
        "pmc_chain_note() {",
        "    printf '%s chain=%s %s\\n' \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\" \"$PMC_CHAIN_ID\""
        ' "$*" >>"$pmc_chain_file" || echo "pmc: cannot write $pmc_chain_file" >&2',
        "}",
        "pmc_chain_link() {",
        '    mkdir -p "$pmc_chain_index" 2>/dev/null'
        " && printf '%s\\n' \"$pmc_chain_file\" >\"$pmc_chain_index/${1//[^A-Za-z0-9._-]/_}\"",
        "}",
        *_find_self(script_path),
        *_submit_next(submit),
        "pmc_chain_link \"$PMC_JOB_ID\"",
        f"pmc_chain_note link=\"$PMC_CHAIN_INDEX\" job=\"$PMC_JOB_ID\" event=started"
        f" scheduler={scheduler}" ' host="${HOSTNAME:-?}"',
        'pmc_next=""',
    ]
    if ahead:
        lines += _queue_ahead(max_jobs)
    return lines


def _find_self(script_path: str | None) -> list[str]:
    # $0 is the batch system's copy of the script it runs (Slurm's slurm_script, PBS's
    # .SC file, the file given to bash for local jobs): the text of this very link,
    # whatever the user named the file or whether it still exists.
    q = shlex.quote
    fallback = [
        f"    elif [ -f {q(script_path)} ] && grep -qxF {q(CHAIN_MARK)} {q(script_path)}; then",
        f"        pmc_self={q(script_path)}",
    ] if script_path is not None else []
    return [
        "# This script's text, to submit again as the next link: pmc_self.",
        "pmc_find_self() {",
        f'    if [ -f "$0" ] && grep -qxF {q(CHAIN_MARK)} "$0"; then',
        '        pmc_self="$0"',
        *fallback,
        "    else",
        '        pmc_self=""',
        "        return 1",
        "    fi",
        "}",
    ]


def _submit_next(submit: list[str]) -> list[str]:
    return [
        "# Submit it as link PMC_CHAIN_INDEX + 1 (its job id in pmc_next, empty if the",
        "# submission failed), and record it.",
        "pmc_submit_next() {",
        "    PMC_CHAIN_INDEX=$((PMC_CHAIN_INDEX + 1))",
        "    export PMC_CHAIN_INDEX",
        *("    " + line for line in submit),
        "    PMC_CHAIN_INDEX=$((PMC_CHAIN_INDEX - 1))",
        '    [ -n "$pmc_next" ] || return 1',
        '    pmc_chain_link "$pmc_next"',
        '    pmc_chain_note link="$((PMC_CHAIN_INDEX + 1))" job="$pmc_next" event=submitted'
        ' by="$PMC_JOB_ID"',
        "}",
    ]


def _queue_ahead(max_jobs: int) -> list[str]:
    return [
        "# A link queued ahead starts once the link before has ended: it runs only if",
        "# that one handed over to it (the workflow may have ended there).",
        'if [ "$PMC_CHAIN_INDEX" -gt 1 ]; then',
        '    pmc_before="$(awk -v c="chain=$PMC_CHAIN_ID" -v l="link=$((PMC_CHAIN_INDEX - 1))"'
        " '$2 == c && $3 == l && $5 == \"event=ended\" { o = $7 } END { print o }'"
        ' "$pmc_chain_file" 2>/dev/null)"',
        '    if [ "$pmc_before" != outcome=continued ]; then',
        '        echo "pmc: link $((PMC_CHAIN_INDEX - 1)) of chain $PMC_CHAIN_ID did not hand'
        ' over to this one (${pmc_before:-no record of its end}): the chain has ended;'
        ' nothing to do" >&2',
        '        pmc_chain_note link="$PMC_CHAIN_INDEX" job="$PMC_JOB_ID" event=ended'
        " status=- outcome=skipped next=-",
        f"        exit {int(ExitCode.OK)}",
        "    fi",
        "fi",
        "# The next link waits in the queue while this one runs.",
        f'if [ "$PMC_CHAIN_INDEX" -lt {max_jobs} ]; then',
        "    if pmc_find_self && pmc_submit_next; then",
        '        echo "pmc: queued job $pmc_next as link $((PMC_CHAIN_INDEX + 1)) of at most'
        f' {max_jobs} in chain $PMC_CHAIN_ID, to start when this job ends" >&2',
        "    else",
        '        echo "pmc: could not queue the next link now; it is submitted at the end'
        ' should the workflow be incomplete" >&2',
        '        pmc_next=""',
        "    fi",
        "fi",
    ]


# A link's outcome in the chain file, by pmc run's exit code.
_OUTCOMES = ((ExitCode.OK, "succeeded"), (ExitCode.FAILED, "failed"),
             (ExitCode.USAGE, "usage-error"), (ExitCode.INCOMPLETE, "incomplete"))


def chain_end(max_jobs: int, cancel: list[str] | None) -> list[str]:
    """Lines after ``pmc run`` (its status, the workflow's, in ``$rc``): hand over to
    the queued successor, or submit one (incomplete), or cancel the queued one (the
    workflow ended here); record this link's end. ``cancel``: the command that cancels
    job ``$pmc_next``, None where nothing is queued ahead."""
    lines = [
        'pmc_outcome=""',
        "case $rc in",
        *[f"    {int(code)}) pmc_outcome={outcome} ;;" for code, outcome in _OUTCOMES],
        "    *) pmc_outcome=ended ;;",
        "esac",
        "pmc_status=$rc",
        f'if [ "$rc" -eq {int(ExitCode.INCOMPLETE)} ]; then',
        '    if [ "$pmc_term" = 1 ]; then',
        '        echo "pmc: the batch system stopped this job (SIGTERM): no follow-up;'
        ' the chain $PMC_CHAIN_ID ends at link $PMC_CHAIN_INDEX (submit again to resume)" >&2',
        "        pmc_outcome=stopped",
        f'    elif [ "$PMC_CHAIN_INDEX" -ge {max_jobs} ]; then',
        f'        echo "pmc: workflow incomplete after {max_jobs} jobs; chain ends" >&2',
        "        pmc_outcome=max-jobs",
        '    elif [ -n "$pmc_next" ]; then',
        '        echo "pmc: workflow incomplete; job $pmc_next, queued as link'
        f' $((PMC_CHAIN_INDEX + 1)) of at most {max_jobs} in chain $PMC_CHAIN_ID, goes on;'
        ' this link ends as a success" >&2',
        "        pmc_outcome=continued",
        "        rc=0",
        "    elif ! pmc_find_self; then",
        '        echo "pmc: cannot find this script\'s text to submit the follow-up ($0 is not'
        ' it); the chain ends: submit the script again to resume" >&2',
        "        pmc_outcome=no-follow-up",
        "    elif pmc_submit_next; then",
        '        echo "pmc: workflow incomplete; submitted job $pmc_next as link'
        f' $((PMC_CHAIN_INDEX + 1)) of at most {max_jobs} in chain $PMC_CHAIN_ID;'
        ' this link ends as a success" >&2',
        "        pmc_outcome=continued",
        "        rc=0",
        "    else",
        '        echo "pmc: could not submit the follow-up job; the chain ends" >&2',
        "        pmc_outcome=no-follow-up",
        "    fi",
        "fi",
    ]
    if cancel is not None:
        lines += [
            "# The workflow ended here: the link queued ahead goes (or, should it start,",
            "# it finds this link did not hand over, and ends at once).",
            'if [ -n "$pmc_next" ] && [ "$pmc_outcome" != continued ]; then',
            f'    if {" ".join(cancel)} >/dev/null 2>&1; then',
            '        echo "pmc: cancelled job $pmc_next, queued as link $((PMC_CHAIN_INDEX + 1)):'
            ' the chain ends here" >&2',
            '        pmc_chain_note link="$((PMC_CHAIN_INDEX + 1))" job="$pmc_next"'
            ' event=cancelled by="$PMC_JOB_ID"',
            "    else",
            '        echo "pmc: could not cancel job $pmc_next, queued as link'
            ' $((PMC_CHAIN_INDEX + 1)): it ends at once when it starts" >&2',
            "    fi",
            '    pmc_next=""',
            "fi",
        ]
    return [*lines, 'pmc_chain_note link="$PMC_CHAIN_INDEX" job="$PMC_JOB_ID" event=ended'
            ' status="$pmc_status" outcome="$pmc_outcome" next="${pmc_next:--}"']
