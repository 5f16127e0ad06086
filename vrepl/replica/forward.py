"""Forwarding bookkeeping: the master's pending-ack window, the slave's sync cache, and
per-peer progress (docs/design.md §4).

Owns: `PendingWindowModel`, the plain-Python reference of the pending-ack window (which
versions wait for confirmation, cumulative acks per member, deadlines in ticks; the replica
uses its C twin `vrepl._core.window.PendingWindow`), `SyncCache` (bounded buffer of forwards that arrive ahead of the log
end while a follower catches up, seed: SYNC_CACHE), `PeerProgress` (what the master knows of
one follower). Plain Python classes with small interfaces.
Must not: do I/O, read a clock, or know about roles and elections.
"""

from __future__ import annotations

import enum
from collections import deque

from vrepl.replica.invariant import invariant
from vrepl.replica.messages import Forward


class PendingWindowModel:
    """Plain-Python reference of `vrepl._core.window.PendingWindow` (the one the replica uses).

    Versions forwarded by the master and not yet confirmed, oldest first. A version is
    confirmed once the master's own WAL is durable up to it (member `self_member`) AND
    `slave_acks_needed` other members acked up to it. Acks are cumulative by version and
    versions are added in order, so what is confirmed or expires is always a prefix, returned
    as one (first, last) range. Kept simple and obviously right: tests/unit/test_codec_window.py
    checks the C window against it on random operation sequences.
    """

    __slots__ = ("self_member", "slave_acks_needed", "limit", "_pending", "_acked")

    def __init__(self, self_member: int, slave_acks_needed: int, limit: int, members: int = 64) -> None:
        invariant(slave_acks_needed >= 0, "acks needed is quorum - 1 >= 0")
        invariant(limit >= 1, "the window needs room for one forward")
        self.self_member = self_member
        self.slave_acks_needed = slave_acks_needed
        self.limit = limit
        self._pending: deque[tuple[int, int]] = deque()  # (version, deadline_tick)
        self._acked: dict[int, int] = {}  # member -> highest acked version

    def __len__(self) -> int:
        return len(self._pending)

    def full(self, n: int = 1) -> bool:
        return len(self._pending) + n > self.limit

    def first_version(self) -> int | None:
        return self._pending[0][0] if self._pending else None

    def last_version(self) -> int | None:
        return self._pending[-1][0] if self._pending else None

    def add(self, version: int, deadline_tick: int) -> None:
        self.add_range(version, version, deadline_tick)

    def add_range(self, first: int, last: int, deadline_tick: int) -> None:
        invariant(not self.full(last - first + 1), "caller checks full() before add")
        for version in range(first, last + 1):
            invariant(not self._pending or version == self._pending[-1][0] + 1, "forwards are added in version order")
            self._pending.append((version, deadline_tick))

    def acked_version(self, member: int) -> int:
        return self._acked.get(member, 0)

    def slaves_acked(self, version: int) -> int:
        """How many members other than the master acked `version` or later."""
        return sum(1 for m, v in self._acked.items() if m != self.self_member and v >= version)

    def _pop_through(self, point: int) -> tuple[int, int] | None:
        out = []
        while self._pending and self._pending[0][0] <= point:
            out.append(self._pending.popleft()[0])
        return (out[0], out[-1]) if out else None

    def ack(self, member: int, up_to_version: int) -> tuple[int, int] | None:
        """Record a cumulative ack; return the (first, last) versions it confirms, or None."""
        if up_to_version <= self._acked.get(member, 0):
            return None  # acks can arrive late or repeated; cumulative, so nothing new
        self._acked[member] = up_to_version
        return self._pop_through(self._confirm_point())

    def expire(self, now_tick: int) -> tuple[int, int] | None:
        """Remove and return versions whose deadline passed (deadlines grow with versions)."""
        point = 0
        for version, deadline_tick in self._pending:
            if deadline_tick > now_tick:
                break
            point = version
        return self._pop_through(point)

    def clear(self) -> tuple[int, int] | None:
        """Remove and return every pending version (the master stepped down)."""
        return self._pop_through(self._pending[-1][0]) if self._pending else None

    def set_slave_acks_needed(self, needed: int) -> tuple[int, int] | None:
        self.slave_acks_needed = needed
        return self._pop_through(self._confirm_point())

    def minority_first(self, first: int, last: int) -> int:
        needed = self.slave_acks_needed
        for v in range(first, last + 1):
            if 0 < self.slaves_acked(v) < needed:
                return v
        return 0

    def _confirm_point(self) -> int:
        own = self._acked.get(self.self_member, 0)
        if self.slave_acks_needed == 0:
            return own
        others = sorted((v for m, v in self._acked.items() if m != self.self_member), reverse=True)
        if len(others) < self.slave_acks_needed:
            return 0
        return min(own, others[self.slave_acks_needed - 1])


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
    RESTORING = 2  # log matched, being restored over a sync connection: no live forwards yet


class PeerProgress:
    """What the master knows about one follower, plus per-peer counters."""

    __slots__ = ("state", "acked_version", "commit_sent_version", "forwards", "forward_bytes", "acks")

    def __init__(self) -> None:
        self.state = PeerState.PROBING
        self.acked_version = 0
        self.commit_sent_version = 0  # the last Commit version sent to it since it (re)synced
        self.forwards = 0
        self.forward_bytes = 0
        self.acks = 0
