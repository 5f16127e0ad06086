"""A tiny deterministic network and storage for scenario tests.

Steps 2-5 `Replica` objects: executes their actions (a WAL per node as a list of records,
promises, a FIFO queue per directed link, an arbitrator lease table) and feeds completions
back as events. Nothing happens unless a test calls deliver()/run()/tick(), so a test
chooses the exact interleaving it wants. Not a simulator of failures on its own: faults are
explicit calls (cut, crash, pause).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from vrepl.replica import (
    ArbitratorConnected,
    ArbitratorGranted,
    ArbitratorLost,
    ArbitratorRefused,
    AppAcked,
    AppForward,
    CommitAdvanced,
    Config,
    ConfirmForward,
    ConfirmStatus,
    Forward,
    LeaseTable,
    Log,
    NotifyRole,
    PeerConnected,
    PeerDisconnected,
    PersistPromisedEpoch,
    PersistRecords,
    Received,
    Record,
    Replica,
    RequestArbitratorGrant,
    ResetConnection,
    Role,
    Send,
    StreamWalFrom,
    TruncateDone,
    TruncateWalAfter,
    WalPersisted,
    WriteToCache,
)
from vrepl.replica.history import EpochHistory

VGROUP = 7


def history_of(wal: list[Record]) -> tuple[tuple[int, int], ...]:
    h = EpochHistory()
    for rec in wal:
        h.note_append(rec.epoch, rec.version)
    return h.pairs()


@dataclass
class SimNode:
    node: int
    replica: Replica
    wal: list[Record] = field(default_factory=list)
    durable_version: int = 0
    promise: tuple[int, int] = (0, -1)
    confirms: dict[int, ConfirmStatus] = field(default_factory=dict)
    roles: list[str] = field(default_factory=list)
    commits: list[int] = field(default_factory=list)  # every CommitAdvanced, in order
    up: bool = True
    paused: bool = False
    auto_persist: bool = True
    auto_app_ack: bool = True
    arbitrator_link: bool = False

    @property
    def role(self) -> Role:
        return self.replica.role

    def versions(self) -> list[tuple[int, int]]:
        return [(r.epoch, r.version) for r in self.wal]


class Net:
    def __init__(
        self,
        n: int,
        *,
        nodes: tuple[int, ...] | None = None,
        logs: dict[int, list[tuple[int, int]]] | None = None,
        promises: dict[int, tuple[int, int]] | None = None,
        **cfg,
    ) -> None:
        """`logs` preloads WALs as (epoch, version) lists; `promises` preloads (epoch, master)."""
        self.node_ids = nodes or tuple(range(n))
        self.cfg_overrides = cfg
        self.now_tick = 0
        self.nodes: dict[int, SimNode] = {}
        for i, node in enumerate(self.node_ids):
            wal = [Record(e, v, b"r%d.%d" % (e, v)) for e, v in (logs or {}).get(node, [])]
            promise = (promises or {}).get(node, (max((r.epoch for r in wal), default=0), -1))
            if promise[0] and promise[1] == -1:
                promise = (promise[0], node)
            sn = SimNode(node, None, wal=wal, durable_version=len(wal), promise=promise)  # type: ignore[arg-type]
            sn.replica = Replica(self._state_config(i, sn))
            self.nodes[node] = sn
        self.links: set[frozenset[int]] = set()
        self.cut_links: set[frozenset[int]] = set()
        self.queues: dict[tuple[int, int], deque] = {}
        self.local: deque[tuple[int, object]] = deque()
        self.lease = LeaseTable(cfg.get("arbitrator_lease_ticks", 20) + 5)
        self.trace: list[str] = []
        self.logs: list[str] = []
        self.confirmed: dict[int, Record] = {}  # every record any master confirmed ok

    def _config(self, i: int, **state) -> Config:
        return Config(vgroup_id=VGROUP, replicas=self.node_ids, self_index=i, **self.cfg_overrides, **state)

    def _state_config(self, i: int, sn: SimNode) -> Config:
        """A config describing what node `sn` has on disk."""
        last = sn.wal[-1] if sn.wal else None
        return self._config(
            i,
            last_version=last.version if last else 0,
            last_epoch=last.epoch if last else 0,
            epoch_history=history_of(sn.wal),
            promised_epoch=sn.promise[0],
            promised_master=sn.promise[1],
        )

    # -------------------------------------------------------------- driving

    def start(self, connect: bool = True) -> None:
        for sn in self.nodes.values():
            self.execute(sn.node, sn.replica.start())
        if connect:
            self.connect_all()
        self.run()

    def connect_all(self) -> None:
        for a in self.node_ids:
            for b in self.node_ids:
                if a < b:
                    self.connect(a, b)

    def connect(self, a: int, b: int) -> None:
        key = frozenset((a, b))
        if key in self.links or key in self.cut_links:
            return
        if not (self.nodes[a].up and self.nodes[b].up):
            return
        self.links.add(key)
        self.queues[(a, b)] = deque()
        self.queues[(b, a)] = deque()
        self.step(a, PeerConnected(b))
        self.step(b, PeerConnected(a))

    def disconnect(self, a: int, b: int) -> None:
        key = frozenset((a, b))
        if key not in self.links:
            return
        self.links.discard(key)
        self.queues.pop((a, b), None)
        self.queues.pop((b, a), None)
        for x, y in ((a, b), (b, a)):
            if self.nodes[x].up:
                self.step(x, PeerDisconnected(y))

    def cut(self, a: int, b: int) -> None:
        self.cut_links.add(frozenset((a, b)))
        self.disconnect(a, b)

    def heal(self, a: int, b: int) -> None:
        self.cut_links.discard(frozenset((a, b)))
        self.connect(a, b)

    def step(self, node: int, event) -> None:
        sn = self.nodes[node]
        if not sn.up:
            return
        self.execute(node, sn.replica.step(event))

    def forward(self, node: int, version: int, payload: bytes = b"x") -> None:
        self.step(node, AppForward(version, payload))

    def deliver(self, src: int, dst: int, count: int = 1) -> int:
        """Deliver up to `count` queued messages src -> dst; returns how many."""
        q = self.queues.get((src, dst))
        done = 0
        while q and done < count and not self.nodes[dst].paused:
            msg = q.popleft()
            self.step(dst, Received(src, msg))
            done += 1
            q = self.queues.get((src, dst))
        return done

    def settle(self) -> None:
        """Process local completions (WAL, app, arbitrator answers) but deliver no message."""
        while self.local:
            self.step(*self.local.popleft())

    def half_close(self, a: int, b: int) -> None:
        """`b` stops hearing `a` (e.g. its heartbeat timed out) while `a` notices nothing."""
        self.step(b, PeerDisconnected(a))

    def half_reopen(self, a: int, b: int) -> None:
        self.step(b, PeerConnected(a))

    def pending(self, src: int, dst: int) -> list[str]:
        return [m.describe() for m in self.queues.get((src, dst), ())]

    def run(self, max_steps: int = 100_000) -> None:
        """Process local completions and deliver messages until quiet (deterministic order)."""
        for _ in range(max_steps):
            if self.local:
                node, event = self.local.popleft()
                self.step(node, event)
                continue
            for (src, dst), q in sorted(self.queues.items()):
                if q and not self.nodes[dst].paused:
                    self.deliver(src, dst)
                    break
            else:
                return
        raise AssertionError("network did not go quiet")

    def tick(self, count: int = 1, run: bool = True) -> None:
        for _ in range(count):
            self.now_tick += 1
            for a in self.node_ids:
                for b in self.node_ids:
                    if a < b:
                        self.connect(a, b)  # reconnect every tick, as the transport does every second
            for sn in self.nodes.values():
                if sn.up and not sn.paused:
                    self.execute(sn.node, sn.replica.tick())
            if run:
                self.run()

    # -------------------------------------------------------------- faults

    def crash(self, node: int) -> None:
        for other in self.node_ids:
            if other != node:
                self.disconnect(node, other)
        sn = self.nodes[node]
        sn.up = False
        sn.wal = sn.wal[: sn.durable_version]  # the page cache is lost with the process

    def restart(self, node: int) -> None:
        sn = self.nodes[node]
        i = self.node_ids.index(node)
        cfg = self._state_config(i, sn)
        sn.replica = Replica(cfg)
        sn.commits = []  # the commit version starts at 0 in a new run
        sn.up = True
        sn.paused = False
        self.execute(node, sn.replica.start())
        for other in self.node_ids:
            if other != node:
                self.connect(node, other)
        if sn.arbitrator_link:
            self.step(node, ArbitratorConnected())

    def arbitrator_connect(self, node: int) -> None:
        self.nodes[node].arbitrator_link = True
        self.step(node, ArbitratorConnected())

    def arbitrator_disconnect(self, node: int) -> None:
        self.nodes[node].arbitrator_link = False
        self.step(node, ArbitratorLost())

    # -------------------------------------------------------------- actions

    def execute(self, node: int, actions: list) -> None:
        sn = self.nodes[node]
        for a in actions:
            if isinstance(a, Log):
                self.logs.append(a.text)
                continue
            self.trace.append(f"n{node}: {a.describe()}")
            if isinstance(a, Send):
                if frozenset((node, a.node)) in self.links:
                    self.queues[(node, a.node)].append(a.message)
            elif isinstance(a, PersistRecords):
                for rec in a.records:
                    assert rec.version == len(sn.wal) + 1, f"n{node} WAL gap at {rec.describe()}"
                    sn.wal.append(rec)
                if sn.auto_persist:
                    self.persist(node)
            elif isinstance(a, TruncateWalAfter):
                # docs/design.md §4.4: committed records are never cut.
                assert not sn.commits or a.version >= sn.commits[-1], f"n{node} cuts below commit v{sn.commits[-1]}"
                del sn.wal[a.version :]
                sn.durable_version = min(sn.durable_version, a.version)
                epoch = sn.wal[-1].epoch if sn.wal else 0
                self.local.append((node, TruncateDone(epoch, a.version)))
            elif isinstance(a, PersistPromisedEpoch):
                sn.promise = (a.epoch, a.master)
            elif isinstance(a, StreamWalFrom):
                key = (node, a.node)
                if frozenset(key) in self.links:
                    prev = a.prev_epoch
                    for rec in sn.wal[a.first_version - 1 : a.last_version]:
                        self.queues[key].append(Forward(a.epoch, rec.version, prev, rec.epoch, rec.payload))
                        prev = rec.epoch
            elif isinstance(a, ResetConnection):
                self.disconnect(node, a.node)
            elif isinstance(a, RequestArbitratorGrant):
                if sn.arbitrator_link:
                    refusal = self.lease.request(VGROUP, node, a.epoch, self.now_tick)
                    answer = ArbitratorGranted(a.epoch) if refusal is None else ArbitratorRefused(a.epoch)
                    self.local.append((node, answer))
            elif isinstance(a, ConfirmForward):
                for v in range(a.first_version, a.last_version + 1):
                    # A refused or failed version may be retried; an ok one is final.
                    assert sn.confirms.get(v) != ConfirmStatus.OK, f"n{node} v{v} confirmed after ok"
                    sn.confirms[v] = a.status
                    if a.status == ConfirmStatus.OK:
                        rec = sn.wal[v - 1]
                        old = self.confirmed.setdefault(v, rec)
                        # Two different records confirmed at one version: the first was lost.
                        assert old == rec, f"confirmed {old.describe()} lost to {rec.describe()}"
            elif isinstance(a, WriteToCache):
                if sn.auto_app_ack:
                    self.local.append((node, AppAcked(a.record.version)))
            elif isinstance(a, NotifyRole):
                sn.roles.append(a.role.describe())
            elif isinstance(a, CommitAdvanced):
                assert not sn.commits or a.version > sn.commits[-1], f"n{node} commit goes back to v{a.version}"
                sn.commits.append(a.version)

    def persist(self, node: int, up_to: int | None = None) -> None:
        """Make node's WAL durable up to `up_to` (default: all of it) and report it."""
        sn = self.nodes[node]
        target = len(sn.wal) if up_to is None else up_to
        if target > sn.durable_version:
            sn.durable_version = target
            self.local.append((node, WalPersisted(target)))

    # -------------------------------------------------------------- queries

    def masters(self) -> list[int]:
        return [n for n, sn in self.nodes.items() if sn.up and sn.role == Role.MASTER]

    def take_trace(self, node: int | None = None) -> list[str]:
        out = [t for t in self.trace if node is None or t.startswith(f"n{node}: ")]
        self.trace.clear()
        return out

    def confirmed_ok(self, node: int) -> list[int]:
        return sorted(v for v, s in self.nodes[node].confirms.items() if s == ConfirmStatus.OK)
