"""vrepl's compiled core: Cython extensions without I/O (crc32c, frame, record, framebuf,
window, wire, rows, memcols; the .pxd files are their contracts, .pyi stubs for Python callers).

Owns only the check below: when this package is a source tree whose extensions were never
built (typically a clone in the current directory that shadows the installed vrepl, since
`python -m` and `python -c` put the current directory first on sys.path), importing it
fails at once with one line saying so and what to do, instead of an ImportError naming a
missing `crc32c` deep in some module (uncaught, it prints just that line, exit 1; the `vrepl`
command catches it: exit 2). Must not: do any other work at import.
"""
import os as _os
import sys as _sys
from importlib.machinery import EXTENSION_SUFFIXES as _SUFFIXES

from vrepl.errors import CoreNotBuiltError

EXTENSIONS = ("crc32c", "frame", "record", "framebuf", "window", "wire", "rows", "memcols")


def _missing() -> list[str]:
    here = _os.path.dirname(_os.path.abspath(__file__))
    return [name for name in EXTENSIONS
            if not any(_os.path.exists(_os.path.join(here, name + sfx)) for sfx in _SUFFIXES)]


def _one_line_hook(previous):
    """sys.excepthook while the error is pending: uncaught, it is the process's last word,
    so print the one line (as the `vrepl` command does) instead of a traceback through
    runpy and vrepl's imports; any other exception goes to the previous hook."""
    def hook(kind, value, tb):
        if isinstance(value, CoreNotBuiltError):
            print(f"vrepl: error: {value}", file=_sys.stderr)
        else:
            previous(kind, value, tb)
    return hook


_not_built = _missing()
if _not_built:
    _sys.excepthook = _one_line_hook(_sys.excepthook)
    _tree = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
    raise CoreNotBuiltError(
        f"vrepl was imported from the source tree {_tree}, whose Cython extensions are not"
        f" built (missing: {', '.join(_not_built)}): run vrepl from another directory (so"
        " the installed package is used), or build the tree in place with"
        " `python3 -m pip install -e .`")
