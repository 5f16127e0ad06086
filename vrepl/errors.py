"""Exceptions raised at vrepl's boundaries: the one home of vrepl's error types.

Owns: every error type vrepl raises on purpose (packages re-export theirs: vrepl.vnode.errors,
vrepl.restore.errors, vrepl.client...). Each subclasses VreplError and the builtin it
behaves like, so `except ValueError` still works for callers who do not know vrepl; a base
that is never raised itself (VnodeError, ClientError) names no builtin. Three kinds of
error (STYLE.md): a bug is an InvariantViolation (always on, unlike `assert`); inside the
replication core, expected conditions (a stale message, a lost peer) are events, not
exceptions; the rest are for the edges (files, sockets, configuration, command line), where
a process stops with one line and an exit code (vrepl/exitcodes.py).
Must not: import anything of vrepl but vrepl.exitcodes.
"""
from __future__ import annotations

import errno
import os

from vrepl.exitcodes import EXIT_DISK_FULL, EXIT_FAILED, EXIT_PEER, EXIT_SOURCE_CHANGING, EXIT_UNSAFE_NAME, EXIT_USAGE


class VreplError(Exception):
    """Base of every error vrepl raises on purpose."""


# -- bugs -------------------------------------------------------------------------------------

class InvariantViolation(VreplError, AssertionError):
    """A vrepl bug: a state its design rules out (vrepl.replica.invariant raises it)."""


class WindowInvariantError(InvariantViolation):
    """A caller broke the pending-ack window's contract (vrepl/_core/window.pyx)."""


class CoreNotBuiltError(VreplError, ImportError):
    """vrepl was imported from a source tree whose Cython extensions are not built."""


# -- bytes, files, the WAL --------------------------------------------------------------------


class FrameError(VreplError, ValueError):
    """Bytes that can never become a valid record/frame (corrupt, oversize, not vrepl)."""

    def __init__(self, reason: str, offset: int | None = None):
        self.reason = reason
        self.offset = offset
        where = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"{reason}{where}")


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


# -- settings, processes, the command line ----------------------------------------------------

class ConfigError(VreplError, ValueError):
    """A setting that is missing, malformed or out of range."""


class RenamedSetting(VreplError, FutureWarning):
    """A warning: a setting was given by its old name (vrepl/renamed.py); it still works."""


class CliError(VreplError, RuntimeError):
    """A command's failure, reported as one line with its exit code (vrepl/exitcodes.py)."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


class DirInUseError(VreplError, RuntimeError):
    """Another process holds the directory's lock (vrepl/dirlock.py)."""

    def __init__(self, path: str, holder: str) -> None:
        self.path = path
        self.holder = holder          # "<pid> <what>" as the holder wrote it, or ""
        pid, _, what = holder.partition(" ")
        self.pid = int(pid) if pid.isdigit() else None
        if self.pid is None:
            who = "pid unknown"
        else:
            who = f"pid {pid}, {what}" if what else f"pid {pid}"
        super().__init__(f"{path} is in use by another process ({who}): one process per data"
                         " directory; stop it first")


class SelfRestoreError(VreplError, RuntimeError):
    """A node's self-restore attempt that cannot go on (no source, a copy refused); retried."""


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


# -- rounds of ingested files (vrepl/node/ingest.py, docs/vnode.md §9) ---------------------------

class IngestError(VreplError, RuntimeError):
    """A round that was refused or whose outcome is unknown: `code` (bad_files, not_master,
    not_running, needs_restore, overloaded, unknown_outcome), `outcome` (not_written,
    unknown) and, once forwarded, the record's `version`."""

    def __init__(self, code: str, message: str, outcome: str = "not_written",
                 version: int | None = None):
        self.code = code
        self.outcome = outcome
        self.version = version
        super().__init__(message)


class IngestFileError(IngestError, ValueError):
    """A file of the round fails its check (code "bad_files"); nothing was forwarded."""

    def __init__(self, message: str):
        super().__init__("bad_files", message)


class StagingError(IngestFileError):
    """The round's files could not be made durable in the staging area (a full disk or an
    I/O error, at a write, a rename or an fsync): code "bad_files" as for any file the round
    cannot take (nothing was forwarded, the files are back in incoming/), and the OSError's
    `errno`, so a producer can tell a full disk from a bad file."""

    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno


class FetchFailed(VreplError, RuntimeError):
    """No replica could give this one the files of a round (this time; retried)."""


# -- the client (vrepl/client.py) -------------------------------------------------------------

class ClientError(VreplError):
    """Base of the client's errors."""


class BadRequestError(ClientError, ValueError):
    """The node refused the request as invalid (4xx): nothing was written. `reason` says why."""

    def __init__(self, status: int, code: str, reason: str):
        self.status, self.code, self.reason = status, code, reason
        super().__init__(f"{status} {code}: {reason}")


class UnauthorizedError(BadRequestError):
    """401: the node requires a bearer token and this client sent none or a wrong one. Never
    retried; nothing was written."""


class TransactionError(BadRequestError):
    """A transaction step refused (4xx, vrepl/client_txn.py): the transaction is in another
    state (aborted, visible, sealed), the label or rows are bad, or a limit was reached."""


class NotWrittenError(ClientError, ConnectionError):
    """No master could take the write before the deadline; it was certainly not written."""


class OutcomeUnknownError(ClientError, TimeoutError):
    """The write may or may not have been applied. Retrying with `request_id` is safe: the
    vgroup answers with the original version if it was applied."""

    def __init__(self, request_id: str, reason: str):
        self.request_id = request_id
        super().__init__(f"request {request_id}: outcome unknown: {reason}")


