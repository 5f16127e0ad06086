"""Faults and the world's tick in the simulator (docs/simulation.md §Fault model).

Owns: `SimFaults`, the part of `World` (vrepl/testing/sim/world.py, which inherits it) that
breaks things — crash (losing the unsynced WAL tail, maybe tearing it), restart, pause,
resume, a stalled or slow disk, partitions, cuts, one-way links, arbitrator crashes — either
scripted by tests through the public methods or drawn each tick by the safety phase, and the
world's tick itself (reconnects, arbitrator keepalive, app flushes, the client's writes).
Must not: execute a replica action (the driver does) or use randomness but the world's PRNGs.
"""
from __future__ import annotations

from vrepl.replica import (
    ArbitratorLost,
    LeaseTable,
)
from vrepl.testing.sim.options import UNITS_PER_TICK
from vrepl.testing.sim.ports import ARB, torn_recovery


class SimFaults:
    """Fault injection and the world tick: a mixin of `World` (its state lives there)."""

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
