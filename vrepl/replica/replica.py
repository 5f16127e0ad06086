"""The replication state machine of one vgroup on one node (docs/design.md).

Owns: `Replica`: what every role shares (the promise, the local log's end and epoch history,
the commit index, the view of every replica and the connections, counters), the dispatch of
events and messages, the election's decisions and the role transitions. The role's own state
and handlers are a role object (role.py): `Master` (master.py) or `Follower` (follower.py),
or `Unsynced`; it is created and dropped only by the `_become_*` transitions here, so no
master state exists while following and no follower state while master. The arbitrator
lease is arbitration.py's.
Events go in through `step(event)` and `tick()`; a list of actions comes out, to be executed
in order (see the ORDERING CONTRACT in vrepl/replica/actions.py).
Must not: open sockets, read a clock, sleep, use randomness or threads, or raise for expected
conditions (stale or unexpected messages are ignored with a logged reason). A broken
invariant raises InvariantViolation: that is a bug.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from vrepl._core.window import PendingWindow
from vrepl.replica.actions import (
    Action,
    CommitAdvanced,
    Log,
    LogLevel,
    NotifyRole,
    PersistPromisedEpoch,
    ResetConnection,
    Send,
)
from vrepl.replica.arbitration import ArbitratorLease
from vrepl.replica.config import Config, config_invalid
from vrepl.replica.electing import Elector
from vrepl.replica.events import (
    AppAcked,
    AppForward,
    AppForwardBatch,
    AppRecover,
    ArbitratorConnected,
    ArbitratorGranted,
    ArbitratorLost,
    ArbitratorRefused,
    Event,
    LogRebased,
    PeerConnected,
    PeerDisconnected,
    PeerRestoreCaughtUp,
    PeerRestoreFailed,
    PeerRestoring,
    Received,
    RestoreBegun,
    RestoredRecords,
    RestoreEnded,
    RestoreFinished,
    TruncateDone,
    WalPersisted,
)
from vrepl.replica.follower import Follower
from vrepl.replica.forward import PeerProgress, SyncCache
from vrepl.replica.history import EpochHistory, history_invalid
from vrepl.replica.invariant import InvariantViolation, invariant
from vrepl.replica.master import Master
from vrepl.replica.messages import (
    NO_NODE,
    AckStatus,
    Commit,
    Forward,
    ForwardAck,
    ForwardBatch,
    Heartbeat,
    PeerView,
    Role,
    Status,
    SyncRequest,
    SyncStart,
    TruncateRequest,
)
from vrepl.replica.report import COUNTERS, describe_replica, replica_stats
from vrepl.replica.role import RoleState, Unsynced

__all__ = ["Config", "Replica", "config_invalid"]


_NO_CACHE = SyncCache(0, 0)  # what `cache` shows outside the follower role: holds nothing


class Replica:
    """One vgroup's replication state machine on one node. Call start() once, then step()
    for every event and tick() every tick_ms; execute the returned actions in order."""

    def __init__(self, config: Config) -> None:
        reason = config_invalid(config)
        if reason:
            raise ValueError(f"invalid replica config: {reason}")
        self.cfg = config
        self.nodes: tuple[int, ...] = tuple(config.replicas)
        self.n = len(self.nodes)
        self.me = config.self_index
        self.node = self.nodes[self.me]
        self._index = {node: i for i, node in enumerate(self.nodes)}
        self._started = False
        self._out: list[Action] = []
        self.now_tick = 0

        # Promise (persisted) and role.
        self.promised_epoch = config.promised_epoch
        self.promised_master = config.promised_master
        # A promise to ITSELF read back from disk is never reused (docs/design.md §2.3): as
        # master of that epoch this node may have written records that its WAL lost with an
        # un-fsynced tail while a slave kept them, so its log cannot show that the epoch is
        # in use. It must announce a new epoch (found by the simulator, seed 195).
        self._own_promise_from_disk = config.promised_epoch > 0 and config.promised_master == self.node
        self._role = Role.UNSYNCED
        self._state: RoleState = Unsynced(self)  # changed only by the _become_* transitions
        # The master's pending-ack window, None outside mastership: a plain attribute that
        # _enter() keeps equal to the role object's, not a property, because the app thread
        # reads it for flow control on every forward (docs/benchmarks.md §One driver).
        self.window: PendingWindow | None = None

        # Local log.
        self.last_epoch = config.last_epoch
        self.last_version = config.last_version
        self.history = EpochHistory(config.epoch_history or ())  # config_invalid: exact, or an empty log
        self.durable_version = config.last_version  # the WAL we start from is on disk
        # The app may have persisted less than the WAL holds (docs/vnode.md §9.3).
        self.app_acked_version = (
            config.last_version
            if config.app_acked_version is None
            else min(config.app_acked_version, config.last_version)
        )
        self.truncating_to: int | None = None  # a TruncateWalAfter not yet done (any role)
        # Commit index (docs/design.md §4.4): every version <= commit_version is in the log of
        # every future master, so it is never truncated and the app may archive it. Never
        # decreases within a run; 0 after a restart (the app keeps its own archived version).
        self.commit_version = 0

        # The connections to the others (index = position in the replica list); what they
        # report and the election are the Elector's.
        self.connected = [False] * self.n
        self.last_heard_tick = [0] * self.n
        self.elector = Elector(self)
        self.arbitrator_lease = ArbitratorLease(self)  # even replica counts only

        self._status_dirty = False
        self._election_dirty = False
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._handlers: dict[type, Callable[..., None]] = {
            PeerConnected: self.on_peer_connected,
            PeerDisconnected: self.on_peer_disconnected,
            Received: self.on_received,
            AppForward: self._to_role("on_app_forward"),
            AppForwardBatch: self.on_app_forward_batch,
            AppRecover: self._to_role("on_app_recover"),
            WalPersisted: self.on_wal_persisted,
            AppAcked: self.on_app_acked,
            ArbitratorConnected: self.arbitrator_lease.on_connected,
            ArbitratorLost: self.arbitrator_lease.on_lost,
            ArbitratorGranted: self.arbitrator_lease.on_granted,
            ArbitratorRefused: self.arbitrator_lease.on_refused,
            TruncateDone: self.on_truncate_done,
            RestoreFinished: self.on_restore_finished,
            # The restore (docs/restore.md): the master's and the follower's side.
            PeerRestoring: self._to_role("on_peer_restoring", "peer_restoring"),
            PeerRestoreCaughtUp: self._to_role("on_peer_restore_caught_up", "peer_restore_caught_up"),
            PeerRestoreFailed: self._to_role("on_peer_restore_failed", "peer_restore_failed"),
            RestoreBegun: self._to_role("on_restore_begun", "restore_begun"),
            LogRebased: self._to_role("on_log_rebased"),
            RestoredRecords: self._to_role("on_restored_records", "restored_records"),
            RestoreEnded: self._to_role("on_restore_ended"),
        }
        self._message_handlers: dict[type, Callable[..., None]] = {
            Status: self.elector.on_status,
            Heartbeat: self.elector.on_heartbeat,
            Forward: self.on_forward,
            ForwardBatch: self.on_forward_batch,
            ForwardAck: self._to_role("on_forward_ack"),
            SyncRequest: self._to_role("on_sync_request"),
            TruncateRequest: self._to_role("on_truncate_request"),
            SyncStart: self._to_role("on_sync_start"),
            Commit: self._to_role("on_commit"),
        }

    # ------------------------------------------------------------------ public API

    def start(self) -> list[Action]:
        """First evaluation (a single replica becomes master here)."""
        invariant(not self._started, "start() is called once")
        self._started = True
        self._out = []
        self._log(LogLevel.INFO, f"start e{self.last_epoch}v{self.last_version} history {self.history.describe()}")
        self._election_dirty = True
        return self._finish()

    def step(self, event: Event) -> list[Action]:
        invariant(self._started, "start() before step()")
        self._out = []
        handler = self._handlers.get(type(event))
        if handler is None:
            raise InvariantViolation(f"unknown event type {type(event).__name__}")
        handler(event)
        return self._finish()

    def tick(self) -> list[Action]:
        invariant(self._started, "start() before tick()")
        self._out = []
        self.now_tick += 1
        self.on_tick()
        return self._finish()

    def set_quorum(self, quorum: int) -> list[Action]:
        """Change the quorum (reconfig). 0 means a majority. Returns actions to execute (a
        master may confirm pending forwards at once when the quorum goes down)."""
        invariant(self._started, "start() before set_quorum()")
        self._out = []
        cfg = dataclasses.replace(self.cfg, quorum=quorum)
        reason = config_invalid(cfg)
        invariant(reason is None, f"set_quorum: {reason}")
        self.cfg = cfg
        self._log(LogLevel.INFO, f"quorum is now {cfg.quorum_effective}")
        self._state.on_quorum_changed()
        return self._finish()

    def view(self) -> PeerView:
        """This replica's own view of itself."""
        return PeerView(self._role, self.last_epoch, self.last_version, self.promised_epoch, self.promised_master)

    def forward_refusal(self, version: int, payload: bytes) -> str | None:
        """Why the master cannot take this forward now, or None."""
        if version != self.last_version + 1:
            return f"v{version} is not the next version v{self.last_version + 1}"
        if len(payload) > self.cfg.record_max_bytes:
            return f"{len(payload)} bytes exceeds record_max_bytes {self.cfg.record_max_bytes}"
        window = self.window
        if window is not None and window.full():
            return f"{len(window)} forwards in flight (max_inflight_forwards)"
        return None

    def forward_batch_refusal(
        self, first_version: int, payloads: tuple[bytes, ...], size_bytes: int | None = None
    ) -> str | None:
        """Why the master cannot take this batch of forwards now, or None. `size_bytes`, when
        given, is the payloads' total length (the caller has it): no record of a batch
        that small can be too big, so the per-record check is skipped."""
        if first_version != self.last_version + 1:
            return f"v{first_version} is not the next version v{self.last_version + 1}"
        if size_bytes is None or size_bytes > self.cfg.record_max_bytes:
            biggest = max(map(len, payloads))
            if biggest > self.cfg.record_max_bytes:
                return f"{biggest} bytes exceeds record_max_bytes {self.cfg.record_max_bytes}"
        window = self.window
        if window is not None and window.full(len(payloads)):
            return f"{len(window)} + {len(payloads)} forwards in flight (max_inflight_forwards)"
        return None

    def stats(self) -> dict[str, object]:
        """Counters and per-peer lag for the embedding app (issue 3 §6; report.py)."""
        return replica_stats(self)

    def describe(self) -> str:
        return describe_replica(self)

    # ------------------------------------------------------------------ read-only views of the role's state

    @property
    def role(self) -> Role:
        return self._role

    @property
    def master(self) -> int:
        """The node followed, this node itself as master, else NO_NODE."""
        state = self._state
        if type(state) is Follower:
            return state.master_node
        return self.node if type(state) is Master else NO_NODE

    @property
    def peers(self) -> dict[int, PeerProgress]:
        """The master's progress of each follower, by replica index; empty outside mastership."""
        state = self._state
        return state.peers if type(state) is Master else {}

    @property
    def sync_started(self) -> bool:
        state = self._state
        return state.sync_started if type(state) is Follower else False

    @property
    def matched_version(self) -> int:
        state = self._state
        return state.matched_version if type(state) is Follower else 0

    @property
    def restoring(self) -> bool:
        """A restore session from the master runs (docs/restore.md); only while following."""
        state = self._state
        return state.restoring if type(state) is Follower else False

    @property
    def cache(self) -> SyncCache:
        state = self._state
        return state.cache if type(state) is Follower else _NO_CACHE

    @property
    def views(self) -> list[PeerView]:
        """This node's view of each replica, by index (its own entry is not kept current: view())."""
        return self.elector.views

    @property
    def grant_epoch(self) -> int:
        return self.arbitrator_lease.grant_epoch

    @property
    def lease_until_tick(self) -> int:
        return self.arbitrator_lease.lease_until_tick

    # ------------------------------------------------------------------ connections

    def on_peer_connected(self, ev: PeerConnected) -> None:
        i = self._peer_index(ev.node, "peer_connected")
        if i is None:
            return
        self.connected[i] = True
        self.last_heard_tick[i] = self.now_tick
        self.elector.peer_connected(i)
        self._state.on_peer_reset(i)
        self._log(LogLevel.INFO, f"peer n{ev.node} connected")
        self._status_dirty = True
        self._election_dirty = True

    def on_peer_disconnected(self, ev: PeerDisconnected) -> None:
        i = self._peer_index(ev.node, "peer_disconnected")
        if i is None or not self.connected[i]:
            return
        self._mark_offline(i, "connection closed")

    def _mark_offline(self, i: int, why: str) -> None:
        self.connected[i] = False
        self.elector.peer_offline(i)
        self._state.on_peer_reset(i)
        self._log(LogLevel.INFO, f"peer n{self.nodes[i]} offline: {why}")
        self._status_dirty = True
        self._election_dirty = True

    def on_received(self, ev: Received) -> None:
        i = self._peer_index(ev.node, "message")
        if i is None:
            return
        msg = ev.message
        if not self.connected[i]:
            self._log(LogLevel.DEBUG, f"ignored {msg.describe()} from n{ev.node}: not connected")
            return
        self.last_heard_tick[i] = self.now_tick
        handler = self._message_handlers.get(type(msg))
        if handler is None:
            self._log(LogLevel.WARNING, f"ignored unknown message {type(msg).__name__} from n{ev.node}")
            return
        handler(i, msg)

    # ------------------------------------------------------------------ the promise and role transitions (the only writers of both)

    def _promise(self, epoch: int, master: int) -> None:
        invariant(epoch > self.promised_epoch, "a promise only moves to a newer epoch")
        self._own_promise_from_disk = False
        self.promised_epoch = epoch
        self.promised_master = master
        self._emit(PersistPromisedEpoch(epoch, master))
        self._status_dirty = True

    def _enter(self, state: RoleState) -> None:
        """Drop the current role object for `state`; the caller then sets the role."""
        self._state.left = True
        self._state = state
        self.window = state.window if type(state) is Master else None

    def _set_role(self, role: Role) -> None:
        invariant(role in self._state.ROLES, f"role {role.describe()} goes with a {type(self._state).__name__} object")
        if role == self._role:
            return
        self._role = role
        self.counters["role_changes"] += 1
        self._emit(NotifyRole(role, self.promised_epoch, self.master))
        self._status_dirty = True

    def _become_master(self) -> None:
        invariant(self.promised_master == self.node, "a master holds its own promise")
        invariant(self.promised_epoch > self.last_epoch, "a master's epoch is newer than every record it has")
        invariant(type(self._state) is not Master, "a master does not become master again")
        self._enter(Master(self))
        self.counters["elections_won"] += 1
        self._set_role(Role.MASTER)
        self._log(LogLevel.INFO, f"became master at e{self.last_epoch}v{self.last_version}")

    def _step_down(self, reason: str) -> None:
        master = self._state
        if type(master) is not Master:
            raise InvariantViolation("only a master steps down")
        master.stand_down()
        self._enter(Unsynced(self))
        self._log(LogLevel.WARNING, f"master steps down: {reason}")
        self._set_role(Role.UNSYNCED)

    def _become_follower(self, master_node: int) -> None:
        invariant(type(self._state) is not Master, "a master steps down before it follows")
        follower = Follower(self, master_node)
        self._enter(follower)
        self._set_role(Role.SYNCING)
        follower.send_sync_request("following a new master")

    def _become_syncing(self) -> None:
        self._set_role(Role.SYNCING)  # a follower's own: _set_role checks it is one

    def _become_slave(self) -> None:
        self._set_role(Role.SLAVE)  # a follower's own: _set_role checks it is one

    def _become_unsynced(self, reason: str) -> None:
        invariant(type(self._state) is Follower, "a follower becomes unsynced (a master steps down)")
        self._enter(Unsynced(self))
        self._log(LogLevel.INFO, f"unsynced: {reason}")
        self._set_role(Role.UNSYNCED)

    # ------------------------------------------------------------------ ticks

    def on_tick(self) -> None:
        now_tick = self.now_tick
        cfg = self.cfg
        if now_tick % cfg.heartbeat_interval_ticks == 0:
            beat = Heartbeat(self.view())
            for i in range(self.n):
                if i != self.me and self.connected[i]:
                    self._emit(Send(self.nodes[i], beat))
        for i in range(self.n):
            if i != self.me and self.connected[i] and now_tick - self.last_heard_tick[i] >= cfg.heartbeat_timeout_ticks:
                self.on_heartbeat_timeout(i)
        if type(self._state) is Master:
            self._state.expire_forwards(now_tick)  # may step down
        self.arbitrator_lease.on_tick(now_tick)
        master = self._state
        if type(master) is Master:
            if cfg.arbitrator_used and now_tick % cfg.heartbeat_interval_ticks == 0:
                self.arbitrator_lease.ask(self.promised_epoch)  # renew the lease
            if self.commit_version:
                master.send_commits()
        # Deciding is cheap (n <= 5); doing it every tick also retries arbitrator requests.
        self._election_dirty = True

    def on_heartbeat_timeout(self, i: int) -> None:
        # Said in ms, not ticks: the reason reaches the operator's log.
        silent_ms = (self.now_tick - self.last_heard_tick[i]) * self.cfg.tick_ms
        self._emit(ResetConnection(self.nodes[i], f"silent for {silent_ms} ms"))
        self._mark_offline(i, f"silent for {silent_ms} ms (heartbeat timeout)")

    # ------------------------------------------------------------------ the app and the local log

    def on_app_forward_batch(self, ev: AppForwardBatch) -> None:
        if ev.payloads:
            self._state.on_app_forward_batch(ev)

    def on_wal_persisted(self, ev: WalPersisted) -> None:
        invariant(ev.up_to_version <= self.last_version, "the WAL reports durability only of appended records")
        if ev.up_to_version <= self.durable_version:
            return
        self.durable_version = ev.up_to_version
        self._state.on_durable(ev.up_to_version)

    def on_app_acked(self, ev: AppAcked) -> None:
        if ev.status != AckStatus.OK:
            self._log(LogLevel.ERROR, f"app failed to apply v{ev.version}")
            self._state.on_app_failed(ev.version)
            return
        self.app_acked_version = max(self.app_acked_version, min(ev.version, self.last_version))
        self._state.maybe_ack()

    def on_truncate_done(self, ev: TruncateDone) -> None:
        invariant(self.truncating_to is not None, "TruncateDone answers a TruncateWalAfter")
        invariant(ev.last_version == self.truncating_to, "the WAL cut where it was asked to")
        self.history.truncate_after(ev.last_version)
        self.last_version = ev.last_version
        self.last_epoch = self.history.epoch_at(ev.last_version)
        invariant(ev.last_epoch == self.last_epoch, "the WAL's epoch at the cut matches the epoch history")
        self.durable_version = min(self.durable_version, ev.last_version)
        self.app_acked_version = min(self.app_acked_version, ev.last_version)
        self.truncating_to = None
        self._status_dirty = True
        self._election_dirty = True
        state = self._state
        if type(state) is Follower:
            state.send_sync_request("truncated")

    def on_restore_finished(self, ev: RestoreFinished) -> None:
        invariant(type(self._state) is not Master, "a master never restores")
        pairs = ev.epoch_history
        invariant(history_invalid(pairs, ev.last_epoch, ev.last_version) is None, "restore reports the log's history")
        self.history = EpochHistory(pairs)
        self.last_epoch, self.last_version = ev.last_epoch, ev.last_version
        self.durable_version = self.app_acked_version = ev.last_version
        self._status_dirty = True
        self._election_dirty = True
        state = self._state
        if type(state) is Follower:
            state.resync("restore finished")

    def _advance_commit(self, version: int) -> None:
        if version <= self.commit_version:
            return
        invariant(version <= self.last_version, "a replica commits only records its log holds")
        self.commit_version = version
        self._emit(CommitAdvanced(version))

    # ------------------------------------------------------------------ forwards (any role: the promise refuses old epochs)

    def on_forward(self, i: int, fwd: Forward) -> None:
        self._on_forwards(i, fwd.epoch, (fwd,))

    def on_forward_batch(self, i: int, batch: ForwardBatch) -> None:
        if len(batch.record_epochs) != len(batch.payloads) or not batch.payloads:
            self._log(LogLevel.WARNING, f"ignored malformed {batch.describe()} from n{self.nodes[i]}")
            return
        if not self._state.fast_append(i, batch):
            # Anything unusual (a gap, a stale epoch, mixed record epochs) takes the per-record path.
            self._on_forwards(i, batch.epoch, batch.forwards())

    def _on_forwards(self, i: int, epoch: int, fwds: tuple[Forward, ...]) -> None:
        self.counters["forwards_received"] += len(fwds)
        self.counters["forward_bytes_received"] += sum(len(f.payload) for f in fwds)
        if epoch < self.promised_epoch:
            # docs/design.md §2.3: after a promise, older epochs are refused, so the old
            # master cannot count this node towards a write the new master lacks.
            self.counters["stale_forwards_refused"] += len(fwds)
            self._log(
                LogLevel.INFO, f"refused {fwds[0].describe()} from n{self.nodes[i]}: promised e{self.promised_epoch}"
            )
            self._emit(Send(self.nodes[i], ForwardAck(self.promised_epoch, 0, AckStatus.STALE_EPOCH)))
            return
        self._state.on_forwards(i, epoch, fwds)

    # ------------------------------------------------------------------ plumbing

    def _to_role(self, name: str, peer: str | None = None) -> Callable[..., None]:
        """A handler that gives an event or a message to the role object's handler `name`
        (role.py); with `peer`, the event names a peer node whose replica index comes first
        (a node that is not one is logged as `peer` and ignored)."""
        if peer is None:
            return lambda *args: getattr(self._state, name)(*args)

        def with_index(
            ev: PeerRestoring | PeerRestoreCaughtUp | PeerRestoreFailed | RestoreBegun | RestoredRecords,
        ) -> None:
            i = self._peer_index(ev.node, peer)
            if i is not None:
                getattr(self._state, name)(i, ev)

        return with_index

    def _peer_index(self, node: int, what: str) -> int | None:
        i = self._index.get(node)
        if i is None or i == self.me:
            self._log(LogLevel.WARNING, f"ignored {what} for n{node}: not a peer in this vgroup")
            return None
        return i

    def _emit(self, action: Action) -> None:
        self._out.append(action)

    def _log(self, level: LogLevel, text: str) -> None:
        self._out.append(Log(level, f"vg{self.cfg.vgroup_id} n{self.node} e{self.promised_epoch}: {text}"))

    def _finish(self) -> list[Action]:
        if self._election_dirty:
            self._election_dirty = False
            self.elector.evaluate()
        if self._status_dirty:
            self._status_dirty = False
            status = self.elector.status()
            for i in range(self.n):
                if i != self.me and self.connected[i]:
                    self._emit(Send(self.nodes[i], status))
        out, self._out = self._out, []
        return out
