"""``python -m pmc`` is the ``pmc`` command."""

import sys

from pmc.cli import main

sys.exit(main())
