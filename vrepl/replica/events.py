"""Events: everything that happens to a replica, fed in through `Replica.step(event)`.

Owns: one frozen dataclass per I/O completion or outside happening (a peer connected, a
message arrived, the WAL became durable, the arbitrator answered, ...). Time is not an
event class: the transport calls `Replica.tick()` every `tick_ms`.
Must not: do I/O or carry behaviour; each class only has a stable one-line `describe()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from vrepl.replica.messages import AckStatus, PeerMessage


@dataclass(frozen=True, slots=True)
class PeerConnected:
    """The peer connection to `node` for this vgroup completed its hello."""

    node: int

    def describe(self) -> str:
        return f"peer_connected n{self.node}"


@dataclass(frozen=True, slots=True)
class PeerDisconnected:
    """The peer connection to `node` closed (either side, any reason)."""

    node: int

    def describe(self) -> str:
        return f"peer_disconnected n{self.node}"


@dataclass(frozen=True, slots=True)
class Received:
    """A whole, decoded message arrived from `node` over the authenticated peer connection."""

    node: int
    message: PeerMessage

    def describe(self) -> str:
        return f"received n{self.node} {self.message.describe()}"


@dataclass(frozen=True, slots=True)
class AppForward:
    """The app asks the master to write and replicate the record `version` (strictly in order).

    `payload` is the encoded record body without an epoch; the replica stamps its epoch.
    A refused forward (not master, a limit) does not consume the version: retry it.
    """

    version: int
    payload: bytes

    def describe(self) -> str:
        return f"app_forward v{self.version} {len(self.payload)}B"


@dataclass(frozen=True, slots=True)
class AppForwardBatch:
    """The app's forwards `first_version ..` (consecutive), handled as one: one PersistBatch,
    one ForwardBatch per follower, one window entry. The hot path of the sync instance.
    A refused batch (not master, a limit) consumes none of its versions."""

    first_version: int
    payloads: tuple[bytes, ...]

    def describe(self) -> str:
        last = self.first_version + len(self.payloads) - 1
        return f"app_forward_batch v{self.first_version}..v{last} {sum(map(len, self.payloads))}B"


@dataclass(frozen=True, slots=True)
class AppRecover:
    """The app asks a follower to match its log with the master again (sync instance
    recover()); a master or a node without a master ignores it with a logged reason."""

    def describe(self) -> str:
        return "app_recover"


@dataclass(frozen=True, slots=True)
class WalPersisted:
    """The local WAL is durable up to `up_to_version` (cumulative). After a TruncateDone,
    only records appended after the truncation are reported."""

    up_to_version: int

    def describe(self) -> str:
        return f"wal_persisted v{self.up_to_version}"


@dataclass(frozen=True, slots=True)
class AppAcked:
    """A slave's app applied and persisted every record up to `version` (seed 数据转发流程 step 5)."""

    version: int
    status: int = AckStatus.OK

    def describe(self) -> str:
        return f"app_acked v{self.version} {AckStatus(self.status).describe()}"


@dataclass(frozen=True, slots=True)
class ArbitratorConnected:
    def describe(self) -> str:
        return "arbitrator_connected"


@dataclass(frozen=True, slots=True)
class ArbitratorLost:
    def describe(self) -> str:
        return "arbitrator_lost"


@dataclass(frozen=True, slots=True)
class ArbitratorGranted:
    """The arbitrator granted (or renewed) its support for this node as master of `epoch`,
    answering the oldest outstanding RequestArbitratorGrant. `lease_ms` is the arbitrator's
    lease as its answer states it (None: not known; the replica then trusts the grant)."""

    epoch: int
    lease_ms: int | None = None

    def describe(self) -> str:
        lease = "" if self.lease_ms is None else f" lease {self.lease_ms}ms"
        return f"arbitrator_granted e{self.epoch}{lease}"


@dataclass(frozen=True, slots=True)
class ArbitratorRefused:
    """The arbitrator supports another node (or a newer epoch) for this vgroup, or its lease
    is too short for the lease asked (docs/design.md §5). `lease_ms` as for ArbitratorGranted."""

    epoch: int
    lease_ms: int | None = None

    def describe(self) -> str:
        lease = "" if self.lease_ms is None else f" lease {self.lease_ms}ms"
        return f"arbitrator_refused e{self.epoch}{lease}"


