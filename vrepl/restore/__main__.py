"""`python -m vrepl.restore restore|replay ...` (vrepl/restore/cli.py)."""
import sys

from vrepl.restore.cli import main

sys.exit(main())
