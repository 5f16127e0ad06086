"""The exit codes of every vrepl process (docs/operations.md §Exit codes).

Owns: the one table of process exit codes, shared by every command: `vrepl node`, `status`,
`demo`, `bench`, `wal`, `validate`, `restore`, `replay`, `ship` and `ship-owner`, `txn`, and `vrepl-arbitrator`. A code
means the same kind of outcome everywhere; each command's --help says which it uses.
Must not: import anything, or change a value (operators' scripts and systemd units test them).
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1          # the work ran and found a fault, or could not start
EXIT_USAGE = 2           # usage or configuration error: nothing was started
EXIT_INTERRUPTED = 3
EXIT_PEER = 4            # the peer is unreachable, refused, or broke the protocol
EXIT_UNSAFE_NAME = 5     # a hostile file name was refused
EXIT_DISK_FULL = 6
EXIT_SOURCE_CHANGING = 7
EXIT_IN_USE = 8          # a data directory (lock) or an address (port) is another process's
EXIT_REFUSED = 9         # the peer refused the work for a reason an operator must resolve

# code -> what it means, in the words of docs/operations.md's table (which a test holds to it).
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_FAILED: "failed",
    EXIT_USAGE: "usage or configuration error",
    EXIT_INTERRUPTED: "interrupted",
    EXIT_PEER: "peer unreachable or refusing",
    EXIT_UNSAFE_NAME: "hostile file name",
    EXIT_DISK_FULL: "disk full",
    EXIT_SOURCE_CHANGING: "source kept changing",
    EXIT_IN_USE: "in use",
    EXIT_REFUSED: "refused by the receiver",
}
