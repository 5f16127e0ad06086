"""The driver: the one place where a replica's actions are executed.

Owns: `Driver`, which owns one `vrepl.replica.Replica`, feeds it events (`step`, `tick`,
`received`, `forward`, ...), executes the actions it returns against its ports
(vrepl/driver/ports.py) and feeds their completions back as events. Production wires it to
asyncio sockets, the WAL thread and the app's callbacks (vrepl/sync.py); the simulator to a
simulated network, disk and app (vrepl/testing/sim/); scenario tests to a scripted network
(tests/scenario/). docs/design.md §9 Where actions run.

THE ORDERING CONTRACT (docs/design.md §1, vrepl/replica/actions.py), implemented here once:
* the actions of one list run IN LIST ORDER; a persisting action (PersistPromisedEpoch,
  PersistRecords, PersistBatch, TruncateWalAfter) is issued to storage before any later
  action of the list;
* PersistPromisedEpoch is DURABLE BEFORE any later Send is written: Storage.persist_promise
  returns only when it is, and sends are only queued on the bus until `end_batch()`;
* completions come back as events (WalPersisted, TruncateDone, ...), never assumed; a
  follower acks only on WalPersisted (the replica's rule, kept by feeding it nothing else);
* an event raised while a list is executing (a link reset by an action) is stepped once the
  list is done, so the list keeps its order.
Must not: do I/O, read a clock, use randomness or threads: everything outside comes through
the ports, and every entry point runs on one thread (production: the I/O thread).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Callable

from vrepl.driver.ports import App, Bus, Restorer, Storage
from vrepl.driver.restoring import ReplicaRestore
from vrepl.driver.streaming import WalStreams
from vrepl.replica import (
    NO_NODE,
    AckStatus,
    Action,
    AppAcked,
    AppForwardBatch,
    ArbitratorGrant,
    ArbitratorGranted,
    ArbitratorLost,
    ArbitratorRefused,
    ArbitratorRequest,
    Commit,
    CommitAdvanced,
    ConfirmForward,
    ConfirmStatus,
    FlowControl,
    Forward,
    ForwardAck,
    ForwardBatch,
    Heartbeat,
    Log,
    NotifyRole,
    PeerDisconnected,
    PeerRestoring,
    PersistBatch,
    PersistPromisedEpoch,
    PersistRecords,
    Received,
    Replica,
    RequestArbitratorGrant,
    ResetConnection,
    Role,
    Send,
    Status,
    StreamWalFrom,
    SyncRequest,
    SyncStart,
    TruncateDone,
    TruncateRequest,
    TruncateWalAfter,
    WalPersisted,
    WriteToCache,
    WriteToCacheBatch,
)
from vrepl.replica.invariant import invariant
from vrepl.transport import codec

PEER_MESSAGE_TYPES = (
    Status,
    Heartbeat,
    Forward,
    ForwardBatch,
    ForwardAck,
    SyncRequest,
    TruncateRequest,
    SyncStart,
    Commit,
)
_encode = codec.encode
_encode_records = codec.encode_records


@dataclass(frozen=True)
class DriverOptions:
    """What the driver needs beyond the replica's own config (docs/embedding.md)."""

    max_batch_records: int = 4096  # records per AppForwardBatch (one WAL append, one frame)
    max_batch_bytes: int = 1 << 20  # payload bytes per AppForwardBatch (one record may exceed it)
    stream_chunk_bytes: int = 1 << 20  # WAL bytes per frame when streaming in band
    restore_min_lag_versions: int = 10_000  # a lag below this that the WAL holds is streamed in band


def batch_bounds(
    payloads: "list[bytes] | tuple[bytes, ...]", max_records: int, max_bytes: int
) -> list[tuple[int, int]]:
    """Split a run of records into batches (one WAL append and one frame each): (start, end)
    index pairs, in order, covering the run. Each batch takes records while it has fewer than
    max_records and its payload bytes stay <= max_bytes; a batch always takes at least one
    record (a record larger than max_bytes goes alone). The per-record work is C (a run from
    forward_many() can hold 100,000 records): a full batch of max_records is taken when its
    byte sum fits, otherwise the cut is found by bisection over cumulative sums."""
    n = len(payloads)
    out = []
    start = 0
    while start < n:
        stop = min(n, start + max_records)
        if sum(map(len, payloads[start:stop])) <= max_bytes:
            end = stop
        else:
            cum = list(accumulate(map(len, payloads[start:stop])))
            end = start + bisect_right(cum, max_bytes)
            if end == start:
                end = start + 1  # one record above max_bytes: alone
        out.append((start, end))
        start = end
    return out


