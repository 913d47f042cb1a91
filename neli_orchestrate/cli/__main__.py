import sys

from neli_orchestrate.cli import main

sys.exit(main())
