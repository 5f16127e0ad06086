"""What a replica reports about itself: the names of its counters, its `stats()` and its
one-line `describe()` (used by the sync instance's stats, the node's metrics and the simulator's
traces).

Owns: `COUNTERS`, `replica_stats`, `describe_replica`, and the `Observed` protocol (the
replica's state they read), so that replica.py stays a dispatcher of events to role objects.
Must not: change the replica, import replica.py (which imports this module), or do I/O.
"""

from __future__ import annotations

from typing import Protocol

from vrepl._core.window import PendingWindow
from vrepl.replica.forward import PeerProgress, SyncCache
from vrepl.replica.host import ReplicaHost
from vrepl.replica.messages import PeerView, Role


class _Views(Protocol):
    @property
    def views(self) -> list[PeerView]: ...


class Observed(ReplicaHost, Protocol):
    """ReplicaHost and the read-only views of the role's state that the report shows."""

    @property
    def elector(self) -> _Views: ...

    @property
    def master(self) -> int: ...

    @property
    def window(self) -> PendingWindow | None: ...

    @property
    def peers(self) -> dict[int, PeerProgress]: ...

    @property
    def cache(self) -> SyncCache: ...


COUNTERS = (
    "forwards_sent",
    "forward_bytes_sent",
    "acks_received",
    "confirmed_ok",
    "confirmed_timed_out",
    "confirmed_failed",
    "refused_forwards",
    "forwards_received",
    "forward_bytes_received",
    "acks_sent",
    "stale_forwards_refused",
    "resyncs",
    "truncations",
    "role_changes",
    "elections_won",
    "minority_resets",
    "restores_begun",
    "restores_ended_ok",
    "restores_failed",
    "log_rebases",
)


def replica_stats(r: Observed) -> dict[str, object]:
    """Counters and per-peer lag for the embedding app (issue 3 §6)."""
    master_peers = r.peers
    peers: dict[int, dict[str, object]] = {}
    for i, node in enumerate(r.nodes):
        if i == r.me:
            continue
        p = master_peers.get(i)
        acked = p.acked_version if p else 0
        peers[node] = {
            "online": r.connected[i],
            "role": Role(r.elector.views[i].role).describe() if r.connected[i] else "offline",
            "state": p.state.name.lower() if p else "-",
            "acked_version": acked,
            "lag_versions": r.last_version - acked if p else 0,
            "forwards": p.forwards if p else 0,
            "forward_bytes": p.forward_bytes if p else 0,
            "acks": p.acks if p else 0,
        }
    window = r.window
    return {
        "vgroup_id": r.cfg.vgroup_id,
        "node": r.node,
        "role": r.role.describe(),
        "epoch": r.promised_epoch,
        "master": r.master,
        "last_epoch": r.last_epoch,
        "last_version": r.last_version,
        "durable_version": r.durable_version,
        "pending_forwards": len(window) if window else 0,
        "sync_cache_records": len(r.cache),
        "counters": dict(r.counters),
        "peers": peers,
    }


def describe_replica(r: Observed) -> str:
    """One line: the replica, its role, epoch, log end and what it sees of the others."""
    others = []
    for i, node in enumerate(r.nodes):
        if i == r.me:
            continue
        role = Role(r.elector.views[i].role).describe() if r.connected[i] else "offline"
        others.append(f"n{node}:{role}")
    return (
        f"vg{r.cfg.vgroup_id} n{r.node} {r.role.describe()} e{r.promised_epoch}"
        f" log e{r.last_epoch}v{r.last_version} durable v{r.durable_version} " + " ".join(others)
    ).rstrip()
