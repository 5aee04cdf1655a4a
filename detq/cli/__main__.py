"""`python -m detq.cli`: the detq command."""

import sys

from detq.cli.main import main

sys.exit(main())
