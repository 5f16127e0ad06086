"""Peer-to-peer messages of the replication protocol (docs/design.md §3).

Owns: the frozen dataclasses a replica sends to another replica of the same vgroup, the
arbitrator request/grant pair, `Role`, `AckStatus`, `PeerView` and `Record`. Fields are plain
ints, bytes and tuples of those so the transport can map each message to a fixed binary layout.
Every class has a stable one-line `describe()` used by logs and scenario tests.
Must not: do I/O, hold mutable state, or import anything outside the standard library. The
vgroup and the sender of a peer message come from the authenticated connection (the hello),
so peer messages do not repeat them (Status carries `sender` as a cross-check).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

NO_NODE = -1  # "no node" in node-id fields (promised_master before any promise)


class Role(enum.IntEnum):
    """A replica's role. OFFLINE is only ever a view of another node (seed 基本概念)."""

    OFFLINE = 0
    UNSYNCED = 1
    SYNCING = 2
    SLAVE = 3
    MASTER = 4

    def describe(self) -> str:
        return self.name.lower()


class AckStatus(enum.IntEnum):
    """Result carried by ForwardAck."""

    OK = 0
    STALE_EPOCH = 1  # the forward's epoch is older than the slave's promised epoch
    FAILED = 2  # the slave's app could not apply the record

    def describe(self) -> str:
        return self.name.lower()


def _node(node: int) -> str:
    return "-" if node == NO_NODE else f"n{node}"


@dataclass(frozen=True, slots=True)
class Record:
    """One WAL record: the epoch of the master that created it, its version, its payload.

    The payload is the already-encoded record body; the core never looks inside it.
    """

    epoch: int
    version: int
    payload: bytes

    def describe(self) -> str:
        return f"e{self.epoch}v{self.version} {len(self.payload)}B"


@dataclass(frozen=True, slots=True)
class PeerView:
    """What one node knows about one replica: its role and log end, and its promise.

    `promised_epoch`/`promised_master`: the highest epoch this replica adopted and the
    candidate it adopted it for (docs/design.md §2.3). Carried so that agreement on the next
    master includes agreement on its epoch.
    """

    role: int
    last_epoch: int
    last_version: int
    promised_epoch: int
    promised_master: int

    def describe(self) -> str:
        return (
            f"{Role(self.role).describe()} e{self.last_epoch}v{self.last_version}"
            f" p{self.promised_epoch}@{_node(self.promised_master)}"
        )


@dataclass(frozen=True, slots=True)
class Status:
    """The sender's view of every replica (ordered as the replica list), broadcast on change.

    `views[i]` for the sender itself is authoritative; the others are the sender's views,
    OFFLINE for nodes it cannot reach (seed 选主流程).
    """

    sender: int
    views: tuple[PeerView, ...]

    def describe(self) -> str:
        return f"status from {_node(self.sender)} [" + ", ".join(v.describe() for v in self.views) + "]"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Sent every heartbeat_interval ticks; carries the sender's own view so versions stay fresh."""

    view: PeerView

    def describe(self) -> str:
        return f"heartbeat {self.view.describe()}"


