"""Errors of `vrepl ship` and its receiver (docs/ship.md §Exit codes).

Owns: the exceptions the ship code raises at its edges, each a VreplError and the builtin it
behaves like, the exit code of `vrepl ship` each one maps to, and the refusal codes the
receiver sends in its ERROR frame (so the sender knows whether waiting can help).
Must not: do anything but describe a failure.
"""
from __future__ import annotations

from vrepl.errors import VreplError

# `vrepl ship` exit codes (docs/ship.md §Exit codes).
EXIT_OK = 0
EXIT_CORRUPT = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 3
EXIT_PEER = 4
EXIT_UNSAFE = 5
EXIT_DISK_FULL = 6
EXIT_REFUSED = 7
EXIT_IN_USE = 8

# Codes of the ERROR frame (docs/ship.md §2): what the receiver refused and why.
ERR_PROTOCOL = 1        # a malformed or unexpected frame
ERR_BUSY = 2            # the previous round of this sender is still loading: retry later
ERR_NOT_MASTER = 3      # this replica is not the vgroup's master; the reason names the master
ERR_OWNER = 4           # a table of the round belongs to another source
ERR_TYPE = 5            # a column of the round has another type on the receiver
ERR_LINEAGE = 6         # the sender's history does not continue the receiver's (clone, backup)
ERR_DISK_FULL = 7       # no space left on the receiver
ERR_BAD_DATA = 8        # a file failed its checks (checksum, size, format)
ERR_UNSAFE_NAME = 9     # a hostile name
ERR_CONFIG = 10         # precision or file span differ, unknown vgroup
ERR_IN_USE = 11         # this sender UUID is shipping from another connection (a clone?)
ERR_LOAD = 12           # the load into the vgroup failed (its reason says why)
ERR_STOPPING = 13       # the receiver is stopping

ERROR_NAMES = {ERR_PROTOCOL: "protocol", ERR_BUSY: "busy", ERR_NOT_MASTER: "not_master",
               ERR_OWNER: "owner_conflict", ERR_TYPE: "type_conflict", ERR_LINEAGE: "lineage",
               ERR_DISK_FULL: "disk_full", ERR_BAD_DATA: "bad_data",
               ERR_UNSAFE_NAME: "unsafe_name", ERR_CONFIG: "config", ERR_IN_USE: "in_use",
               ERR_LOAD: "load_failed", ERR_STOPPING: "stopping"}

# How a receiver's refusal ends `vrepl ship`, and whether a later attempt may succeed by
# itself (retry) or an operator must act first.
_EXIT_OF_CODE = {ERR_BUSY: EXIT_PEER, ERR_NOT_MASTER: EXIT_PEER, ERR_OWNER: EXIT_REFUSED,
                 ERR_TYPE: EXIT_REFUSED, ERR_LINEAGE: EXIT_REFUSED, ERR_CONFIG: EXIT_REFUSED,
                 ERR_DISK_FULL: EXIT_DISK_FULL, ERR_BAD_DATA: EXIT_CORRUPT,
                 ERR_UNSAFE_NAME: EXIT_UNSAFE, ERR_IN_USE: EXIT_IN_USE, ERR_LOAD: EXIT_PEER,
                 ERR_STOPPING: EXIT_PEER, ERR_PROTOCOL: EXIT_PEER}
_RETRYABLE = frozenset({ERR_BUSY, ERR_NOT_MASTER, ERR_LOAD, ERR_STOPPING, ERR_PROTOCOL,
                        ERR_IN_USE, ERR_BAD_DATA})


class ShipError(VreplError, RuntimeError):
    """A round failed; the message says why in one line. `retry`: whether running the round
    again later can succeed without an operator (a cut link, a busy receiver) or not (a
    conflict, a hostile name, a full disk)."""

    exit_code = EXIT_PEER

    def __init__(self, reason: str, *, retry: bool = True, exit_code: int | None = None):
        self.reason = reason
        self.retry = retry
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(reason)


class PeerGone(ShipError, ConnectionError):
    """The connection failed, closed or timed out, or the peer broke the protocol."""


class Refused(ShipError):
    """The receiver refused (an ERROR frame with a code, docs/ship.md §2)."""

    def __init__(self, code: int, reason: str):
        self.code = code
        super().__init__(reason, retry=code in _RETRYABLE, exit_code=_EXIT_OF_CODE.get(code, EXIT_PEER))


class BadData(ShipError, ValueError):
    """A file is corrupt: it kept failing its checksum, or the sender's own copy is damaged."""

    exit_code = EXIT_CORRUPT


class UnsafeName(ShipError, ValueError):
    """A hostile name (a file or table name that could leave its directory)."""

    exit_code = EXIT_UNSAFE

    def __init__(self, reason: str):
        super().__init__(reason, retry=False)


class DiskFull(ShipError, OSError):
    """No space left (receiver side)."""

    exit_code = EXIT_DISK_FULL

    def __init__(self, reason: str):
        ShipError.__init__(self, reason, retry=False)


class StateError(ShipError):
    """The sender's own state directory is unusable (the message says how to repair it)."""

    exit_code = EXIT_USAGE

    def __init__(self, reason: str):
        super().__init__(reason, retry=False)
