"""Batch-system adapters (installed as ``pmc.adapters``): site profile → batch script →
submit, status and cancel for Slurm, PBS/Torque, LoadLeveler and local runs."""

from __future__ import annotations

from .base import AdapterError, CommandError, JobState, JobStatus, Scheduler, render_script
from .site import Site


def scheduler_for(name: str) -> Scheduler:
    """The adapter for a scheduler name from a site profile."""
    # Imported here so that loading one adapter does not import the others.
    if name == "slurm":
        from .slurm import Slurm

        return Slurm()
    if name == "pbs":
        from .pbs import Pbs

        return Pbs()
    if name == "loadleveler":
        from .loadleveler import LoadLeveler

        return LoadLeveler()
    if name == "local":
        from .local import Local

        return Local()
    raise AdapterError(f"unknown scheduler {name!r}; allowed: slurm, pbs, loadleveler, local")


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
