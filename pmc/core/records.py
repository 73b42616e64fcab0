"""Records that Pegasus tools and users' scripts parse (formats in FORMATS.md).

The ``[cluster-task ...]`` record a worker appends to a task's stdout and the
``[cluster-summary ...]`` record of the master, byte for byte where FORMATS.md lists a
field. The files written through a run (jobstate.log, DAG.dagman.out, DAG.resource) are
``pmc.outputs.recordfiles``. Only the standard library here: every worker imports this at start.
"""

from __future__ import annotations

import math
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import Any

    from pmc.core.events import Summary

_second: list[Any] = [None, "", ""]  # the last whole second formatted: key, date-time, zone


def iso_time(t: float) -> str:
    """Local time with milliseconds and zone, as ``datetime.isoformat`` writes it:
    ``2026-11-22T07:43:43.120+00:00``. Each worker formats one per task; the zone lookup
    behind it is the slow part, done once per second here."""
    frac, whole = math.modf(t)
    us = round(frac * 1e6)  # half to even, as datetime.fromtimestamp rounds
    if us >= 1_000_000:
        whole += 1
        us -= 1_000_000
    key = int(whole)
    cache = _second
    if cache[0] != key:
        local = time.localtime(key)
        cache[:] = [key, time.strftime("%Y-%m-%dT%H:%M:%S", local), _zone(local.tm_gmtoff)]
    return f"{cache[1]}.{us // 1000:03d}{cache[2]}"


def _zone(offset: int) -> str:
    """A UTC offset in seconds as ``isoformat`` writes it: ``+01:00``, ``-03:30``, with
    seconds only when it has some (old local mean times)."""
    sign = "-" if offset < 0 else "+"
    hours, rest = divmod(abs(offset), 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}" + (f":{seconds:02d}" if seconds else "")


def cluster_task_record(
    name: str,
    pegasus_id: str | None,
    start: float,
    duration: float,
    status: int,
    app: str,
    hostname: str,
    slot: int,
    cpus: int,
    memory: int,
) -> str:
    ident = f"id={pegasus_id}, " if pegasus_id is not None else ""
    return (
        f'[cluster-task {ident}name={name}, start="{iso_time(start)}", '
        f'duration={duration:.3f}, status={status}, app="{app}", hostname="{hostname}", '
        f"slot={slot}, cpus={cpus}, memory={memory}]\n"
    )


def cluster_summary_record(s: Summary) -> str:
    """The reference's summary: ``submitted`` and ``failed`` count tries (a task tried
    three times counts three times), ``succeeded`` the tasks that succeeded in this run,
    and ``extra`` is always 0 (its retries show in ``submitted`` and ``failed``)."""
    stat = "ok" if s.ok else "failed"
    return (
        f'[cluster-summary stat="{stat}", tasks={s.tasks}, submitted={s.tries_submitted}, '
        f"succeeded={s.succeeded}, failed={s.tries_failed}, extra=0, "
        f'start="{iso_time(s.start)}", duration={s.wall:.3f}, pid={s.pid}, '
        f'app="{s.app}", runtime={s.runtime:.3f}, slots={s.slots}, cpus={s.cpus}]\n'
    )
