"""The file to give spark-submit: `spark-submit [options] $(python -m vrepl.spark.submit) ARGS`.

Run as a script (by spark-submit), it runs the validation with `vrepl validate`'s options
and the master spark-submit chose. Run with `python -m vrepl.spark.submit` and no
arguments, it prints its own path (the package's `validate` attribute is the function, so
`vrepl.spark.validate.__file__` is not a path). Must not: do anything else.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # Run as a file, Python put this directory first on sys.path: its modules (cli, job...)
    # must not shadow top-level names.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    if os.environ.get("SPARK_SUBMIT_OPTS") is None and "PYSPARK_GATEWAY_PORT" not in os.environ \
            and len(sys.argv) == 1:
        print(os.path.abspath(__file__))
        sys.exit(0)
    from vrepl.spark.cli import main
    sys.exit(main(sys.argv[1:]))
