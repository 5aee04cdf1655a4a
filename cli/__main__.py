"""`python -m cli`: the detq command."""

import sys

from cli.main import main

sys.exit(main())
