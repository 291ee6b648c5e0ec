"""`python -m ppscope` is the `ppscope` command."""

import sys

from ppscope.cli.main import main

sys.exit(main())
