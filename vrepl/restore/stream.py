"""A sync connection as a blocking socket (docs/restore.md §Protocol).

Owns: `SyncStream`, the framed + raw byte stream of one restore session over a blocking
socket: `recv()` the next sync message, `recv_raw()` exactly n raw bytes (those announced by
FILE_DATA / WAL_DATA) into a sink, `send()` a message, `sendfile()` a file range with
os.sendfile (zero copy); and `connect_sync()`, which opens a TCP connection and runs the
usual HELLO / CHALLENGE / AUTH / WELCOME exchange (vrepl/transport/handshake.py) on it.
A session runs on its own thread; bulk transfers do not belong on the asyncio I/O thread.
Must not: interpret messages; every read has a timeout (`io_timeout_s`).
"""
from __future__ import annotations

import os
import select
import socket
import struct
from typing import Callable

from vrepl._core import frame as _rec
from vrepl.errors import FrameError
from vrepl.restore import protocol as P
from vrepl.restore.errors import FilesChanged, PeerError
from vrepl.transport import codec
from vrepl.transport.handshake import ClientHandshake, HandshakeError
from vrepl.untrusted import printable

HEADER = P.HEADER_BYTES
_LEN = struct.Struct("<I")
RECV_CHUNK_BYTES = 4 * 1024 * 1024
SENDFILE_CHUNK_BYTES = 64 * 1024 * 1024


