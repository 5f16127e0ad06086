"""Actions: what a replica asks its embedding (transport, WAL, app) to do.

Owns: one frozen dataclass per request, returned in a list by `Replica.step()`/`tick()`.

ORDERING CONTRACT: THE CALLER MUST EXECUTE THE ACTIONS OF ONE LIST IN LIST ORDER, AND AN
ACTION THAT PERSISTS STATE (PersistPromisedEpoch, PersistRecords, PersistBatch, TruncateWalAfter) MUST BE
ISSUED TO STORAGE BEFORE ANY LATER ACTION OF THE SAME LIST; PersistPromisedEpoch MUST BE
DURABLE BEFORE ANY LATER Send IS WRITTEN TO A SOCKET. Completion of WAL work comes back as
events (WalPersisted, TruncateDone), never assumed.

Must not: do I/O or carry behaviour; each class only has a stable one-line `describe()`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from vrepl.replica.messages import NO_NODE, PeerMessage, Record, Role


class ConfirmStatus(enum.IntEnum):
    """Outcome of a forward reported to the app through ConfirmForward."""

    OK = 0
    FAILED = 1  # the master stepped down (outcome unknown: retry), or a limit refused it
    TIMED_OUT = 2  # not confirmed within forward_timeout_ticks; the record may still survive
    NOT_MASTER = 3  # refused: this replica is not master; the version is not consumed

    def describe(self) -> str:
        return self.name.lower()


class LogLevel(enum.IntEnum):
    DEBUG = 10
    INFO = 20
    WARNING = 30
    ERROR = 40

    def describe(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Send:
    """Write `message` to the peer connection of `node` (dropped if it is not connected)."""

    node: int
    message: PeerMessage

    def describe(self) -> str:
        return f"send n{self.node} {self.message.describe()}"


@dataclass(frozen=True, slots=True)
class PersistRecords:
    """Append `records` (consecutive versions) to the local WAL. Durability is reported later
    with WalPersisted; the records must be readable by StreamWalFrom as soon as this runs."""

    records: tuple[Record, ...]

    def describe(self) -> str:
        first, last = self.records[0], self.records[-1]
        if first.version == last.version:
            return f"persist_records {first.describe()}"
        return f"persist_records e{first.epoch}v{first.version}..e{last.epoch}v{last.version} ({len(self.records)} records)"


@dataclass(frozen=True, slots=True)
class PersistBatch:
    """Append records first_version.. with these epochs and payloads to the local WAL: the
    batched PersistRecords (same rules: durability comes back as WalPersisted, readable by
    StreamWalFrom as soon as this runs). `block`, when not empty, is exactly these records
    already encoded as WAL records (a follower received them so): append it unchanged."""

    first_version: int
    record_epochs: tuple[int, ...]
    payloads: tuple[bytes, ...]
    block: bytes = field(default=b"", compare=False, repr=False)

    @property
    def last_version(self) -> int:
        return self.first_version + len(self.payloads) - 1

    def describe(self) -> str:
        e0, e1 = self.record_epochs[0], self.record_epochs[-1]
        if len(self.payloads) == 1:
            return f"persist_batch e{e0}v{self.first_version} {len(self.payloads[0])}B"
        return f"persist_batch e{e0}v{self.first_version}..e{e1}v{self.last_version} ({len(self.payloads)} records)"


@dataclass(frozen=True, slots=True)
class TruncateWalAfter:
    """Discard every WAL record with version > `version` (a suffix the master does not have).

    THE WAL MUST REPORT ALL WalPersisted FOR EARLIER APPENDS BEFORE IT REPORTS TruncateDone,
    AND THE APP MUST DROP WHAT IT APPLIED FROM THE DISCARDED RECORDS (e.g. rebuild from WAL).
    The replica accepts nothing from the master until TruncateDone arrives.
    """

    version: int

    def describe(self) -> str:
        return f"truncate_wal_after v{self.version}"


@dataclass(frozen=True, slots=True)
class NotifyRole:
    """This replica's role changed (seed: notifyRole). `master` is NO_NODE when unknown."""

    role: Role
    epoch: int
    master: int = NO_NODE

    def describe(self) -> str:
        master = "-" if self.master == NO_NODE else f"n{self.master}"
        return f"notify_role {self.role.describe()} e{self.epoch} master {master}"


