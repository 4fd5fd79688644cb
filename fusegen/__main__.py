"""`python -m fusegen`: the same command line as the `fusegen` script."""

import sys

from fusegen.cli import main

sys.exit(main())
