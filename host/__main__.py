"""`python -m dlbooster ...`: the same command line as `dlbooster ...`."""

import sys

from .cli import main

sys.exit(main())
