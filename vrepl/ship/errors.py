"""The refusal codes of a ship connection and what each means to `vrepl ship` (docs/ship.md
§2.3, §8.2).

Owns: the codes the receiver sends in its ERROR frame (so the sender knows whether waiting
can help), the exit code each ends `vrepl ship` with (names of vrepl/exitcodes.py),
`refused(code, reason)`, the exception for a received ERROR, and the re-export of the ship
exceptions under short names (they are defined in vrepl/errors.py, the one errors home).
Must not: do anything but describe a failure.
"""

from __future__ import annotations

from vrepl.errors import ShipBadData as BadData
from vrepl.errors import ShipError
from vrepl.errors import ShipPeerGone as PeerGone
from vrepl.errors import ShipRefused as Refused
from vrepl.errors import ShipStateError as StateError
from vrepl.errors import ShipUnsafeName as UnsafeName
from vrepl.exitcodes import (
    EXIT_DISK_FULL,
    EXIT_FAILED,
    EXIT_IN_USE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PEER,
    EXIT_REFUSED,
    EXIT_UNSAFE_NAME,
    EXIT_USAGE,
)

__all__ = [
    "BadData",
    "PeerGone",
    "Refused",
    "ShipError",
    "StateError",
    "UnsafeName",
    "refused",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
    "EXIT_PEER",
    "EXIT_UNSAFE_NAME",
    "EXIT_DISK_FULL",
    "EXIT_IN_USE",
    "EXIT_REFUSED",
]

# Codes of the ERROR frame (docs/ship.md §2.3): what the receiver refused and why.
ERR_PROTOCOL = 1  # a malformed or unexpected frame
ERR_BUSY = 2  # the previous round of this sender is still loading: retry later
ERR_NOT_MASTER = 3  # this replica is not the vgroup's master (the sender tries the next address)
ERR_OWNER = 4  # a table of the round belongs to another source
ERR_TYPE = 5  # a column of the round has another type on the receiver
ERR_LINEAGE = 6  # reserved
ERR_DISK_FULL = 7  # no space left on the receiver
ERR_BAD_DATA = 8  # a file failed its checks (size, format) at load
ERR_UNSAFE_NAME = 9  # a hostile name
ERR_CONFIG = 10  # precision or file span differ
ERR_IN_USE = 11  # this sender UUID is shipping from another connection (a clone?)
ERR_LOAD = 12  # the load into the vgroup failed (its reason says why)
ERR_STOPPING = 13  # the receiver is stopping

ERROR_NAMES = {
    ERR_PROTOCOL: "protocol",
    ERR_BUSY: "busy",
    ERR_NOT_MASTER: "not_master",
    ERR_OWNER: "owner_conflict",
    ERR_TYPE: "type_conflict",
    ERR_LINEAGE: "lineage",
    ERR_DISK_FULL: "disk_full",
    ERR_BAD_DATA: "bad_data",
    ERR_UNSAFE_NAME: "unsafe_name",
    ERR_CONFIG: "config",
    ERR_IN_USE: "in_use",
    ERR_LOAD: "load_failed",
    ERR_STOPPING: "stopping",
}

# How a receiver's refusal ends `vrepl ship`, and whether a later attempt may succeed by
# itself (retry) or an operator must act first.
REFUSAL_EXIT = {
    ERR_BUSY: EXIT_PEER,
    ERR_NOT_MASTER: EXIT_PEER,
    ERR_OWNER: EXIT_REFUSED,
    ERR_TYPE: EXIT_REFUSED,
    ERR_LINEAGE: EXIT_REFUSED,
    ERR_CONFIG: EXIT_REFUSED,
    ERR_DISK_FULL: EXIT_DISK_FULL,
    ERR_BAD_DATA: EXIT_FAILED,
    ERR_UNSAFE_NAME: EXIT_UNSAFE_NAME,
    ERR_IN_USE: EXIT_IN_USE,
    ERR_LOAD: EXIT_PEER,
    ERR_STOPPING: EXIT_PEER,
    ERR_PROTOCOL: EXIT_PEER,
}
RETRYABLE = frozenset({ERR_BUSY, ERR_NOT_MASTER, ERR_LOAD, ERR_STOPPING, ERR_PROTOCOL, ERR_IN_USE, ERR_BAD_DATA})


def refused(code: int, reason: str) -> Refused:
    """The exception for an ERROR frame of `code`, with its exit code and retry rule."""
    return Refused(code, reason, retry=code in RETRYABLE, exit_code=REFUSAL_EXIT.get(code, EXIT_PEER))
