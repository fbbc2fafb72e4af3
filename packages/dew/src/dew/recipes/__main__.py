"""``python -m dew.recipes chain CONFIG`` (the same as ``dew chain CONFIG``)."""

import sys

from dew.cli import main

sys.exit(main(sys.argv[1:]))
