"""Durations and memory sizes of a site profile: ``parse_duration`` (minutes or Slurm's
``D-HH:MM:SS`` forms, the ambiguous ``MM:SS`` refused with both readings), ``hms`` and
``parse_memory_mb`` (MB, or a K/M/G/T unit)."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")


def parse_duration(value: int | str) -> int:
    """Seconds from a profile duration: a number of minutes, ``HH:MM:SS``, ``D-HH``,
    ``D-HH:MM`` or ``D-HH:MM:SS`` (Slurm's forms).

    Slurm's ``MM:SS`` is refused: ``1:30`` is a minute and a half to Slurm and an hour
    and a half to many people, and nothing in the profile says which was meant. The
    ``ValueError`` says why and how to write each reading."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("expected minutes, HH:MM:SS or D-HH:MM:SS")
    if isinstance(value, int):
        if value < 1:
            raise ValueError("must be at least 1 minute")
        return value * 60
    text = value.strip()
    m = _DURATION.match(text)
    if not m:
        raise ValueError("expected minutes, HH:MM:SS or D-HH:MM:SS")
    days, a, b, c = m.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    if days is None and len(nums) == 2:
        x, y = nums
        raise ValueError(
            f"ambiguous: Slurm reads {text!r} as {x} min {y} s (MM:SS), people often mean "
            f"{x} h {y} min; write '{hms(x * 60 + y)}' for {x} min {y} s "
            f"or '{hms((x * 60 + y) * 60)}' for {x} h {y} min"
        )
    if days is not None:
        h, mi, s = [*nums, 0, 0][:3]  # D-HH[:MM[:SS]]
        if h > 23:
            raise ValueError(f"hours after the days must be below 24, got {h}")
    elif len(nums) == 1:
        h, mi, s = 0, nums[0], 0
    else:
        h, mi, s = nums
    if len(nums) > 1 and (mi > 59 or s > 59):
        raise ValueError("minutes and seconds must be below 60 in HH:MM:SS")
    total = ((int(days or 0) * 24 + h) * 60 + mi) * 60 + s
    if total < 1:
        raise ValueError("must be more than zero")
    return total


def hms(seconds: int) -> str:
    """HH:MM:SS with hours unbounded (Slurm, PBS and LoadLeveler all accept it)."""
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


_MEMORY = re.compile(r"^(\d+) *([KkMmGgTt])?[Bb]?$")


def parse_memory_mb(value: int | str) -> int:
    """MB from a number (MB) or a string with a K/M/G/T unit (powers of 1024)."""
    if isinstance(value, int):
        return value
    m = _MEMORY.match(value.strip())
    if not m:
        raise ValueError(f"bad memory size {value!r}")
    n, unit = int(m.group(1)), (m.group(2) or "M").upper()
    factor = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
    return max(1, int(n * factor))