@dataclass(frozen=True, slots=True)
class Forward:
    """One record from the master of `epoch`.

    `prev_epoch` is the epoch of record `version - 1` in the master's log (0 for version 1):
    a slave appends only if its own last record is (prev_epoch, version - 1), which keeps
    every slave's log a prefix of the master's (docs/design.md §4.2).
    `record_epoch` is the record's own epoch: equal to `epoch` for new writes, older when the
    master streams records it inherited from earlier epochs.
    """

    epoch: int
    version: int
    prev_epoch: int
    record_epoch: int
    payload: bytes

    def describe(self) -> str:
        return (
            f"forward e{self.epoch} v{self.version} prev e{self.prev_epoch}"
            f" rec e{self.record_epoch} {len(self.payload)}B"
        )


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """Consecutive records `first_version ..` in one frame; same rules as Forward per record.

    `block`, when not empty, is the same records already encoded as WAL records (what the
    wire codec received): a follower that appends the whole batch hands it to its WAL as it
    is (PersistBatch.block). It carries no information of its own and is not compared.
    """

    epoch: int
    first_version: int
    prev_epoch: int
    record_epochs: tuple[int, ...]
    payloads: tuple[bytes, ...]
    block: bytes = field(default=b"", compare=False, repr=False)

    def forwards(self) -> tuple[Forward, ...]:
        out = []
        prev = self.prev_epoch
        for i, (rec_epoch, payload) in enumerate(zip(self.record_epochs, self.payloads)):
            out.append(Forward(self.epoch, self.first_version + i, prev, rec_epoch, payload))
            prev = rec_epoch
        return tuple(out)

    def describe(self) -> str:
        last = self.first_version + len(self.payloads) - 1
        size_bytes = sum(len(p) for p in self.payloads)
        return f"forward_batch e{self.epoch} v{self.first_version}..v{last} prev e{self.prev_epoch} {size_bytes}B"


@dataclass(frozen=True, slots=True)
class ForwardAck:
    """Slave -> master: cumulative. Every record up to `acked_version` is durable and matches."""

    epoch: int
    acked_version: int
    status: int

    def describe(self) -> str:
        return f"forward_ack e{self.epoch} v{self.acked_version} {AckStatus(self.status).describe()}"


@dataclass(frozen=True, slots=True)
class SyncRequest:
    """Follower -> master of `epoch`: my log ends at (last_epoch, last_version); make me match."""

    epoch: int
    last_epoch: int
    last_version: int

    def describe(self) -> str:
        return f"sync_request e{self.epoch} have e{self.last_epoch}v{self.last_version}"


@dataclass(frozen=True, slots=True)
class TruncateRequest:
    """Master -> follower: keep only records with epoch <= keep_epoch and version <= keep_version.

    The follower combines this with its own epoch history to find the common point, as
    Kafka's leader-epoch truncation does (docs/design.md §4.3). Repeated until logs match.
    """

    epoch: int
    keep_epoch: int
    keep_version: int

    def describe(self) -> str:
        return f"truncate_request e{self.epoch} keep <=e{self.keep_epoch} <=v{self.keep_version}"


@dataclass(frozen=True, slots=True)
class SyncStart:
    """Master -> follower: your log is a prefix of mine; records first..last will be streamed,
    then new forwards follow. The follower is a SLAVE once it holds `last_version`."""

    epoch: int
    first_version: int
    last_version: int

    def describe(self) -> str:
        return f"sync_start e{self.epoch} stream v{self.first_version}..v{self.last_version}"


@dataclass(frozen=True, slots=True)
class Commit:
    """Master of `epoch` -> a replicating follower: every version <= `version` is committed
    (docs/design.md §4.4). Sent on a tick when the master's commit version advanced beyond
    what it last sent that follower; a follower ignores a Commit of another epoch."""

    epoch: int
    version: int

    def describe(self) -> str:
        return f"commit e{self.epoch} v{self.version}"


@dataclass(frozen=True, slots=True)
class ArbitratorRequest:
    """Replica -> arbitrator: grant (or renew) support for me as master of vgroup in epoch."""

    vgroup_id: int
    node: int
    epoch: int
    lease_ms: int

    def describe(self) -> str:
        return f"arbitrator_request vg{self.vgroup_id} {_node(self.node)} e{self.epoch} lease {self.lease_ms}ms"


@dataclass(frozen=True, slots=True)
class ArbitratorGrant:
    """Arbitrator -> replica: `granted` 1 when the lease is yours, 0 when refused."""

    vgroup_id: int
    node: int
    epoch: int
    lease_ms: int
    granted: int

    def describe(self) -> str:
        verdict = "granted" if self.granted else "refused"
        return f"arbitrator_grant vg{self.vgroup_id} {_node(self.node)} e{self.epoch} lease {self.lease_ms}ms {verdict}"


PeerMessage = (
    Status | Heartbeat | Forward | ForwardBatch | ForwardAck | SyncRequest | TruncateRequest | SyncStart | Commit
)
