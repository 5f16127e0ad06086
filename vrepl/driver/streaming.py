"""In-band catch-up: a master streams WAL records to a follower that is a little behind.

Owns: `WalStreams`, the driver's execution of `StreamWalFrom` when the lag is small and the
WAL still holds it (docs/design.md §4.3; larger lags get the restore flow, docs/restore.md):
wait until the records are durable (so the WAL can read them back), read them in blocks
through `Storage.read_wal`, send them as ForwardBatch frames of up to `stream_chunk_bytes`,
pausing while the link's send queue is full (`Bus.writable`, resumed by
`Driver.link_writable`). A stream stops when the link goes down (any PeerDisconnected), when
the node stops being master of the stream's epoch, or when a newer StreamWalFrom replaces it.
Must not: do I/O itself (reads and sends go through the driver's ports) or decide anything
about replication.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from vrepl._core import wire as _wire
from vrepl.driver.ports import Bus, Storage
from vrepl.replica import Replica, Role, StreamWalFrom
from vrepl.transport.codec import HEADER_BYTES, MsgType

_FORWARD_BATCH = int(MsgType.FORWARD_BATCH)
_INFO, _ERROR = 20, 40


@dataclass
class _Stream:
    action: StreamWalFrom
    reader: int
    sent: int  # the last version sent
    prev_epoch: int  # the epoch of record `sent`
    state: str = "durable"  # durable -> read -> (write) -> read ... -> done
    data: Any = None  # the block being sent, its scan, the next record index in it
    scan: Any = None
    index: int = 0


class StreamHost(Protocol):
    """What a stream needs from its driver."""

    replica: Replica
    bus: Bus
    storage: Storage
    counters: dict[str, int]
    options: Any

    def log(self, level: int, text: str) -> None: ...

    def drop_link(self, node: int, reason: str) -> None: ...


class WalStreams:
    """The in-band streams of one driver, at most one per follower."""

    def __init__(self, driver: StreamHost) -> None:
        self.d = driver
        self._by_node: dict[int, _Stream] = {}
        self._by_reader: dict[int, _Stream] = {}
        self._next_reader = 0

    def start(self, action: StreamWalFrom) -> None:
        d = self.d
        self.stop_node(action.node)
        d.counters["streams"] += 1
        self._next_reader += 1
        s = _Stream(action, self._next_reader, action.first_version - 1, action.prev_epoch)
        self._by_node[action.node] = s
        self._by_reader[s.reader] = s
        d.log(_INFO, f"streaming v{action.first_version}..v{action.last_version} to n{action.node}")
        if d.replica.durable_version >= action.last_version:
            self._read(s)

    def stop_node(self, node: int) -> None:
        """The link to `node` went down (or a new stream replaces this one)."""
        s = self._by_node.pop(node, None)
        if s is not None:
            self._stop(s)

    def durable(self, version: int) -> None:
        for s in list(self._by_node.values()):
            if s.state == "durable" and s.action.last_version <= version:
                self._read(s)

    def writable(self, node: int) -> None:
        s = self._by_node.get(node)
        if s is not None and s.state == "write":
            self._pump(s)

    def block(self, reader: int, data: Any, scan: Any) -> None:
        s = self._by_reader.get(reader)
        if s is None or s.state != "read":
            return
        a = s.action
        if not self._alive(s):
            self._stop(s)
            return
        if data is None:
            self.d.log(_ERROR, f"WAL ended at v{s.sent} while streaming up to v{a.last_version} to n{a.node}")
            self._fail(s, "the WAL lacks records to stream")
            return
        versions = scan.versions
        i, n = 0, scan.count
        while i < n and int(versions[i]) <= s.sent:
            i += 1
        s.data, s.scan, s.index = data, scan, i
        self._pump(s)

    def failed(self, reader: int, reason: str) -> None:
        s = self._by_reader.get(reader)
        if s is None:
            return
        self.d.log(_ERROR, f"streaming to n{s.action.node} failed: {reason}")
        self._fail(s, f"stream failed: {reason}")

    # -- inside ------------------------------------------------------------------------------

    def _alive(self, s: _Stream) -> bool:
        r = self.d.replica
        a = s.action
        return (
            self._by_node.get(a.node) is s
            and self.d.bus.connected(a.node)
            and r.role == Role.MASTER
            and r.promised_epoch == a.epoch
        )

    def _read(self, s: _Stream) -> None:
        s.state = "read"
        s.data = s.scan = None
        self.d.storage.read_wal(s.reader, s.sent + 1)

    def _pump(self, s: _Stream) -> None:
        """Send the current block's records as frames while the link takes them."""
        d = self.d
        a = s.action
        bus = d.bus
        chunk_bytes = d.options.stream_chunk_bytes
        scan = s.scan
        versions, offsets, lengths, epochs = scan.versions, scan.offsets, scan.lengths, scan.epochs
        n = scan.count
        i = s.index
        while i < n and s.sent < a.last_version:
            if not self._alive(s):
                self._stop(s)
                return
            if not bus.writable(a.node):
                s.index = i
                s.state = "write"
                return
            j, size = i, 0
            while (
                j < n
                and int(versions[j]) <= a.last_version
                and (j == i or size + int(lengths[j]) + HEADER_BYTES <= chunk_bytes)
            ):
                size += int(lengths[j]) + HEADER_BYTES
                j += 1
            start = int(offsets[i])
            frame = _wire.encode_forward_frame(
                _FORWARD_BATCH, int(versions[i]), a.epoch, s.prev_epoch, s.data[start : start + size]
            )
            bus.send(a.node, frame)
            bus.flush()
            d.counters["streamed_records"] += j - i
            s.prev_epoch = int(epochs[j - 1])
            s.sent = int(versions[j - 1])
            i = j
        if s.sent >= a.last_version:
            d.log(_INFO, f"streamed up to v{s.sent} to n{a.node}")
            self._stop(s)
            return
        s.state = "read"
        self._read(s)

    def _fail(self, s: _Stream, reason: str) -> None:
        self._stop(s)
        self.d.drop_link(s.action.node, reason)

    def _stop(self, s: _Stream) -> None:
        s.state = "done"
        if self._by_node.get(s.action.node) is s:
            del self._by_node[s.action.node]
        if self._by_reader.pop(s.reader, None) is not None:
            self.d.storage.close_reader(s.reader)
