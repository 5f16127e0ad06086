"""The simulated cluster: each node the production `vrepl.driver.Driver` (owning a real
`Replica`) over a simulated network, disk, app, clock and arbitrator, all driven by one
seeded PRNG (docs/simulation.md).

Owns: `World` — the event heap and simulated time, the per-connection FIFO channels that
carry encoded frames, each node's WAL (a durable prefix and a volatile tail made durable by
a simulated fsync; a crash may tear it), the promise file, the app (write_to_cache ->
AppAcked after a delay; a memtable of applied records and an archived prefix that survives
crashes, flushed up to the flush limit, as the vnode behaves), the client's view of every
write (confirm_forward), the arbitrator (vrepl.replica.lease.LeaseTable), fault injection
and the two phases (safety under faults, then liveness after healing). The world executes
no action: the driver does, through the node's ports (vrepl/testing/sim/ports.py), and every
completion comes back through the driver's entry for it.

Faithful to the TCP transport the core is written for: messages of one connection arrive in
order or not at all; loss breaks the connection (the rest of it is lost too); a partition
holds messages back (TCP retransmits) until it heals or the connection is reset. Reordering
comes from different connections racing each other, from random latency and from clock drift.

Must not: use the global `random`, wall-clock time, threads or sockets; everything random
comes from `self.rng`, so a seed replays exactly (the app's flush points from `self.app_rng`,
seeded from the same seed: the app never feeds back into replication, so adding it left the
fault schedule of every seed unchanged).
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from vrepl.driver import Driver, DriverOptions
from vrepl.replica import (
    AppAcked,
    AppForward,
    ArbitratorConnected,
    ArbitratorGrant,
    ArbitratorLost,
    ArbitratorRequest,
    CUTS_COMMITTED_RECORDS,
    Config,
    ConfirmForward,
    ConfirmStatus,
    InvariantViolation,
    LeaseTable,
    LogLevel,
    NotifyRole,
    PeerConnected,
    PeerDisconnected,
    Record,
    Replica,
    Role,
    TruncateDone,
    WalPersisted,
)
from vrepl.replica.history import EpochHistory
from vrepl.replica.messages import NO_NODE
from vrepl.testing.records import encode_block
from vrepl.testing.sim.checker import History, SafetyViolation
from vrepl.testing.sim.options import UNITS_PER_TICK, SimOptions
from vrepl.testing.sim.ports import Channel, Conn, SimError, SimNode, SimPorts, torn_recovery
from vrepl.testing.sim.restore import RestoreSession, SessionRunner, SimRestorer
from vrepl.transport import codec

VGROUP = 7
ARB = -1  # the arbitrator's "node id" in link keys
TICK_MS = 100  # a tick's length in the replicas' config (the arbitrator's lease_ms is in it)
MID_LIST_CRASH_CHANCE = 0.3  # an armed crash lands before each action with this chance, else after the list


class LivenessFailure(AssertionError):
    """After every fault healed, the cluster did not elect a master and converge in time."""


class _Crash(Exception):
    """Raised from the driver's action hook: the process dies before this action runs."""


def history_pairs(wal: list[Record]) -> tuple[tuple[int, int], ...]:
    h = EpochHistory()
    for rec in wal:
        h.note_append(rec.epoch, rec.version)
    return h.pairs()


@dataclass
class Stats:
    writes_submitted: int = 0
    confirmed_ok: int = 0
    confirmed_failed: int = 0
    confirmed_timed_out: int = 0
    confirmed_not_master: int = 0
    unknown: int = 0  # in flight when the master crashed: the client never heard
    crashes: int = 0
    restarts: int = 0
    pauses: int = 0
    partitions: int = 0
    conn_losses: int = 0
    truncations: int = 0
    arbitrator_crashes: int = 0
    elections: int = 0
    max_epoch: int = 0
    recovery_ticks: int = -1
    lost: int = 0
    events: int = 0
    flushes: int = 0  # app flushes that archived something
    archived: int = 0  # rows archived (summed over flushes)