@dataclass(frozen=True, slots=True)
class TruncateDone:
    """The WAL executed TruncateWalAfter: the log now ends at (last_epoch, last_version)."""

    last_epoch: int
    last_version: int

    def describe(self) -> str:
        return f"truncate_done e{self.last_epoch}v{self.last_version}"


@dataclass(frozen=True, slots=True)
class RestoreFinished:
    """A file/WAL restore replaced the local state; the log now ends at (last_epoch,
    last_version) with the given epoch history ((epoch, first_version), ...), which a
    non-empty log must have (docs/design.md §4.3)."""

    last_epoch: int
    last_version: int
    epoch_history: tuple[tuple[int, int], ...] = ()

    def describe(self) -> str:
        return f"restore_finished e{self.last_epoch}v{self.last_version}"


@dataclass(frozen=True, slots=True)
class PeerRestoring:
    """Master: the transport runs the restore flow for `node` over a sync connection
    (docs/restore.md): no live forwards go to it until PeerRestoreCaughtUp."""

    node: int

    def describe(self) -> str:
        return f"peer_restoring n{self.node}"


@dataclass(frozen=True, slots=True)
class PeerRestoreCaughtUp:
    """Master: the restore's WAL stream to `node` is nearly drained; live forwards start now
    (seed SYNC_CACHE). The stream covers every version up to the master's log end at this
    event; forwards of later versions go over the peer connection."""

    node: int

    def describe(self) -> str:
        return f"peer_restore_caught_up n{self.node}"


@dataclass(frozen=True, slots=True)
class PeerRestoreFailed:
    """Master: the restore session to `node` failed; its peer connection is reset so it
    starts over from a fresh SyncRequest."""

    node: int
    reason: str

    def describe(self) -> str:
        return f"peer_restore_failed n{self.node} ({self.reason})"


@dataclass(frozen=True, slots=True)
class RestoreBegun:
    """Follower: the master `node` of `epoch` opened a restore session to this node. While
    it runs the follower stays syncing even when its log reaches the sync target."""

    node: int
    epoch: int

    def describe(self) -> str:
        return f"restore_begun n{self.node} e{self.epoch}"


@dataclass(frozen=True, slots=True)
class LogRebased:
    """Follower: the restore's files phase installed archived files holding every version up
    to `last_version` (written in `last_epoch`), beyond this node's log end; the WAL was
    reset to start after it. `epoch_history` is the master's, up to last_version."""

    last_epoch: int
    last_version: int
    epoch_history: tuple[tuple[int, int], ...] = ()

    def describe(self) -> str:
        return f"log_rebased e{self.last_epoch}v{self.last_version}"


@dataclass(frozen=True, slots=True)
class RestoredRecords:
    """Follower: whole records from the restore's WAL stream (the master's WAL, in order),
    handled like a forward batch of the master `node`."""

    node: int
    batch: PeerMessage

    def describe(self) -> str:
        return f"restored_records n{self.node} {self.batch.describe()}"


@dataclass(frozen=True, slots=True)
class RestoreEnded:
    """Follower: the restore session ended; `ok` False resyncs with `reason`."""

    node: int
    ok: bool
    reason: str = ""

    def describe(self) -> str:
        return f"restore_ended n{self.node} {'ok' if self.ok else 'failed: ' + self.reason}"


Event = (
    PeerConnected
    | PeerDisconnected
    | Received
    | AppForward
    | AppForwardBatch
    | AppRecover
    | WalPersisted
    | AppAcked
    | ArbitratorConnected
    | ArbitratorLost
    | ArbitratorGranted
    | ArbitratorRefused
    | TruncateDone
    | RestoreFinished
    | PeerRestoring
    | PeerRestoreCaughtUp
    | PeerRestoreFailed
    | RestoreBegun
    | LogRebased
    | RestoredRecords
    | RestoreEnded
)
