"""The restore flow's exceptions, re-exported (defined in vrepl/errors.py, their one home).

Owns: nothing but the names vrepl.restore's modules and callers import from here; each
error's `exit_code` is what `vrepl restore` exits with (vrepl/exitcodes.py).
Must not: define an error type (add it to vrepl/errors.py).
"""
from vrepl.errors import BadData, DiskFull, FilesChanged, PeerError, RestoreError, UnsafeName

__all__ = ["BadData", "DiskFull", "FilesChanged", "PeerError", "RestoreError", "UnsafeName"]
