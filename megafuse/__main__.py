"""``python -m megafuse``: the ``megafuse`` command (megafuse/cli.py)."""
import sys

from megafuse.cli import main

sys.exit(main())
