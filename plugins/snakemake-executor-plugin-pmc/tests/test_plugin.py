"""Snakemake's own tests for executor plugins (``snakemake.common.tests``), run with
this plugin: each workflow's jobs become tasks of one pmc open run on this host."""

from __future__ import annotations

from snakemake.common.tests import TestWorkflowsLocalStorageBase
from snakemake_executor_plugin_pmc import ExecutorSettings


class TestWorkflows(TestWorkflowsLocalStorageBase):
    __test__ = True

    def get_executor(self) -> str:
        return "pmc"

    def get_executor_settings(self) -> ExecutorSettings:
        return ExecutorSettings(workers=2)
