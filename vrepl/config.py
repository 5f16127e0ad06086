"""Configuration of a sync instance (docs/embedding.md §Configuration).

Owns: `SyncConfig` (everything a vnode passes to start one sync instance for one vgroup),
`ReplicaAddress`, parsing of "host:port", `sync_config_invalid()` (returns why a config is
refused, or None) and the mapping to the replication core's `vrepl.replica.Config`.
Every limit has a name and a default here and in docs/embedding.md.
Must not: open files or sockets.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass

from vrepl.endpoint import parse_endpoint
from vrepl.errors import ConfigError
from vrepl.renamed import new_keywords, renamed_settings
from vrepl.replica import Config as ReplicaConfig
from vrepl.replica import config_invalid
from vrepl.replica.lease import DEFAULT_CLOCK_DRIFT_RATIO, DEFAULT_LEASE_ALLOWANCE_MS
from vrepl.wal import HEADER_SIZE

MiB = 1024 * 1024


@dataclass(frozen=True, order=True)
class ReplicaAddress:
    """One replica of the vgroup: its node id and the address of its node's TCP server."""

    node: int
    host: str
    port: int

    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def order_key(self) -> tuple:
        """The key that decides which of two nodes opens their peer connection: the lower
        (host, port) connects (seed 虚拟节点之间的网络连接: the smaller IP is the client)."""
        try:
            host_key: tuple = (0, int(ipaddress.ip_address(self.host)))
        except ValueError:
            host_key = (1, self.host)
        return (host_key, self.port)


def replica_address(item: "ReplicaAddress | tuple[int, str] | tuple[int, str, int]") -> ReplicaAddress:
    if isinstance(item, ReplicaAddress):
        return item
    if len(item) == 2:
        host, port = parse_endpoint(item[1])
        return ReplicaAddress(int(item[0]), host, port)
    return ReplicaAddress(int(item[0]), str(item[1]), int(item[2]))


# Limits renamed to `max_<what>_<unit>` (vrepl/renamed.py): {old name: new name}.
RENAMED_SYNC_SETTINGS = {
    "record_max_bytes": "max_record_bytes",
    "sync_cache_max_records": "max_sync_cache_records",
    "sync_cache_max_bytes": "max_sync_cache_bytes",
    "send_queue_max_bytes": "max_send_queue_bytes",
    "wal_max_file_bytes": "max_wal_file_bytes",
    "wal_inline_sync_max_bytes": "max_wal_inline_sync_bytes",
}


