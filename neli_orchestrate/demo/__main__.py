"""``python -m neli_orchestrate.demo``: see :mod:`neli_orchestrate.demo`."""

import sys

from neli_orchestrate.demo import main

sys.exit(main())
