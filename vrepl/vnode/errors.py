"""Exceptions raised by the reference vnode (vrepl.vnode).

Owns: the error types of the storage half (payloads, archived files, the manifest). Each
subclasses VnodeError (a VreplError) and the builtin it behaves like, following
vrepl/errors.py. Bad client input is not an exception: rows_invalid() returns a reason.
"""
from __future__ import annotations

from vrepl.errors import VreplError


class VnodeError(VreplError):
    """Base of every error the vnode raises on purpose."""


class PayloadError(VnodeError, ValueError):
    """A WAL payload that is not a valid batch of rows (corrupt, foreign, wrong shape)."""

    def __init__(self, reason: str, version: int | None = None):
        self.reason = reason
        self.version = version
        where = f"version {version}: " if version is not None else ""
        super().__init__(f"{where}malformed row payload: {reason}")


class ApplyError(VnodeError, ValueError):
    """A decoded batch that cannot be applied (its types conflict with the table schema)."""


class ArchiveError(VnodeError, OSError):
    """An archived file or the manifest cannot be used as it is; names the file."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")

    def __str__(self) -> str:  # OSError's __str__ would show errno/strerror
        return self.args[0]


class VnodeClosedError(VnodeError, RuntimeError):
    """A call on a vnode after close()."""
