"""``python -m pmc`` is the ``pmc`` command."""

import sys

from pmc.commands.cli import main

sys.exit(main())
