"""A scripted network for scenario tests: the production `Driver` over ports that do nothing
until the test says so (tests/scenario/).

Owns: `Net`, 1..n replicas, each a `vrepl.driver.Driver` over scripted ports: a bus whose
frames (the real wire codec's bytes) wait in one FIFO queue per directed link until the test
delivers them (`deliver`, `run`), a WAL per node as a list of records that becomes durable when
the test (or `auto_persist`) says so, an app that acks what it is given (`auto_app_ack`) and
records confirmations, roles and commits, and an arbitrator lease table. Completions wait in
`local` until `settle()`/`run()` feed them back through the driver. Nothing happens unless the
test calls deliver()/settle()/run()/tick(), so a test chooses the exact interleaving it wants,
and `trace` holds every action the drivers executed (`describe()`), as scenario tests compare.
Faults are explicit calls (cut, crash, pause).
Must not: decide anything about replication or execute an action itself: the drivers do.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from vrepl.driver import Driver
from vrepl.replica import (
    AppForward,
    ArbitratorConnected,
    ArbitratorGranted,
    ArbitratorLost,
    ArbitratorRefused,
    AppAcked,
    Config,
    ConfirmStatus,
    LeaseTable,
    Log,
    PeerConnected,
    PeerDisconnected,
    Record,
    Replica,
    Role,
    TruncateDone,
    WalPersisted,
)
from vrepl.testing.records import decode_block, encode_block, history_of
from vrepl.transport import codec

VGROUP = 7


@dataclass
class SimNode:
    node: int
    driver: Driver | None = None
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
    def replica(self) -> Replica:
        assert self.driver is not None
        return self.driver.replica

    @property
    def role(self) -> Role:
        return self.replica.role

    def versions(self) -> list[tuple[int, int]]:
        return [(r.epoch, r.version) for r in self.wal]


class _Ports:
    """One node's Bus, Storage and App over the Net (the driver's ports)."""

    def __init__(self, net: "Net", sn: SimNode) -> None:
        self.net = net
        self.sn = sn
        self.node = sn.node

    # -- Bus
    def connected(self, node: int) -> bool:
        return frozenset((self.node, node)) in self.net.links

    def send(self, node: int, frame: bytes) -> None:
        q = self.net.queues.get((self.node, node))
        if q is not None:
            q.append(frame)

    def reset(self, node: int, reason: str) -> bool:
        key = frozenset((self.node, node))
        if key not in self.net.links:
            return False
        # The other side hears of it now; this side steps PeerDisconnected after its list.
        self.net.links.discard(key)
        self.net.queues.pop((self.node, node), None)
        self.net.queues.pop((node, self.node), None)
        self.net.step(node, PeerDisconnected(self.node))
        return True

    def to_arbitrator(self, frame: bytes) -> None:
        if not self.sn.arbitrator_link:
            return
        req = codec.decode_bytes(frame)
        refusal = self.net.lease.request(VGROUP, self.node, req.epoch, self.net.now_tick)  # type: ignore[union-attr]
        answer = ArbitratorGranted(req.epoch) if refusal is None else ArbitratorRefused(req.epoch)  # type: ignore[union-attr]
        self.net.local.append((self.node, answer))

    def reset_arbitrator(self, reason: str) -> bool:
        return False

    def writable(self, node: int) -> bool:
        return True

    def congested(self) -> bool:
        return False

    def flush(self) -> None:
        pass

    # -- Storage
    def append(self, first_version: int, last_version: int, block: bytes) -> None:
        sn = self.sn
        for rec in decode_block(first_version, block):
            assert rec.version == len(sn.wal) + 1, f"n{self.node} WAL gap at {rec.describe()}"
            sn.wal.append(rec)
        if sn.auto_persist:
            self.net.persist(self.node)

    def persist_promise(self, epoch: int, master: int) -> None:
        self.sn.promise = (epoch, master)

    def truncate_after(self, version: int) -> None:
        sn = self.sn
        # docs/design.md §4.4: committed records are never cut.
        assert not sn.commits or version >= sn.commits[-1], f"n{self.node} cuts below commit v{sn.commits[-1]}"
        del sn.wal[version:]
        sn.durable_version = min(sn.durable_version, version)
        self.net.local.append((self.node, TruncateDone(sn.wal[-1].epoch if sn.wal else 0, version)))

    def rebase(self, base_version: int, base_epoch: int) -> None:
        raise AssertionError("the scripted network runs no restore")

    def first_version(self) -> int:
        return 1 if self.sn.wal else 0

    def read_wal(self, reader: int, from_version: int) -> None:
        """At once: the page cache holds what was appended."""
        recs = self.sn.wal[from_version - 1:]
        d = self.sn.driver
        assert d is not None
        if recs:
            d.wal_block(reader, *encode_block(recs))
        else:
            d.wal_block(reader, None, None)

    def close_reader(self, reader: int) -> None:
        pass

    def end_batch(self) -> None:
        pass

    # -- App
    def write_to_cache(self, first_version: int, record_epochs: tuple[int, ...], payloads: tuple[bytes, ...]) -> None:
        if self.sn.auto_app_ack:
            self.net.local.append((self.node, AppAcked(first_version + len(payloads) - 1)))

    def confirm_forward(self, first: int, last: int, status: ConfirmStatus) -> None:
        sn = self.sn
        for v in range(first, last + 1):
            # A refused or failed version may be retried; an ok one is final.
            assert sn.confirms.get(v) != ConfirmStatus.OK, f"n{self.node} v{v} confirmed after ok"
            sn.confirms[v] = status
            if status == ConfirmStatus.OK:
                rec = sn.wal[v - 1]
                old = self.net.confirmed.setdefault(v, rec)
                # Two different records confirmed at one version: the first was lost.
                assert old == rec, f"confirmed {old.describe()} lost to {rec.describe()}"

    def notify_role(self, role: Role, epoch: int, master: int | None) -> None:
        self.sn.roles.append(role.describe())

    def notify_flow_control(self, level: int) -> None:
        pass

    def notify_commit(self, version: int) -> None:
        sn = self.sn
        assert not sn.commits or version > sn.commits[-1], f"n{self.node} commit goes back to v{version}"
        sn.commits.append(version)

    def notify_wal_truncated(self, version: int) -> None:
        pass


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
        self.links: set[frozenset[int]] = set()
        self.cut_links: set[frozenset[int]] = set()
        self.queues: dict[tuple[int, int], deque] = {}
        self.local: deque[tuple[int, object]] = deque()
        self.lease = LeaseTable(cfg.get("arbitrator_lease_ticks", 20) + 5)
        self.trace: list[str] = []
        self.logs: list[str] = []
        self.confirmed: dict[int, Record] = {}  # every record any master confirmed ok
        for node in self.node_ids:
            wal = [Record(e, v, b"r%d.%d" % (e, v)) for e, v in (logs or {}).get(node, [])]
            promise = (promises or {}).get(node, (max((r.epoch for r in wal), default=0), -1))
            if promise[0] and promise[1] == -1:
                promise = (promise[0], node)
            sn = SimNode(node, wal=wal, durable_version=len(wal), promise=promise)
            self.nodes[node] = sn
            self._boot(sn)

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

    def _boot(self, sn: SimNode) -> None:
        replica = Replica(self._state_config(self.node_ids.index(sn.node), sn))
        ports = _Ports(self, sn)
        node = sn.node

        def on_action(action: Any) -> None:
            if type(action) is not Log:
                self.trace.append(f"n{node}: {action.describe()}")

        def on_log(origin: str, level: int, text: str) -> None:
            if origin == "replica":
                self.logs.append(text)

        sn.driver = Driver(replica, ports, ports, ports, on_action=on_action, on_log=on_log)

    # -------------------------------------------------------------- driving

    def start(self, connect: bool = True) -> None:
        for sn in self.nodes.values():
            sn.driver.start()  # type: ignore[union-attr]
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
        """One event for `node`; storage completions go through the driver's completion calls."""
        sn = self.nodes[node]
        if not sn.up:
            return
        d = sn.driver
        assert d is not None
        t = type(event)
        if t is WalPersisted:
            d.wal_durable(event.up_to_version)
        elif t is TruncateDone:
            d.wal_truncated(event.last_epoch, event.last_version)
        else:
            d.step(event)
        d.end_batch()

    def execute(self, node: int, actions: list) -> None:
        """Execute actions the test got by stepping node's replica itself."""
        d = self.nodes[node].driver
        assert d is not None
        d.execute(actions)
        d.end_batch()

    def forward(self, node: int, version: int, payload: bytes = b"x") -> None:
        self.step(node, AppForward(version, payload))

    def deliver(self, src: int, dst: int, count: int = 1) -> int:
        """Deliver up to `count` queued messages src -> dst; returns how many."""
        q = self.queues.get((src, dst))
        done = 0
        while q and done < count and not self.nodes[dst].paused:
            frame = q.popleft()
            d = self.nodes[dst].driver
            assert d is not None
            d.received(src, [codec.decode_bytes(frame)])
            d.end_batch()
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
        return [codec.decode_bytes(f).describe() for f in self.queues.get((src, dst), ())]

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
                    sn.driver.tick()  # type: ignore[union-attr]
                    sn.driver.end_batch()  # type: ignore[union-attr]
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
        self._boot(sn)
        sn.commits = []  # the commit version starts at 0 in a new run
        sn.up = True
        sn.paused = False
        sn.driver.start()  # type: ignore[union-attr]
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
