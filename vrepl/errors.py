"""Exceptions raised at vrepl's boundaries.

Owns: the error types callers catch. Each subclasses VreplError and the builtin it behaves
like, so `except ValueError` still works for callers who do not know vrepl. Inside the
replication core, expected conditions (a stale message, a lost peer) are events, not
exceptions; these are for the edges (files, sockets, configuration, command line).
"""
from __future__ import annotations

import errno
import os


class VreplError(Exception):
    """Base of every error vrepl raises on purpose."""


class FrameError(VreplError, ValueError):
    """Bytes that can never become a valid record/frame (corrupt, oversize, not vrepl)."""

    def __init__(self, reason: str, offset: int | None = None):
        self.reason = reason
        self.offset = offset
        where = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"{reason}{where}")


class ConfigError(VreplError, ValueError):
    """A setting that is missing, malformed or out of range."""


class WalError(VreplError, OSError):
    """A WAL directory that cannot be used as it is."""

    def __init__(self, message: str, path: str | None = None, offset: int | None = None):
        self.path = path
        self.offset = offset
        super().__init__(message)

    def __str__(self) -> str:  # OSError's __str__ would show errno/strerror
        return self.args[0]


class WalCorruptError(WalError):
    """Corruption that is not a torn tail: never skipped, needs an operator."""

    def __init__(self, path: str, offset: int, reason: str, last_good_version: int = 0):
        self.reason = reason
        self.last_good_version = last_good_version
        super().__init__(f"{path}: corrupt at offset {offset}: {reason}"
                         f" (last good version {last_good_version})", path, offset)


class TornTailError(WalError):
    """The last WAL file ends in a torn or zero-filled record: `repair` truncates it."""

    def __init__(self, path: str, offset: int, last_good_version: int, reason: str):
        self.reason = reason
        self.last_good_version = last_good_version
        super().__init__(f"{path}: torn tail at offset {offset}: {reason}"
                         f" (last good version {last_good_version}; repairable with"
                         f" 'vrepl wal repair')", path, offset)


class VersionError(VreplError, ValueError):
    """A record whose version does not follow the last one (versions go up by exactly 1)."""


class ListenError(VreplError, OSError):
    """A server could not listen on its address: in use by another process (`in_use`), not
    an address of this host, or a privileged port."""

    def __init__(self, address: str, what: str, cause: OSError):
        self.address = address
        self.what = what                 # "HTTP API", "replication"
        self.in_use = cause.errno == errno.EADDRINUSE
        hint = ": another process listens there" if self.in_use else ""
        # asyncio's own message repeats the address: the errno's text is enough.
        reason = os.strerror(cause.errno) if cause.errno else str(cause)
        super().__init__(cause.errno, f"cannot listen on {address} ({what}): {reason}{hint}")

    def __str__(self) -> str:  # OSError's __str__ would show "[Errno N]"
        return str(self.strerror)
