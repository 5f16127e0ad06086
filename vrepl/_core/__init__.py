"""vrepl's compiled core: Cython extensions without I/O (crc32c, record, framebuf, window,
wire, rows, memcols; the .pxd files are their contracts, .pyi stubs for Python callers).

Owns only the check below: when this package is a source tree whose extensions were never
built (typically a clone in the current directory that shadows the installed vrepl, since
`python -m` and `python -c` put the current directory first on sys.path), importing it
fails at once with one line saying so and what to do, instead of an ImportError naming a
missing `crc32c` deep in some module. Must not: do any other work at import.
"""
import os as _os
from importlib.machinery import EXTENSION_SUFFIXES as _SUFFIXES

EXTENSIONS = ("crc32c", "record", "framebuf", "window", "wire", "rows", "memcols")


def _missing() -> list[str]:
    here = _os.path.dirname(_os.path.abspath(__file__))
    return [name for name in EXTENSIONS
            if not any(_os.path.exists(_os.path.join(here, name + sfx)) for sfx in _SUFFIXES)]


class CoreNotBuiltError(ImportError):
    """vrepl was imported from a source tree whose Cython extensions are not built."""


_not_built = _missing()
if _not_built:
    _tree = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
    raise CoreNotBuiltError(
        f"vrepl was imported from the source tree {_tree}, whose Cython extensions are not"
        f" built (missing: {', '.join(_not_built)}): run vrepl from another directory (so"
        " the installed package is used), or build the tree in place with"
        " `python3 -m pip install -e .`")
