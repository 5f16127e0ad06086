"""What a restore session runs over, as ports, so one session code serves production and the
simulator (docs/restore.md §Sessions).

Owns: `SessionIO`, the session's side of a sync connection: send a message or raw bytes,
receive a message or exactly n raw bytes, sleep, pace, read the clock. A method that may wait is a
generator (`msg = yield from io.recv()`): production's `BlockingIO` (a `SyncStream` on the
session's own thread) blocks inside and never yields; the simulator's yields until its
simulated network has the bytes. `run_blocking(session)` runs a session generator whose
ports never yield to completion, returning its result.
Must not: interpret messages or touch files.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Generator, Protocol

from vrepl.restore import protocol as P
from vrepl.restore.stream import SyncStream

Session = Generator[Any, None, Any]  # a session step by step: what it yields is its port's


class SessionIO(Protocol):
    def send(self, msg: P.SyncMessage) -> None: ...

    def send_bytes(self, data: bytes | memoryview) -> None: ...

    def recv(self) -> Generator[Any, None, P.SyncMessage]:
        """The next message (an ERROR from the peer raises PeerError)."""

    def recv_raw(self, size: int, sink: Callable[[memoryview], None], buffers: int = 1) -> Generator[Any, None, None]:
        """Exactly `size` raw bytes (those a FILE_DATA / WAL_DATA announced), to `sink` in pieces."""

    def sleep(self, seconds: float) -> Generator[Any, None, None]: ...

    def pace(self) -> Generator[Any, None, None]:
        """A point where a stepped session lets time pass (the simulator's: a send takes
        time there too); a blocking session goes on at once."""

    def now(self) -> float:
        """Seconds on the session's clock (monotonic)."""


class BlockingIO:
    """SessionIO over a blocking SyncStream: its generators never yield."""

    def __init__(self, stream: SyncStream) -> None:
        self.stream = stream

    def send(self, msg: P.SyncMessage) -> None:
        self.stream.send(msg)

    def send_bytes(self, data: bytes | memoryview) -> None:
        self.stream.send_bytes(data)

    def recv(self) -> Generator[Any, None, P.SyncMessage]:
        return self.stream.recv()
        yield  # a generator: the socket blocks this thread instead

    def recv_raw(self, size: int, sink: Callable[[memoryview], None], buffers: int = 1) -> Generator[Any, None, None]:
        self.stream.recv_raw(size, sink, buffers=buffers)
        return
        yield

    def sleep(self, seconds: float) -> Generator[Any, None, None]:
        time.sleep(seconds)
        return
        yield

    def pace(self) -> Generator[Any, None, None]:
        return
        yield

    def now(self) -> float:
        return time.monotonic()


def run_blocking(session: Session) -> Any:
    """Run a session whose ports block instead of yielding; return what it returns."""
    try:
        while True:
            waited = next(session)
            raise RuntimeError(f"a blocking session yielded {waited!r}: its ports must not yield")
    except StopIteration as done:
        return done.value
