"""``python -m integration.regions``: see :mod:`integration.regions`."""

import sys

from integration.regions import main

sys.exit(main())
