"""The reference vnode's exceptions, re-exported (defined in vrepl/errors.py, their one home).

Owns: nothing but the names vrepl.vnode's modules and callers import from here.
Must not: define an error type (add it to vrepl/errors.py).
"""
from vrepl.errors import ApplyError, ArchiveError, PayloadError, StreamRefused, VnodeClosedError, VnodeError

__all__ = ["ApplyError", "ArchiveError", "PayloadError", "StreamRefused", "VnodeClosedError",
           "VnodeError"]
