"""Batch-system adapters (installed as ``pmc.adapters``): site profile → batch script →
submit, status and cancel for Slurm, PBS/Torque, LoadLeveler and local runs."""

from __future__ import annotations

import importlib

from . import schedulers
from .base import AdapterError, CommandError, JobState, JobStatus, Scheduler, render_script
from .site import Site


def scheduler_for(name: str) -> Scheduler:
    """The adapter for a scheduler name from a site profile."""
    if name not in schedulers.BY_NAME:
        raise AdapterError(f"unknown scheduler {name!r}; allowed: {', '.join(schedulers.NAMES)}")
    # Its module imported only now: loading one adapter does not import the others.
    entry = schedulers.BY_NAME[name]
    module = importlib.import_module(f".{entry.module}", __package__)
    scheduler: Scheduler = getattr(module, entry.cls)()
    return scheduler


def script_for(site: Site, dag: str, *, script_path: str | None = None, max_jobs: int = 1,
               follow_up: str = "ahead") -> str:
    return render_script(
        scheduler_for(site.scheduler), site, dag, script_path=script_path, max_jobs=max_jobs,
        follow_up=follow_up,
    )


__all__ = [
    "AdapterError",
    "CommandError",
    "JobState",
    "JobStatus",
    "Scheduler",
    "render_script",
    "scheduler_for",
    "script_for",
]