class Driver:
    """Executes one replica's actions against its ports (see the module doc).

    `on_log(origin, level, text)` receives log lines: origin "replica" for the replica's Log
    actions, "driver" for the driver's own (streams, flow control); `on_action(action)`, when
    set, is called before each action runs (scenario traces; the simulator crashes a process
    there).
    """

    def __init__(
        self,
        replica: Replica,
        bus: Bus,
        storage: Storage,
        app: App,
        *,
        restorer: Restorer | None = None,
        options: DriverOptions | None = None,
        on_log: Callable[[str, int, str], Any] | None = None,
        on_action: Callable[[Action], Any] | None = None,
    ) -> None:
        self.replica = replica
        self.bus = bus
        self.storage = storage
        self.app = app
        self.restorer = restorer
        self.options = options or DriverOptions()
        self.on_log = on_log
        self.on_action = on_action
        self.before_flush: Callable[[], Any] | None = None  # the embedding's queued calls (end_batch)
        self.vgroup_id = replica.cfg.vgroup_id
        self.node = replica.node
        self._executing = False
        self._deferred: list[object] = []
        self._batch_block: tuple[tuple[bytes, ...], bytes] | None = None
        self._core_flow = 0
        self.flow_level = 0
        self.committed_version = 0  # the replica's commit version (CommitAdvanced)
        self.streams = WalStreams(self)
        self.restore = ReplicaRestore(self)
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "forwards",
                "forward_bytes",
                "app_acks",
                "epochs_promised",
                "streams",
                "streamed_records",
                "streamed_in_band",
            ),
            0,
        )

    # ================================================================== events in

    def start(self) -> None:
        """The replica's first evaluation (a single replica becomes master here)."""
        self._execute(self.replica.start())

    def step(self, event: object) -> None:
        """One event. Raised while a list executes (from a port called by an action), it is
        stepped once that list is done."""
        if self._executing:
            self._deferred.append(event)
            return
        if type(event) is PeerDisconnected:
            self.streams.stop_node(event.node)
        self._execute(self.replica.step(event))  # type: ignore[arg-type]

    def tick(self, count: int = 1) -> None:
        for _ in range(count):
            self._execute(self.replica.tick())

    def received(self, node: int, messages: list) -> None:
        """Decoded frames from one read of the link to `node`. Anything that is not a peer
        message closes the link; a link an action closed drops the rest of the read."""
        replica = self.replica
        bus = self.bus
        for msg in messages:
            if type(msg) not in PEER_MESSAGE_TYPES:
                self.drop_link(node, f"{msg.describe()} is not a peer message")
                return
            self._execute(replica.step(Received(node, msg)))
            if not bus.connected(node):
                return

    def arbitrator_message(self, msg: object) -> None:
        """A decoded frame from the arbitrator: only a grant for this vgroup and node."""
        if type(msg) is not ArbitratorGrant:
            what = getattr(msg, "describe", lambda: type(msg).__name__)()
            self.drop_arbitrator(f"{what} from the arbitrator")
            return
        if msg.vgroup_id != self.vgroup_id or msg.node != self.node:
            self.drop_arbitrator(f"{msg.describe()} is not for vg{self.vgroup_id} n{self.node}")
            return
        event = ArbitratorGranted if msg.granted else ArbitratorRefused
        self.step(event(msg.epoch, msg.lease_ms))

    def forward(self, first_version: int, payloads: "list[bytes] | tuple[bytes, ...]") -> None:
        """The app's records first_version.. (consecutive): AppForwardBatch events cut at
        max_batch_records / max_batch_bytes, each one WAL append and one frame per follower."""
        o = self.options
        n = len(payloads)
        total = sum(map(len, payloads))
        self.counters["forwards"] += n
        self.counters["forward_bytes"] += total
        replica = self.replica
        if n <= o.max_batch_records and total <= o.max_batch_bytes:
            self._execute(replica.step(AppForwardBatch(first_version, tuple(payloads))))
            return
        for start, end in batch_bounds(payloads, o.max_batch_records, o.max_batch_bytes):
            self._execute(replica.step(AppForwardBatch(first_version + start, tuple(payloads[start:end]))))

    def app_acked(self, version: int, status: int = AckStatus.OK) -> None:
        if status == AckStatus.OK:
            self.counters["app_acks"] += 1
        self.step(AppAcked(version, status))

    def wal_durable(self, version: int) -> None:
        """Storage: the WAL is durable up to `version`."""
        r = self.replica
        if r.durable_version < version <= r.last_version:
            self.step(WalPersisted(version))
        self.streams.durable(version)

    def wal_truncated(self, last_epoch: int, last_version: int) -> None:
        """Storage: a TruncateWalAfter is done; the WAL ends at (last_epoch, last_version)."""
        self.app.notify_wal_truncated(last_version)
        self.step(TruncateDone(last_epoch, last_version))

    def wal_block(self, reader: int, data: bytes | None, scan: Any) -> None:
        """Storage: the next block a `read_wal` asked for (None: nothing more written)."""
        self.streams.block(reader, data, scan)

    def wal_read_failed(self, reader: int, reason: str) -> None:
        self.streams.failed(reader, reason)

    def link_writable(self, node: int) -> None:
        """Bus: the link to `node` takes frames again."""
        self.streams.writable(node)
        self.update_flow()

    def drop_link(self, node: int, reason: str) -> None:
        """Close the link to `node` for a reason found outside the replica (bad input, a
        stream that failed) and tell the replica."""
        if self.bus.reset(node, reason):
            self.step(PeerDisconnected(node))

    def drop_arbitrator(self, reason: str) -> None:
        if self.bus.reset_arbitrator(reason):
            self.step(ArbitratorLost())

    def set_quorum(self, quorum: int) -> None:
        self._execute(self.replica.set_quorum(quorum))

    def end_batch(self) -> None:
        """The end of a batch of events: what the embedding queued meanwhile is handed over
        (`before_flush`), the frames queued go out, storage may sync. Inside an action list
        (an app callback calling in) it waits for the list's own end."""
        if self._executing:
            return
        if self.before_flush is not None:
            self.before_flush()
        self.bus.flush()
        self.storage.end_batch()

    def abandon(self) -> None:
        """The embedding stops: every forward taken and not confirmed is confirmed failed
        (its outcome is unknown to the app, which may retry it)."""
        window = self.replica.window
        span = window.clear() if window is not None else None
        if span is not None:
            self.app.confirm_forward(span[0], span[1], ConfirmStatus.FAILED)

    def update_flow(self) -> None:
        """Flow control (docs/embedding.md §Back-pressure): a lagging follower (the core's
        FlowControl) or a congested link."""
        level = 1 if self._core_flow or self.bus.congested() else 0
        if level != self.flow_level:
            self.flow_level = level
            self.log(20, f"flow control {'on' if level else 'off'}")
            self.app.notify_flow_control(level)

    # ================================================================== state, for the facade

    def is_connected(self, node: int) -> bool:
        return self.bus.connected(node)

    def pending_forwards(self) -> int:
        """Forwards taken and not yet confirmed (any thread may read this)."""
        w = self.replica.window
        return len(w) if w is not None else 0

    def role_now(self) -> tuple[Role, int | None]:
        """This node's role and the master it follows (itself as master), as the replica has
        them at this moment."""
        m = self.replica.master
        return self.replica.role, (None if m == NO_NODE else m)

    def log_end(self) -> tuple[int, int]:
        """(last epoch, last version) of the replica's log."""
        return self.replica.last_epoch, self.replica.last_version

    def record_epoch(self, version: int) -> int:
        """The epoch of record `version` of the log (its epoch history)."""
        return int(self.replica.history.epoch_at(version))

    def roles(self) -> dict[str, Any]:
        """This node's role, epoch and master, and its view of every replica's role."""
        r = self.replica
        views = {}
        for i, node in enumerate(r.nodes):
            if i == r.me:
                views[node] = r.role.describe()
            else:
                views[node] = Role(r.views[i].role).describe() if r.connected[i] else "offline"
        return {
            "vgroup_id": self.vgroup_id,
            "node": self.node,
            "role": r.role.describe(),
            "epoch": r.promised_epoch,
            "master": None if r.master == NO_NODE else r.master,
            "last_version": r.last_version,
            "last_epoch": r.last_epoch,
            "replicas": views,
        }

    def lease(self, tick_ms: int) -> dict[str, int] | None:
        """The arbitrator lease this node counts now, if any."""
        r = self.replica
        if r.grant_epoch and r.lease_until_tick > r.now_tick:
            return {"epoch": r.grant_epoch, "remaining_ms": (r.lease_until_tick - r.now_tick) * tick_ms}
        return None

    def lowest_acked(self) -> int | None:
        """A master's lowest ack among its followers (None: no follower progress)."""
        peers = self.replica.peers
        return min(p.acked_version for p in peers.values()) if peers else None

    # ================================================================== actions out

    def execute(self, actions: list) -> None:
        """Execute actions a harness got by stepping the replica itself (scenario tests)."""
        invariant(not self._executing, "execute() is not called from inside an action list")
        self._execute(actions)

    def _execute(self, actions: list) -> None:
        """Execute one action list IN ORDER (the ordering contract, module doc)."""
        self._executing = True
        try:
            frames: dict[int, bytes] = {}
            bus, storage, app = self.bus, self.storage, self.app
            observe = self.on_action
            for action in actions:
                if observe is not None:
                    observe(action)
                t = type(action)
                if t is Send:
                    if not bus.connected(action.node):
                        continue
                    msg = action.message
                    frame = frames.get(id(msg))
                    if frame is None:
                        block = None
                        bb = self._batch_block
                        if bb is not None and type(msg) is ForwardBatch and bb[0] is msg.payloads:
                            block = bb[1]  # the WAL block of this batch: encoded once
                        frame = _encode(msg, block)
                        frames[id(msg)] = frame
                    bus.send(action.node, frame)
                elif t is PersistBatch:
                    block = action.block or _encode_records(action.first_version, action.record_epochs, action.payloads)
                    self._batch_block = (action.payloads, block)
                    storage.append(action.first_version, action.last_version, block)
                elif t is ConfirmForward:
                    app.confirm_forward(action.first_version, action.last_version, action.status)
                elif t is WriteToCacheBatch:
                    app.write_to_cache(action.first_version, action.record_epochs, action.payloads)
                elif t is Log:
                    if self.on_log is not None:
                        self.on_log("replica", int(action.level), action.text)
                elif t is PersistRecords:
                    recs = action.records
                    block = _encode_records(
                        recs[0].version, tuple(r.epoch for r in recs), tuple(r.payload for r in recs)
                    )
                    storage.append(recs[0].version, recs[-1].version, block)
                elif t is WriteToCache:
                    rec = action.record
                    app.write_to_cache(rec.version, (rec.epoch,), (rec.payload,))
                elif t is NotifyRole:
                    app.notify_role(action.role, action.epoch, None if action.master == NO_NODE else action.master)
                elif t is PersistPromisedEpoch:
                    # Durable on return, before any later Send of this list is written: the
                    # sends are only queued until the batch ends (ordering contract).
                    storage.persist_promise(action.epoch, action.master)
                    self.counters["epochs_promised"] += 1
                elif t is TruncateWalAfter:
                    storage.truncate_after(action.version)
                elif t is StreamWalFrom:
                    self._on_stream_wal_from(action)
                elif t is ResetConnection:
                    if bus.reset(action.node, f"reset: {action.reason}"):
                        self._deferred.append(PeerDisconnected(action.node))
                elif t is RequestArbitratorGrant:
                    cfg = self.replica.cfg
                    req = ArbitratorRequest(cfg.vgroup_id, self.node, action.epoch, cfg.arbitrator_lease_ms)
                    bus.to_arbitrator(_encode(req))
                elif t is FlowControl:
                    self._core_flow = action.level
                    self.update_flow()
                elif t is CommitAdvanced:
                    self.committed_version = action.version
                    app.notify_commit(action.version)
                else:
                    invariant(False, f"no executor for action {t.__name__}")
        finally:
            self._executing = False
            self._batch_block = None
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            for event in deferred:
                self.step(event)

    def _on_stream_wal_from(self, action: StreamWalFrom) -> None:
        """Bring a follower up to date: a small lag the WAL still holds is streamed in band
        (docs/design.md §4.3); anything else gets the restore flow (docs/restore.md) when a
        Restorer is wired: files if the WAL was recycled, then the WAL."""
        if not self.bus.connected(action.node):
            return
        wal_first = self.storage.first_version() or action.last_version + 1
        lag = action.last_version - action.first_version + 1
        if self.restorer is None or (wal_first <= action.first_version and lag < self.options.restore_min_lag_versions):
            self.counters["streamed_in_band"] += 1
            self.streams.start(action)
            return
        self._deferred.append(PeerRestoring(action.node))
        self.log(
            20,
            f"restore of n{action.node} from v{action.first_version} (log end v{action.last_version},"
            f" WAL from v{wal_first})",
        )
        self.restorer.start_sender(action.node, action.first_version, action.last_version)

    def log_prefix(self) -> str:
        return f"vg{self.vgroup_id} n{self.node} e{self.replica.promised_epoch}"

    def log(self, level: int, text: str) -> None:
        """A line of the driver's own (origin "driver"), prefixed like the replica's."""
        if self.on_log is not None:
            self.on_log("driver", level, f"{self.log_prefix()}: {text}")


__all__ = ["Driver", "DriverOptions", "batch_bounds", "PEER_MESSAGE_TYPES"]