class World:
    """One simulated cluster. `run()` plays both phases; tests may instead script faults with
    the public methods (crash, restart, pause, resume, partition, heal, ...) and run_ticks()."""

    def __init__(self, seed: int, opts: SimOptions | None = None, *, record_trace: bool = True) -> None:
        self.seed = seed
        self.opts = opts = opts or SimOptions()
        self.rng = random.Random(seed)
        self.app_rng = random.Random(seed * 2 + 1)  # the apps' flush points only
        self.now = 0  # units
        self._heap: list = []
        self._seq = 0
        self.node_ids = tuple(range(opts.replicas))
        self.n = len(self.node_ids)
        self.history = History(self.n, opts.quorum_effective, lossy=opts.lossy)
        self.stats = Stats()
        self.trace: deque[str] = deque(maxlen=opts.trace_len)
        self._hash = hashlib.sha256()
        self.record_trace = record_trace
        self.faults_on = opts.faults
        self.workload_on = True
        self.blocked: set[tuple[int, int]] = set()  # (src, dst) directions that drop nothing but deliver nothing
        self.link_slow: dict[tuple[int, int], int] = {}  # (src, dst) -> extra latency units
        self.conns: dict[tuple[int, int], Conn] = {}
        self._gen = 0
        self.channels: dict[tuple, Channel] = {}
        self._stalled: list[Channel] = []
        self.payload_seq = 0
        self.on_confirm: Callable[[int, Record], None] | None = None  # test hook
        self.kill_on_confirm: set[int] = set()  # nodes crashed right after they confirm ok
        self.role_log: list[tuple[int, int, int, Role, int]] = []  # (time, node, epoch, role, master)
        # Arbitrator.
        self.arb_used = opts.arbitrator_used
        arb_lease_ticks = 20
        # The arbitrator's lease must outlast the master's own count of arbitrator_lease_ticks
        # on a slow clock (docs/design.md §5): +25 % covers the drift modelled here.
        self.arb_lease_units = arb_lease_ticks * (UNITS_PER_TICK + opts.clock_drift_units) * 5 // 4 + UNITS_PER_TICK
        self.arb_up = self.arb_used
        self.arb_table = LeaseTable(self.arb_lease_units)
        self.arb_refuse_until = 0
        self.arb_conns: dict[int, Conn] = {}
        self.arb_blocked_since: dict[int, int] = {}
        self.nodes: dict[int, SimNode] = {}
        for i, node in enumerate(self.node_ids):
            drift = self.rng.randint(-opts.clock_drift_units, opts.clock_drift_units)
            sn = SimNode(node, i, UNITS_PER_TICK + drift)
            sn.sock = {p: None for p in self.node_ids if p != node}
            self.nodes[node] = sn
        self.phase = "safety"
        self.heal_time = 0
        self.restores = SessionRunner(self)

    # ================================================================== config and start

    def config_for(self, sn: SimNode) -> Config:
        last = sn.wal[-1] if sn.wal else None
        return Config(
            vgroup_id=VGROUP,
            replicas=self.node_ids,
            self_index=sn.index,
            quorum=self.opts.quorum,
            last_version=last.version if last else 0,
            last_epoch=last.epoch if last else 0,
            epoch_history=history_pairs(sn.wal),
            promised_epoch=sn.promise[0],
            promised_master=sn.promise[1],
            arbitrator=self.arb_used,
            forward_timeout_ticks=20,
            arbitrator_lease_ticks=20,
        )

    def start(self) -> None:
        for sn in self.nodes.values():
            self._boot(sn)
        self._push(UNITS_PER_TICK, "world", None)

    def _boot(self, sn: SimNode) -> None:
        sn.up, sn.paused = True, False
        sn.replica = Replica(self.config_for(sn))
        ports = SimPorts(self, sn)

        def on_action(action: object) -> None:
            # A crash in the middle of a list: the actions before this one ran, the rest never do.
            sn.actions_seen += 1
            if sn.crash_now or (sn.crash_armed and self.rng.random() < MID_LIST_CRASH_CHANCE):
                raise _Crash()

        def on_log(origin: str, level: int, text: str) -> None:
            if origin == "replica" and level >= LogLevel.ERROR and CUTS_COMMITTED_RECORDS in text:
                self.history.on_committed_cut_refused(sn.node, text)  # the core's refusal, still a bug

        restorer = SimRestorer(self.restores, sn) if self.opts.restore else None
        options = DriverOptions(restore_min_lag_versions=self.opts.restore_min_lag_versions)
        sn.driver = Driver(sn.replica, ports, ports, ports, restorer=restorer, options=options,
                           on_action=on_action, on_log=on_log)
        sn.durable = len(sn.wal)
        self._app_recover(sn)
        sn.local = Channel("local", sn.node, sn.node, sn.inc)
        sn.sock = {p: None for p in sn.sock}
        sn.arb_sock = None
        self._drive(sn, "start", sn.driver.start)
        self._arm_timer(sn)

    def _arm_timer(self, sn: SimNode) -> None:
        sn.tick_token += 1
        self._push(self.now + sn.tick_period, "tick", (sn.node, sn.tick_token))

    # ================================================================== event heap

    def _push(self, time: int, kind: str, arg) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, self.rng.random(), self._seq, kind, arg))

    def run_until(self, end_time: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= end_time:
            time, _, _, kind, arg = heapq.heappop(heap)
            self.now = time
            if kind == "chan":
                self._on_channel(arg)
            elif kind == "tick":
                self._on_node_tick(*arg)
            elif kind == "world":
                self._on_world_tick()
            elif kind == "storage":
                self._on_storage(*arg)
            elif kind == "app":
                self._on_app(*arg)
            elif kind == "restore":
                self.restores.step(arg)
        self.now = max(self.now, end_time)

    def run_ticks(self, ticks: int) -> None:
        self.run_until(self.now + ticks * UNITS_PER_TICK)

    @property
    def tick(self) -> int:
        return self.now // UNITS_PER_TICK

    # ================================================================== channels

    def _enqueue(self, ch: Channel, item, delay: int) -> None:
        if ch.dead:
            return
        ready = self.now + delay
        if ch.q:
            ready = max(ready, ch.q[-1][0])
        ch.q.append((ready, item))
        if not ch.armed and len(ch.q) == 1:
            ch.armed = True
            self._push(ready, "chan", ch)

    def _blocked(self, ch: Channel) -> bool:
        if ch.kind == "local":
            return self.nodes[ch.dst].paused
        if ch.kind == "peer":
            return (ch.src, ch.dst) in self.blocked or self.nodes[ch.dst].paused
        if ch.kind == "n2a":
            return (ch.src, ARB) in self.blocked
        return (ARB, ch.dst) in self.blocked or self.nodes[ch.dst].paused  # a2n

    def _on_channel(self, ch: Channel) -> None:
        ch.armed = False
        if ch.dead or not ch.q:
            return
        if self._blocked(ch):
            self._stalled.append(ch)
            return
        _, item = ch.q.popleft()
        if ch.q:
            ch.armed = True
            self._push(max(self.now, ch.q[0][0]), "chan", ch)
        kind = ch.kind
        if kind == "local":
            self._on_local(self.nodes[ch.dst], item)
        elif kind == "peer":
            self._on_peer_item(ch, item)
        elif kind == "n2a":
            self._on_arbitrator_request(ch, item)
        else:
            self._on_arbitrator_item(ch, item)

    def _rearm_stalled(self) -> None:
        stalled, self._stalled = self._stalled, []
        for ch in stalled:
            if not ch.dead and ch.q and not ch.armed:
                ch.armed = True
                self._push(max(self.now, ch.q[0][0]), "chan", ch)

    def _latency(self, src: int, dst: int) -> int:
        o = self.opts
        d = self.rng.randint(o.latency_units_min, o.latency_units_max)
        if o.slow_message_rate and self.rng.random() < o.slow_message_rate:
            d += self.rng.randint(0, o.slow_latency_units_max)
        return d + self.link_slow.get((src, dst), 0)

    def _local(self, sn: SimNode, event, delay: int = 1) -> None:
        if sn.local is not None:
            self._enqueue(sn.local, event, delay)

    # ================================================================== peer connections

    def _pair(self, a: int, b: int) -> tuple[int, int]:
        return (a, b) if a < b else (b, a)

    def _chan(self, kind: str, src: int, dst: int, gen: int) -> Channel:
        key = (kind, src, dst, gen)
        ch = self.channels.get(key)
        if ch is None:
            ch = self.channels[key] = Channel(kind, src, dst, gen)
        return ch

    def _connect(self, a: int, b: int) -> None:
        self._gen += 1
        gen = self._gen
        self.conns[self._pair(a, b)] = Conn(a, b, gen)
        # The hello completes at each side when the other's first bytes arrive: a marker at
        # the head of each direction, so PeerConnected precedes every message of the link.
        self._enqueue(self._chan("peer", a, b, gen), ("connected",), self._latency(a, b))
        self._enqueue(self._chan("peer", b, a, gen), ("connected",), self._latency(b, a))

    def _break(self, a: int, b: int, *, notify: bool) -> None:
        """The connection between a and b dies; what is in flight is lost. With `notify`,
        each side whose socket is still open is told (a RST/FIN) when the path lets it."""
        conn = self.conns.pop(self._pair(a, b), None)
        if conn is None:
            return
        conn.alive = False
        gen = conn.gen
        for s, d in ((a, b), (b, a)):
            ch = self.channels.pop(("peer", s, d, gen), None)
            if ch is not None:
                ch.dead = True
        if notify:
            for s, d in ((a, b), (b, a)):
                if self.nodes[d].sock.get(s) == gen:
                    # A channel of its own (not registered): the close notice outlives the link.
                    self._enqueue(Channel("peer", s, d, gen), ("closed",), self._latency(s, d))

    def reset_link(self, sn: SimNode, peer: int) -> bool:
        """Bus.reset: `sn` closes its socket to `peer` (ResetConnection, a bad frame); True
        when one was open (the driver then steps PeerDisconnected itself)."""
        gen = sn.sock.get(peer)
        if gen is None:
            return False
        sn.sock[peer] = None
        conn = self.conns.get(self._pair(sn.node, peer))
        if conn is not None and conn.gen == gen:
            self._break(sn.node, peer, notify=True)
        return True

    def _on_peer_item(self, ch: Channel, item) -> None:
        dst = self.nodes[ch.dst]
        if not dst.up:
            return
        if isinstance(item, tuple):
            what = item[0]
            if what == "connected":
                conn = self.conns.get(self._pair(ch.src, ch.dst))
                if conn is None or conn.gen != ch.gen:
                    return
                if dst.sock[ch.src] is not None:
                    # A new connection from a peer replaces a half-open one.
                    dst.sock[ch.src] = None
                    self._event(dst, PeerDisconnected(ch.src))
                dst.sock[ch.src] = ch.gen
                self._event(dst, PeerConnected(ch.src))
            elif what == "closed":
                if dst.sock[ch.src] == ch.gen:
                    dst.sock[ch.src] = None
                    self._event(dst, PeerDisconnected(ch.src))
            return
        if dst.sock[ch.src] != ch.gen:
            return
        # The frame as the transport reads it: through the real wire codec.
        msg = codec.decode_bytes(item)
        self._drive(dst, f"n{ch.src}: {msg.describe()}", dst.driver.received, ch.src, [msg])

    def send_frame(self, sn: SimNode, peer: int, frame: bytes) -> None:
        """Bus.send: one encoded frame on the connection `sn` holds to `peer`."""
        gen = sn.sock.get(peer)
        if gen is None:
            return
        conn = self.conns.get(self._pair(sn.node, peer))
        if conn is None or conn.gen != gen:
            return
        if self.faults_on and self.opts.conn_loss_rate and self.rng.random() < self.opts.conn_loss_rate:
            self.stats.conn_losses += 1
            # Lost on the wire: TCP gives up on the connection. Half the time both ends hear
            # of it at once, else only their heartbeat timeouts find out.
            self._break(sn.node, peer, notify=self.rng.random() < 0.5)
            return
        self._enqueue(self._chan("peer", sn.node, peer, gen), frame, self._latency(sn.node, peer))

    # ================================================================== arbitrator

    def _arb_connect(self, sn: SimNode) -> None:
        self._gen += 1
        self.arb_conns[sn.node] = Conn(sn.node, ARB, self._gen)
        self._enqueue(self._chan("a2n", ARB, sn.node, self._gen), ("connected",), self._latency(ARB, sn.node))

    def _arb_break(self, node: int, *, notify: bool = True) -> None:
        conn = self.arb_conns.pop(node, None)
        if conn is None:
            return
        conn.alive = False
        for key in (("n2a", node, ARB, conn.gen), ("a2n", ARB, node, conn.gen)):
            ch = self.channels.pop(key, None)
            if ch is not None:
                ch.dead = True
        sn = self.nodes[node]
        if notify and sn.arb_sock == conn.gen:
            # A channel of its own (not registered): the close notice outlives the link.
            self._enqueue(Channel("a2n", ARB, node, conn.gen), ("closed", conn.gen), self._latency(ARB, node))

    def _on_arbitrator_item(self, ch: Channel, item) -> None:
        sn = self.nodes[ch.dst]
        if not sn.up:
            return
        what = item[0]
        if what == "connected":
            conn = self.arb_conns.get(sn.node)
            if conn is None or conn.gen != ch.gen:
                return
            sn.arb_sock = ch.gen
            self._event(sn, ArbitratorConnected())
        elif what == "closed":
            if sn.arb_sock == item[1]:
                sn.arb_sock = None
                self._event(sn, ArbitratorLost())
        elif sn.arb_sock == ch.gen:  # ("answer", frame)
            msg = codec.decode_bytes(item[1])
            self._drive(sn, f"arbitrator: {msg.describe()}", sn.driver.arbitrator_message, msg)

    def send_to_arbitrator(self, sn: SimNode, frame: bytes) -> None:
        """Bus.to_arbitrator: one encoded frame on this node's arbitrator connection."""
        conn = self.arb_conns.get(sn.node)
        if sn.arb_sock is not None and conn is not None and conn.gen == sn.arb_sock:
            self._enqueue(self._chan("n2a", sn.node, ARB, conn.gen), frame, self._latency(sn.node, ARB))

    def reset_arbitrator_link(self, sn: SimNode) -> bool:
        """Bus.reset_arbitrator: `sn` closes its arbitrator socket."""
        if sn.arb_sock is None:
            return False
        conn = self.arb_conns.get(sn.node)
        if conn is not None and conn.gen == sn.arb_sock:
            self._arb_break(sn.node, notify=False)
        sn.arb_sock = None
        return True

    def _on_arbitrator_request(self, ch: Channel, frame: bytes) -> None:
        req = codec.decode_bytes(frame)
        if type(req) is not ArbitratorRequest:
            raise SimError(f"n{ch.src} sent the arbitrator {req.describe()}")
        node, epoch = req.node, req.epoch
        conn = self.arb_conns.get(node)
        if not self.arb_up or conn is None or conn.gen != ch.gen:
            return
        if self.now < self.arb_refuse_until:
            granted = False  # just restarted without its table: wait out any lease it gave
        else:
            granted = self.arb_table.request(VGROUP, node, epoch, self.now) is None
        self._trace(f"arbitrator {'grants' if granted else 'refuses'} n{node} e{epoch}")
        lease_ms = self.arb_lease_units * TICK_MS // UNITS_PER_TICK
        answer = codec.encode(ArbitratorGrant(req.vgroup_id, node, epoch, lease_ms, int(granted)))
        self._enqueue(self._chan("a2n", ARB, node, ch.gen), ("answer", answer), self._latency(ARB, node))

    # ================================================================== stepping a replica

    def _trace(self, text: str) -> None:
        line = f"t{self.now // UNITS_PER_TICK}.{self.now % UNITS_PER_TICK} {text}"
        if self.record_trace:
            self.trace.append(line)
        self._hash.update(line.encode())

    def _drive(self, sn: SimNode, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """One call into `sn`'s driver (an event, a tick, frames, a completion, a restore
        session's question), which runs the actions it leads to; then the batch ends. Returns
        what the call returns (None when the process crashed). A crash armed for this node
        lands before one of those actions (the driver's hook raises _Crash) or after the last."""
        if not sn.up:
            return None
        self.stats.events += 1
        self._trace(f"n{sn.node} <- {what}")
        sn.actions_seen = 0
        try:
            result = call(*args)
            sn.driver.end_batch()  # type: ignore[union-attr]
        except _Crash:
            self.crash(sn.node, mid_step=True)
            return None
        except InvariantViolation as exc:
            raise InvariantViolation(f"n{sn.node} on {what}: {exc}") from exc
        if sn.crash_now or (sn.crash_armed and sn.actions_seen):
            self.crash(sn.node, mid_step=True)
            return None
        self._check_node(sn)
        return result

    call_driver = _drive  # the restore sessions' way in (vrepl/testing/sim/restore.py)

    # ------------------------------------------------------------------ restore sessions

    def session_alive(self, s: RestoreSession) -> str | None:
        """Why session `s` is dead, or None: a side crashed, its connection was cut."""
        m, f = self.nodes[s.master], self.nodes[s.follower]
        if not m.up or m.inc != s.master_inc:
            return f"n{s.master} (the master) went down"
        if not f.up or f.inc != s.follower_inc:
            return f"n{s.follower} (the follower) went down"
        conn = self.conns.get(self._pair(s.master, s.follower))
        if conn is None or conn.gen != s.gen:
            return "the connection between them is gone"
        if self.faults_on and self.opts.restore_cut_rate and self.rng.random() < self.opts.restore_cut_rate:
            self.stats.conn_losses += 1
            return "the sync connection was cut"
        return None

    def session_blocked(self, s: RestoreSession) -> bool:
        m, f = self.nodes[s.master], self.nodes[s.follower]
        return ((s.master, s.follower) in self.blocked or (s.follower, s.master) in self.blocked
                or m.paused or f.paused)

    def schedule_session(self, s: RestoreSession, delay: int) -> None:
        self._push(self.now + delay, "restore", s)

    def latency(self, src: int, dst: int) -> int:
        return self._latency(src, dst)

    def chunk_records(self) -> int:
        return self.rng.randint(1, 8)

    def note(self, text: str) -> None:
        self._trace(text)

    def conn_gen(self, a: int, b: int) -> int:
        conn = self.conns.get(self._pair(a, b))
        return conn.gen if conn is not None else -1

    def _event(self, sn: SimNode, event) -> None:
        if sn.up:
            self._drive(sn, event.describe(), sn.driver.step, event)  # type: ignore[union-attr]

    def _on_local(self, sn: SimNode, item) -> None:
        """A completion of this node's disk or app, back through the driver's entry for it."""
        if not sn.up:
            return
        d = sn.driver
        t = type(item)
        if t is WalPersisted:
            self._drive(sn, item.describe(), d.wal_durable, item.up_to_version)
        elif t is TruncateDone:
            sn.truncating -= 1
            self._drive(sn, item.describe(), d.wal_truncated, item.last_epoch, item.last_version)
        elif t is AppAcked:
            self._drive(sn, item.describe(), d.app_acked, item.version)
        elif t is tuple:  # ("read", reader, from_version): the WAL read back for a stream
            _, reader, first = item
            recs = sn.wal[first - 1: first - 1 + self.rng.randint(1, 8)]
            data, scan = encode_block(recs) if recs else (None, None)
            self._drive(sn, f"WAL read v{first}: {len(recs)} records", d.wal_block, reader, data, scan)
        else:
            self._event(sn, item)

    def _on_node_tick(self, node: int, token: int) -> None:
        sn = self.nodes[node]
        if not sn.up or sn.tick_token != token or sn.paused:
            return  # a paused process's timer is frozen (it catches up nothing on SIGCONT)
        self._push(self.now + sn.tick_period, "tick", (node, token))
        self._drive(sn, "tick", sn.driver.tick)

    def _check_node(self, sn: SimNode) -> None:
        r = sn.replica
        if sn.truncating:
            return  # the WAL was cut; the replica learns it from TruncateDone
        if r.last_version != len(sn.wal) or (sn.wal and r.last_epoch != sn.wal[-1].epoch):
            raise SimError(f"n{sn.node} replica log end e{r.last_epoch}v{r.last_version} but its WAL ends at"
                           f" {sn.wal[-1].describe() if sn.wal else 'v0'}")

    # ================================================================== storage (WAL) and app

    def wal_append(self, sn: SimNode, records: list[Record]) -> None:
        """Storage.append: readable at once (page cache), durable at the next fsync job."""
        for rec in records:
            if rec.version != len(sn.wal) + 1:
                raise SimError(f"n{sn.node} WAL gap: appending {rec.describe()} after v{len(sn.wal)}")
            if sn.wal and rec.epoch < sn.wal[-1].epoch:
                raise SimError(f"n{sn.node} WAL epoch goes back: {rec.describe()} after {sn.wal[-1].describe()}")
            sn.wal.append(rec)
            self.history.on_append(sn.node, rec)
        # Group commit: an fsync not yet started takes every append queued so far.
        if sn.jobs and sn.jobs[-1][0] == "sync" and not (sn.job_running and len(sn.jobs) == 1):
            sn.jobs[-1][1] = len(sn.wal)
        else:
            sn.jobs.append(["sync", len(sn.wal)])
        self._start_job(sn)

    def wal_truncate(self, sn: SimNode, version: int) -> None:
        """Storage.truncate_after: a job behind the fsyncs already queued."""
        if version < sn.app_commit:
            raise SafetyViolation(f"n{sn.node} truncates its WAL after v{version}, below its commit version"
                                  f" v{sn.app_commit}")
        archived = len(sn.archive)
        if version < archived:
            # Issue 13: the app archived records the group never confirmed; the WAL now cuts
            # them, and the node would go on serving the wrong rows.
            raise SafetyViolation(f"n{sn.node} truncates its WAL after v{version}, below its app's archived"
                                  f" version v{archived} (flush limit {self.opts.flush_limit}): archived"
                                  f" {sn.archive[version].describe()}..{sn.archive[-1].describe()} are cut")
        # The app drops what it applied or would apply from the discarded records.
        del sn.memtable[version - archived:]
        sn.app_q = deque((t, v) for t, v in sn.app_q if v <= version)
        sn.truncating += 1
        sn.jobs.append(["trunc", version])
        self._start_job(sn)

    def _start_job(self, sn: SimNode) -> None:
        if sn.job_running or not sn.jobs:
            return
        sn.job_running = True
        o = self.opts
        d = self.rng.randint(o.fsync_units_min, o.fsync_units_max)
        if self.now < sn.fsync_slow_until:
            d += self.rng.randint(0, o.slow_disk_units_max)
        self._push(max(self.now + d, sn.disk_stalled_until), "storage", (sn.node, sn.inc))

    def _on_storage(self, node: int, inc: int) -> None:
        sn = self.nodes[node]
        if not sn.up or sn.inc != inc:
            return
        sn.job_running = False
        kind, arg = sn.jobs.popleft()
        if kind == "sync":
            arg = min(arg, len(sn.wal))
            if arg > sn.durable:
                sn.durable = arg
                self._local(sn, WalPersisted(arg))
        else:
            dropped = sn.wal[arg:]
            del sn.wal[arg:]
            sn.durable = min(sn.durable, arg)
            self.stats.truncations += 1
            if dropped:
                self.history.on_truncate(node, arg, [x.wal[: x.durable] for x in self.nodes.values()], dropped)
            self._local(sn, TruncateDone(sn.wal[-1].epoch if sn.wal else 0, arg))
        self._start_job(sn)

    def wal_read(self, sn: SimNode, reader: int, from_version: int) -> None:
        """Storage.read_wal: the next block (1-8 records, as written: the page cache is
        readable) comes back as a completion through the driver's wal_block."""
        self._local(sn, ("read", reader, from_version))

    def app_write(self, sn: SimNode, records: list[Record]) -> None:
        """App.write_to_cache: applied now, acked (AppAcked) after a delay, in order."""
        self._app_apply(sn, records)
        self._app(sn, records[-1].version)

    def _app(self, sn: SimNode, version: int) -> None:
        ready = max(sn.app_last, self.now + self.rng.randint(1, self.opts.app_units_max))
        sn.app_last = ready
        sn.app_q.append((ready, version))
        self._push(ready, "app", (sn.node, sn.inc))

    def _on_app(self, node: int, inc: int) -> None:
        sn = self.nodes[node]
        if not sn.up or sn.inc != inc or not sn.app_q or sn.app_q[0][0] > self.now:
            return
        if sn.paused:
            self._push(self.now + UNITS_PER_TICK, "app", (node, inc))
            return
        _, version = sn.app_q.popleft()
        self._local(sn, AppAcked(version), 0)

    # ------------------------------------------------------------------ the app's data

    def _app_recover(self, sn: SimNode) -> None:
        """Start-up: the app reloads its archive and replays its WAL above the archived
        version into the memtable (docs/vnode.md §6)."""
        archived = len(sn.archive)
        if archived > len(sn.wal) or sn.wal[:archived] != sn.archive:
            raise SafetyViolation(f"n{sn.node} starts with its app archived up to v{archived} but its WAL"
                                  f" ends at v{len(sn.wal)} or differs below it (flush limit"
                                  f" {self.opts.flush_limit}): the app archived records its WAL lost")
        sn.memtable = sn.wal[archived:]
        sn.app_commit = 0
        sn.commit_checked = 0

    def _app_apply(self, sn: SimNode, records) -> None:
        """The app applies records in version order; each must be its WAL's record there."""
        for rec in records:
            v = rec.version
            applied = len(sn.archive) + len(sn.memtable)
            if v != applied + 1:
                raise SimError(f"n{sn.node} app applies v{v} after v{applied}")
            have = sn.wal[v - 1] if v <= len(sn.wal) else None
            if have != rec:
                raise SafetyViolation(f"n{sn.node} app applies {rec.describe()} {rec.payload!r} but its WAL has"
                                      f" {have.describe() if have else 'nothing'} at v{v}")
            sn.memtable.append(rec)

    def app_commit(self, sn: SimNode, version: int) -> None:
        """CommitAdvanced (notify_commit): the app may archive up to `version`; the checker
        learns which records are committed."""
        if version <= sn.app_commit:
            raise SimError(f"n{sn.node} commit goes back from v{sn.app_commit} to v{version}")
        if version > sn.durable:
            raise SafetyViolation(f"n{sn.node} commits v{version} but its WAL is durable only to v{sn.durable}")
        sn.app_commit = version
        self.history.on_commit(sn.node, sn.wal, sn.commit_checked, version)
        sn.commit_checked = version

    def app_flush(self, sn: SimNode) -> int:
        """Archive the memtable up to the flush limit; returns the archived version."""
        archived = len(sn.archive)
        applied = archived + len(sn.memtable)
        limit = applied if self.opts.flush_limit == "applied" else min(applied, sn.app_commit)
        if limit > archived:
            k = limit - archived
            sn.archive.extend(sn.memtable[:k])
            del sn.memtable[:k]
            self.stats.flushes += 1
            self.stats.archived += k
            self._trace(f"n{sn.node} FLUSH archived v{archived + 1}..v{limit}")
        return len(sn.archive)

    def app_rows(self, sn: SimNode) -> list[Record]:
        """What the app serves: archive + memtable."""
        return sn.archive + sn.memtable

    # ================================================================== client and roles

    def app_role(self, sn: SimNode, role: Role, epoch: int, master: int | None) -> None:
        """App.notify_role."""
        master_node = NO_NODE if master is None else master
        self.role_log.append((self.now, sn.node, epoch, role, master_node))
        self._trace(f"n{sn.node} is {NotifyRole(role, epoch, master_node).describe()}")
        if role == Role.MASTER:
            if sn.truncating:
                # The WAL is cutting records this master counts as its log (it advertised
                # them when it won); TruncateDone would then rewind a master's log end.
                raise SafetyViolation(f"n{sn.node} became master of e{epoch} while its WAL truncation"
                                      f" (TruncateWalAfter v{sn.jobs_trunc_target()}) is still pending")
            self.stats.elections += 1
            self.stats.max_epoch = max(self.stats.max_epoch, epoch)
            self.history.on_master(sn.node, epoch, sn.wal)

    def masters(self) -> list[SimNode]:
        return [sn for sn in self.nodes.values() if sn.up and sn.replica.role == Role.MASTER]

    def submit(self, sn: SimNode, count: int = 1, batch: bool = False) -> list[int]:
        """The app on `sn` writes `count` new records (versions after its log end)."""
        r = sn.replica
        first = r.last_version + 1
        epoch = r.promised_epoch
        payloads = []
        for i in range(count):
            self.payload_seq += 1
            payloads.append(b"s%d.w%d" % (self.seed, self.payload_seq))
            sn.outstanding[first + i] = Record(epoch, first + i, payloads[-1])
        self.stats.writes_submitted += count
        if batch and count > 1:
            self._drive(sn, f"app forwards v{first}..v{first + count - 1}", sn.driver.forward, first, payloads)
        else:
            for i, p in enumerate(payloads):
                if not sn.up:
                    break
                self._event(sn, AppForward(first + i, p))
        return list(range(first, first + count))

    def app_confirm(self, sn: SimNode, first: int, last: int, st: ConfirmStatus) -> None:
        """App.confirm_forward: the client hears the outcome of its writes first..last."""
        for v in range(first, last + 1):
            rec = sn.outstanding.pop(v, None)
            if rec is None:
                raise SimError(f"n{sn.node} {ConfirmForward(first, last, st).describe()}: v{v} has no write in flight")
            if st != ConfirmStatus.NOT_MASTER:
                # The vnode applies a record at its outcome (vrepl/node/vgroup.py _confirm):
                # ok, timed_out and failed records are in the WAL.
                self._app_apply(sn, (rec,))
            if st == ConfirmStatus.OK:
                self.stats.confirmed_ok += 1
                have = sn.wal[v - 1] if v <= len(sn.wal) else None
                if have != rec:
                    raise SafetyViolation(f"n{sn.node} confirmed {rec.describe()} {rec.payload!r} ok but its WAL"
                                          f" has {have.describe() if have else 'nothing'} there")
                if sn.durable < v:
                    raise SafetyViolation(f"n{sn.node} confirmed v{v} before its own WAL was durable there")
                masters = [(m.node, m.replica.promised_epoch, m.wal) for m in self.masters()]
                self.history.on_confirm_ok(sn.node, rec, masters)
                if self.on_confirm is not None:
                    self.on_confirm(sn.node, rec)
            elif st == ConfirmStatus.FAILED:
                self.stats.confirmed_failed += 1
            elif st == ConfirmStatus.TIMED_OUT:
                self.stats.confirmed_timed_out += 1
            else:
                self.stats.confirmed_not_master += 1
        if st == ConfirmStatus.OK and sn.node in self.kill_on_confirm:
            self.kill_on_confirm.discard(sn.node)
            sn.crash_now = True  # the rest of this action list never runs

    # ================================================================== faults (public: tests script them)

    def crash(self, node: int, *, mid_step: bool = False, torn: bool | None = None) -> None:
        """Kill the process: un-fsynced WAL records are lost, or (torn tail) part of them."""
        sn = self.nodes[node]
        if not sn.up:
            return
        self.stats.crashes += 1
        self._trace(f"n{node} CRASH{' mid-step' if mid_step else ''}")
        if torn is None:
            torn = self.rng.random() < self.opts.torn_tail_share
        if torn and len(sn.wal) > sn.durable:
            # The OS wrote some pages of the unsynced tail before the crash, maybe half a
            # record: recovery keeps the whole records before the torn one.
            sn.wal = torn_recovery(sn.wal[: sn.durable], sn.wal[sn.durable:], self.rng)
        else:
            del sn.wal[sn.durable:]
        sn.durable = len(sn.wal)
        sn.up = False
        sn.paused = False
        sn.crash_armed = sn.crash_now = False
        sn.truncating = 0
        sn.inc += 1
        sn.jobs.clear()
        sn.job_running = False
        sn.app_q.clear()
        sn.memtable = []  # the archive stays: it is files
        sn.app_commit = 0
        sn.commit_checked = 0
        if sn.local is not None:
            sn.local.dead = True
        sn.local = None
        self.stats.unknown += len(sn.outstanding)
        sn.outstanding.clear()
        sn.down_since = self.now
        for peer in self.node_ids:
            if peer != node:
                sn.sock[peer] = None
                self._break(node, peer, notify=True)  # the kernel resets its sockets
        self._arb_break(node)
        sn.arb_sock = None
        sn.replica = sn.driver = None

    def restart(self, node: int) -> None:
        sn = self.nodes[node]
        if sn.up:
            return
        self.stats.restarts += 1
        # This draw chose the one-epoch history the core no longer accepts (docs/simulation.md
        # finding 3); it stays so that every seed keeps the schedule it had.
        self.rng.random()
        self._trace(f"n{node} RESTART e{sn.wal[-1].epoch if sn.wal else 0}v{len(sn.wal)}"
                    f" promise e{sn.promise[0]}@n{sn.promise[1]}")
        sn.app_last = self.now
        self._boot(sn)

    def pause(self, node: int) -> None:
        sn = self.nodes[node]
        if sn.running:
            self.stats.pauses += 1
            self._trace(f"n{node} PAUSE")
            sn.paused = True
            sn.paused_since = self.now

    def resume(self, node: int) -> None:
        sn = self.nodes[node]
        if sn.up and sn.paused:
            self._trace(f"n{node} RESUME")
            sn.paused = False
            self._arm_timer(sn)
            self._rearm_stalled()

    def stall_disk(self, node: int, ticks: int) -> None:
        """No fsync or truncation of `node` completes for `ticks` ticks (a hung disk)."""
        self.nodes[node].disk_stalled_until = self.now + ticks * UNITS_PER_TICK
        self._trace(f"n{node} DISK STALLED for {ticks} ticks")

    def block(self, src: int, dst: int) -> None:
        """Messages src -> dst are held back (a one-way partition); ARB names the arbitrator."""
        self.blocked.add((src, dst))

    def partition(self, *groups: tuple[int, ...]) -> None:
        """Symmetric partition: no traffic between different groups (nodes not named are
        in a group of their own)."""
        where = {}
        for g, members in enumerate(groups):
            for x in members:
                where[x] = g
        for a in self.node_ids:
            for b in self.node_ids:
                if a != b and where.get(a, ("own", a)) != where.get(b, ("own", b)):
                    self.blocked.add((a, b))
        self._trace(f"PARTITION {groups}")

    def cut(self, a: int, b: int) -> None:
        self.blocked.add((a, b))
        self.blocked.add((b, a))
        self._trace(f"CUT n{a}-n{b}" if b != ARB else f"CUT n{a}-arbitrator")

    def heal(self) -> None:
        self.blocked.clear()
        self.link_slow.clear()
        self.arb_blocked_since.clear()
        self._trace("HEAL network")
        self._rearm_stalled()

    def arbitrator_crash(self) -> None:
        if not self.arb_up:
            return
        self.stats.arbitrator_crashes += 1
        self._trace("arbitrator CRASH")
        self.arb_up = False
        for node in list(self.arb_conns):
            self._arb_break(node)

    def arbitrator_restart(self) -> None:
        if self.arb_up or not self.arb_used:
            return
        self._trace("arbitrator RESTART")
        self.arb_up = True
        if self.opts.arbitrator_forgets:
            self.arb_table = LeaseTable(self.arb_lease_units)
            self.arb_refuse_until = self.now + self.arb_lease_units

    # ================================================================== the world's tick

    def _on_world_tick(self) -> None:
        self._push(self.now + UNITS_PER_TICK, "world", None)
        tick = self.tick
        if self.faults_on:
            self._inject_faults()
        # The transport retries missing connections every reconnect_ticks (staggered per pair).
        for a in self.node_ids:
            for b in self.node_ids:
                if a < b and (tick + a * 3 + b) % self.opts.reconnect_ticks == 0 and self._pair(a, b) not in self.conns:
                    sa, sb = self.nodes[a], self.nodes[b]
                    if sa.running and sb.running and (a, b) not in self.blocked and (b, a) not in self.blocked:
                        self._connect(a, b)
        if self.arb_used:
            for node, sn in self.nodes.items():
                blocked = (node, ARB) in self.blocked or (ARB, node) in self.blocked
                if blocked and node in self.arb_conns:
                    since = self.arb_blocked_since.setdefault(node, tick)
                    if tick - since >= 20:  # the transport's keepalive gives up
                        self.arb_blocked_since.pop(node, None)
                        self._arb_break(node, notify=False)
                        if sn.arb_sock is not None and sn.running:
                            sn.arb_sock = None
                            self._event(sn, ArbitratorLost())
                elif not blocked:
                    self.arb_blocked_since.pop(node, None)
                if (self.arb_up and sn.running and node not in self.arb_conns and not blocked
                        and (tick + node) % self.opts.reconnect_ticks == 0):
                    if sn.arb_sock is not None:
                        sn.arb_sock = None
                        self._event(sn, ArbitratorLost())
                    self._arb_connect(sn)
        if self.opts.flush_rate:
            for sn in self.nodes.values():
                if self.app_rng.random() < self.opts.flush_rate and sn.running:
                    self.app_flush(sn)
        if self.workload_on:
            for sn in self.masters():
                if sn.running and self.rng.random() < self.opts.write_rate:
                    count = self.rng.randint(1, 3)
                    self.submit(sn, count, batch=self.rng.random() < self.opts.batch_rate)

    def _inject_faults(self) -> None:
        o, rng = self.opts, self.rng
        nodes = list(self.nodes.values())
        for sn in nodes:
            if sn.up and not sn.crash_armed and rng.random() < o.crash_rate:
                if rng.random() < o.crash_mid_step_share:
                    sn.crash_armed = True
                else:
                    self.crash(sn.node)
            elif not sn.up and rng.random() < o.restart_rate:
                self.restart(sn.node)
            elif sn.running and rng.random() < o.pause_rate:
                self.pause(sn.node)
            elif sn.paused and rng.random() < o.resume_rate:
                self.resume(sn.node)
            if sn.up and rng.random() < o.slow_disk_rate:
                sn.fsync_slow_until = self.now + rng.randint(1, 100) * UNITS_PER_TICK
        if rng.random() < o.partition_rate:
            self._random_partition()
        if self.blocked and rng.random() < o.heal_rate:
            self.heal()
        if rng.random() < o.link_slow_rate:
            a, b = rng.sample(self.node_ids, 2)
            self.link_slow[(a, b)] = rng.randint(10, 200)
        if self.arb_used:
            if self.arb_up and rng.random() < o.arbitrator_crash_rate:
                self.arbitrator_crash()
            elif not self.arb_up and rng.random() < o.arbitrator_restart_rate:
                self.arbitrator_restart()
            if rng.random() < o.arbitrator_link_cut_rate:
                node = rng.choice(self.node_ids)
                if rng.random() < 0.5:
                    self.cut(node, ARB)
                else:
                    self.block(*rng.choice(((node, ARB), (ARB, node))))
                    self._trace(f"ONE-WAY arbitrator link of n{node}")

    def _random_partition(self) -> None:
        rng, ids = self.rng, list(self.node_ids)
        self.stats.partitions += 1
        if self.opts.isolate_master_share and rng.random() < self.opts.isolate_master_share:
            masters = [m.node for m in self.masters()]
            if masters:
                # Cut a master off from its majority: every other replica and the arbitrator.
                victim = rng.choice(masters)
                self.partition((victim,), tuple(x for x in ids if x != victim))
                if self.arb_used:
                    self.cut(victim, ARB)
                return
        kind = rng.randrange(5)
        if kind == 0:  # isolate one node (often the master)
            masters = [m.node for m in self.masters()]
            victim = rng.choice(masters) if masters and rng.random() < 0.7 else rng.choice(ids)
            self.partition((victim,), tuple(x for x in ids if x != victim))
        elif kind == 1:  # split in two halves
            rng.shuffle(ids)
            k = rng.randint(1, len(ids) - 1)
            self.partition(tuple(ids[:k]), tuple(ids[k:]))
        elif kind == 2:  # one-way link
            a, b = rng.sample(ids, 2)
            self.block(a, b)
            self._trace(f"ONE-WAY n{a}->n{b} blocked")
        elif kind == 3 and len(ids) >= 3:  # bridge: two sides that only one node hears both of
            rng.shuffle(ids)
            bridge, rest = ids[0], ids[1:]
            k = rng.randint(1, len(rest) - 1)
            left, right = rest[:k], rest[k:]
            for a in left:
                for b in right:
                    self.blocked.add((a, b))
                    self.blocked.add((b, a))
            self._trace(f"BRIDGE n{bridge} between {left} and {right}")
        else:  # one random symmetric link
            a, b = rng.sample(ids, 2)
            self.cut(a, b)
        if self.arb_used and rng.random() < 0.3:
            self.cut(rng.choice(ids), ARB)

    # ================================================================== phases

    def heal_all(self) -> None:
        """Start of the liveness phase: every fault healed, every node running."""
        self.faults_on = False
        self.phase = "liveness"
        self.heal()
        for sn in self.nodes.values():
            sn.fsync_slow_until = sn.disk_stalled_until = 0
            sn.crash_armed = False
            if not sn.up:
                self.restart(sn.node)
            elif sn.paused:
                self.resume(sn.node)
        if self.arb_used and not self.arb_up:
            self.arbitrator_restart()
        self.heal_time = self.now

    def converged(self) -> SimNode | None:
        """The master, once every node is up, follows it as a slave of its epoch, and every
        WAL is durable and identical to the master's."""
        masters = self.masters()
        if len(masters) != 1:
            return None
        m = masters[0]
        epoch = m.replica.promised_epoch
        for sn in self.nodes.values():
            if not sn.running or sn.jobs or sn.job_running:
                return None
            if sn is not m:
                r = sn.replica
                if r.role != Role.SLAVE or r.master != m.node or r.promised_epoch != epoch:
                    return None
            if sn.durable != len(sn.wal) or sn.wal != m.wal:
                return None
        return m

    def run_liveness(self, budget_ticks: int | None = None) -> SimNode:
        """Heal everything, then require one master, a confirmed probe write and identical
        durable logs within the budget. Returns the master."""
        budget = self.opts.liveness_ticks if budget_ticks is None else budget_ticks
        self.heal_all()
        self.workload_on = False
        probe: dict[int, int] = {}  # master node -> probe version
        probe_ok = False

        def watch(node: int, rec: Record) -> None:
            nonlocal probe_ok
            if probe.get(node) == rec.version:
                probe_ok = True

        old_hook, self.on_confirm = self.on_confirm, watch
        try:
            end = self.now + budget * UNITS_PER_TICK
            while self.now < end:
                self.run_ticks(1)
                masters = self.masters()
                if len(masters) == 1 and not probe_ok:
                    m = masters[0]
                    if probe.get(m.node) not in m.outstanding:  # none yet, or it failed: write again
                        probe[m.node] = self.submit(m)[0]
                if probe_ok and self.converged() is not None:
                    m = self.converged()
                    self.stats.recovery_ticks = (self.now - self.heal_time) // UNITS_PER_TICK
                    self.history.check_final(m.node, m.wal)
                    for sn in self.nodes.values():
                        if sn.wal != m.wal[: len(sn.wal)]:
                            raise SafetyViolation(f"n{sn.node} log is not a prefix of master n{m.node}'s")
                        self.check_app_final(sn, m)
                    self.stats.lost = len(self.history.lost)
                    return m
        finally:
            self.on_confirm = old_hook
        raise LivenessFailure(
            f"no convergence {budget} ticks after healing (probe confirmed: {probe_ok}):\n  "
            + "\n  ".join(self.describe_node(sn) for sn in self.nodes.values())
        )

    def check_app_final(self, sn: SimNode, m: SimNode) -> None:
        """After healing, every replica's app holds exactly the confirmed log (the master's)."""
        rows = self.app_rows(sn)
        if rows != m.wal:
            where = next((i for i, (x, y) in enumerate(zip(rows, m.wal)) if x != y), min(len(rows), len(m.wal)))
            raise SafetyViolation(f"n{sn.node}'s app holds {len(rows)} rows (archived {len(sn.archive)}) but the"
                                  f" confirmed log has {len(m.wal)}; first difference at v{where + 1}")

    def run(self) -> Stats:
        """The whole run: start, safety phase under faults, liveness phase."""
        self.start()
        self.run_ticks(self.opts.safety_ticks)
        self.run_liveness()
        return self.stats

    # ================================================================== reporting

    def describe_node(self, sn: SimNode) -> str:
        state = "down" if not sn.up else ("paused " if sn.paused else "") + sn.replica.describe()
        last = sn.wal[-1].describe() if sn.wal else "empty"
        return (f"n{sn.node}: {state}; wal {len(sn.wal)} (durable {sn.durable}) last {last};"
                f" promise e{sn.promise[0]}@n{sn.promise[1]}")

    def trace_hash(self) -> str:
        return self._hash.hexdigest()
