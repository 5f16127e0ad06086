"""The start-up configuration of one replica and the rules it must satisfy (docs/design.md §6).

Owns: `Config` (the vgroup's replica list, this node's place in it, what its WAL and promise
file hold, the limits and timeouts in ticks) and `config_invalid()`, the one-line reason a
configuration is refused.
Must not: read files or the environment; the embedding builds a Config from its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from vrepl.replica.history import history_invalid
from vrepl.replica.lease import DEFAULT_CLOCK_DRIFT_RATIO, DEFAULT_LEASE_ALLOWANCE_MS
from vrepl.replica.messages import NO_NODE


@dataclass(frozen=True)
class Config:
    """Start-up configuration of one replica. Limits have defaults listed in docs/design.md §6.

    `replicas` are node ids in the vgroup's order (host:port is the transport's business).
    `last_epoch`/`last_version`/`epoch_history` describe the local WAL: the history is the
    WAL's (epoch, first_version) pairs, rebuilt from the records' epochs, and is required for
    a non-empty log (None or () for an empty one; docs/design.md §4.3); `promised_epoch`/
    `promised_master` are the persisted promise (PersistPromisedEpoch). `quorum` 0 means a
    majority. `app_ack_required` None means "when quorum > 1" (seed 数据转发流程 step 6).
    """

    vgroup_id: int
    replicas: tuple[int, ...]
    self_index: int
    quorum: int = 0
    last_version: int = 0
    last_epoch: int = 0
    epoch_history: tuple[tuple[int, int], ...] | None = None
    promised_epoch: int = 0
    promised_master: int = NO_NODE
    arbitrator: bool = False
    tick_ms: int = 100
    heartbeat_interval_ticks: int = 5
    heartbeat_timeout_ticks: int = 20
    forward_timeout_ticks: int = 20
    arbitrator_lease_ticks: int = 20
    clock_drift_ratio: float = DEFAULT_CLOCK_DRIFT_RATIO
    lease_allowance_ms: int = DEFAULT_LEASE_ALLOWANCE_MS
    max_inflight_forwards: int = 100_000
    sync_cache_max_records: int = 100_000
    sync_cache_max_bytes: int = 64 * 1024 * 1024
    record_max_bytes: int = 16 * 1024 * 1024
    flow_control_lag_versions: int = 10_000
    app_ack_required: bool | None = None

    @property
    def quorum_effective(self) -> int:
        return self.quorum or len(self.replicas) // 2 + 1

    @property
    def arbitrator_used(self) -> bool:
        # seed Split Brain: the arbitrator only matters for an even number of replicas.
        return self.arbitrator and len(self.replicas) % 2 == 0

    @property
    def arbitrator_lease_ms(self) -> int:
        """The lease the master assumes, counted from when it sent the request."""
        return self.arbitrator_lease_ticks * self.tick_ms

    @property
    def app_ack_required_effective(self) -> bool:
        return self.quorum_effective > 1 if self.app_ack_required is None else self.app_ack_required

    @property
    def commit_follows_quorum(self) -> bool:
        """True when a confirmation (quorum) is also a majority, so "confirmed ok" is the
        commit rule; with quorum < majority the commit index counts a majority itself
        (docs/design.md §4.4)."""
        return self.quorum_effective >= len(self.replicas) // 2 + 1


def config_invalid(cfg: Config) -> str | None:
    """Why `cfg` cannot start a replica, or None."""
    n = len(cfg.replicas)
    if n < 1:
        return "replicas is empty"
    if len(set(cfg.replicas)) != n:
        return "replicas has duplicate node ids"
    if any(node < 0 for node in cfg.replicas):
        return "node ids are >= 0"
    if not 0 <= cfg.self_index < n:
        return f"self_index {cfg.self_index} not in 0..{n - 1}"
    if not 0 <= cfg.quorum <= n:
        return f"quorum {cfg.quorum} not in 1..{n} (0 = majority)"
    if cfg.last_version < 0 or cfg.last_epoch < 0:
        return "last_version and last_epoch are >= 0"
    if (cfg.last_version == 0) != (cfg.last_epoch == 0):
        return "an empty log has epoch 0 and a non-empty one an epoch >= 1"
    if cfg.epoch_history is None and cfg.last_version > 0:
        # No stand-in (docs/design.md §4.3): a guessed history makes a follower cut records it
        # shares with its master, confirmed ones included (docs/simulation.md finding 3).
        return "a non-empty log needs its epoch_history (the WAL's (epoch, first_version) pairs)"
    reason = history_invalid(cfg.epoch_history or (), cfg.last_epoch, cfg.last_version)
    if reason:
        return reason
    if cfg.promised_epoch < cfg.last_epoch:
        return f"promised_epoch {cfg.promised_epoch} is below the log's last epoch {cfg.last_epoch}"
    if cfg.promised_epoch > 0 and cfg.promised_master not in cfg.replicas:
        return f"promised_master {cfg.promised_master} is not a replica"
    for name in (
        "tick_ms",
        "heartbeat_interval_ticks",
        "heartbeat_timeout_ticks",
        "forward_timeout_ticks",
        "arbitrator_lease_ticks",
        "max_inflight_forwards",
        "sync_cache_max_records",
        "sync_cache_max_bytes",
        "record_max_bytes",
        "flow_control_lag_versions",
    ):
        if getattr(cfg, name) < 1:
            return f"{name} must be >= 1"
    if cfg.heartbeat_timeout_ticks <= cfg.heartbeat_interval_ticks:
        return "heartbeat_timeout_ticks must exceed heartbeat_interval_ticks"
    if cfg.arbitrator_used and cfg.arbitrator_lease_ticks <= cfg.heartbeat_interval_ticks:
        return "arbitrator_lease_ticks must exceed heartbeat_interval_ticks (the renewal period)"
    if type(cfg.clock_drift_ratio) not in (int, float) or not 0 <= cfg.clock_drift_ratio < 1:
        return f"clock_drift_ratio {cfg.clock_drift_ratio!r} is not in [0, 1)"
    if cfg.lease_allowance_ms < 0:
        return f"lease_allowance_ms {cfg.lease_allowance_ms} is negative"
    renewal_ms = cfg.heartbeat_interval_ticks * cfg.tick_ms
    if cfg.arbitrator_used and cfg.arbitrator_lease_ms <= renewal_ms + cfg.lease_allowance_ms:
        # docs/design.md §5: a renewal answered later than the allowance permits must still
        # find the lease live, or a healthy master would step down between two renewals.
        return (
            f"arbitrator_lease_ticks {cfg.arbitrator_lease_ticks} x tick_ms {cfg.tick_ms} = {cfg.arbitrator_lease_ms} ms"
            f" must exceed heartbeat_interval_ticks {cfg.heartbeat_interval_ticks} x tick_ms {cfg.tick_ms}"
            f" + lease_allowance_ms {cfg.lease_allowance_ms} = {renewal_ms + cfg.lease_allowance_ms} ms"
            " (the renewal period plus the allowance)"
        )
    return None
