"""The sync connection of a simulated restore session (docs/simulation.md §Restore).

Owns: `SimSessionIO`, one side's `SessionIO` port (vrepl/restore/session_io.py) over the
simulated world: every message goes through the real sync protocol codec
(vrepl/restore/protocol.py) and is read back with the real record decoder, raw bytes
(FILE_DATA, WAL_DATA) follow as they are; each direction is a FIFO byte pipe whose
deliveries arrive after the link's latency, in order. A method that must wait yields:
`RECV` (until bytes arrive) or a number of units (a sleep). `SimPipe`, one direction.
Must not: interpret a message beyond its frame, or use randomness (latencies come from the
world's PRNG through the runner).
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Generator

from vrepl._core import record as _rec
from vrepl.errors import FrameError
from vrepl.restore import protocol as P
from vrepl.restore.errors import PeerError
from vrepl.testing.sim.options import UNITS_PER_TICK
from vrepl.untrusted import printable

RECV = "recv"  # yielded: wait until bytes arrive
UNITS_PER_SECOND = UNITS_PER_TICK * 10  # a tick is 100 ms (docs/simulation.md)
_HEADER = P.HEADER_BYTES
_LEN = struct.Struct("<I")


@dataclass
class SimPipe:
    """One direction of a sync connection: (ready_time, bytes) in send order."""

    q: deque = field(default_factory=deque)
    last_ready: int = 0
    bytes_sent: int = 0


class SimSessionIO:
    """One side of a simulated sync connection (see the module doc)."""

    def __init__(self, clock: Callable[[], int], latency: Callable[[], int], out: SimPipe) -> None:
        self.clock = clock  # the world's time in units
        self.latency = latency  # the link's latency for the next delivery, in units
        self.out = out
        self.inbuf = bytearray()

    # -- sending ---------------------------------------------------------------------------------

    def _put(self, data: bytes) -> None:
        ready = max(self.out.last_ready, self.clock() + self.latency())
        self.out.last_ready = ready
        self.out.q.append((ready, data))
        self.out.bytes_sent += len(data)

    def send(self, msg: P.SyncMessage) -> None:
        self._put(P.encode(msg))

    def send_bytes(self, data: bytes | memoryview) -> None:
        self._put(bytes(data))

    # -- receiving -------------------------------------------------------------------------------

    def _frame(self) -> _rec.Record | None:
        buf = self.inbuf
        if len(buf) < _HEADER:
            return None
        reason = _rec.header_invalid(buf, 0, P.MAX_FRAME_PAYLOAD_BYTES)
        if reason:
            raise PeerError(f"bad frame: {reason}")
        need = _HEADER + _LEN.unpack_from(buf, 24)[0]
        if len(buf) < need:
            return None
        try:
            rec = _rec.decode_record(bytes(buf[:need]), 0, P.MAX_FRAME_PAYLOAD_BYTES)
        except (FrameError, ValueError) as exc:
            raise PeerError(f"bad frame: {exc}") from None
        del buf[:need]
        return rec

    def recv(self) -> Generator[Any, None, P.SyncMessage]:
        rec = self._frame()
        while rec is None:
            yield RECV
            rec = self._frame()
        try:
            msg = P.decode(rec)
        except FrameError as exc:
            raise PeerError(str(exc)) from None
        if type(msg) is P.Error:
            raise PeerError(f"the other side stopped the restore: {printable(msg.reason)}")
        return msg

    def recv_raw(self, size: int, sink: Callable[[memoryview], None], buffers: int = 1) -> Generator[Any, None, None]:
        left = size
        while left > 0:
            if not self.inbuf:
                yield RECV
                continue
            take = min(left, len(self.inbuf))
            sink(memoryview(bytes(self.inbuf[:take])))
            del self.inbuf[:take]
            left -= take

    def sleep(self, seconds: float) -> Generator[Any, None, None]:
        yield max(1, round(seconds * UNITS_PER_SECOND))

    def pace(self) -> Generator[Any, None, None]:
        yield 1  # a unit per block sent: the master's WAL may grow while its tail is read

    def now(self) -> float:
        return self.clock() / UNITS_PER_SECOND
