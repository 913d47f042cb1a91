"""``python -m integration.chaos``: see :mod:`integration.chaos.run`."""

import sys

from integration.chaos.run import main

sys.exit(main())
