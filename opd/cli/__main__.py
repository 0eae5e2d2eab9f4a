"""`python -m opd.cli`, as the tests and scripts call the command line."""

import sys

from opd.cli.entry import main

sys.exit(main())
