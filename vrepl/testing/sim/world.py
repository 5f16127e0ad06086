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
    CUTS_COMMITTED_RECORDS,
    AppAcked,
    AppForward,
    Config,
    ConfirmForward,
    ConfirmStatus,
    InvariantViolation,
    LeaseTable,
    LogLevel,
    NotifyRole,
    Record,
    Replica,
    Role,
    TruncateDone,
    WalPersisted,
)
from vrepl.replica.messages import NO_NODE
from vrepl.testing.records import encode_block, history_of
from vrepl.testing.sim.checker import History, SafetyViolation
from vrepl.testing.sim.disk import SimDiskAndApp
from vrepl.testing.sim.faults import SimFaults
from vrepl.testing.sim.network import SimNetwork
from vrepl.testing.sim.options import UNITS_PER_TICK, SimOptions
from vrepl.testing.sim.ports import VGROUP, Channel, Conn, SimError, SimNode, SimPorts
from vrepl.testing.sim.restore import RestoreSession, SessionRunner, SimRestorer

MID_LIST_CRASH_CHANCE = 0.3  # an armed crash lands before each action with this chance, else after the list


class LivenessFailure(AssertionError):
    """After every fault healed, the cluster did not elect a master and converge in time."""


class _Crash(Exception):
    """Raised from the driver's action hook: the process dies before this action runs."""


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
    restores: int = 0  # restore sessions started (docs/simulation.md §Restore)
    restores_ok: int = 0
    restores_failed: int = 0
    restores_with_files: int = 0  # sessions that ran the files phase
    restore_files_sent: int = 0  # files sent by sessions that ended ok
    restores_files_changed: int = 0  # sessions stopped by a file changed on the source


class World(SimNetwork, SimDiskAndApp, SimFaults):
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
            epoch_history=history_of(sn.wal),
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

    def schedule_session(self, s: RestoreSession, time: int) -> None:
        self._push(time, "restore", s)

    def files_share_drawn(self) -> bool:
        share = self.opts.restore_files_share
        return share >= 1 or (share > 0 and self.rng.random() < share)

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