class SyncStream:
    """Frames and raw byte runs over one blocking socket."""

    def __init__(self, sock: socket.socket, *, io_timeout_s: float = 30.0, initial: bytes = b"") -> None:
        self.sock = sock
        sock.setblocking(True)
        sock.settimeout(io_timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self.io_timeout_s = io_timeout_s
        self._buf = bytearray(initial)
        self.bytes_sent = 0
        self.bytes_received = len(initial)
        self.peer = "?"
        try:
            host, port = sock.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            pass

    # -- reading ---------------------------------------------------------------------------------

    def _recv_some(self) -> None:
        try:
            data = self.sock.recv(256 * 1024)
        except socket.timeout:
            raise PeerError(f"{self.peer}: nothing received for {self.io_timeout_s:g} s") from None
        except OSError as exc:
            raise PeerError(f"{self.peer}: connection failed: {exc.strerror or exc}") from None
        if not data:
            raise PeerError(f"{self.peer}: connection closed by the other side")
        self.bytes_received += len(data)
        self._buf += data

    def recv_record(self, max_payload: int = P.MAX_FRAME_PAYLOAD_BYTES) -> _rec.Record:
        """The next whole, verified frame."""
        buf = self._buf
        while len(buf) < HEADER:
            self._recv_some()
        reason = _rec.header_invalid(buf, 0, max_payload)
        if reason:
            raise PeerError(f"{self.peer}: bad frame: {reason}")
        need = HEADER + _LEN.unpack_from(buf, 24)[0]
        while len(buf) < need:
            self._recv_some()
        try:
            rec = _rec.decode_record(bytes(buf[:need]), 0, max_payload)
        except (FrameError, ValueError) as exc:
            raise PeerError(f"{self.peer}: bad frame: {exc}") from None
        del buf[:need]
        return rec

    def recv(self) -> P.SyncMessage:
        rec = self.recv_record()
        try:
            msg = P.decode(rec)
        except FrameError as exc:
            raise PeerError(f"{self.peer}: {exc}") from None
        if type(msg) is P.Error:
            # The reason is the peer's text: escaped before it reaches a log or a terminal.
            if msg.code == P.ERROR_SOURCE_CHANGED:
                raise FilesChanged(f"the source changed: {printable(msg.reason)}")
            raise PeerError(f"the other side stopped the restore: {printable(msg.reason)}")
        return msg

    def recv_raw(self, size: int, sink: Callable[[memoryview], None], chunk_bytes: int = RECV_CHUNK_BYTES,
                 buffers: int = 1) -> None:
        """Exactly `size` raw bytes, handed to `sink` in pieces of at most `chunk_bytes`. With
        `buffers` > 1 the receive rotates over that many buffers, so a sink that hands a piece
        to another thread may keep it until `buffers - 1` later pieces were received."""
        left = size
        if self._buf:
            take = min(left, len(self._buf))
            sink(memoryview(bytes(self._buf[:take])))
            del self._buf[:take]
            left -= take
        if left <= 0:
            return
        views = [memoryview(bytearray(min(chunk_bytes, left))) for _ in range(max(buffers, 1))]
        turn = 0
        recv_into = self.sock.recv_into
        while left > 0:
            view = views[turn % len(views)]
            turn += 1
            want = min(left, len(view))
            got = 0
            while got < want:
                try:
                    n = recv_into(view[got:want])
                except socket.timeout:
                    raise PeerError(f"{self.peer}: nothing received for {self.io_timeout_s:g} s") from None
                except OSError as exc:
                    raise PeerError(f"{self.peer}: connection failed: {exc.strerror or exc}") from None
                if not n:
                    raise PeerError(f"{self.peer}: connection closed {left - got} bytes before the announced end")
                got += n
            self.bytes_received += got
            sink(view[:got])
            left -= got

    # -- writing ---------------------------------------------------------------------------------

    def send_bytes(self, data: bytes | memoryview) -> None:
        try:
            self.sock.sendall(data)
        except socket.timeout:
            raise PeerError(f"{self.peer}: could not send for {self.io_timeout_s:g} s") from None
        except OSError as exc:
            raise PeerError(f"{self.peer}: connection failed: {exc.strerror or exc}") from None
        self.bytes_sent += len(data)

    def send(self, msg: P.SyncMessage) -> None:
        self.send_bytes(P.encode(msg))

    def sendfile(self, fd: int, offset: int, count: int, on_progress: Callable[[int], None] | None = None) -> None:
        """Send bytes offset..offset+count of an open file with os.sendfile (zero copy)."""
        out = self.sock.fileno()
        end = offset + count
        while offset < end:
            try:
                n = os.sendfile(out, fd, offset, min(SENDFILE_CHUNK_BYTES, end - offset))
            except socket.timeout:
                raise PeerError(f"{self.peer}: could not send for {self.io_timeout_s:g} s") from None
            except BlockingIOError:
                # The socket has a timeout, so it is non-blocking underneath: wait until it
                # can take more instead of spinning.
                _, writable, _ = select.select([], [out], [], self.io_timeout_s)
                if not writable:
                    raise PeerError(f"{self.peer}: could not send for {self.io_timeout_s:g} s") from None
                continue
            except OSError as exc:
                raise PeerError(f"{self.peer}: sendfile failed: {exc.strerror or exc}") from None
            if n == 0:
                raise PeerError(f"file ended {end - offset} bytes before its announced size (it changed)")
            offset += n
            self.bytes_sent += n
            if on_progress is not None:
                on_progress(n)

    def send_error(self, reason: str, code: int = P.ERROR_OTHER) -> None:
        """Best effort: tell the other side why, before closing."""
        try:
            self.sock.settimeout(1.0)
            self.sock.sendall(P.encode(P.Error(reason, code)))
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def connect_sync(host: str, port: int, *, secret: bytes, kind: int, vgroup_id: int, node: int,
                 target_node: int, timeout_s: float = 5.0, io_timeout_s: float = 30.0) -> SyncStream:
    """Open a sync (or backup) connection and authenticate it like a peer connection.
    `target_node` None accepts whichever node answers (the CLI does not know node ids)."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        raise PeerError(f"cannot connect to {host}:{port}: {exc.strerror or exc}", restart=False) from None
    stream = SyncStream(sock, io_timeout_s=timeout_s)
    try:
        hs = ClientHandshake(secret, kind, vgroup_id, node, -1 if target_node is None else target_node,
                             any_server=target_node is None)
        stream.send_bytes(hs.start())
        while not hs.done:
            rec = stream.recv_record(4096)
            try:
                out = hs.on_message(codec.decode(rec))
            except (FrameError, HandshakeError) as exc:
                raise PeerError(f"{host}:{port}: handshake failed: {exc}", restart=False) from None
            if out:
                stream.send_bytes(out)
    except PeerError as exc:
        stream.close()
        if stream._buf.startswith(b"HTTP/"):
            raise PeerError(f"{host}:{port} answered in HTTP: that is a node's client API port; a restore needs"
                            " the node's replication port (its `replication` address in node.toml)",
                            restart=False) from None
        if "closed by the other side" in str(exc):
            raise PeerError(f"{host}:{port} refused the sync connection (wrong secret, vgroup or node; see its log)",
                            restart=False) from None
        raise
    stream.server_node = hs.server_node  # type: ignore[attr-defined]
    sock.settimeout(io_timeout_s)
    stream.io_timeout_s = io_timeout_s
    return stream
