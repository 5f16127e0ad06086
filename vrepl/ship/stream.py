"""A ship connection as a blocking socket (docs/ship.md §2).

Owns: `ShipStream`, the framed + raw byte stream of one ship session (the restore's
`SyncStream` underneath: exact raw reads, os.sendfile, an I/O timeout on every read and
write) with the ship messages instead of the sync ones, a send lock (the receiver answers
from its session and its loader threads), and `connect()`, which opens the TCP connection
and runs the HELLO / CHALLENGE / AUTH / WELCOME exchange of kind SHIP with the sender's own
secret.
Must not: interpret messages. Every failure of the connection is a PeerGone, one line.
"""

from __future__ import annotations

import socket
import threading
from typing import Callable, Sequence

from vrepl.errors import FrameError
from vrepl.restore.errors import PeerError
from vrepl.restore.stream import SyncStream
from vrepl.ship import protocol as P
from vrepl.ship.errors import PeerGone, refused
from vrepl.transport import codec
from vrepl.transport.handshake import ClientHandshake, HandshakeError
from vrepl.untrusted import printable

SEND_SLICE_BYTES = 1 << 20  # a DATA body goes out in os.sendfile calls of at most this
RECV_CHUNK_BYTES = 4 << 20  # a DATA body is handed to the receiver's sink in pieces of at most this
RECV_LOWAT_BYTES = 1 << 20  # and read with a low-water mark of at most this (recv_raw)
SHIP_ANY_NODE = -1  # a sender names no node: it accepts the node that answers


class ShipStream:
    """Ship messages over one blocking socket."""

    def __init__(self, sock: socket.socket, *, io_timeout_s: float = 30.0, initial: bytes = b"") -> None:
        self.raw = SyncStream(sock, io_timeout_s=io_timeout_s, initial=initial)
        self.peer = self.raw.peer
        self._send_lock = threading.Lock()

    @property
    def bytes_sent(self) -> int:
        return self.raw.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.raw.bytes_received

    def set_timeout(self, io_timeout_s: float) -> None:
        self.raw.sock.settimeout(io_timeout_s)
        self.raw.io_timeout_s = io_timeout_s

    def recv(self) -> P.ShipMessage:
        """The next message; PeerGone on a broken connection or frame, Refused on ERROR."""
        try:
            rec = self.raw.recv_record(P.MAX_FRAME_PAYLOAD_BYTES)
        except PeerError as exc:
            raise PeerGone(str(exc)) from None
        try:
            msg = P.decode(rec)
        except FrameError as exc:
            raise PeerGone(f"{self.peer}: {exc}") from None
        if type(msg) is P.Error:
            # The reason is the peer's text: escaped before it reaches a log or a terminal.
            raise refused(msg.code, printable(msg.reason))
        return msg

    def recv_raw(self, size: int, sink: Callable[[memoryview], None]) -> None:
        """Exactly `size` raw bytes (a DATA body), handed to `sink` in pieces of at most
        RECV_CHUNK_BYTES. The socket's low-water mark (SO_RCVLOWAT) is raised to the rest of
        the piece (at most RECV_LOWAT_BYTES) while it is read, so each wake-up takes a large
        piece instead of what one loopback segment brought: every recv() gives the GIL up and
        must take it back from the node's other threads (a loader checking files), which
        made receiving several times slower while a batch loaded."""
        raw = self.raw
        left = size
        if raw._buf:
            take = min(left, len(raw._buf))
            sink(memoryview(bytes(raw._buf[:take])))
            del raw._buf[:take]
            left -= take
        if left <= 0:
            return
        sock = raw.sock
        view = memoryview(bytearray(min(RECV_CHUNK_BYTES, left)))
        lowat = 1
        try:
            while left > 0:
                want = min(left, len(view))
                got = 0
                while got < want:
                    w = max(1, min(want - got, RECV_LOWAT_BYTES))
                    if w != lowat:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, w)
                        lowat = w
                    try:
                        n = sock.recv_into(view[got:want])
                    except socket.timeout:
                        raise PeerGone(f"{raw.peer}: nothing received for {raw.io_timeout_s:g} s") from None
                    except OSError as exc:
                        raise PeerGone(f"{raw.peer}: connection failed: {exc.strerror or exc}") from None
                    if not n:
                        raise PeerGone(f"{raw.peer}: connection closed {left - got} bytes before the announced end")
                    got += n
                raw.bytes_received += got
                sink(view[:got])
                left -= got
        finally:
            if lowat != 1:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
                except OSError:
                    pass

    def send(self, msg: P.ShipMessage) -> None:
        frame = P.encode(msg)
        with self._send_lock:
            try:
                self.raw.send_bytes(frame)
            except PeerError as exc:
                raise PeerGone(str(exc)) from None

    def send_many(self, msgs: "Sequence[P.ShipMessage]") -> None:
        """Several messages in one write (the receiver's batched RESULTs)."""
        frame = b"".join(P.encode(m) for m in msgs)
        with self._send_lock:
            try:
                self.raw.send_bytes(frame)
            except PeerError as exc:
                raise PeerGone(str(exc)) from None

    def send_file(
        self, head: P.ShipMessage, fd: int, offset: int, count: int, on_progress: Callable[[int], None] | None = None
    ) -> None:
        """A DATA frame and its raw bytes (os.sendfile), never interleaved with another send."""
        frame = P.encode(head)
        with self._send_lock:
            try:
                self.raw.send_bytes(frame)
                # In slices, so progress (and a cut, docs/ship.md §3.4) comes every SLICE bytes.
                end = offset + count
                while offset < end:
                    n = min(SEND_SLICE_BYTES, end - offset)
                    self.raw.sendfile(fd, offset, n)
                    offset += n
                    if on_progress is not None:
                        on_progress(n)
            except PeerError as exc:
                raise PeerGone(str(exc)) from None

    def send_error(self, code: int, reason: str) -> None:
        """Best effort: tell the other side why, before closing."""
        frame = P.encode(P.Error(code, reason))
        with self._send_lock:
            try:
                self.raw.sock.settimeout(1.0)
                self.raw.sock.sendall(frame)
            except OSError:
                pass

    def close(self) -> None:
        self.raw.close()


