"""A replica's side of the arbitrator: its connection, its requests and the lease it holds
(docs/design.md §2.4 rule 4, §5).

Owns: `ArbitratorLease`: whether the arbitrator is connected, the one request waiting for an
answer (epoch and the tick it was sent), when to ask again after a refusal, and the grant
this node holds, counted in ticks from when it ASKED, so that it ends here no later than at
the arbitrator, which counts from when it answered. An answer whose lease cannot back this
node's own (the margin rule, lease.py) counts as a refusal. Used only for an even replica
count with an arbitrator configured.
Must not: decide the role (the election reads `live_grant_epoch` and `asked_epoch`); do I/O.
"""

from __future__ import annotations

from vrepl.replica.actions import LogLevel, RequestArbitratorGrant
from vrepl.replica.events import ArbitratorConnected, ArbitratorGranted, ArbitratorLost, ArbitratorRefused
from vrepl.replica.host import ReplicaHost
from vrepl.replica.lease import lease_margin_refusal


class ArbitratorLease:
    """The arbitrator as one replica sees it, in ticks of that replica."""

    __slots__ = ("r", "connected", "grant_epoch", "lease_until_tick", "request", "retry_tick", "short_lease_logged_ms")

    def __init__(self, r: ReplicaHost) -> None:
        self.r = r
        self.connected = False
        self.grant_epoch = 0  # the epoch of the last grant, until it expires or is void
        self.lease_until_tick = 0
        self.request: tuple[int, int] | None = None  # (epoch, tick sent) of the unanswered request
        self.retry_tick = 0  # no new request before this tick (after a refusal)
        self.short_lease_logged_ms: int | None = None  # the arbitrator lease last warned about

    def live_grant_epoch(self) -> int:
        """The epoch of a live grant held by this node, 0 when none."""
        return self.grant_epoch if self.lease_until_tick > self.r.now_tick else 0

    def asked_epoch(self) -> int:
        """An epoch above this node's promise it asked for and has no answer yet, else 0."""
        request = self.request
        return request[0] if request is not None and request[0] > self.r.promised_epoch else 0

    def on_connected(self, ev: ArbitratorConnected) -> None:
        self.connected = True
        self.r._election_dirty = True

    def on_lost(self, ev: ArbitratorLost) -> None:
        # A granted lease stays valid until it expires: the arbitrator honours it.
        self.connected = False
        self.request = None
        self.r._election_dirty = True

    def ask(self, epoch: int) -> None:
        """Ask for (or renew) a grant of `epoch`, unless a request is out or a refusal is recent."""
        r = self.r
        if not self.connected or self.request is not None or r.now_tick < self.retry_tick:
            return
        self.request = (epoch, r.now_tick)
        r._emit(RequestArbitratorGrant(epoch))

    def on_tick(self, now_tick: int) -> None:
        if self.request is not None and now_tick - self.request[1] >= self.r.cfg.heartbeat_timeout_ticks:
            self.request = None  # unanswered: ask again
        if self.grant_epoch and self.lease_until_tick <= now_tick:
            self.grant_epoch = 0
            self.r._log(LogLevel.INFO, "arbitrator lease expired")

    def on_granted(self, ev: ArbitratorGranted) -> None:
        r = self.r
        if self.request is None or self.request[0] != ev.epoch:
            r._log(LogLevel.DEBUG, f"ignored arbitrator grant for e{ev.epoch}: not asked")
            return
        short = self._short_lease(ev.lease_ms)
        if short is not None:
            # Counting it would let this node believe in a lease the arbitrator may give to
            # another node first: the grant counts as a refusal.
            self._log_short_lease(f"arbitrator grant for e{ev.epoch} not counted", short, ev.lease_ms)
            self._refused(ev.epoch)
            return
        # The lease is counted from when we ASKED, so it ends here no later than at the
        # arbitrator, which counts from when it answered (docs/design.md §5).
        self.grant_epoch = ev.epoch
        self.lease_until_tick = self.request[1] + r.cfg.arbitrator_lease_ticks
        self.request = None
        r._election_dirty = True
        if ev.epoch > r.promised_epoch and r.truncating_to is None:
            # A candidate asked before promising (§2.4). The arbitrator's vote for this epoch
            # is mine: my own goes with it, so no other candidate can be elected in it and
            # be refused a lease for ever after ("granted to n<me>").
            r._promise(ev.epoch, r.node)

    def on_refused(self, ev: ArbitratorRefused) -> None:
        short = self._short_lease(ev.lease_ms)
        if short is not None:
            self._log_short_lease(f"arbitrator refused e{ev.epoch}", short, ev.lease_ms)
        else:
            self.r._log(LogLevel.INFO, f"arbitrator refused e{ev.epoch}")
        self._refused(ev.epoch)

    def _refused(self, epoch: int) -> None:
        self.request = None
        self.retry_tick = self.r.now_tick + self.r.cfg.heartbeat_interval_ticks
        if self.grant_epoch == epoch:
            self.grant_epoch = 0  # someone else holds a newer grant: ours is void
        self.r._election_dirty = True

    def _short_lease(self, lease_ms: int | None) -> str | None:
        """Why an arbitrator lease stated in an answer cannot back this node's lease (§5)."""
        if lease_ms is None:
            return None
        cfg = self.r.cfg
        return lease_margin_refusal(lease_ms, cfg.arbitrator_lease_ms, cfg.clock_drift_ratio, cfg.lease_allowance_ms)

    def _log_short_lease(self, what: str, reason: str, lease_ms: int | None) -> None:
        # Renewals repeat every heartbeat interval: the same reason is a warning once.
        level = LogLevel.DEBUG if lease_ms == self.short_lease_logged_ms else LogLevel.WARNING
        self.short_lease_logged_ms = lease_ms
        self.r._log(level, f"{what}: {reason}")
