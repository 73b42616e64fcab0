"""A worker's part in starting a multi-rank task (``--ranks``, a pmc extension): the node
file in the worker's own temporary directory, the launcher's words before the task's
(``pmc.runtime.ranklaunch`` substitutes the template), and the task's environment with
the outer launch's variables removed, so that a nested launcher works."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

from pmc.core.protocol import TaskSpec

# What only multi-rank tasks need (the launch template's module, tempfile, shutil) is
# imported at the first such task: every worker makes a RankLauncher as it starts.


class RankLauncher:
    """Turns a multi-rank task's argv and environment into the launcher's."""

    def __init__(self, template: str | None, env: Mapping[str, str]) -> None:
        # The run's --task-launcher, else (at the first task) the default where this
        # worker runs: srun inside a Slurm allocation, else mpiexec.
        self.template = template
        self.env = env
        self.dir: str | None = None  # made for the first such task, removed by close

    def prepare(self, spec: TaskSpec, argv: list[str], env: dict[str, str]
                ) -> tuple[list[str], dict[str, str], str]:
        """The argv and environment to spawn, and the node file written for them."""
        import tempfile

        from pmc.runtime import ranklaunch

        assert spec.hosts is not None
        if self.template is None:
            self.template = ranklaunch.default_template(self.env)
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix="pmc-ranks-")
        nodefile = os.path.join(self.dir, f"task{spec.id}.{spec.attempt}.nodes")
        ranklaunch.write_nodefile(nodefile, spec.hosts)
        launcher = ranklaunch.launcher_argv(
            self.template, ranks=spec.ranks, hosts=spec.hosts,
            cpus_per_rank=spec.cpus, nodefile=nodefile)
        return launcher + argv, ranklaunch.task_env(env, spec.hosts, nodefile), nodefile

    @staticmethod
    def done(nodefile: str) -> None:
        """The task ended: its node file goes."""
        with contextlib.suppress(OSError):
            os.unlink(nodefile)

    def close(self) -> None:
        if self.dir is not None:
            import shutil

            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
