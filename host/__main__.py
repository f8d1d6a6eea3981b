"""`python -m dlbooster ...`: the same command line as `dlbooster ...`."""

import sys

from dlbooster.cli import main

sys.exit(main())
