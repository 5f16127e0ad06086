"""The simulator's side of the driver's ports: one node's Bus, Storage and App over the
simulated world (docs/simulation.md §What is simulated, docs/design.md §9).

Owns: `SimPorts`, which a production `vrepl.driver.Driver` is wired to in the simulator —
frames (the real wire codec's bytes, vrepl/transport/codec.py) go on the world's channels,
WAL blocks (the real record codec's bytes) are decoded into the node's simulated WAL, app
callbacks go to the node's simulated app; and `torn_recovery()`, what the simulated disk
holds after a crash: the durable bytes and a random part of the unsynced ones, read back
with the real record scanner, which stops at a torn last record as the WAL's recovery does.
Must not: execute a replica action or decide anything about replication (the driver does),
or step a driver itself: completions go through the world's channels, so they come back as
events later, as production's do.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from vrepl._core import record as _rec
from vrepl.driver import Driver
from vrepl.replica import NO_NODE, ConfirmStatus, Record, Replica, Role
from vrepl.testing.records import MAX_RECORD_BYTES, decode_block, encode_block


class SimError(AssertionError):
    """The simulated environment saw something a real transport/WAL would refuse (a bug in
    the replica's use of its actions, or in the simulator)."""


VGROUP = 7  # the simulated vgroup's id
ARB = -1  # the arbitrator's "node id" in link keys
TICK_MS = 100  # a tick's length in the replicas' config (the arbitrator's lease_ms is in it)


@dataclass(slots=True)
class Channel:
    """One FIFO stream of deliveries to one destination: (ready_time, item) in order."""

    kind: str  # "peer", "local", "n2a", "a2n"
    src: int
    dst: int
    gen: int
    q: deque = field(default_factory=deque)
    armed: bool = False
    dead: bool = False


@dataclass(slots=True)
class Conn:
    a: int
    b: int
    gen: int
    alive: bool = True


@dataclass
class SimNode:
    """One simulated process: its driver (and replica), disk, app and sockets."""

    node: int
    index: int
    tick_period: int
    driver: Driver | None = None
    replica: Replica | None = None  # the driver's, for the checkers
    up: bool = True
    paused: bool = False
    inc: int = 0  # incarnation: bumped by every crash, voids its pending work
    wal: list[Record] = field(default_factory=list)
    durable: int = 0
    promise: tuple[int, int] = (0, NO_NODE)
    jobs: deque = field(default_factory=deque)  # storage jobs: ["sync", up_to] / ["trunc", v]
    job_running: bool = False
    fsync_slow_until: int = 0  # time (units) until which this disk is slow
    disk_stalled_until: int = 0  # no storage job completes before this time (units)
    app_q: deque = field(default_factory=deque)  # (ready_time, version)
    app_last: int = 0
    # The app's data (docs/simulation.md §App): records applied above the archive (lost by a
    # crash), the archived prefix (files: survives crashes), the commit version it was told
    # (CommitAdvanced; 0 after a restart) and how far its commits went to the checker.
    memtable: list[Record] = field(default_factory=list)
    archive: list[Record] = field(default_factory=list)
    app_commit: int = 0
    commit_checked: int = 0
    # The app's files (vrepl/testing/sim/restore_ports.py): (first, last) version ranges of
    # its data files over the archive; files a restore staged (kept across crashes); the
    # archived version restored files installed beyond the WAL (0 once the WAL reaches it).
    files: list[tuple[int, int]] = field(default_factory=list)
    staged: dict[str, bytes] = field(default_factory=dict)
    restored_files_version: int = 0
    local: Channel | None = None
    sock: dict[int, int | None] = field(default_factory=dict)  # peer -> connection gen this node holds
    arb_sock: int | None = None
    outstanding: dict[int, Record] = field(default_factory=dict)  # the client's writes in flight
    crash_armed: bool = False  # crash at a random point of the next action list
    crash_now: bool = False  # crash right after the action being executed
    actions_seen: int = 0  # actions the driver executed in the current call (crash_armed)
    truncating: int = 0  # TruncateWalAfter issued, TruncateDone not yet stepped
    tick_token: int = 0  # voids a timer left over from before a pause or restart
    down_since: int = 0
    paused_since: int = 0

    def jobs_trunc_target(self) -> int:
        return next((arg for kind, arg in self.jobs if kind == "trunc"), -1)

    @property
    def running(self) -> bool:
        return self.up and not self.paused


class WorldHooks(Protocol):
    """What the ports ask of the simulated world (vrepl/testing/sim/world.py)."""

    def send_frame(self, sn: SimNode, node: int, frame: bytes) -> None: ...

    def reset_link(self, sn: SimNode, node: int) -> bool: ...

    def send_to_arbitrator(self, sn: SimNode, frame: bytes) -> None: ...

    def reset_arbitrator_link(self, sn: SimNode) -> bool: ...

    def wal_append(self, sn: SimNode, records: list[Record]) -> None: ...

    def wal_truncate(self, sn: SimNode, version: int) -> None: ...

    def wal_read(self, sn: SimNode, reader: int, from_version: int) -> None: ...

    def wal_rebase(self, sn: SimNode, base_version: int, base_epoch: int) -> None: ...

    def app_write(self, sn: SimNode, records: list[Record]) -> None: ...

    def app_confirm(self, sn: SimNode, first: int, last: int, status: ConfirmStatus) -> None: ...

    def app_role(self, sn: SimNode, role: Role, epoch: int, master: int | None) -> None: ...

    def app_commit(self, sn: SimNode, version: int) -> None: ...


def torn_recovery(durable: list[Record], volatile: list[Record], rng: random.Random) -> list[Record]:
    """The records a WAL holds after a crash that kept `durable` and a random byte prefix of
    the encoded `volatile` records (the pages the OS wrote before the crash), as its recovery
    reads them: whole records up to the first torn one."""
    if not volatile:
        return list(durable)
    block, _ = encode_block(volatile)
    kept = block[: rng.randint(0, len(block))]
    scan = _rec.scan(kept, max_payload_len=MAX_RECORD_BYTES, expect_version=volatile[0].version, contiguous=True)
    if scan.status not in (_rec.STATUS_OK, _rec.STATUS_INCOMPLETE):
        raise SimError(f"a torn WAL tail reads as corrupt, not torn: {scan.describe()}")
    return list(durable) + list(volatile[: scan.count])


class SimPorts:
    """Bus, Storage and App of one simulated node (vrepl/driver/ports.py)."""

    def __init__(self, world: WorldHooks, sn: SimNode) -> None:
        self.w = world
        self.sn = sn

    # ------------------------------------------------------------------ Bus

    def connected(self, node: int) -> bool:
        return self.sn.sock.get(node) is not None

    def send(self, node: int, frame: bytes) -> None:
        self.w.send_frame(self.sn, node, frame)

    def reset(self, node: int, reason: str) -> bool:
        return self.w.reset_link(self.sn, node)

    def to_arbitrator(self, frame: bytes) -> None:
        self.w.send_to_arbitrator(self.sn, frame)

    def reset_arbitrator(self, reason: str) -> bool:
        return self.w.reset_arbitrator_link(self.sn)

    def writable(self, node: int) -> bool:
        return True  # the simulated links have no send-queue limit

    def congested(self) -> bool:
        return False

    def flush(self) -> None:
        pass  # a frame is on its channel when sent

    # ------------------------------------------------------------------ Storage

    def append(self, first_version: int, last_version: int, block: bytes) -> None:
        records = decode_block(first_version, block)
        if not records or records[-1].version != last_version:
            raise SimError(f"n{self.sn.node} WAL block v{first_version}..v{last_version} decodes to"
                           f" {len(records)} records")
        self.w.wal_append(self.sn, records)

    def persist_promise(self, epoch: int, master: int) -> None:
        sn = self.sn
        if epoch <= sn.promise[0]:
            raise SimError(f"n{sn.node} promise goes back: {sn.promise} -> e{epoch} n{master}")
        sn.promise = (epoch, master)  # durable before anything after it (fsync'd file)

    def truncate_after(self, version: int) -> None:
        self.w.wal_truncate(self.sn, version)

    def rebase(self, base_version: int, base_epoch: int) -> None:
        self.w.wal_rebase(self.sn, base_version, base_epoch)

    def first_version(self) -> int:
        return 1 if self.sn.wal else 0  # the simulated WAL is never recycled

    def read_wal(self, reader: int, from_version: int) -> None:
        self.w.wal_read(self.sn, reader, from_version)

    def close_reader(self, reader: int) -> None:
        pass

    def end_batch(self) -> None:
        pass

    # ------------------------------------------------------------------ App

    def write_to_cache(self, first_version: int, record_epochs: tuple[int, ...], payloads: tuple[bytes, ...]) -> None:
        self.w.app_write(self.sn, [Record(e, first_version + i, p)
                                   for i, (e, p) in enumerate(zip(record_epochs, payloads))])

    def confirm_forward(self, first_version: int, last_version: int, status: ConfirmStatus) -> None:
        self.w.app_confirm(self.sn, first_version, last_version, status)

    def notify_role(self, role: Role, epoch: int, master: int | None) -> None:
        self.w.app_role(self.sn, role, epoch, master)

    def notify_flow_control(self, level: int) -> None:
        pass

    def notify_commit(self, version: int) -> None:
        self.w.app_commit(self.sn, version)

    def notify_wal_truncated(self, version: int) -> None:
        pass  # the app dropped the discarded records when the truncation was issued
