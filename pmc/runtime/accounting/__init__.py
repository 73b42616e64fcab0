"""Per-task accounting and memory limits (see ``account``): the worker's interface."""

from pmc.runtime.accounting.account import Accounting, Usage, self_maxrss_kb

__all__ = ["Accounting", "Usage", "self_maxrss_kb"]
