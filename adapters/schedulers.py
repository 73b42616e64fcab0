"""The schedulers pmc writes jobs for, one row each: the name a site profile gives, the
module and class of its adapter, the launchers it runs (the first its default) and the
command whose presence on PATH says a machine has it. Adding a scheduler: its module
and its row here; the profile schema's ``scheduler`` values, ``--scheduler``'s choices,
the default launcher and the launchers' checks are read from this table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    name: str
    module: str  # adapters/<module>.py
    cls: str  # its Scheduler subclass
    launchers: tuple[str, ...]  # those it runs, its default first
    submit_tool: str | None  # on PATH: this machine has the scheduler (None: never guessed)

    @property
    def launcher(self) -> str:
        return self.launchers[0]


ENTRIES = (
    Entry("slurm", "slurm", "Slurm", ("srun", "mpiexec", "aprun"), "sbatch"),
    Entry("pbs", "pbs", "Pbs", ("mpiexec", "aprun"), "qsub"),
    Entry("loadleveler", "loadleveler", "LoadLeveler", ("poe",), "llsubmit"),
    Entry("local", "local", "Local", ("mpiexec", "aprun"), None),
)
BY_NAME = {e.name: e for e in ENTRIES}
NAMES = tuple(BY_NAME)
