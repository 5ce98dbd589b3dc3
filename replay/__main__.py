"""``python -m skewlens.replay ...`` is ``skewlens replay ...``."""

import sys

from skewlens.cli import main

raise SystemExit(main(["replay", *sys.argv[1:]]))
