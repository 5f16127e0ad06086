"""The ports of the driver: what it needs from the world around the replica.

Owns: the `typing.Protocol`s a `Driver` is generic over (docs/design.md §9 Where actions run)
and the contract each implementation keeps —

* `Bus`: frames to the other replicas and to the arbitrator, connection resets, send-queue
  state. Frames are the wire codec's bytes (vrepl/transport/codec.py): the driver encodes,
  the bus carries.
* `Storage`: the WAL (append a block of encoded records, truncate after a version, rebase
  it for a restore, read it back for streaming) and the promise (durable on return).
* `App`: the embedding's callbacks (write to cache, confirm, commit, role and flow notices,
  WAL truncated).
* `Restorer`: starts a restore session for a follower too far behind (docs/restore.md).
* `Clock`: calls `Driver.tick()` every tick; the driver knows no other time.

Completions come back as calls on the driver, never as return values of a port call:
`Driver.wal_durable(version)`, `Driver.wal_truncated(epoch, version)`,
`Driver.wal_block(reader, data, scan)`, `Driver.link_writable(node)`, and replica events
(`Driver.step(PeerConnected(n))`, ...). Production implements the ports over asyncio sockets,
the WAL thread and `SyncCallbacks` (vrepl/transport/, vrepl/instance/); the simulator over a
simulated network, disk and app (vrepl/testing/sim/).
Must not: hold behaviour, or import anything that does I/O.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from vrepl.replica import ConfirmStatus, Role


class Bus(Protocol):
    """Links to the other replicas of the vgroup and to the arbitrator.

    `send` queues a frame on the link to `node` and drops it when there is none; frames
    queued during one batch leave when `flush()` is called (the driver calls it at the end
    of every batch, `Driver.end_batch()`). A link's events come back as
    `PeerConnected`/`PeerDisconnected` steps, its messages through `Driver.received()`.
    """

    def connected(self, node: int) -> bool:
        """A link to `node` is up (its hello completed)."""

    def send(self, node: int, frame: bytes) -> None:
        """Queue one encoded frame to `node`; dropped when not connected."""

    def reset(self, node: int, reason: str) -> bool:
        """Close the link to `node` now (a reconnect follows as usual). True when a link was
        closed: the driver then steps PeerDisconnected itself."""

    def to_arbitrator(self, frame: bytes) -> None:
        """Queue one encoded frame to the arbitrator; dropped when not connected."""

    def reset_arbitrator(self, reason: str) -> bool:
        """Close the arbitrator link; True when one was closed (the driver steps ArbitratorLost)."""

    def writable(self, node: int) -> bool:
        """The link to `node` takes more frames now (its send queue is below its high-water
        mark); when it was not, `Driver.link_writable(node)` is called once it is again."""

    def congested(self) -> bool:
        """Some link's send queue is above its high-water mark (flow control, level 1)."""

    def flush(self) -> None:
        """Write every frame queued so far."""


class Storage(Protocol):
    """The replica's WAL and its promise file.

    Jobs run in the order issued. Durability of appends comes back as
    `Driver.wal_durable(version)` (cumulative); a truncation as
    `Driver.wal_truncated(last_epoch, last_version)`, after every durability report of the
    appends issued before it (docs/design.md §1).
    """

    def append(self, first_version: int, last_version: int, block: bytes) -> None:
        """Append encoded WAL records first_version..last_version (vrepl/_core/record.pyx)."""

    def persist_promise(self, epoch: int, master: int) -> None:
        """Durably record the promise; DURABLE ON RETURN (the Sends after it depend on it)."""

    def truncate_after(self, version: int) -> None:
        """Discard every record above `version`."""

    def rebase(self, base_version: int, base_epoch: int) -> None:
        """Drop the whole WAL; the next record is base_version + 1 (a restore installed
        archived files holding every version up to base_version)."""

    def first_version(self) -> int:
        """The first version the WAL still holds, 0 when it holds none."""

    def read_wal(self, reader: int, from_version: int) -> None:
        """Deliver, later, the next block of whole records of reader `reader` at or after
        `from_version` through `Driver.wal_block(reader, data, scan)` (`data` None: nothing
        more is written), or `Driver.wal_read_failed(reader, reason)`."""

    def close_reader(self, reader: int) -> None:
        """Forget reader `reader` (its stream ended)."""

    def end_batch(self) -> None:
        """The driver's batch ended (production: a small batch may be made durable inline)."""


class App(Protocol):
    """The embedding app (seed: writeToCache, confirmForward, notifyRole, ...)."""

    def write_to_cache(self, first_version: int, record_epochs: tuple[int, ...], payloads: tuple[bytes, ...]) -> None:
        """A follower appended these records to its WAL: apply them, ack with AppAcked."""

    def confirm_forward(self, first_version: int, last_version: int, status: ConfirmStatus) -> None:
        """The outcome of the app's forwards first_version..last_version."""

    def notify_role(self, role: Role, epoch: int, master: int | None) -> None:
        """This replica's role changed."""

    def notify_flow_control(self, level: int) -> None:
        """1: slow down, 0: back to normal."""

    def notify_commit(self, version: int) -> None:
        """The commit version rose to `version` (docs/design.md §4.4)."""

    def notify_wal_truncated(self, version: int) -> None:
        """The WAL was cut after `version`: drop what was applied from later records."""


class Restorer(Protocol):
    """Runs restore sessions (docs/restore.md) for this replica."""

    def start_sender(self, node: int, first_version: int, last_version: int) -> None:
        """Bring follower `node` up from `first_version` over a sync connection (a session
        already running for it is replaced)."""


class Clock(Protocol):
    """Calls `tick(count)` every tick_ms (count > 1 after a stall: the ticks it missed)."""

    def start(self, tick: Callable[[int], Any]) -> None: ...

    def stop(self) -> None: ...
