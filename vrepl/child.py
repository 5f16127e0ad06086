"""How vrepl starts a Python child process: `python_argv(*args)`.

Owns: the interpreter's command line for every Python child vrepl starts (the demo's and
the load generator's `vrepl node` processes, test and chaos nodes, the arbitrator in tests).
`-P` (Python >= 3.11) keeps the current directory (with `-m`) and the script's directory
off the child's sys.path, so the child imports the same installed vrepl as its parent even
when started from a clone's root, whose unbuilt `vrepl/` would otherwise shadow it.
Must not: start anything itself.
"""
from __future__ import annotations

import sys


def python_argv(*args: str) -> list[str]:
    """[python, -P, *args] for subprocess: this interpreter, no current directory on sys.path."""
    return [sys.executable, "-P", *args]