def connect(
    host: str,
    port: int,
    *,
    secret: bytes,
    sender_id: int,
    vgroup: int,
    timeout_s: float = 5.0,
    io_timeout_s: float = 30.0,
    source_address: tuple[str, int] | None = None,
) -> ShipStream:
    """Open a ship connection to a node's replication port and authenticate with the
    sender's secret (HELLO kind SHIP, node = the sender id, vgroup = the receiving vgroup)."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s, source_address=source_address)
    except OSError as exc:
        raise PeerGone(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
    stream = ShipStream(sock, io_timeout_s=timeout_s)
    raw = stream.raw
    try:
        hs = ClientHandshake(
            secret,
            codec.ConnKind.SHIP,
            vgroup,
            sender_id,
            SHIP_ANY_NODE,
            any_server=True,
            secret_name="this sender's secret",
        )
        raw.send_bytes(hs.start())
        while not hs.done:
            rec = raw.recv_record(4096)
            try:
                out = hs.on_message(codec.decode(rec))
            except (FrameError, HandshakeError) as exc:
                raise PeerGone(
                    f"{host}:{port}: handshake failed: {exc}: the receiver's [[ship.senders]]"
                    f" entry for sender id {sender_id} has another secret",
                    retry=False,
                ) from None
            if out:
                raw.send_bytes(out)
    except (PeerError, PeerGone) as exc:
        stream.close()
        if raw._buf.startswith(b"HTTP/"):
            raise PeerGone(
                f"{host}:{port} answered in HTTP: that is a node's client API port; ship to the"
                " node's replication port (its `replication` address in node.toml)",
                retry=False,
            ) from None
        if "closed by the other side" in str(exc):
            raise PeerGone(
                f"{host}:{port} refused the ship connection (unknown sender id, wrong secret,"
                " or a vgroup this sender may not ship into: see the receiver's log)",
                retry=False,
            ) from None
        if isinstance(exc, PeerGone):
            raise
        raise PeerGone(str(exc)) from None
    stream.set_timeout(io_timeout_s)
    stream.server_node = hs.server_node  # type: ignore[attr-defined]
    return stream
