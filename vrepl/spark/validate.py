"""`python -m vrepl.spark.validate ARGS`: `vrepl validate` without the vrepl command
(docs/validation.md).

Owns: nothing but that entry. The validation is `validate()` in vrepl/spark/validation.py
(the package exports it as `vrepl.spark.validate`), the command line is vrepl/spark/cli.py;
this file sits above both, so neither imports it. Must not: hold any code of its own.
"""
from __future__ import annotations

import sys

from vrepl.spark.cli import main
from vrepl.spark.validation import validate

__all__ = ["main", "validate"]

if __name__ == "__main__":
    sys.exit(main())
