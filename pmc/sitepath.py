"""Which site profile applies when none is named: ``$PMC_SITE``, else
``$XDG_CONFIG_HOME/pmc/site.yaml`` (``~/.config/pmc/site.yaml``) when it exists.

One rule for the batch wing (``pmc script``, ``pmc submit``, ``pmc jobs``) and ``pmc
run``. A base module of its own: ``pmc run`` asks it on every start, and must not import
the batch wing (the profile reader and its schema) unless there is a profile to read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def default_site_path(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The profile to use without ``--site``, and where that choice came from:
    ``$PMC_SITE``, else ``$XDG_CONFIG_HOME/pmc/site.yaml`` (``~/.config`` by default)
    when it exists."""
    env = os.environ if environ is None else environ
    if env.get("PMC_SITE"):
        return env["PMC_SITE"], "$PMC_SITE"
    config = env.get("XDG_CONFIG_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".config"
    )
    path = os.path.join(config, "pmc", "site.yaml")
    if os.path.isfile(path):
        return path, "the user's config directory"
    return None
