"""Per-task accounting and memory limits (see ``account``): the worker's interface."""

from pmc.runtime.accounting.account import Accounting, Usage, not_wanted

__all__ = ["Accounting", "Usage", "not_wanted"]
