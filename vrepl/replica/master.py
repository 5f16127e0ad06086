"""The master's role: its state and what only a master does (docs/design.md §4.1, §4.3, §4.4).

Owns: `Master`: the pending-ack window of its own forwards, what it knows of each follower
(`forward.PeerProgress`: replication state, acked version, the last Commit sent), where its
epoch's own records start, flow control, and the commit bookkeeping. Its handlers: the app's
forwards, the followers' acks and sync requests, forwards past their deadline, the restore
of a follower over a sync connection, the Commit frames sent on a tick.
Must not: exist outside mastership: `Replica._become_master` creates it and
`Replica._step_down` drops it (role.py); change the role but through those; do I/O.
"""

from __future__ import annotations

from vrepl._core.window import PendingWindow
from vrepl.replica.actions import (
    ConfirmForward,
    ConfirmStatus,
    FlowControl,
    LogLevel,
    PersistBatch,
    PersistRecords,
    ResetConnection,
    Send,
    StreamWalFrom,
)
from vrepl.replica.events import AppForward, AppForwardBatch, PeerRestoreCaughtUp, PeerRestoreFailed, PeerRestoring
from vrepl.replica.forward import PeerProgress, PeerState
from vrepl.replica.host import ReplicaHost
from vrepl.replica.messages import (
    AckStatus,
    Commit,
    Forward,
    ForwardAck,
    ForwardBatch,
    Record,
    Role,
    SyncRequest,
    SyncStart,
    TruncateRequest,
)
from vrepl.replica.role import RoleState


