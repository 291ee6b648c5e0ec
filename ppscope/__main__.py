"""`python -m ppscope` is the `ppscope` command."""

import sys

from ppscope.cli import main

sys.exit(main())