@dataclass(frozen=True, slots=True)
class ConfirmForward:
    """Outcome of the app's forwards `first_version..last_version` (seed: confirmForward).

    Confirmations are cumulative, so one action covers a contiguous range of versions.
    """

    first_version: int
    last_version: int
    status: ConfirmStatus

    def describe(self) -> str:
        if self.first_version == self.last_version:
            return f"confirm_forward v{self.first_version} {self.status.describe()}"
        return f"confirm_forward v{self.first_version}..v{self.last_version} {self.status.describe()}"


@dataclass(frozen=True, slots=True)
class WriteToCache:
    """A slave hands a forwarded record to its app (seed: writeToCache). The app reports with
    AppAcked when it has applied and persisted it, if the replica waits for the app."""

    record: Record

    def describe(self) -> str:
        return f"write_to_cache {self.record.describe()}"


@dataclass(frozen=True, slots=True)
class WriteToCacheBatch:
    """The batched WriteToCache: a slave hands records first_version.. to its app."""

    first_version: int
    record_epochs: tuple[int, ...]
    payloads: tuple[bytes, ...]

    def describe(self) -> str:
        last = self.first_version + len(self.payloads) - 1
        return f"write_to_cache_batch v{self.first_version}..v{last} ({len(self.payloads)} records)"


@dataclass(frozen=True, slots=True)
class StreamWalFrom:
    """Master: read records first_version..last_version from the local WAL and send them to
    `node` as Forward/ForwardBatch of `epoch`, in order; `prev_epoch` is the epoch of record
    first_version - 1. A stand-in for the restore flow (seed 数据恢复流程, a later issue)."""

    node: int
    epoch: int
    first_version: int
    last_version: int
    prev_epoch: int

    def describe(self) -> str:
        return (
            f"stream_wal_from n{self.node} e{self.epoch} v{self.first_version}..v{self.last_version}"
            f" prev e{self.prev_epoch}"
        )


@dataclass(frozen=True, slots=True)
class ResetConnection:
    """Close the peer connection to `node` (the transport reconnects as usual)."""

    node: int
    reason: str

    def describe(self) -> str:
        return f"reset_connection n{self.node} ({self.reason})"


@dataclass(frozen=True, slots=True)
class RequestArbitratorGrant:
    """Ask the arbitrator to grant or renew support for this node as master of `epoch`
    (maps to messages.ArbitratorRequest). Answered with ArbitratorGranted/ArbitratorRefused."""

    epoch: int

    def describe(self) -> str:
        return f"request_arbitrator_grant e{self.epoch}"


@dataclass(frozen=True, slots=True)
class PersistPromisedEpoch:
    """Durably record that this node adopted `epoch` for candidate `master`.

    THIS MUST BE DURABLE (fsync) BEFORE ANY Send THAT FOLLOWS IT IN THE SAME ACTION LIST IS
    WRITTEN TO A SOCKET: the Status after it tells the candidate this node will refuse older
    epochs, and a restart must not forget that promise (docs/design.md §2.3).
    """

    epoch: int
    master: int

    def describe(self) -> str:
        return f"persist_promised_epoch e{self.epoch} for n{self.master}"


@dataclass(frozen=True, slots=True)
class Log:
    """A log line; `text` already names vgroup, node and epoch."""

    level: LogLevel
    text: str

    def describe(self) -> str:
        return f"log {self.level.describe()} {self.text}"


@dataclass(frozen=True, slots=True)
class CommitAdvanced:
    """This replica's commit version rose to `version` (docs/design.md §4.4): every record up
    to it is in the log of every future master and is never truncated, so the app may archive
    (flush) it. Records above it may still be cut by a TruncateWalAfter."""

    version: int

    def describe(self) -> str:
        return f"commit_advanced v{self.version}"


@dataclass(frozen=True, slots=True)
class FlowControl:
    """Slow the app's writes down (level 1) or back to normal (level 0): a slave lags by more
    than flow_control_lag_versions (seed / issue: notify_flow_control)."""

    level: int

    def describe(self) -> str:
        return f"flow_control {self.level}"


Action = (
    Send
    | PersistRecords
    | PersistBatch
    | TruncateWalAfter
    | NotifyRole
    | ConfirmForward
    | WriteToCache
    | WriteToCacheBatch
    | StreamWalFrom
    | ResetConnection
    | RequestArbitratorGrant
    | PersistPromisedEpoch
    | Log
    | FlowControl
    | CommitAdvanced
)
