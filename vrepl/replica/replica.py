"""The replication state machine of one vgroup on one node (docs/design.md).

Owns: `Config`, `config_invalid()` and `Replica`: roles, promises (epochs), the view of every
replica, the master's forwarding and confirmation, the follower's log matching, acks and
sync cache, heartbeats and timeouts counted in ticks, the arbitrator lease, counters.
Events go in through `step(event)` and `tick()`; a list of actions comes out, to be executed
in order (see the ORDERING CONTRACT in vrepl/replica/actions.py).
Must not: open sockets, read a clock, sleep, use randomness or threads, or raise for expected
conditions (stale or unexpected messages are ignored with a logged reason). A broken
invariant raises InvariantViolation: that is a bug.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from vrepl.replica import election
from vrepl.replica.actions import (
    Action,
    CommitAdvanced,
    ConfirmForward,
    ConfirmStatus,
    FlowControl,
    Log,
    LogLevel,
    NotifyRole,
    PersistBatch,
    PersistPromisedEpoch,
    PersistRecords,
    RequestArbitratorGrant,
    ResetConnection,
    Send,
    StreamWalFrom,
    TruncateWalAfter,
    WriteToCache,
    WriteToCacheBatch,
)
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
from vrepl._core.record import HEADER_SIZE_BYTES as RECORD_HEADER_BYTES
from vrepl._core.window import PendingWindow
from vrepl.replica.forward import PeerProgress, PeerState, SyncCache
from vrepl.replica.history import EpochHistory, history_invalid
from vrepl.replica.invariant import invariant
from vrepl.replica.lease import DEFAULT_CLOCK_DRIFT_RATIO, DEFAULT_LEASE_ALLOWANCE_MS, lease_margin_refusal
from vrepl.replica.messages import (
    NO_NODE,
    AckStatus,
    Commit,
    Forward,
    ForwardAck,
    ForwardBatch,
    Heartbeat,
    PeerView,
    Record,
    Role,
    Status,
    SyncRequest,
    SyncStart,
    TruncateRequest,
)


@dataclass(frozen=True)
class Config:
    """Start-up configuration of one replica. Limits have defaults listed in docs/design.md §6.

    `replicas` are node ids in the vgroup's order (host:port is the transport's business).
    `last_epoch`/`last_version`/`epoch_history` describe the local WAL; `promised_epoch`/
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
    # What the app persisted as its acks promise, when less than the WAL (None: all of it).
    app_acked_version: int | None = None
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
    if cfg.epoch_history is not None:
        reason = history_invalid(cfg.epoch_history, cfg.last_epoch, cfg.last_version)
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
        self.role = Role.UNSYNCED
        self.master: int = NO_NODE  # node id this replica follows (or itself as master)

        # Local log.
        self.last_epoch = config.last_epoch
        self.last_version = config.last_version
        if config.epoch_history is None:
            self.history = EpochHistory.conservative(config.last_epoch, config.last_version)
        else:
            self.history = EpochHistory(config.epoch_history)
        self.durable_version = config.last_version  # the WAL we start from is on disk
        # The app may have persisted less than the WAL holds (docs/vnode.md §9.3).
        self.app_acked_version = config.last_version if config.app_acked_version is None \
            else min(config.app_acked_version, config.last_version)
        # Commit index (docs/design.md §4.4): every version <= commit_version is in the log of
        # every future master, so it is never truncated and the app may archive it. Never
        # decreases within a run; 0 after a restart (the app keeps its own archived version).
        self.commit_version = 0

        # Views of the others; index = position in the replica list.
        blank = PeerView(Role.OFFLINE, 0, 0, 0, NO_NODE)
        self.views: list[PeerView] = [blank] * self.n
        self.connected = [False] * self.n
        # A connected peer counts as online only once its status arrived: deciding on a view
        # we have not heard yet is how the seed's "decide only when views agree" is kept.
        self.heard = [False] * self.n
        self.last_heard_tick = [0] * self.n
        # The views each peer sent in its last status: which replicas it hears (§2.4).
        self.reports: list[tuple[PeerView, ...] | None] = [None] * self.n
        self._defer_since_tick: int | None = None  # when the current deferral began

        # Arbitrator (even replica counts only).
        self.arbitrator_connected = False
        self.grant_epoch = 0
        self.lease_until_tick = 0
        self._grant_request: tuple[int, int] | None = None  # (epoch, tick sent)
        self._grant_retry_tick = 0
        self._short_lease_logged: int | None = None  # arbitrator lease last warned about

        # Master side.
        self.window: PendingWindow | None = None
        self.epoch_first_version = 0  # the first version this master writes in its epoch
        self.peers: dict[int, PeerProgress] = {}
        self.flow_level = 0

        # Follower side.
        self.sync_started = False  # the master confirmed my log is a prefix of its own
        self.matched_version = 0  # my log matches the master's up to here
        self.sync_target_version = 0
        self.acked_sent_version = 0
        self.truncating_to: int | None = None
        self.master_commit_version = 0  # the last Commit of the master followed now
        self.restoring = False  # a restore session from the master runs (docs/restore.md)
        self.cache = SyncCache(config.sync_cache_max_records, config.sync_cache_max_bytes)

        self._status_dirty = False
        self._election_dirty = False
        self._last_decision = ""
        self._commit_on_confirm = self._commit_follows_quorum(config)
        self.counters: dict[str, int] = dict.fromkeys(
            (
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
            ),
            0,
        )
        self._handlers: dict[type, Callable[[object], None]] = {
            PeerConnected: self.on_peer_connected,
            PeerDisconnected: self.on_peer_disconnected,
            Received: self.on_received,
            AppForward: self.on_app_forward,
            AppForwardBatch: self.on_app_forward_batch,
            AppRecover: self.on_app_recover,
            WalPersisted: self.on_wal_persisted,
            AppAcked: self.on_app_acked,
            ArbitratorConnected: self.on_arbitrator_connected,
            ArbitratorLost: self.on_arbitrator_lost,
            ArbitratorGranted: self.on_arbitrator_granted,
            ArbitratorRefused: self.on_arbitrator_refused,
            TruncateDone: self.on_truncate_done,
            RestoreFinished: self.on_restore_finished,
            PeerRestoring: self.on_peer_restoring,
            PeerRestoreCaughtUp: self.on_peer_restore_caught_up,
            PeerRestoreFailed: self.on_peer_restore_failed,
            RestoreBegun: self.on_restore_begun,
            LogRebased: self.on_log_rebased,
            RestoredRecords: self.on_restored_records,
            RestoreEnded: self.on_restore_ended,
        }
        self._message_handlers: dict[type, Callable[[int, object], None]] = {
            Status: self.on_status,
            Heartbeat: self.on_heartbeat,
            Forward: self.on_forward,
            ForwardBatch: self.on_forward_batch,
            ForwardAck: self.on_forward_ack,
            SyncRequest: self.on_sync_request,
            TruncateRequest: self.on_truncate_request,
            SyncStart: self.on_sync_start,
            Commit: self.on_commit,
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
        invariant(handler is not None, f"unknown event type {type(event).__name__}")
        handler(event)
        return self._finish()

    def tick(self) -> list[Action]:
        invariant(self._started, "start() before tick()")
        self._out = []
        self.now_tick += 1
        self.on_tick()
        return self._finish()

    def view(self) -> PeerView:
        """This replica's own view of itself."""
        return PeerView(self.role, self.last_epoch, self.last_version, self.promised_epoch, self.promised_master)

    def stats(self) -> dict[str, object]:
        """Counters and per-peer lag for the embedding app (issue 3 §6)."""
        peers = {}
        for i, node in enumerate(self.nodes):
            if i == self.me:
                continue
            p = self.peers.get(i)
            acked = p.acked_version if p else 0
            peers[node] = {
                "online": self.connected[i],
                "role": Role(self.views[i].role).describe() if self.connected[i] else "offline",
                "state": p.state.name.lower() if p else "-",
                "acked_version": acked,
                "lag_versions": self.last_version - acked if p else 0,
                "forwards": p.forwards if p else 0,
                "forward_bytes": p.forward_bytes if p else 0,
                "acks": p.acks if p else 0,
            }
        return {
            "vgroup_id": self.cfg.vgroup_id,
            "node": self.node,
            "role": self.role.describe(),
            "epoch": self.promised_epoch,
            "master": self.master,
            "last_epoch": self.last_epoch,
            "last_version": self.last_version,
            "durable_version": self.durable_version,
            "pending_forwards": len(self.window) if self.window else 0,
            "sync_cache_records": len(self.cache),
            "counters": dict(self.counters),
            "peers": peers,
        }

    def describe(self) -> str:
        others = []
        for i, node in enumerate(self.nodes):
            if i == self.me:
                continue
            role = Role(self.views[i].role).describe() if self.connected[i] else "offline"
            others.append(f"n{node}:{role}")
        return (
            f"vg{self.cfg.vgroup_id} n{self.node} {self.role.describe()} e{self.promised_epoch}"
            f" log e{self.last_epoch}v{self.last_version} durable v{self.durable_version} " + " ".join(others)
        ).rstrip()

    # ------------------------------------------------------------------ connections

    def on_peer_connected(self, ev: PeerConnected) -> None:
        i = self._peer_index(ev.node, "peer_connected")
        if i is None:
            return
        self.connected[i] = True
        self.heard[i] = False
        self.reports[i] = None
        self.last_heard_tick[i] = self.now_tick
        # Unknown until its status arrives; a stale MASTER here could make us follow a ghost.
        self.views[i] = dataclasses.replace(self.views[i], role=Role.UNSYNCED)
        if i in self.peers:
            self.peers[i].state = PeerState.PROBING
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
        self.views[i] = dataclasses.replace(self.views[i], role=Role.OFFLINE)
        if i in self.peers:
            self.peers[i].state = PeerState.PROBING
        self._log(LogLevel.INFO, f"peer n{self.nodes[i]} offline: {why}")
        self._status_dirty = True
        self._election_dirty = True

    def on_received(self, ev: Received) -> None:
        i = self._peer_index(ev.node, "message")
        if i is None:
            return
        if not self.connected[i]:
            self._log(LogLevel.DEBUG, f"ignored {ev.message.describe()} from n{ev.node}: not connected")
            return
        self.last_heard_tick[i] = self.now_tick
        handler = self._message_handlers.get(type(ev.message))
        if handler is None:
            self._log(LogLevel.WARNING, f"ignored unknown message {type(ev.message).__name__} from n{ev.node}")
            return
        handler(i, ev.message)

    # ------------------------------------------------------------------ status and election

    def on_status(self, i: int, msg: Status) -> None:
        if msg.sender != self.nodes[i] or len(msg.views) != self.n:
            self._log(
                LogLevel.WARNING,
                f"ignored status from n{self.nodes[i]}: sender n{msg.sender}, {len(msg.views)} views for {self.n} replicas",
            )
            return
        self.views[i] = msg.views[i]
        self.reports[i] = msg.views
        self.heard[i] = True
        self._election_dirty = True

    def on_heartbeat(self, i: int, msg: Heartbeat) -> None:
        self.views[i] = msg.view
        self.heard[i] = True
        self._election_dirty = True

    def _election_input(self) -> election.ElectionInput:
        views = tuple(self.view() if i == self.me else self.views[i] for i in range(self.n))
        online = tuple(i == self.me or (self.connected[i] and self.heard[i]) for i in range(self.n))
        grant = self.grant_epoch if self.lease_until_tick > self.now_tick else 0
        deferred = 0 if self._defer_since_tick is None else self.now_tick - self._defer_since_tick
        return election.ElectionInput(
            nodes=self.nodes,
            self_index=self.me,
            views=views,
            online=online,
            arbitrator_used=self.cfg.arbitrator_used,
            arbitrator_connected=self.arbitrator_connected,
            grant_epoch=grant,
            own_promise_reusable=not self._own_promise_from_disk,
            asked_epoch=(
                self._grant_request[0]
                if self._grant_request is not None and self._grant_request[0] > self.promised_epoch
                else 0
            ),
            reports=tuple(self.reports),
            defer_allowed=deferred < self.cfg.heartbeat_timeout_ticks,
            contest_allowed=deferred < self.cfg.heartbeat_interval_ticks,
        )

    def _evaluate(self) -> None:
        # Each applied decision changes the inputs (a promise, a role); re-decide until stable.
        # Four rounds cover the longest chain: announce -> request grant / become master.
        for _ in range(4):
            inp = self._election_input()
            decision = election.decide(inp)
            text = decision.describe()
            if text != self._last_decision:
                self._last_decision = text
                views = ", ".join(f"n{node}={v.describe()}" for node, v in zip(self.nodes, inp.views))
                self._log(LogLevel.INFO, f"election {text} views [{views}]")
            if not self._apply(decision):
                return

    def _apply(self, d: election.Decision) -> bool:
        """Carry out a decision; True when it changed state the next decision depends on."""
        V = election.Verdict
        following = self.role in (Role.SLAVE, Role.SYNCING)
        if d.verdict is not V.DEFER:
            self._defer_since_tick = None
        elif self._defer_since_tick is None:
            # Bounded: after heartbeat_timeout_ticks of deferring, announce anyway (§2.4).
            self._defer_since_tick = self.now_tick
        if self.truncating_to is not None and d.verdict in (V.ANNOUNCE, V.BECOME_MASTER, V.REQUEST_GRANT):
            # Its log end still counts the records it is discarding, and the TruncateDone to
            # come would rewind a master's log: no candidacy until the cut is done
            # (found by the simulator, seed 36 --profile harsh).
            if following:
                self._become_unsynced(f"no online master: {d.reason}")
            return False
        if d.verdict is V.STAY_MASTER:
            return False
        if d.verdict is V.STEP_DOWN:
            self._step_down(d.reason)
            return True
        if d.verdict is V.BECOME_MASTER:
            if d.epoch > self.promised_epoch:  # single replica: promise its own new epoch
                self._promise(d.epoch, self.node)
            self._become_master()
            return True
        if d.verdict is V.FOLLOW:
            if following and self.master == d.master and self.promised_epoch == d.epoch:
                return False
            if d.epoch > self.promised_epoch:
                self._promise(d.epoch, d.master)
            self._become_follower(d.master)
            return True
        if following:
            self._become_unsynced(f"no online master: {d.reason}")
        if d.verdict is V.ANNOUNCE:
            self._promise(d.epoch, self.node)
            return True
        if d.verdict is V.ADOPT:
            self._promise(d.epoch, d.master)
            return True
        if d.verdict is V.REQUEST_GRANT:
            self._request_grant(d.epoch)
            return False
        # UNSYNCED, WAIT, DEFER
        return following

    def _promise(self, epoch: int, master: int) -> None:
        invariant(epoch > self.promised_epoch, "a promise only moves to a newer epoch")
        self._own_promise_from_disk = False
        self.promised_epoch = epoch
        self.promised_master = master
        self._emit(PersistPromisedEpoch(epoch, master))
        self._status_dirty = True

    def _set_role(self, role: Role) -> None:
        if role == self.role:
            return
        self.role = role
        self.counters["role_changes"] += 1
        self._emit(NotifyRole(role, self.promised_epoch, self.master))
        self._status_dirty = True

    def _become_master(self) -> None:
        invariant(self.promised_master == self.node, "a master holds its own promise")
        invariant(self.promised_epoch > self.last_epoch, "a master's epoch is newer than every record it has")
        self.master = self.node
        self.peers = {i: PeerProgress() for i in range(self.n) if i != self.me}
        self.window = PendingWindow(self.me, self.cfg.quorum_effective - 1, self.cfg.max_inflight_forwards, self.n)
        # Records inherited from older epochs need no confirmation; the window starts empty.
        self.window.ack(self.me, self.durable_version)
        self.epoch_first_version = self.last_version + 1
        self.flow_level = 0
        self.counters["elections_won"] += 1
        self._set_role(Role.MASTER)
        self._log(LogLevel.INFO, f"became master at e{self.last_epoch}v{self.last_version}")

    def _step_down(self, reason: str) -> None:
        invariant(self.role == Role.MASTER, "only a master steps down")
        if self.window is not None:
            self._confirm_range(self.window.clear(), ConfirmStatus.FAILED)
        self.window = None
        self.peers = {}
        if self.flow_level:
            self.flow_level = 0
            self._emit(FlowControl(0))
        self.master = NO_NODE
        self._log(LogLevel.WARNING, f"master steps down: {reason}")
        self._set_role(Role.UNSYNCED)

    def _become_follower(self, master_node: int) -> None:
        self.master = master_node
        self._reset_follower_state()
        self._set_role(Role.SYNCING)
        self._send_sync_request("following a new master")

    def _become_unsynced(self, reason: str) -> None:
        self.master = NO_NODE
        self._reset_follower_state()
        self._log(LogLevel.INFO, f"unsynced: {reason}")
        self._set_role(Role.UNSYNCED)

    def _reset_follower_state(self) -> None:
        self.sync_started = False
        self.restoring = False
        self.matched_version = 0
        self.sync_target_version = 0
        self.acked_sent_version = 0
        self.master_commit_version = 0
        self.cache.clear()

    # ------------------------------------------------------------------ arbitrator

    def on_arbitrator_connected(self, ev: ArbitratorConnected) -> None:
        self.arbitrator_connected = True
        self._election_dirty = True

    def on_arbitrator_lost(self, ev: ArbitratorLost) -> None:
        # A granted lease stays valid until it expires: the arbitrator honours it.
        self.arbitrator_connected = False
        self._grant_request = None
        self._election_dirty = True

    def _short_lease(self, lease_ms: int | None) -> str | None:
        """Why an arbitrator lease stated in an answer cannot back this node's lease (§5)."""
        if lease_ms is None:
            return None
        cfg = self.cfg
        return lease_margin_refusal(lease_ms, cfg.arbitrator_lease_ms, cfg.clock_drift_ratio, cfg.lease_allowance_ms)

    def _log_short_lease(self, what: str, reason: str, lease_ms: int) -> None:
        # Renewals repeat every heartbeat interval: the same reason is a warning once.
        level = LogLevel.DEBUG if lease_ms == self._short_lease_logged else LogLevel.WARNING
        self._short_lease_logged = lease_ms
        self._log(level, f"{what}: {reason}")

    def on_arbitrator_granted(self, ev: ArbitratorGranted) -> None:
        if self._grant_request is None or self._grant_request[0] != ev.epoch:
            self._log(LogLevel.DEBUG, f"ignored arbitrator grant for e{ev.epoch}: not asked")
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
        self.lease_until_tick = self._grant_request[1] + self.cfg.arbitrator_lease_ticks
        self._grant_request = None
        self._election_dirty = True
        if ev.epoch > self.promised_epoch and self.truncating_to is None:
            # A candidate asked before promising (§2.4). The arbitrator's vote for this epoch
            # is mine: my own goes with it, so no other candidate can be elected in it and
            # be refused a lease for ever after ("granted to n<me>").
            self._promise(ev.epoch, self.node)

    def on_arbitrator_refused(self, ev: ArbitratorRefused) -> None:
        short = self._short_lease(ev.lease_ms)
        if short is not None:
            self._log_short_lease(f"arbitrator refused e{ev.epoch}", short, ev.lease_ms)
        else:
            self._log(LogLevel.INFO, f"arbitrator refused e{ev.epoch}")
        self._refused(ev.epoch)

    def _refused(self, epoch: int) -> None:
        self._grant_request = None
        self._grant_retry_tick = self.now_tick + self.cfg.heartbeat_interval_ticks
        if self.grant_epoch == epoch:
            self.grant_epoch = 0  # someone else holds a newer grant: ours is void
        self._election_dirty = True

    def _request_grant(self, epoch: int) -> None:
        if not self.arbitrator_connected or self._grant_request is not None:
            return
        if self.now_tick < self._grant_retry_tick:
            return
        self._grant_request = (epoch, self.now_tick)
        self._emit(RequestArbitratorGrant(epoch))

    # ------------------------------------------------------------------ ticks

    def on_tick(self) -> None:
        now = self.now_tick
        cfg = self.cfg
        if now % cfg.heartbeat_interval_ticks == 0:
            beat = Heartbeat(self.view())
            for i in range(self.n):
                if i != self.me and self.connected[i]:
                    self._emit(Send(self.nodes[i], beat))
        for i in range(self.n):
            if i != self.me and self.connected[i] and now - self.last_heard_tick[i] >= cfg.heartbeat_timeout_ticks:
                self.on_heartbeat_timeout(i)
        if self.window is not None:
            expired = self.window.expire(now)
            if expired is not None:
                self.on_forward_timeout(expired)
        if self._grant_request is not None and now - self._grant_request[1] >= cfg.heartbeat_timeout_ticks:
            self._grant_request = None  # unanswered: ask again
        if self.grant_epoch and self.lease_until_tick <= now:
            self.grant_epoch = 0
            self._log(LogLevel.INFO, "arbitrator lease expired")
        if (
            self.role == Role.MASTER
            and cfg.arbitrator_used
            and now % cfg.heartbeat_interval_ticks == 0
        ):
            self._request_grant(self.promised_epoch)  # renew the lease
        if self.role == Role.MASTER and self.commit_version:
            self._send_commits()
        # Deciding is cheap (n <= 5); doing it every tick also retries arbitrator requests.
        self._election_dirty = True

    def on_heartbeat_timeout(self, i: int) -> None:
        # Said in ms, not ticks: the reason reaches the operator's log.
        silent_ms = (self.now_tick - self.last_heard_tick[i]) * self.cfg.tick_ms
        self._emit(ResetConnection(self.nodes[i], f"silent for {silent_ms} ms"))
        self._mark_offline(i, f"silent for {silent_ms} ms (heartbeat timeout)")

    def on_forward_timeout(self, span: tuple[int, int]) -> None:
        invariant(self.window is not None, "only a master has forwards to time out")
        first, last = span
        minority = self.window.minority_first(first, last)
        self.counters["confirmed_timed_out"] += last - first + 1
        self._confirm_range(span, ConfirmStatus.TIMED_OUT)
        if minority:
            # seed 少数虚拟节点写入成功的问题: some replicas hold a write the app was told
            # failed. Reset replication so the group re-elects and every log matches again.
            self.counters["minority_resets"] += 1
            self._log(LogLevel.WARNING, f"minority write v{minority}: resetting replication")
            for i in range(self.n):
                if i != self.me and self.connected[i]:
                    self._emit(ResetConnection(self.nodes[i], f"minority write v{minority}"))
                    self._mark_offline(i, "replication reset")
            self._step_down(f"minority write v{minority}")

    # ------------------------------------------------------------------ master: forwarding

    def forward_refusal(self, version: int, payload: bytes) -> str | None:
        """Why the master cannot take this forward now, or None."""
        if version != self.last_version + 1:
            return f"v{version} is not the next version v{self.last_version + 1}"
        if len(payload) > self.cfg.record_max_bytes:
            return f"{len(payload)} bytes exceeds record_max_bytes {self.cfg.record_max_bytes}"
        if self.window is not None and self.window.full():
            return f"{len(self.window)} forwards in flight (max_inflight_forwards)"
        return None

    def forward_batch_refusal(self, first_version: int, payloads: tuple[bytes, ...], size: int | None = None) -> str | None:
        """Why the master cannot take this batch of forwards now, or None. `size`, when
        given, is the payloads' total length (the caller has it): no record of a batch
        that small can be too big, so the per-record check is skipped."""
        if first_version != self.last_version + 1:
            return f"v{first_version} is not the next version v{self.last_version + 1}"
        if size is None or size > self.cfg.record_max_bytes:
            biggest = max(map(len, payloads))
            if biggest > self.cfg.record_max_bytes:
                return f"{biggest} bytes exceeds record_max_bytes {self.cfg.record_max_bytes}"
        if self.window is not None and self.window.full(len(payloads)):
            return f"{len(self.window)} + {len(payloads)} forwards in flight (max_inflight_forwards)"
        return None

    def on_app_forward_batch(self, ev: AppForwardBatch) -> None:
        """The batched on_app_forward: one PersistBatch, one ForwardBatch per follower."""
        n = len(ev.payloads)
        if n == 0:
            return
        first, last = ev.first_version, ev.first_version + n - 1
        if self.role != Role.MASTER:
            self._emit(ConfirmForward(first, last, ConfirmStatus.NOT_MASTER))
            return
        payloads = ev.payloads
        size = sum(map(len, payloads))
        reason = self.forward_batch_refusal(first, payloads, size)
        if reason:
            self.counters["refused_forwards"] += n
            self._log(LogLevel.WARNING, f"refused forwards v{first}..v{last}: {reason}")
            self._emit(ConfirmForward(first, last, ConfirmStatus.FAILED))
            return
        invariant(self.window is not None, "a master has a window")
        epoch = self.promised_epoch
        prev_epoch = self.last_epoch
        self.history.note_append(epoch, first)
        self.last_version = last
        self.last_epoch = epoch
        epochs = (epoch,) * n
        payloads = tuple(payloads)
        self._emit(PersistBatch(first, epochs, payloads))
        msg = ForwardBatch(epoch, first, prev_epoch, epochs, payloads)
        for i, peer in self.peers.items():
            if peer.state == PeerState.REPLICATING and self.connected[i]:
                self._emit(Send(self.nodes[i], msg))
                peer.forwards += n
                peer.forward_bytes += size
                self.counters["forwards_sent"] += n
                self.counters["forward_bytes_sent"] += size
        self.window.add_range(first, last, self.now_tick + self.cfg.forward_timeout_ticks)
        self._check_flow()

    def on_app_recover(self, ev: AppRecover) -> None:
        if self.role not in (Role.SLAVE, Role.SYNCING) or self.truncating_to is not None:
            self._log(LogLevel.INFO, f"ignored app recover: role {self.role.describe()}, nothing to resync from")
            return
        self._resync("the app asked to recover")

    def set_quorum(self, quorum: int) -> list[Action]:
        """Change the quorum (reconfig). 0 means a majority. Returns actions to execute (a
        master may confirm pending forwards at once when the quorum goes down)."""
        invariant(self._started, "start() before set_quorum()")
        self._out = []
        cfg = dataclasses.replace(self.cfg, quorum=quorum)
        reason = config_invalid(cfg)
        invariant(reason is None, f"set_quorum: {reason}")
        self.cfg = cfg
        self._commit_on_confirm = self._commit_follows_quorum(cfg)
        self._log(LogLevel.INFO, f"quorum is now {cfg.quorum_effective}")
        if self.window is not None:
            self._confirm_range(self.window.set_slave_acks_needed(cfg.quorum_effective - 1), ConfirmStatus.OK)
            if not self._commit_on_confirm:
                self._commit_by_majority()
        self._maybe_ack()
        return self._finish()

    def on_app_forward(self, ev: AppForward) -> None:
        if self.role != Role.MASTER:
            self._emit(ConfirmForward(ev.version, ev.version, ConfirmStatus.NOT_MASTER))
            return
        reason = self.forward_refusal(ev.version, ev.payload)
        if reason:
            self.counters["refused_forwards"] += 1
            self._log(LogLevel.WARNING, f"refused forward: {reason}")
            self._emit(ConfirmForward(ev.version, ev.version, ConfirmStatus.FAILED))
            return
        invariant(self.window is not None, "a master has a window")
        epoch = self.promised_epoch
        prev_epoch = self.last_epoch
        record = Record(epoch, ev.version, ev.payload)
        self.history.note_append(epoch, ev.version)
        self.last_version = ev.version
        self.last_epoch = epoch
        self._emit(PersistRecords((record,)))
        fwd = Forward(epoch, ev.version, prev_epoch, epoch, ev.payload)
        for i, peer in self.peers.items():
            if peer.state == PeerState.REPLICATING and self.connected[i]:
                self._emit(Send(self.nodes[i], fwd))
                peer.forwards += 1
                peer.forward_bytes += len(ev.payload)
                self.counters["forwards_sent"] += 1
                self.counters["forward_bytes_sent"] += len(ev.payload)
        self.window.add(ev.version, self.now_tick + self.cfg.forward_timeout_ticks)
        self._check_flow()

    def on_wal_persisted(self, ev: WalPersisted) -> None:
        invariant(ev.up_to_version <= self.last_version, "the WAL reports durability only of appended records")
        if ev.up_to_version <= self.durable_version:
            return
        self.durable_version = ev.up_to_version
        if self.role == Role.MASTER:
            invariant(self.window is not None, "a master has a window")
            self._confirm_range(self.window.ack(self.me, ev.up_to_version), ConfirmStatus.OK)
            if not self._commit_on_confirm:
                self._commit_by_majority()
        else:
            self._maybe_ack()

    def on_forward_ack(self, i: int, ack: ForwardAck) -> None:
        if self.role != Role.MASTER or ack.epoch != self.promised_epoch:
            self._log(LogLevel.DEBUG, f"ignored {ack.describe()} from n{self.nodes[i]}: not master of that epoch")
            return
        if ack.status != AckStatus.OK:
            self._log(LogLevel.WARNING, f"n{self.nodes[i]} answered {ack.describe()}")
            return
        if ack.acked_version > self.last_version:
            self._log(LogLevel.WARNING, f"ignored {ack.describe()} from n{self.nodes[i]}: beyond my log end")
            return
        invariant(self.window is not None, "a master has a window")
        peer = self.peers[i]
        peer.acks += 1
        peer.acked_version = max(peer.acked_version, ack.acked_version)
        self.counters["acks_received"] += 1
        self._confirm_range(self.window.ack(i, ack.acked_version), ConfirmStatus.OK)
        if not self._commit_on_confirm:
            self._commit_by_majority()
        self._check_flow()

    def _confirm_range(self, span: tuple[int, int] | None, status: ConfirmStatus) -> None:
        """Emit one ConfirmForward for the (first, last) versions the window released."""
        if span is None:
            return
        first, last = span
        if status == ConfirmStatus.OK:
            self.counters["confirmed_ok"] += last - first + 1
        elif status == ConfirmStatus.FAILED:
            self.counters["confirmed_failed"] += last - first + 1
        self._emit(ConfirmForward(first, last, status))
        if status == ConfirmStatus.OK and self._commit_on_confirm:
            # The window holds only this master's own-epoch records, and an own-epoch record
            # on a quorum commits every record below it (docs/design.md §4.4). After the
            # ConfirmForward: an app applies a record at its confirmation, then may archive it.
            self._advance_commit(last)

    # ------------------------------------------------------------------ commit index (docs/design.md §4.4)

    @staticmethod
    def _commit_follows_quorum(cfg: Config) -> bool:
        """True when a confirmation (quorum) is also a majority, so "confirmed ok" is the
        commit rule; with quorum < majority the commit index counts a majority itself."""
        return cfg.quorum_effective >= len(cfg.replicas) // 2 + 1

    def _advance_commit(self, version: int) -> None:
        if version <= self.commit_version:
            return
        invariant(version <= self.last_version, "a replica commits only records its log holds")
        self.commit_version = version
        self._emit(CommitAdvanced(version))

    def _commit_by_majority(self) -> None:
        """quorum < majority: a confirmation may be on fewer replicas than any election
        consults, so it commits nothing; the highest own-epoch version a majority holds
        durably (the master's own WAL and its followers' acks in this epoch) does, capped
        at the master's own durable log as a confirmation is."""
        w = self.window
        invariant(w is not None, "a master has a window")
        held = sorted((w.acked_version(i) for i in range(self.n)), reverse=True)
        point = min(held[self.n // 2], self.durable_version)
        if point >= self.epoch_first_version:
            self._advance_commit(point)

    def _send_commits(self) -> None:
        """On a tick: tell each replicating follower the commit version if it advanced since
        the last Commit it got (at most one small frame per follower per tick)."""
        version = self.commit_version
        msg = None
        for i, peer in self.peers.items():
            if peer.commit_sent < version and peer.state == PeerState.REPLICATING and self.connected[i]:
                if msg is None:
                    msg = Commit(self.promised_epoch, version)
                peer.commit_sent = version
                self._emit(Send(self.nodes[i], msg))

    def on_commit(self, i: int, msg: Commit) -> None:
        if not self._is_my_master(i, msg.epoch):
            self._log(LogLevel.DEBUG, f"ignored {msg.describe()} from n{self.nodes[i]}: not following it in e{msg.epoch}")
            return
        if msg.version > self.master_commit_version:
            self.master_commit_version = msg.version
            self._follower_commit()

    def _follower_commit(self) -> None:
        """A follower's commit version: what its master committed, as far as this node's
        own log is durable and known to match the master's (so the records are the
        committed ones, not a deposed master's records at the same versions)."""
        if self.truncating_to is not None or self.role not in (Role.SLAVE, Role.SYNCING):
            return
        point = min(self.master_commit_version, self.durable_version, self.matched_version)
        if point > self.commit_version:
            self._advance_commit(point)

    def _check_flow(self) -> None:
        # Hysteresis: slow down above the limit, resume below half of it.
        # Called on every forward batch and every ack: a plain loop over the (few) peers
        # for the lowest ack, no generator (4x cheaper; same value as the max of the lags).
        limit = self.cfg.flow_control_lag_versions
        connected = self.connected
        lowest = None
        for i, p in self.peers.items():
            # A peer being restored is not a slow slave: the master must not slow down for it.
            if connected[i] and p.state != PeerState.RESTORING:
                acked = p.acked_version
                if lowest is None or acked < lowest:
                    lowest = acked
        lag = 0 if lowest is None else self.last_version - lowest
        if self.flow_level == 0 and lag > limit:
            self.flow_level = 1
            self._log(LogLevel.WARNING, f"a slave lags {lag} versions: flow control on")
            self._emit(FlowControl(1))
        elif self.flow_level == 1 and lag <= limit // 2:
            self.flow_level = 0
            self._emit(FlowControl(0))

    # ------------------------------------------------------------------ master: log matching

    def on_sync_request(self, i: int, req: SyncRequest) -> None:
        node = self.nodes[i]
        if self.role != Role.MASTER or req.epoch != self.promised_epoch:
            self._log(LogLevel.DEBUG, f"ignored {req.describe()} from n{node}: not master of that epoch")
            return
        peer = self.peers[i]
        peer.commit_sent = 0  # it resyncs: tell it the commit version again
        # docs/design.md §4.3: find where the follower's log stops matching mine, comparing
        # (epoch, version), never the version alone.
        common_epoch, end = self.history.end_of_epoch_at_most(req.last_epoch, self.last_version)
        if common_epoch == req.last_epoch and req.last_version <= end:
            first, last = req.last_version + 1, self.last_version
            self._emit(Send(node, SyncStart(self.promised_epoch, first, last)))
            if first <= last:
                prev = self.history.epoch_at(first - 1)
                self._emit(StreamWalFrom(node, self.promised_epoch, first, last, prev))
            peer.state = PeerState.REPLICATING
            # For lag and flow control only; confirmations wait for the follower's own acks.
            peer.acked_version = max(peer.acked_version, req.last_version)
            stream = f"streaming v{first}..v{last}" if first <= last else "nothing to stream"
            self._log(LogLevel.INFO, f"n{node} matches up to v{req.last_version}; {stream}")
            return
        keep = min(req.last_version, end)
        peer.state = PeerState.PROBING
        self._emit(Send(node, TruncateRequest(self.promised_epoch, common_epoch, keep)))
        self._log(
            LogLevel.INFO,
            f"n{node} has e{req.last_epoch}v{req.last_version} I lack: keep <=e{common_epoch} <=v{keep}",
        )

    # ------------------------------------------------------------------ follower

    def _is_my_master(self, i: int, epoch: int) -> bool:
        return (
            self.role in (Role.SLAVE, Role.SYNCING)
            and self.master == self.nodes[i]
            and epoch == self.promised_epoch
        )

    def _send_sync_request(self, why: str) -> None:
        self.counters["resyncs"] += 1
        self._log(LogLevel.INFO, f"sync request to n{self.master}: {why}")
        self._emit(Send(self.master, SyncRequest(self.promised_epoch, self.last_epoch, self.last_version)))

    def _resync(self, why: str) -> None:
        self.cache.clear()
        self.sync_started = False
        self.restoring = False  # the transport aborts the session when it sees this
        self._set_role(Role.SYNCING)
        self._send_sync_request(why)

    def on_truncate_request(self, i: int, req: TruncateRequest) -> None:
        if not self._is_my_master(i, req.epoch) or self.truncating_to is not None:
            self._log(LogLevel.DEBUG, f"ignored {req.describe()} from n{self.nodes[i]}")
            return
        _, own_end = self.history.end_of_epoch_at_most(req.keep_epoch, self.last_version)
        cut = min(req.keep_version, own_end)
        if cut >= self.last_version:
            self._send_sync_request("nothing to truncate")
            return
        if cut < self.matched_version:
            # A peer's message, not a bug here: the master would cut records it matched with
            # this log (its restore stream sent records its own log lacks, say). Refused;
            # the follower starts over and matches from scratch (docs/design.md §4.3).
            self._refuse_master(i, f"refused {req.describe()}: it cuts v{cut + 1}..v{self.matched_version},"
                                   f" which matched n{self.nodes[i]}'s log")
            return
        # docs/design.md §4.4: committed records are in every later master's log, so a
        # master never asks for them to be cut.
        invariant(cut >= self.commit_version, f"never truncate below the commit version v{self.commit_version}")
        self.truncating_to = cut
        self.sync_started = False
        self.cache.clear()
        self.counters["truncations"] += 1
        self._log(LogLevel.WARNING, f"truncating e{self.last_epoch}v{self.last_version} after v{cut}")
        self._set_role(Role.SYNCING)
        self._emit(TruncateWalAfter(cut))

    def _refuse_master(self, i: int, reason: str) -> None:
        """The master sent what contradicts the log it matched with this follower: bad input
        from a peer. Logged, connection reset, unsynced: after it reconnects the follower
        sends a new SyncRequest and the logs are matched from scratch."""
        self._log(LogLevel.WARNING, reason)
        self._emit(ResetConnection(self.nodes[i], reason))
        self._mark_offline(i, "refused its messages")
        self._become_unsynced(reason)

    def _record_epoch_refusal(self, fwd: Forward) -> str | None:
        """Why a forward that extends the log cannot be appended (its record epoch), or None:
        epochs never go back along a log, and no record is newer than the master's epoch."""
        if self.last_epoch <= fwd.record_epoch <= self.promised_epoch:
            return None
        return (f"refused {fwd.describe()} from n{self.master}: record epoch e{fwd.record_epoch} outside"
                f" e{self.last_epoch}..e{self.promised_epoch}")

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
        if self.role in (Role.SLAVE, Role.SYNCING):
            self._send_sync_request("truncated")

    def on_restore_finished(self, ev: RestoreFinished) -> None:
        invariant(self.role != Role.MASTER, "a master never restores")
        pairs = ev.epoch_history or (((ev.last_epoch, 1),) if ev.last_version else ())
        invariant(history_invalid(pairs, ev.last_epoch, ev.last_version) is None, "restore reports a valid history")
        self.history = EpochHistory(pairs)
        self.last_epoch, self.last_version = ev.last_epoch, ev.last_version
        self.durable_version = self.app_acked_version = ev.last_version
        self._status_dirty = True
        self._election_dirty = True
        if self.role in (Role.SLAVE, Role.SYNCING):
            self._resync("restore finished")

    # ------------------------------------------------------------------ restore (docs/restore.md)

    def on_peer_restoring(self, ev: PeerRestoring) -> None:
        i = self._peer_index(ev.node, "peer_restoring")
        if i is None:
            return
        peer = self.peers.get(i)
        if self.role != Role.MASTER or peer is None or not self.connected[i]:
            self._log(LogLevel.DEBUG, f"ignored {ev.describe()}: not master, or n{ev.node} not connected")
            return
        peer.state = PeerState.RESTORING
        self._log(LogLevel.INFO, f"restoring n{ev.node} over a sync connection; live forwards wait")

    def on_peer_restore_caught_up(self, ev: PeerRestoreCaughtUp) -> None:
        i = self._peer_index(ev.node, "peer_restore_caught_up")
        if i is None:
            return
        peer = self.peers.get(i)
        if self.role != Role.MASTER or peer is None or peer.state != PeerState.RESTORING:
            self._log(LogLevel.DEBUG, f"ignored {ev.describe()}: n{ev.node} is not being restored")
            return
        peer.state = PeerState.REPLICATING
        self._log(LogLevel.INFO, f"n{ev.node} restore stream covers v{self.last_version}: live forwards start (sync cache)")

    def on_peer_restore_failed(self, ev: PeerRestoreFailed) -> None:
        i = self._peer_index(ev.node, "peer_restore_failed")
        if i is None:
            return
        peer = self.peers.get(i)
        if self.role != Role.MASTER or peer is None or not self.connected[i] or peer.state != PeerState.RESTORING:
            self._log(LogLevel.DEBUG, f"ignored {ev.describe()}")
            return
        self.counters["restores_failed"] += 1
        self._log(LogLevel.WARNING, f"restore of n{ev.node} failed: {ev.reason}; resetting its connection")
        self._emit(ResetConnection(ev.node, f"restore failed: {ev.reason}"))
        self._mark_offline(i, "restore failed")

    def on_restore_begun(self, ev: RestoreBegun) -> None:
        i = self._peer_index(ev.node, "restore_begun")
        if i is None:
            return
        if not self._is_my_master(i, ev.epoch) or not self.sync_started or self.truncating_to is not None:
            self._log(LogLevel.INFO, f"refused {ev.describe()}: not following n{ev.node} in e{ev.epoch} with a matched log")
            return
        self.restoring = True
        self.counters["restores_begun"] += 1
        self._set_role(Role.SYNCING)
        self._log(LogLevel.INFO, f"restore from n{ev.node} begun at e{self.last_epoch}v{self.last_version}")

    def on_log_rebased(self, ev: LogRebased) -> None:
        if not self.restoring or ev.last_version <= self.last_version:
            self._log(LogLevel.WARNING, f"ignored {ev.describe()}: restoring {self.restoring}, log ends at v{self.last_version}")
            return
        if not 1 <= ev.last_epoch <= self.promised_epoch:
            # The epoch comes from the master's WAL_BEGIN: a peer's value, refused, not a bug.
            self._log(LogLevel.WARNING, f"refused {ev.describe()}: epoch outside e1..e{self.promised_epoch}")
            return
        pairs = tuple(p for p in ev.epoch_history if p[1] <= ev.last_version) or ((ev.last_epoch, ev.last_version),)
        if history_invalid(pairs, ev.last_epoch, ev.last_version) is not None:
            pairs = ((ev.last_epoch, ev.last_version),)
        self.history = EpochHistory(pairs)
        self.last_epoch, self.last_version = ev.last_epoch, ev.last_version
        self.matched_version = ev.last_version
        self.durable_version = self.app_acked_version = ev.last_version
        self.cache.drop_through(ev.last_version)
        self.counters["log_rebases"] += 1
        self._status_dirty = True
        self._log(LogLevel.INFO, f"log rebased on restored files at e{ev.last_epoch}v{ev.last_version}")
        self._maybe_ack()

    def on_restored_records(self, ev: RestoredRecords) -> None:
        i = self._peer_index(ev.node, "restored_records")
        if i is None:
            return
        if not self.restoring or type(ev.batch) is not ForwardBatch:
            self._log(LogLevel.DEBUG, f"ignored {ev.describe()}: no restore running")
            return
        self.on_forward_batch(i, ev.batch)

    def on_restore_ended(self, ev: RestoreEnded) -> None:
        if not self.restoring:
            return
        self.restoring = False
        if ev.ok:
            self.counters["restores_ended_ok"] += 1
            self._log(LogLevel.INFO, f"restore from n{ev.node} done at e{self.last_epoch}v{self.last_version}")
            self._update_follower_role()
            return
        self.counters["restores_failed"] += 1
        self._resync(f"restore failed: {ev.reason}")

    def on_sync_start(self, i: int, msg: SyncStart) -> None:
        if not self._is_my_master(i, msg.epoch) or self.truncating_to is not None:
            self._log(LogLevel.DEBUG, f"ignored {msg.describe()} from n{self.nodes[i]}")
            return
        if msg.first_version != self.last_version + 1:
            self._resync(f"sync start at v{msg.first_version} but my log ends at v{self.last_version}")
            return
        self.sync_started = True
        self.matched_version = self.last_version
        self.sync_target_version = msg.last_version
        self.cache.drop_through(self.last_version)
        appended: list[Record] = []
        self._drain_cache(appended)
        self._persist_appended(appended)
        self._update_follower_role()
        self._maybe_ack()

    def on_forward_batch(self, i: int, batch: ForwardBatch) -> None:
        if len(batch.record_epochs) != len(batch.payloads) or not batch.payloads:
            self._log(LogLevel.WARNING, f"ignored malformed {batch.describe()} from n{self.nodes[i]}")
            return
        epochs = batch.record_epochs
        if (
            batch.first_version == self.last_version + 1
            and batch.prev_epoch == self.last_epoch
            and self.sync_started
            and self.truncating_to is None
            and not len(self.cache)
            and self._is_my_master(i, batch.epoch)
            and epochs[0] == epochs[-1]
            and self.last_epoch <= epochs[0] <= batch.epoch
            and epochs.count(epochs[0]) == len(epochs)  # one epoch (a C loop, no set)
        ):
            self._append_batch(batch)
            return
        # Anything unusual (a gap, a stale epoch, mixed record epochs) takes the per-record path.
        self._on_forwards(i, batch.epoch, batch.forwards())

    def _append_batch(self, batch: ForwardBatch) -> None:
        """Fast path of _on_forwards for a batch that extends the log as it is: the same
        checks, made once for the batch (docs/design.md §4.2)."""
        n = len(batch.payloads)
        self.counters["forwards_received"] += n
        block = batch.block
        # The block is the same records as WAL records (a 36-byte header each): its length
        # gives the payload bytes without a pass over the payloads.
        self.counters["forward_bytes_received"] += (
            len(block) - RECORD_HEADER_BYTES * n if block else sum(map(len, batch.payloads))
        )
        epoch = batch.record_epochs[0]
        self.history.note_append(epoch, batch.first_version)
        self.last_version = batch.first_version + n - 1
        self.last_epoch = epoch
        self.matched_version = self.last_version
        self._emit(PersistBatch(batch.first_version, batch.record_epochs, batch.payloads, batch.block))
        self._emit(WriteToCacheBatch(batch.first_version, batch.record_epochs, batch.payloads))
        self._update_follower_role()
        self._maybe_ack()

    def on_forward(self, i: int, fwd: Forward) -> None:
        self._on_forwards(i, fwd.epoch, (fwd,))

    def _on_forwards(self, i: int, epoch: int, fwds: tuple[Forward, ...]) -> None:
        node = self.nodes[i]
        self.counters["forwards_received"] += len(fwds)
        self.counters["forward_bytes_received"] += sum(len(f.payload) for f in fwds)
        if epoch < self.promised_epoch:
            # docs/design.md §2.3: after a promise, older epochs are refused, so the old
            # master cannot count this node towards a write the new master lacks.
            self.counters["stale_forwards_refused"] += len(fwds)
            self._log(LogLevel.INFO, f"refused {fwds[0].describe()} from n{node}: promised e{self.promised_epoch}")
            self._emit(Send(node, ForwardAck(self.promised_epoch, 0, AckStatus.STALE_EPOCH)))
            return
        if not self._is_my_master(i, epoch):
            self._log(LogLevel.DEBUG, f"ignored {fwds[0].describe()} from n{node}: not following it in e{epoch}")
            return
        if self.truncating_to is not None:
            return  # resent by the stream after the truncation
        appended: list[Record] = []
        for fwd in fwds:
            if not self._take_forward(fwd, appended):
                break
        self._persist_appended(appended)
        self._update_follower_role()
        self._maybe_ack()

    def _take_forward(self, fwd: Forward, appended: list[Record]) -> bool:
        """Append, cache or drop one forward; False when the follower had to resync."""
        if not self.sync_started or fwd.version > self.last_version + 1:
            refusal = self.cache.add(fwd)
            if refusal:
                self._resync(refusal)
                return False
            return True
        if fwd.version <= self.last_version:
            if fwd.version <= self.matched_version and self.history.epoch_at(fwd.version) != fwd.record_epoch:
                # A peer's message, not a bug here: the master contradicts a record it matched.
                self._refuse_master(self._index[self.master], f"refused {fwd.describe()}: matched v{fwd.version}"
                                    f" is e{self.history.epoch_at(fwd.version)}")
                return False
            return True  # a duplicate from the stream
        if fwd.prev_epoch != self.last_epoch:
            self._resync(f"v{fwd.version} follows e{fwd.prev_epoch} but my last record is e{self.last_epoch}")
            return False
        refusal = self._record_epoch_refusal(fwd)
        if refusal:
            self._refuse_master(self._index[self.master], refusal)
            return False
        self._append(fwd, appended)
        self._drain_cache(appended)
        return True

    def _append(self, fwd: Forward, appended: list[Record]) -> None:
        record = Record(fwd.record_epoch, fwd.version, fwd.payload)
        self.history.note_append(record.epoch, record.version)
        self.last_version = record.version
        self.last_epoch = record.epoch
        self.matched_version = record.version
        appended.append(record)

    def _drain_cache(self, appended: list[Record]) -> None:
        while True:
            fwd = self.cache.pop(self.last_version + 1)
            if fwd is None:
                return
            if fwd.prev_epoch != self.last_epoch:
                self._resync(f"cached v{fwd.version} follows e{fwd.prev_epoch}, my last is e{self.last_epoch}")
                return
            refusal = self._record_epoch_refusal(fwd)
            if refusal:
                self._refuse_master(self._index[self.master], refusal)
                return
            self._append(fwd, appended)

    def _persist_appended(self, appended: list[Record]) -> None:
        if not appended:
            return
        self._emit(PersistRecords(tuple(appended)))
        for record in appended:
            self._emit(WriteToCache(record))

    def _update_follower_role(self) -> None:
        if self.role not in (Role.SLAVE, Role.SYNCING):
            return
        caught_up = (
            self.sync_started
            and not self.restoring
            and self.last_version >= self.sync_target_version
            and not len(self.cache)
        )
        self._set_role(Role.SLAVE if caught_up else Role.SYNCING)

    def on_app_acked(self, ev: AppAcked) -> None:
        if ev.status != AckStatus.OK:
            self._log(LogLevel.ERROR, f"app failed to apply v{ev.version}")
            if self.role in (Role.SLAVE, Role.SYNCING):
                self._emit(ResetConnection(self.master, f"app failed to apply v{ev.version}"))
                self._become_unsynced(f"app failed to apply v{ev.version}")
            return
        self.app_acked_version = max(self.app_acked_version, min(ev.version, self.last_version))
        self._maybe_ack()

    def _maybe_ack(self) -> None:
        """Ack cumulatively what is durable, matches the master, and (if required) applied."""
        if self.master_commit_version > self.commit_version:
            self._follower_commit()  # durable or matched may have grown
        if self.role not in (Role.SLAVE, Role.SYNCING) or not self.sync_started:
            return
        point = min(self.durable_version, self.matched_version)
        if self.cfg.app_ack_required_effective:
            point = min(point, self.app_acked_version)
        if point <= self.acked_sent_version:
            return
        self.acked_sent_version = point
        self.counters["acks_sent"] += 1
        self._emit(Send(self.master, ForwardAck(self.promised_epoch, point, AckStatus.OK)))

    # ------------------------------------------------------------------ plumbing

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
            self._evaluate()
        if self._status_dirty:
            self._status_dirty = False
            status = Status(
                self.node,
                tuple(
                    self.view()
                    if i == self.me
                    else (self.views[i] if self.connected[i] else dataclasses.replace(self.views[i], role=Role.OFFLINE))
                    for i in range(self.n)
                ),
            )
            for i in range(self.n):
                if i != self.me and self.connected[i]:
                    self._emit(Send(self.nodes[i], status))
        out, self._out = self._out, []
        return out