@renamed_settings(RENAMED_SYNC_SETTINGS)
@dataclass(frozen=True)
class SyncConfig:
    """One sync instance (one vgroup on one node). See docs/embedding.md for each field; the
    old names of renamed limits (RENAMED_SYNC_SETTINGS) are still accepted and readable."""

    vgroup_id: int
    replicas: tuple[ReplicaAddress, ...]
    self_index: int
    data_path: str
    secret: bytes
    quorum: int = 0  # 0 = majority
    initial_version: int = 0  # 0 = whatever the WAL holds; else must match it
    initial_epoch: int = 0
    arbitrator: str | None = None  # "host:port"; used only for an even replica count
    # time
    tick_ms: int = 100
    heartbeat_interval_ticks: int = 5
    heartbeat_timeout_ticks: int = 20
    forward_timeout_ticks: int = 20
    arbitrator_lease_ticks: int = 20
    clock_drift_ratio: float = DEFAULT_CLOCK_DRIFT_RATIO  # lease margin (docs/design.md §5)
    lease_allowance_ms: int = DEFAULT_LEASE_ALLOWANCE_MS
    reconnect_interval_ms: int = 1000
    handshake_timeout_ms: int = 5000
    # limits
    max_inflight_forwards: int = 100_000  # queued + unconfirmed forwards
    max_record_bytes: int = 16 * MiB
    max_batch_records: int = 4096  # records per ForwardBatch frame / WAL append
    max_batch_bytes: int = 1 * MiB  # payload bytes per ForwardBatch frame (one record may exceed it)
    max_sync_cache_records: int = 100_000
    max_sync_cache_bytes: int = 64 * MiB
    flow_control_lag_versions: int = 10_000
    send_queue_high_bytes: int = 8 * MiB  # above it: flow control on, streams pause
    max_send_queue_bytes: int = 64 * MiB  # above it: the peer is too slow, connection reset
    stream_chunk_bytes: int = 1 * MiB  # WAL bytes per frame when streaming to a follower
    max_wal_file_bytes: int = 64 * MiB
    # >0: a batch up to this size is made durable on the I/O thread while its group commits
    # take at most 1 ms on average (transport/storage.py INLINE_MAX_COMMIT_S); 0: never
    max_wal_inline_sync_bytes: int = 4096
    # >0: while group commits average at most this many µs (a RAM disk, a power-safe drive
    # cache), batches of any size up to 1 MiB are made durable on the I/O thread; 0: never
    max_wal_inline_commit_us: int = 100
    app_ack_required: bool | None = None  # None: when quorum > 1 (seed 数据转发流程 step 6)

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", tuple(replica_address(r) for r in self.replicas))
        if isinstance(self.secret, str):
            object.__setattr__(self, "secret", self.secret.encode())

    @property
    def me(self) -> ReplicaAddress:
        return self.replicas[self.self_index]

    @property
    def max_frame_bytes(self) -> int:
        """Largest frame accepted from a peer: one maximal record, or one full batch."""
        return max(self.max_record_bytes, self.max_batch_bytes, self.stream_chunk_bytes) + 64 * 1024

    @property
    def arbitrator_used(self) -> bool:
        return bool(self.arbitrator) and len(self.replicas) % 2 == 0

    def replica_config(self, **disk: object) -> ReplicaConfig:
        """The core's config; `disk` gives last_epoch/last_version/epoch_history/promise."""
        return ReplicaConfig(
            vgroup_id=self.vgroup_id,
            replicas=tuple(r.node for r in self.replicas),
            self_index=self.self_index,
            quorum=self.quorum,
            arbitrator=self.arbitrator_used,
            tick_ms=self.tick_ms,
            heartbeat_interval_ticks=self.heartbeat_interval_ticks,
            heartbeat_timeout_ticks=self.heartbeat_timeout_ticks,
            forward_timeout_ticks=self.forward_timeout_ticks,
            arbitrator_lease_ticks=self.arbitrator_lease_ticks,
            clock_drift_ratio=self.clock_drift_ratio,
            lease_allowance_ms=self.lease_allowance_ms,
            max_inflight_forwards=self.max_inflight_forwards,
            # the core's names until its own pass (vrepl/replica is another branch's)
            sync_cache_max_records=self.max_sync_cache_records,
            sync_cache_max_bytes=self.max_sync_cache_bytes,
            record_max_bytes=self.max_record_bytes,
            flow_control_lag_versions=self.flow_control_lag_versions,
            app_ack_required=self.app_ack_required,
            **disk,  # type: ignore[arg-type]
        )

    def replace(self, **changes: object) -> "SyncConfig":
        return dataclasses.replace(self, **new_keywords(SyncConfig, changes))


def sync_config_invalid(cfg: SyncConfig) -> str | None:
    """Why `cfg` cannot start a sync instance, or None."""
    if not 0 <= cfg.vgroup_id <= 0xFFFFFFFF:
        return f"vgroup_id {cfg.vgroup_id} not in 0..2^32-1"
    if not cfg.secret:
        return "secret (the cluster secret) is empty"
    if not cfg.data_path:
        return "data_path is empty"
    endpoints = [(r.host, r.port) for r in cfg.replicas]
    if len(set(endpoints)) != len(endpoints):
        return "two replicas share one host:port"
    if any(not 0 < r.port < 65536 for r in cfg.replicas):
        return "a replica port is not in 1..65535"
    if cfg.initial_version < 0 or cfg.initial_epoch < 0:
        return "initial_version and initial_epoch are >= 0"
    if cfg.arbitrator:
        try:
            parse_endpoint(cfg.arbitrator)
        except ConfigError as exc:
            return f"arbitrator: {exc}"
    for name in (
        "reconnect_interval_ms",
        "handshake_timeout_ms",
        "max_batch_records",
        "max_batch_bytes",
        "send_queue_high_bytes",
        "max_send_queue_bytes",
        "stream_chunk_bytes",
    ):
        if getattr(cfg, name) < 1:
            return f"{name} must be >= 1"
    if cfg.max_send_queue_bytes < cfg.send_queue_high_bytes:
        return "max_send_queue_bytes must be >= send_queue_high_bytes"
    if cfg.max_frame_bytes > 0xFFFFFFFF:
        return "max_record_bytes is too large for a frame"
    if cfg.max_wal_file_bytes < HEADER_SIZE:
        # the WAL refuses it only when start() opens it: a traceback instead of this line
        return f"max_wal_file_bytes must be >= {HEADER_SIZE} (one record header)"
    if cfg.max_wal_inline_sync_bytes < 0:
        return "max_wal_inline_sync_bytes must be >= 0 (0: off)"
    if cfg.max_wal_inline_commit_us < 0:
        return "max_wal_inline_commit_us must be >= 0 (0: off)"
    reason = config_invalid(cfg.replica_config())
    if reason is None:
        return None
    # The core still speaks the old names of the limits it checks; the user wrote the new ones.
    name, _, rest = reason.partition(" ")
    return f"{RENAMED_SYNC_SETTINGS.get(name, name)} {rest}"
