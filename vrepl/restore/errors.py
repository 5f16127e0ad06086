"""Errors of the restore flow (docs/restore.md).

Owns: the exceptions the restore code raises at its edges, each a VreplError and the builtin
it behaves like, and the CLI exit code each one maps to.
Must not: do anything but describe a failure.
"""
from __future__ import annotations

from vrepl.errors import VreplError


class RestoreError(VreplError, RuntimeError):
    """A restore session failed; the message says why in one line. `restart` says whether
    running the session again can help (a file changed, a gap, a peer gone) or not (a
    refused name, a full disk: an operator must act)."""

    exit_code = 1

    def __init__(self, reason: str, *, restart: bool = True):
        self.reason = reason
        self.restart = restart
        super().__init__(reason)


class FilesChanged(RestoreError):
    """A file already processed changed on the source during the restore (seed: inotify)."""

    exit_code = 7  # when it keeps happening (the tool's retries are exhausted)


class BadData(RestoreError):
    """What the sender sent is corrupt or inconsistent: WAL bytes that are not whole valid
    records, a gap, a file whose magic differs from the announced one, a file larger than
    `max_file_bytes`. Not the connection's fault, so not a PeerError (exit 1, not 4)."""


class UnsafeName(RestoreError):
    """A file name from the peer would leave the data path (absolute, `..`, a symlink)."""

    exit_code = 5

    def __init__(self, reason: str):
        super().__init__(reason, restart=False)


class DiskFull(RestoreError, OSError):
    """No space left while staging; the previous data is intact."""

    exit_code = 6

    def __init__(self, reason: str):
        RestoreError.__init__(self, reason, restart=False)


class PeerError(RestoreError, ConnectionError):
    """The other side closed, refused, or broke the protocol."""

    exit_code = 4