# -- transactions (vrepl.txn) -----------------------------------------------------------------

class TxnPayloadError(VreplError, ValueError):
    """A format-9 payload (a transaction's WAL record) that does not decode; names the
    version when known (docs/transactions.md §3)."""


# -- the reference vnode (vrepl.vnode) --------------------------------------------------------
# Bad client input is not an exception there: rows_invalid() returns a reason.

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


class StreamRefused(VnodeError, ValueError):
    """A write body (an Arrow IPC stream) refused while it is read: the one-line reason
    goes back to the client, nothing of it is written (vrepl/vnode/ingest.py)."""


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


# -- restore (vrepl.restore, docs/restore.md) -------------------------------------------------
# `exit_code`: what `vrepl restore` exits with when this error ends it.

class RestoreError(VreplError, RuntimeError):
    """A restore session failed; the message says why in one line. `restart` says whether
    running the session again can help (a file changed, a gap, a peer gone) or not (a
    refused name, a full disk: an operator must act)."""

    exit_code = EXIT_FAILED

    def __init__(self, reason: str, *, restart: bool = True):
        self.reason = reason
        self.restart = restart
        super().__init__(reason)


class FilesChanged(RestoreError):
    """A file already processed changed on the source during the restore (seed: inotify)."""

    exit_code = EXIT_SOURCE_CHANGING  # when it keeps happening (the tool's retries are exhausted)


class BadData(RestoreError):
    """What the sender sent is corrupt or inconsistent: WAL bytes that are not whole valid
    records, a gap, a file whose magic differs from the announced one, a file larger than
    `max_file_bytes`. Not the connection's fault, so not a PeerError (exit 1, not 4)."""


class UnsafeName(RestoreError):
    """A file name from the peer would leave the data path (absolute, `..`, a symlink)."""

    exit_code = EXIT_UNSAFE_NAME

    def __init__(self, reason: str):
        super().__init__(reason, restart=False)


class DiskFull(RestoreError, OSError):
    """No space left while staging; the previous data is intact."""

    exit_code = EXIT_DISK_FULL

    def __init__(self, reason: str):
        RestoreError.__init__(self, reason, restart=False)


class PeerError(RestoreError, ConnectionError):
    """The other side closed, refused, or broke the protocol."""

    exit_code = EXIT_PEER


# -- ship (vrepl.ship, vrepl.node.shipreceiver, docs/ship.md) ---------------------------------
# `exit_code`: what `vrepl ship` exits with when this error ends it; `retry`: whether running
# the round again later can succeed without an operator (a cut link, a busy receiver) or not
# (a conflict, a hostile name, a full disk). Re-exported by vrepl/ship/errors.py.

class ShipError(VreplError, RuntimeError):
    """A ship round failed; the message says why in one line."""

    exit_code = EXIT_PEER

    def __init__(self, reason: str, *, retry: bool = True, exit_code: int | None = None):
        self.reason = reason
        self.retry = retry
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(reason)


class ShipPeerGone(ShipError, ConnectionError):
    """The ship connection failed, closed or timed out, or the peer broke the protocol."""


class ShipRefused(ShipError):
    """The receiver refused (an ERROR frame with a code, docs/ship.md §2); `code`, and the
    exit code and retry rule of that code (vrepl/ship/errors.py)."""

    def __init__(self, code: int, reason: str, *, retry: bool, exit_code: int):
        self.code = code
        super().__init__(reason, retry=retry, exit_code=exit_code)


class ShipBadData(ShipError, ValueError):
    """A shipped file is corrupt: it kept failing its checksum, or the sender's copy is damaged."""

    exit_code = EXIT_FAILED


class ShipUnsafeName(ShipError, ValueError):
    """A hostile name (a file or table name that could leave its directory)."""

    exit_code = EXIT_UNSAFE_NAME

    def __init__(self, reason: str):
        super().__init__(reason, retry=False)


class ShipStateError(ShipError):
    """The sender's own state directory is unusable (the message says how to repair it)."""

    exit_code = EXIT_USAGE

    def __init__(self, reason: str):
        super().__init__(reason, retry=False)


# -- the Spark validation (vrepl.spark, docs/validation.md) -----------------------------------

class InputError(VreplError, ValueError):
    """The inputs cannot be validated at all (missing path, unreadable manifest...): exit 2.

    The message is one line naming the vgroup, the replica and the file.
    """


class SparkJobError(VreplError, RuntimeError):
    """Spark could not start or a Spark job failed; the message is one line (no Java trace)."""


class WriteInputError(VreplError, ValueError):
    """vrepl.spark.write: the DataFrame cannot be written (a missing column, a type the
    vnode has no column for, a row without a ts or table): nothing of it is made visible."""


# -- the sync instance and its transport (vrepl/sync.py, vrepl/transport/)


class NotRunningError(VreplError, RuntimeError):
    """The sync instance is not started, was stopped, or failed (see the message)."""


class FlowControlError(VreplError, BufferError):
    """forward() refused: max_inflight_forwards forwards are queued or unconfirmed. The
    version was not taken; forward it again later (notify_flow_control said so first)."""


class ReconfigError(VreplError, NotImplementedError):
    """reconfig() was asked for a change this version cannot make (it names which)."""


class HandshakeError(VreplError, ConnectionError):
    """The handshake failed; `reason` says why (logged by the caller, then the connection is
    closed); `code` is its class for counting (docs/operations.md §Metrics, connection
    refusals): hello_refused, wrong_secret, bad_handshake."""

    def __init__(self, reason: str, code: str = "bad_handshake"):
        self.reason = reason
        self.code = code
        super().__init__(reason)