class Master(RoleState):
    """The master of `r.promised_epoch`: its window, its followers' progress, its commits."""

    __slots__ = ("window", "peers", "epoch_first_version", "flow_level", "commit_on_confirm")

    ROLES = (Role.MASTER,)

    def __init__(self, r: ReplicaHost) -> None:
        super().__init__(r)
        cfg = r.cfg
        self.peers = {i: PeerProgress() for i in range(r.n) if i != r.me}
        self.window = PendingWindow(r.me, cfg.quorum_effective - 1, cfg.max_inflight_forwards, r.n)
        # Records inherited from older epochs need no confirmation; the window starts empty.
        self.window.ack(r.me, r.durable_version)
        self.epoch_first_version = r.last_version + 1  # the first version written in this epoch
        self.flow_level = 0
        self.commit_on_confirm = cfg.commit_follows_quorum

    def stand_down(self) -> None:
        """Stepping down: nothing pending will be confirmed ok now, and flow control ends."""
        self._confirm_range(self.window.clear(), ConfirmStatus.FAILED)
        if self.flow_level:
            self.flow_level = 0
            self.r._emit(FlowControl(0))

    def on_peer_reset(self, i: int) -> None:
        self.peers[i].state = PeerState.PROBING

    # ------------------------------------------------------------------ forwarding (§4.1)

    def on_app_forward(self, ev: AppForward) -> None:
        r = self.r
        reason = r.forward_refusal(ev.version, ev.payload)
        if reason:
            r.counters["refused_forwards"] += 1
            r._log(LogLevel.WARNING, f"refused forward: {reason}")
            r._emit(ConfirmForward(ev.version, ev.version, ConfirmStatus.FAILED))
            return
        epoch = r.promised_epoch
        prev_epoch = r.last_epoch
        record = Record(epoch, ev.version, ev.payload)
        r.history.note_append(epoch, ev.version)
        r.last_version = ev.version
        r.last_epoch = epoch
        r._emit(PersistRecords((record,)))
        fwd = Forward(epoch, ev.version, prev_epoch, epoch, ev.payload)
        self._send_forward(fwd, 1, len(ev.payload))
        self.window.add(ev.version, r.now_tick + r.cfg.forward_timeout_ticks)
        self._check_flow()

    def on_app_forward_batch(self, ev: AppForwardBatch) -> None:
        """The batched on_app_forward: one PersistBatch, one ForwardBatch per follower."""
        r = self.r
        n = len(ev.payloads)
        first, last = ev.first_version, ev.first_version + n - 1
        payloads = ev.payloads
        size_bytes = sum(map(len, payloads))
        reason = r.forward_batch_refusal(first, payloads, size_bytes)
        if reason:
            r.counters["refused_forwards"] += n
            r._log(LogLevel.WARNING, f"refused forwards v{first}..v{last}: {reason}")
            r._emit(ConfirmForward(first, last, ConfirmStatus.FAILED))
            return
        epoch = r.promised_epoch
        prev_epoch = r.last_epoch
        r.history.note_append(epoch, first)
        r.last_version = last
        r.last_epoch = epoch
        epochs = (epoch,) * n
        payloads = tuple(payloads)
        r._emit(PersistBatch(first, epochs, payloads))
        self._send_forward(ForwardBatch(epoch, first, prev_epoch, epochs, payloads), n, size_bytes)
        self.window.add_range(first, last, r.now_tick + r.cfg.forward_timeout_ticks)
        self._check_flow()

    def _send_forward(self, msg: Forward | ForwardBatch, records: int, size_bytes: int) -> None:
        """Send a new forward to every follower that replicates (§4.1: no waiting)."""
        r = self.r
        connected, nodes, counters = r.connected, r.nodes, r.counters
        for i, peer in self.peers.items():
            if peer.state == PeerState.REPLICATING and connected[i]:
                r._emit(Send(nodes[i], msg))
                peer.forwards += records
                peer.forward_bytes += size_bytes
                counters["forwards_sent"] += records
                counters["forward_bytes_sent"] += size_bytes

    def on_durable(self, version: int) -> None:
        self._confirm_range(self.window.ack(self.r.me, version), ConfirmStatus.OK)
        if not self.commit_on_confirm:
            self._commit_by_majority()

    def on_forward_ack(self, i: int, ack: ForwardAck) -> None:
        r = self.r
        if ack.epoch != r.promised_epoch:
            super().on_forward_ack(i, ack)
            return
        if ack.status != AckStatus.OK:
            r._log(LogLevel.WARNING, f"n{r.nodes[i]} answered {ack.describe()}")
            return
        if ack.acked_version > r.last_version:
            r._log(LogLevel.WARNING, f"ignored {ack.describe()} from n{r.nodes[i]}: beyond my log end")
            return
        peer = self.peers[i]
        peer.acks += 1
        peer.acked_version = max(peer.acked_version, ack.acked_version)
        r.counters["acks_received"] += 1
        self._confirm_range(self.window.ack(i, ack.acked_version), ConfirmStatus.OK)
        if not self.commit_on_confirm:
            self._commit_by_majority()
        self._check_flow()

    def on_quorum_changed(self) -> None:
        cfg = self.r.cfg
        self.commit_on_confirm = cfg.commit_follows_quorum
        self._confirm_range(self.window.set_slave_acks_needed(cfg.quorum_effective - 1), ConfirmStatus.OK)
        if not self.commit_on_confirm:
            self._commit_by_majority()

    def expire_forwards(self, now_tick: int) -> None:
        expired = self.window.expire(now_tick)
        if expired is not None:
            self.on_forward_timeout(expired)

    def on_forward_timeout(self, span: tuple[int, int]) -> None:
        r = self.r
        first, last = span
        minority = self.window.minority_first(first, last)
        r.counters["confirmed_timed_out"] += last - first + 1
        self._confirm_range(span, ConfirmStatus.TIMED_OUT)
        if minority:
            # seed 少数虚拟节点写入成功的问题: some replicas hold a write the app was told
            # failed. Reset replication so the group re-elects and every log matches again.
            r.counters["minority_resets"] += 1
            r._log(LogLevel.WARNING, f"minority write v{minority}: resetting replication")
            for i in range(r.n):
                if i != r.me and r.connected[i]:
                    r._emit(ResetConnection(r.nodes[i], f"minority write v{minority}"))
                    r._mark_offline(i, "replication reset")
            r._step_down(f"minority write v{minority}")

    def _confirm_range(self, span: tuple[int, int] | None, status: ConfirmStatus) -> None:
        """Emit one ConfirmForward for the (first, last) versions the window released."""
        if span is None:
            return
        r = self.r
        first, last = span
        if status == ConfirmStatus.OK:
            r.counters["confirmed_ok"] += last - first + 1
        elif status == ConfirmStatus.FAILED:
            r.counters["confirmed_failed"] += last - first + 1
        r._emit(ConfirmForward(first, last, status))
        if status == ConfirmStatus.OK and self.commit_on_confirm:
            # The window holds only this master's own-epoch records, and an own-epoch record
            # on a quorum commits every record below it (docs/design.md §4.4). After the
            # ConfirmForward: an app applies a record at its confirmation, then may archive it.
            r._advance_commit(last)

    def _check_flow(self) -> None:
        # Hysteresis: slow down above the limit, resume below half of it.
        # Called on every forward batch and every ack: a plain loop over the (few) peers
        # for the lowest ack, no generator (4x cheaper; same value as the max of the lags).
        r = self.r
        limit_versions = r.cfg.flow_control_lag_versions
        connected = r.connected
        lowest = None
        for i, p in self.peers.items():
            # A peer being restored is not a slow slave: the master must not slow down for it.
            if connected[i] and p.state != PeerState.RESTORING:
                acked = p.acked_version
                if lowest is None or acked < lowest:
                    lowest = acked
        lag_versions = 0 if lowest is None else r.last_version - lowest
        if self.flow_level == 0 and lag_versions > limit_versions:
            self.flow_level = 1
            r._log(LogLevel.WARNING, f"a slave lags {lag_versions} versions: flow control on")
            r._emit(FlowControl(1))
        elif self.flow_level == 1 and lag_versions <= limit_versions // 2:
            self.flow_level = 0
            r._emit(FlowControl(0))

    # ------------------------------------------------------------------ commit index (§4.4)

    def _commit_by_majority(self) -> None:
        """quorum < majority: a confirmation may be on fewer replicas than any election
        consults, so it commits nothing; the highest own-epoch version a majority holds
        durably (the master's own WAL and its followers' acks in this epoch) does, capped
        at the master's own durable log as a confirmation is."""
        r = self.r
        w = self.window
        held = sorted((w.acked_version(i) for i in range(r.n)), reverse=True)
        point = min(held[r.n // 2], r.durable_version)
        if point >= self.epoch_first_version:
            r._advance_commit(point)

    def send_commits(self) -> None:
        """On a tick: tell each replicating follower the commit version if it advanced since
        the last Commit it got (at most one small frame per follower per tick)."""
        r = self.r
        version = r.commit_version
        msg = None
        for i, peer in self.peers.items():
            if peer.commit_sent_version < version and peer.state == PeerState.REPLICATING and r.connected[i]:
                if msg is None:
                    msg = Commit(r.promised_epoch, version)
                peer.commit_sent_version = version
                r._emit(Send(r.nodes[i], msg))

    # ------------------------------------------------------------------ log matching (§4.3)

    def on_sync_request(self, i: int, req: SyncRequest) -> None:
        r = self.r
        if req.epoch != r.promised_epoch:
            super().on_sync_request(i, req)
            return
        node = r.nodes[i]
        peer = self.peers[i]
        peer.commit_sent_version = 0  # it resyncs: tell it the commit version again
        # docs/design.md §4.3: find where the follower's log stops matching mine, comparing
        # (epoch, version), never the version alone.
        common_epoch, end = r.history.end_of_epoch_at_most(req.last_epoch, r.last_version)
        if common_epoch == req.last_epoch and req.last_version <= end:
            first, last = req.last_version + 1, r.last_version
            r._emit(Send(node, SyncStart(r.promised_epoch, first, last)))
            if first <= last:
                prev = r.history.epoch_at(first - 1)
                r._emit(StreamWalFrom(node, r.promised_epoch, first, last, prev))
            peer.state = PeerState.REPLICATING
            # For lag and flow control only; confirmations wait for the follower's own acks.
            peer.acked_version = max(peer.acked_version, req.last_version)
            stream = f"streaming v{first}..v{last}" if first <= last else "nothing to stream"
            r._log(LogLevel.INFO, f"n{node} matches up to v{req.last_version}; {stream}")
            return
        keep = min(req.last_version, end)
        peer.state = PeerState.PROBING
        r._emit(Send(node, TruncateRequest(r.promised_epoch, common_epoch, keep)))
        r._log(
            LogLevel.INFO, f"n{node} has e{req.last_epoch}v{req.last_version} I lack: keep <=e{common_epoch} <=v{keep}"
        )

    # ------------------------------------------------------------------ restore of a follower (docs/restore.md)

    def on_peer_restoring(self, i: int, ev: PeerRestoring) -> None:
        if not self.r.connected[i]:
            super().on_peer_restoring(i, ev)
            return
        self.peers[i].state = PeerState.RESTORING
        self.r._log(LogLevel.INFO, f"restoring n{ev.node} over a sync connection; live forwards wait")

    def on_peer_restore_caught_up(self, i: int, ev: PeerRestoreCaughtUp) -> None:
        peer = self.peers[i]
        if peer.state != PeerState.RESTORING:
            super().on_peer_restore_caught_up(i, ev)
            return
        peer.state = PeerState.REPLICATING
        self.r._log(
            LogLevel.INFO, f"n{ev.node} restore stream covers v{self.r.last_version}: live forwards start (sync cache)"
        )

    def on_peer_restore_failed(self, i: int, ev: PeerRestoreFailed) -> None:
        r = self.r
        if not r.connected[i] or self.peers[i].state != PeerState.RESTORING:
            super().on_peer_restore_failed(i, ev)
            return
        r.counters["restores_failed"] += 1
        r._log(LogLevel.WARNING, f"restore of n{ev.node} failed: {ev.reason}; resetting its connection")
        r._emit(ResetConnection(ev.node, f"restore failed: {ev.reason}"))
        r._mark_offline(i, "restore failed")
