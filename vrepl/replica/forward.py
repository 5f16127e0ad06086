"""Forwarding bookkeeping: the master's pending-ack window, the slave's sync cache, and
per-peer progress (docs/design.md §4).

Owns: `PendingWindow` (which versions wait for confirmation, cumulative acks per member,
deadlines in ticks), `SyncCache` (bounded buffer of forwards that arrive ahead of the log
end while a follower catches up, seed: SYNC_CACHE), `PeerProgress` (what the master knows of
one follower). Plain Python classes with small interfaces so the window can move to
`vrepl/_core` (Cython) without touching the replica.
Must not: do I/O, read a clock, or know about roles and elections.
"""

from __future__ import annotations

import enum
from collections import deque

from vrepl.replica.invariant import invariant
from vrepl.replica.messages import Forward


class PendingWindow:
    """Versions forwarded by the master and not yet confirmed, oldest first.

    A version is confirmed once the master's own WAL is durable up to it (member
    `self_member`) AND `slave_acks_needed` other members acked up to it. Acks are cumulative
    by version and versions are added in order, so the confirmed set is always a prefix.
    """

    __slots__ = ("_self_member", "_needed", "_limit", "_pending", "_acked")

    def __init__(self, self_member: int, slave_acks_needed: int, limit: int) -> None:
        invariant(slave_acks_needed >= 0, "acks needed is quorum - 1 >= 0")
        invariant(limit >= 1, "the window needs room for one forward")
        self._self_member = self_member
        self._needed = slave_acks_needed
        self._limit = limit
        self._pending: deque[tuple[int, int]] = deque()  # (version, deadline_tick)
        self._acked: dict[int, int] = {}  # member -> highest acked version

    def __len__(self) -> int:
        return len(self._pending)

    def full(self) -> bool:
        return len(self._pending) >= self._limit

    def first_version(self) -> int | None:
        return self._pending[0][0] if self._pending else None

    def add(self, version: int, deadline_tick: int) -> None:
        invariant(not self.full(), "caller checks full() before add()")
        invariant(not self._pending or version == self._pending[-1][0] + 1, "forwards are added in version order")
        self._pending.append((version, deadline_tick))

    def acked_version(self, member: int) -> int:
        return self._acked.get(member, 0)

    def slaves_acked(self, version: int) -> int:
        """How many members other than the master acked `version` or later."""
        return sum(1 for m, v in self._acked.items() if m != self._self_member and v >= version)

    def ack(self, member: int, up_to_version: int) -> list[int]:
        """Record a cumulative ack; return the versions it confirms, in order."""
        if up_to_version <= self._acked.get(member, 0):
            return []  # acks can arrive late or repeated; cumulative, so nothing new
        self._acked[member] = up_to_version
        point = self._confirm_point()
        confirmed = []
        while self._pending and self._pending[0][0] <= point:
            confirmed.append(self._pending.popleft()[0])
        return confirmed

    def expire(self, now_tick: int) -> list[int]:
        """Remove and return versions whose deadline passed (deadlines grow with versions)."""
        expired = []
        while self._pending and self._pending[0][1] <= now_tick:
            expired.append(self._pending.popleft()[0])
        return expired

    def clear(self) -> list[int]:
        """Remove and return every pending version (the master stepped down)."""
        out = [v for v, _ in self._pending]
        self._pending.clear()
        return out

    def _confirm_point(self) -> int:
        own = self._acked.get(self._self_member, 0)
        if self._needed == 0:
            return own
        others = sorted((v for m, v in self._acked.items() if m != self._self_member), reverse=True)
        if len(others) < self._needed:
            return 0
        return min(own, others[self._needed - 1])


class SyncCache:
    """Forwards that arrived ahead of the follower's log end, keyed by version.

    Bounded by record count and payload bytes; `add` returns a reason string when it refuses.
    """

    __slots__ = ("_max_records", "_max_bytes", "_by_version", "_bytes")

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._by_version: dict[int, Forward] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._by_version)

    def add(self, fwd: Forward) -> str | None:
        if fwd.version in self._by_version:
            return None
        if len(self._by_version) >= self._max_records:
            return f"sync cache holds {self._max_records} records (sync_cache_max_records)"
        if self._bytes + len(fwd.payload) > self._max_bytes:
            return f"sync cache would exceed {self._max_bytes} bytes (sync_cache_max_bytes)"
        self._by_version[fwd.version] = fwd
        self._bytes += len(fwd.payload)
        return None

    def pop(self, version: int) -> Forward | None:
        fwd = self._by_version.pop(version, None)
        if fwd is not None:
            self._bytes -= len(fwd.payload)
        return fwd

    def drop_through(self, version: int) -> None:
        """Forget cached forwards at or below `version` (already in the log)."""
        for v in [v for v in self._by_version if v <= version]:
            self.pop(v)

    def clear(self) -> None:
        self._by_version.clear()
        self._bytes = 0


class PeerState(enum.IntEnum):
    PROBING = 0  # waiting for the follower's SyncRequest, or for its truncation
    REPLICATING = 1  # log matched: gets every new forward (and a stream of what it lacks)


class PeerProgress:
    """What the master knows about one follower, plus per-peer counters."""

    __slots__ = ("state", "acked_version", "forwards", "forward_bytes", "acks")

    def __init__(self) -> None:
        self.state = PeerState.PROBING
        self.acked_version = 0
        self.forwards = 0
        self.forward_bytes = 0
        self.acks = 0
