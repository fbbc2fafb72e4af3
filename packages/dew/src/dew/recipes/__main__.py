"""``python -m dew.recipes chain CONFIG``."""

import sys

from dew.recipes.cli import main

sys.exit(main())
