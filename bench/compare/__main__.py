"""Entry point of `python -m bench.compare`; see run.py."""
import sys

from bench.compare.run import main

sys.exit(main())
