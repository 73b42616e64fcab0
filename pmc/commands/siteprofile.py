"""The site profile a run takes its options from.

Which one: ``--site PROFILE``; else, for ``pmc run``, ``$PMC_SITE`` or
``~/.config/pmc/site.yaml`` (``pmc.sitepath``), unless ``--no-site`` (what the batch
scripts pmc writes pass, with the profile's options on their command line).
``pegasus-mpi-cluster`` reads one only when given ``--site``: a drop-in run stays the
reference's whatever the user's environment holds.

The profile is read and checked whole by the batch wing's reader (``pmc.adapters.site``,
imported only when there is a profile: the master rank runs this), so a bad one is a
usage error naming the file and the YAML path of the value, before anything runs. Its
``pmc:``, ``logging:`` and ``metrics:`` sections fill the options neither given nor set
through their environment alias (``pmc.options.apply_profile``); its ``site:`` names the
run (the ``site`` label of the metrics and JSON log) unless ``PMC_SITE_NAME`` does.
"""

from __future__ import annotations

import argparse
import importlib

from pmc import options
from pmc.sitepath import default_site_path


def apply_site_profile(p: argparse.ArgumentParser, args: argparse.Namespace,
                       dropin: bool) -> None:
    given = options.BY_DEST["site_profile"]
    if args.site_profile is not None and args.no_site:
        p.error(f"{given.long} and {options.BY_DEST['no_site'].long} exclude each other")
    path, origin = args.site_profile, given.long
    if path is None:
        found = None if dropin or args.no_site else default_site_path()
        if found is None:
            return
        path, origin = found
    site_module = importlib.import_module("pmc.adapters.site")
    try:
        site = site_module.load_site(path)
    except site_module.SiteError as e:
        where = "" if origin == given.long else (
            f" (the site profile from {origin}; {options.BY_DEST['no_site'].long} reads none)")
        # A usage error (exit 2), without the usage: the command line was not the problem.
        p.exit(2, f"{p.prog}: error: {e}{where}\n")
    options.apply_profile(args, options.profile_values(
        {"pmc": site.pmc, "logging": site.logging, "metrics": site.metrics}))
    if args.site is None:
        args.site = site.name
    args.site_profile = path
