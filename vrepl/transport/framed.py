"""Frames and the handshake over asyncio streams, for users that are not the replica
transport (the arbitrator, tools, tests).

Owns: `FramedStream` (records in and out of an asyncio StreamReader/StreamWriter pair, cut
by the frame buffer) and `client_handshake()` / `server_handshake()`, which run the state
machines of vrepl/transport/handshake.py over one, with a timeout. Must not: decide
anything about the handshake itself (handshake.py does), or log or close the stream on a
failure (the caller does, after logging the reason).
"""

from __future__ import annotations

import asyncio
from typing import Callable

from vrepl._core.framebuf import FrameBuffer
from vrepl.errors import FrameError, HandshakeError, InvariantViolation
from vrepl.transport import codec
from vrepl.transport.codec import Hello
from vrepl.transport.handshake import ClientHandshake, ServerHandshake

DEFAULT_HANDSHAKE_TIMEOUT_S = 5.0


class FramedStream:
    """Frames over an asyncio StreamReader/StreamWriter pair: `recv()` the next decoded
    message (FrameError on bad bytes, EOFError at end of stream), `send()` messages."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_frame_bytes: int = 16 * 1024 * 1024 + 4096,
        max_record_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.max_record_bytes = max_record_bytes
        self.frames = FrameBuffer(max_frame_bytes)

    def set_max_frame_bytes(self, max_frame_bytes: int) -> None:
        """Switch the frame limit (a server leaves the small handshake limit). Bytes already
        buffered would have been sent before the peer heard WELCOME: a protocol error."""
        if self.frames.buffered:
            raise FrameError(f"{self.frames.buffered} bytes sent before the handshake finished")
        self.frames = FrameBuffer(max_frame_bytes)

    async def recv(self) -> codec.WireMessage:
        while True:
            rec = self.frames.next_frame()
            if rec is not None:
                return codec.decode(rec, self.max_record_bytes)
            data = await self.reader.read(65536)
            if not data:
                raise EOFError("connection closed by the other side")
            self.frames.feed(data)

    def send_frame(self, frame: bytes) -> None:
        self.writer.write(frame)

    def send(self, msg: codec.WireMessage) -> None:
        self.writer.write(codec.encode(msg))

    async def drain(self) -> None:
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


async def client_handshake(
    stream: FramedStream,
    *,
    secret: bytes,
    kind: int,
    vgroup_id: int,
    node: int,
    target_node: int,
    timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
) -> None:
    """Run the client side over `stream`; HandshakeError (or FrameError/EOFError) on failure."""
    hs = ClientHandshake(secret, kind, vgroup_id, node, target_node)

    async def run() -> None:
        stream.send_frame(hs.start())
        await stream.drain()
        while not hs.done:
            out = hs.on_message(await stream.recv())
            if out:
                stream.send_frame(out)
                await stream.drain()

    try:
        await asyncio.wait_for(run(), timeout_s)
    except asyncio.TimeoutError:
        raise HandshakeError(f"no handshake answer within {timeout_s} s") from None


async def server_handshake(
    stream: FramedStream,
    *,
    secret: bytes,
    node: int,
    check_hello: Callable[[Hello], str | None],
    max_frame_bytes: int = 16 * 1024 * 1024 + 4096,
    timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
) -> Hello:
    """Run the server side over `stream` (which should start with a FrameBuffer limited to
    HANDSHAKE_MAX_FRAME_BYTES); returns the authenticated Hello and raises the frame limit to
    `max_frame_bytes`. HandshakeError (or FrameError/EOFError) on failure."""
    hs = ServerHandshake(secret, node, check_hello)

    async def run() -> Hello:
        while not hs.done:
            out = hs.on_message(await stream.recv())
            if out:
                stream.send_frame(out)
                await stream.drain()
        if hs.hello is None:
            raise InvariantViolation("hs.hello is not None")
        return hs.hello

    try:
        hello = await asyncio.wait_for(run(), timeout_s)
    except asyncio.TimeoutError:
        raise HandshakeError(f"no handshake within {timeout_s} s") from None
    stream.set_max_frame_bytes(max_frame_bytes)
    return hello
