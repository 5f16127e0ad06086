"""One TCP server per node for all its vgroups, and the connections it carries.

Owns: `NodeTransport` (the listening socket of one node, the registry of the connection owners
it serves, the hello checks of the server side) and `Connection` (an asyncio
BufferedProtocol: TCP_NODELAY, the handshake, reading with recv_into a FrameBuffer's
writable() view, decoding frames, coalesced writes, bounded send queue with back-pressure).
docs/embedding.md §Connections and the hello, §Back-pressure.

A connection is for one vgroup: the hello names it (seed 虚拟节点之间的网络连接: the server
checks that the vgroup runs here, else closes). Between two replicas the one with the lower
(host, port) connects; the server refuses a hello from the other side. Anything wrong (a bad
hello, a wrong proof, a frame above the limit, garbage, an unknown message type, a handshake
that does not finish in time) closes that connection with a logged reason naming vgroup,
node and epoch; the node keeps serving.
A connection belongs to a `ConnectionOwner` (declared here; a sync instance's links,
vrepl/transport/peers.py), which the server side finds by the hello's vgroup.
Must not: decide anything about replication; a Connection hands decoded messages to its
owner, which hands them to the driver that owns the replica.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any, Protocol, cast

from vrepl._core.framebuf import FrameBuffer
from vrepl.config import SyncConfig
from vrepl.errors import ConfigError, FrameError, InvariantViolation, ListenError
from vrepl.transport import codec
from vrepl.transport.codec import ConnKind
from vrepl.transport.handshake import (
    HANDSHAKE_MAX_FRAME_BYTES,
    ClientHandshake,
    HandshakeError,
    ServerHandshake,
)

log = logging.getLogger("vrepl.transport")

MAX_PENDING_HANDSHAKES = 256  # unauthenticated server-side connections at once
# A connection's receive buffer starts at READ_MIN_BYTES and grows (x4 each time a read
# fills it, up to READ_CHUNK_BYTES) only when the peer sends faster than one small read per
# wake-up: an idle vgroup's links (heartbeats, statuses) hold 4 KiB each, not 256 KiB, which
# was most of a node's idle memory per vgroup (docs/perf.md §Many vgroups).
READ_MIN_BYTES = 4096
READ_CHUNK_BYTES = 256 * 1024


class ConnectionOwner(Protocol):
    """What the node transport and a connection need from the vgroup they serve."""

    cfg: SyncConfig
    node: int

    def log_prefix(self) -> str: ...

    def peer_hello_refusal(self, node: int) -> str | None: ...

    def sync_hello_refusal(self, node: int) -> str | None: ...

    def backup_hello_refusal(self) -> str | None: ...

    def on_connection_ready(self, conn: "Connection") -> None: ...

    def on_connection_lost(self, conn: "Connection") -> None: ...

    def on_messages(self, conn: "Connection", msgs: list) -> None: ...

    def on_send_queue(self, conn: "Connection", paused: bool) -> None: ...

    def on_sync_connection(self, sock: socket.socket, hello: codec.Hello) -> None: ...

    def fetch_hello_refusal(self, node: int) -> str | None: ...


class ShipAcceptor(Protocol):
    """What the transport needs from a node's ship service (vrepl/node/shipreceiver.py)."""

    def hello_refusal(self, hello: codec.Hello) -> str | None: ...

    def secret_for(self, hello: codec.Hello) -> bytes: ...

    def on_connection(self, sock: socket.socket, hello: codec.Hello) -> None: ...


class Connection(asyncio.BufferedProtocol):
    """One TCP connection: a peer link of one vgroup, or a replica's arbitrator link.

    Client side: created by its owner for a known peer (or the arbitrator).
    Server side: created by NodeTransport for an unknown caller; bound to an owner and a
    peer node once the hello checks out and the proofs match.
    """

    def __init__(
        self,
        node_transport: "NodeTransport",
        *,
        owner: ConnectionOwner | None = None,
        peer_node: int | None = None,
        kind: int = ConnKind.PEER,
    ) -> None:
        self.nt = node_transport
        self.loop = node_transport.loop
        self.owner = owner
        self.peer_node = peer_node
        self.kind = kind
        self.is_client = owner is not None
        self.transport: asyncio.Transport | None = None
        self.authenticated = False
        self.closed = False
        self.close_reason = ""
        self.done: asyncio.Future = self.loop.create_future()
        self.peername = "?"
        self._out: list[bytes] = []
        self._dirty = False
        self.paused = False
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._timer: asyncio.TimerHandle | None = None
        self.detached = False  # a sync/backup connection handed to a restore thread
        self.bytes_sent = 0
        self.bytes_received = 0
        self.frames_sent = 0
        self.frames_received = 0
        self._read_hint = READ_MIN_BYTES
        self._view_bytes = 0  # the size of the last get_buffer() view
        if owner is not None:
            self.frames = FrameBuffer(owner.cfg.max_frame_bytes, READ_MIN_BYTES)
            # a client connection other than the arbitrator's always names its peer node
            target = codec.ARBITRATOR_NODE_ID if kind == ConnKind.ARBITRATOR else peer_node
            self.hs: ClientHandshake | ServerHandshake = ClientHandshake(
                owner.cfg.secret,
                kind,
                owner.cfg.vgroup_id,
                owner.node,
                target,  # type: ignore[arg-type]
            )
        else:
            self.frames = FrameBuffer(HANDSHAKE_MAX_FRAME_BYTES, READ_MIN_BYTES)
            self.hs = ServerHandshake(
                node_transport.secret, node_transport.node, self._check_hello, secret_for=node_transport.secret_for
            )

    # -- naming --------------------------------------------------------------------------------

    def prefix(self) -> str:
        """'vg7 n1 e3' for log lines (vgroup, this node, epoch)."""
        if self.owner is not None:
            return self.owner.log_prefix()
        hello = getattr(self.hs, "hello", None)
        vg = f"vg{hello.vgroup_id}" if hello is not None else "vg?"
        return f"{vg} n{self.nt.node} e-"

    def describe(self) -> str:
        who = (
            "arbitrator"
            if self.kind == ConnKind.ARBITRATOR
            else f"n{self.peer_node if self.peer_node is not None else '?'}"
        )
        side = "to" if self.is_client else "from"
        return f"connection {side} {who} ({self.peername})"

    # -- asyncio protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream connection (loop.create_connection / create_server) gets a Transport.
        tr = self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        self.peername = f"{peer[0]}:{peer[1]}" if peer else "?"
        if self.owner is not None:
            cfg = self.owner.cfg
            high = cfg.send_queue_high_bytes
        else:
            high = 1024 * 1024
        tr.set_write_buffer_limits(high=high, low=high // 4)
        timeout_s = (self.owner.cfg.handshake_timeout_ms if self.owner else self.nt.handshake_timeout_ms) / 1000
        self._timer = self.loop.call_later(timeout_s, self._handshake_timeout, timeout_s)
        if self.is_client:
            if not isinstance(self.hs, ClientHandshake):
                raise InvariantViolation("isinstance(self.hs, ClientHandshake)")
            self._write_now(self.hs.start())
        else:
            self.nt.pending_handshakes.add(self)
            if len(self.nt.pending_handshakes) > MAX_PENDING_HANDSHAKES:
                self.abort(
                    f"more than {MAX_PENDING_HANDSHAKES} connections in handshake",
                    logging.WARNING,
                    refusal="too_many_handshakes",
                )

    def get_buffer(self, sizehint: int) -> memoryview:
        # recv_into the frame buffer's free space: no intermediate bytes object per read.
        # Before the hello is checked a caller gets a small buffer only.
        view = self.frames.writable(self._read_hint)
        self._view_bytes = len(view)
        return view

    def buffer_updated(self, nbytes: int) -> None:
        self.frames.wrote(nbytes)
        if nbytes >= self._view_bytes and self._read_hint < READ_CHUNK_BYTES and (self.authenticated or self.is_client):
            self._read_hint = min(self._read_hint * 4, READ_CHUNK_BYTES)  # more is waiting
        self.bytes_received += nbytes
        if self.closed:
            return
        try:
            if not self.authenticated:
                self._on_handshake_bytes()
                if not self.authenticated or self.closed:
                    return
            self._on_frames()
        except (FrameError, HandshakeError) as exc:
            code = exc.code if isinstance(exc, HandshakeError) else "bad_frame"
            self.abort(str(exc), logging.WARNING, refusal=code)

    def eof_received(self) -> bool | None:
        self.close_reason = self.close_reason or "closed by the other side"
        return False  # let asyncio close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.nt.pending_handshakes.discard(self)
        if not self.close_reason:
            self.close_reason = f"lost: {exc}" if exc else "closed by the other side"
        was_closed = self.closed
        self.closed = True
        self._resumed.set()
        if not self.done.done():
            self.done.set_result(self.close_reason)
        if self.detached:
            return
        if self.authenticated and self.owner is not None:
            self.owner.on_connection_lost(self)
        elif not was_closed and self.is_client and self.owner is not None:
            log.debug("%s: %s closed during handshake: %s", self.prefix(), self.describe(), self.close_reason)

    def pause_writing(self) -> None:
        self.paused = True
        self._resumed.clear()
        if self.owner is not None and self.authenticated:
            self.owner.on_send_queue(self, True)

    def resume_writing(self) -> None:
        self.paused = False
        self._resumed.set()
        if self.owner is not None and self.authenticated:
            self.owner.on_send_queue(self, False)

    # -- handshake -----------------------------------------------------------------------------

    def _handshake_timeout(self, timeout_s: float) -> None:
        self._timer = None
        if not self.authenticated and not self.closed:
            self.abort(f"handshake not finished within {timeout_s:g} s", logging.WARNING, refusal="handshake_timeout")

    def _check_hello(self, hello: codec.Hello) -> str | None:
        return self.nt.check_hello(hello)

    def _on_handshake_bytes(self) -> None:
        while not self.authenticated and not self.closed:
            rec = self.frames.next_frame()
            if rec is None:
                return
            if rec.msg_type not in (
                codec.MsgType.HELLO,
                codec.MsgType.CHALLENGE,
                codec.MsgType.AUTH,
                codec.MsgType.WELCOME,
            ):
                raise HandshakeError(f"message type {rec.msg_type} before the handshake finished")
            msg = codec.decode(rec)
            out = self.hs.on_message(msg)
            if out:
                self._write_now(out)
            if self.hs.done:
                self._authenticated()

    def _authenticated(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.is_client:
            self.nt.pending_handshakes.discard(self)
            hello = self.hs.hello
            if hello is None:
                raise InvariantViolation("hello is not None")
            if hello.kind == ConnKind.SHIP:
                # A ship sender (docs/ship.md): its session runs on the node's ship service.
                if self.frames.buffered:
                    raise HandshakeError(f"{self.frames.buffered} bytes sent before the handshake finished")
                self._detach_when_flushed(None, hello, 0)
                return
            inst = self.nt.owners.get(hello.vgroup_id)
            if inst is None:  # stopped while we were shaking hands
                raise HandshakeError(f"vg{hello.vgroup_id} stopped during the handshake", "hello_refused")
            if self.frames.buffered:
                raise HandshakeError(f"{self.frames.buffered} bytes sent before the handshake finished")
            self.owner = inst
            self.peer_node = hello.node
            if hello.kind in (ConnKind.SYNC, ConnKind.BACKUP, ConnKind.FETCH):
                # A restore session: bulk, blocking, on its own thread (docs/restore.md).
                self._detach_when_flushed(inst, hello, 0)
                return
            self.frames = FrameBuffer(inst.cfg.max_frame_bytes, READ_MIN_BYTES)
            # connection_made set the transport before any frame (so the handshake) came in
            self.transport.set_write_buffer_limits(  # type: ignore[union-attr]
                high=inst.cfg.send_queue_high_bytes, low=inst.cfg.send_queue_high_bytes // 4
            )
        self.authenticated = True
        if self.owner is None:
            raise InvariantViolation("self.owner is not None")
        self.owner.on_connection_ready(self)

    def _detach_when_flushed(self, inst: ConnectionOwner | None, hello: codec.Hello, tries: int) -> None:
        """Hand the socket to the owner's restore code (None: the node's ship service) once
        WELCOME has left; reading
        stops now, so every later byte stays in the kernel for the new owner."""
        if self.closed or self.transport is None:
            return
        self.transport.pause_reading()
        if self.transport.get_write_buffer_size() and tries < 1000:
            self.loop.call_later(0.005, self._detach_when_flushed, inst, hello, tries + 1)
            return
        sock = self.transport.get_extra_info("socket")
        try:
            fd = os.dup(sock.fileno())
        except OSError as exc:
            self.abort(f"cannot take over the sync connection: {exc}", logging.WARNING)
            return
        self.detached = True
        self.closed = True
        self.close_reason = "handed to a restore session"
        self.transport.abort()  # closes asyncio's descriptor; the duplicate stays open
        raw = socket.socket(fileno=fd)
        if inst is None:
            self.nt.on_ship_connection(raw, hello)
        else:
            inst.on_sync_connection(raw, hello)

    # -- frames --------------------------------------------------------------------------------

    def _on_frames(self) -> None:
        inst = self.owner
        if inst is None:
            raise InvariantViolation("inst is not None")
        max_record = inst.cfg.max_record_bytes
        msgs = []
        frames = self.frames
        while True:
            rec = frames.next_frame()
            if rec is None:
                break
            msgs.append(codec.decode(rec, max_record))
        if msgs:
            self.frames_received += len(msgs)
            inst.on_messages(self, msgs)

    # -- writing -------------------------------------------------------------------------------

    def _write_now(self, frame: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(frame)
            self.bytes_sent += len(frame)

    def send_frame(self, frame: bytes) -> None:
        """Queue a frame; all frames queued during one batch of events go out in one write
        when the node flushes (write coalescing)."""
        if self.closed:
            return
        self._out.append(frame)
        if not self._dirty:
            self._dirty = True
            self.nt.mark_dirty(self)

    def flush(self) -> None:
        self._dirty = False
        if self.closed or not self._out or self.transport is None:
            self._out.clear()
            return
        out = self._out
        self._out = []
        data = out[0] if len(out) == 1 else b"".join(out)
        self.transport.write(data)
        self.bytes_sent += len(data)
        self.frames_sent += len(out)
        limit = self.owner.cfg.max_send_queue_bytes if self.owner else 1 << 24
        queued = self.transport.get_write_buffer_size()
        if queued > limit:
            self.abort(
                f"send queue holds {queued} bytes, above max_send_queue_bytes {limit}: peer too slow", logging.WARNING
            )

    async def writable(self) -> None:
        """Wait until the send queue is below its low-water mark (or the connection closed)."""
        await self._resumed.wait()

    def abort(self, reason: str, level: int = logging.INFO, refusal: str | None = None) -> None:
        """Close now, dropping anything unsent, with a logged reason; `refusal` (a reason
        code) counts it in the node's refusals (docs/operations.md §Metrics)."""
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        if refusal is not None:
            refusals = self.nt.refusals
            refusals[refusal] = refusals.get(refusal, 0) + 1
        self._out.clear()
        log.log(level, "%s: %s closed: %s", self.prefix(), self.describe(), reason)
        if self.transport is not None:
            self.transport.abort()


class NodeTransport:
    """The TCP server of one node (host:port, node id) and the vgroups (connection owners)
    it serves."""

    _registry: dict[tuple[str, int], "NodeTransport"] = {}
    # The ship service of the node listening at (host, port) (docs/ship.md §1), set by the
    # node process: it decides on SHIP hellos, their secrets, and takes their sockets.
    ship_acceptors: dict[tuple[str, int], "ShipAcceptor"] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop, node: int, host: str, port: int, secret: bytes) -> None:
        self.loop = loop
        self.node = node
        self.host = host
        self.port = port
        self.secret = secret
        self.handshake_timeout_ms = 5000
        self.owners: dict[int, ConnectionOwner] = {}
        self.pending_handshakes: set[Connection] = set()
        self.server: asyncio.AbstractServer | None = None
        self._dirty: list[Connection] = []
        self._flush_scheduled = False
        # Connections closed for what the other side sent, by reason code (HandshakeError.code,
        # handshake_timeout, too_many_handshakes, bad_frame): the refusals metric.
        self.refusals: dict[str, int] = {}
        # Per-node state its vgroups share, set by the first that needs it (the restore limiter
        # of max_concurrent_restores, vrepl/sync.py): it lives as long as this server.
        self.restore_limiter: Any = None

    @classmethod
    async def acquire(cls, loop: asyncio.AbstractEventLoop, owner: ConnectionOwner) -> "NodeTransport":
        """The node transport for the owner's own address (started on first use)."""
        me = owner.cfg.me
        key = (me.host, me.port)
        nt = cls._registry.get(key)
        if nt is None:
            nt = cls(loop, me.node, me.host, me.port, owner.cfg.secret)
            nt.handshake_timeout_ms = owner.cfg.handshake_timeout_ms
            cls._registry[key] = nt
            try:
                nt.server = await loop.create_server(
                    lambda: Connection(nt), me.host, me.port, reuse_address=True, backlog=256
                )
            except OSError as exc:
                del cls._registry[key]
                raise ListenError(f"{me.host}:{me.port}", "replication", exc) from None
            log.info("n%d: listening on %s:%d", me.node, me.host, me.port)
        if nt.node != me.node:
            raise ConfigError(f"{me.host}:{me.port} is node {nt.node}, vg{owner.cfg.vgroup_id} says node {me.node}")
        if nt.secret != owner.cfg.secret:
            raise ConfigError(
                f"vg{owner.cfg.vgroup_id}: the cluster secret differs from the other vgroups on {me.host}:{me.port}"
            )
        if owner.cfg.vgroup_id in nt.owners:
            raise ConfigError(f"vg{owner.cfg.vgroup_id} already runs on {me.host}:{me.port}")
        nt.owners[owner.cfg.vgroup_id] = owner
        return nt

    def release(self, owner: ConnectionOwner) -> None:
        """Forget the owner; the last one closes the server."""
        if self.owners.get(owner.cfg.vgroup_id) is owner:
            del self.owners[owner.cfg.vgroup_id]
        if self.owners:
            return
        self._registry.pop((self.host, self.port), None)
        if self.server is not None:
            self.server.close()
            self.server = None
        for conn in list(self.pending_handshakes):
            conn.abort("node transport stopping")
        log.info("n%d: stopped listening on %s:%d", self.node, self.host, self.port)

    def ship_acceptor(self) -> "ShipAcceptor | None":
        return NodeTransport.ship_acceptors.get((self.host, self.port))

    def secret_for(self, hello: codec.Hello) -> bytes:
        """The secret a hello must prove: a ship sender's own, else the cluster secret."""
        acceptor = self.ship_acceptor() if hello.kind == ConnKind.SHIP else None
        return acceptor.secret_for(hello) if acceptor is not None else self.secret

    def on_ship_connection(self, sock: socket.socket, hello: codec.Hello) -> None:
        acceptor = self.ship_acceptor()
        if acceptor is None:
            sock.close()
            return
        acceptor.on_connection(sock, hello)

    def check_hello(self, hello: codec.Hello) -> str | None:
        """Why this node refuses a hello, or None (docs/embedding.md §Connections)."""
        if hello.kind == ConnKind.SHIP:
            acceptor = self.ship_acceptor()
            if acceptor is None:
                return f"ship hello from sender {hello.node}: this node takes no ship connections ([ship] senders)"
            return acceptor.hello_refusal(hello)
        if hello.kind not in (ConnKind.PEER, ConnKind.SYNC, ConnKind.BACKUP, ConnKind.FETCH):
            return f"hello of kind {hello.kind} from n{hello.node}: this node takes peer, sync, backup and fetch connections"
        inst = self.owners.get(hello.vgroup_id)
        if inst is None:
            return f"unknown vgroup {hello.vgroup_id} (hello from n{hello.node})"
        if hello.kind == ConnKind.BACKUP:
            # A restore tool does not know node ids: it names none (docs/restore.md §CLI).
            if hello.node != codec.RESTORE_TOOL_NODE_ID or hello.target_node not in (self.node, -1):
                return f"backup hello from n{hello.node} for n{hello.target_node}: not a restore tool's"
            return inst.backup_hello_refusal()
        if hello.target_node != self.node:
            return f"hello from n{hello.node} for n{hello.target_node}, this is n{self.node}"
        if hello.kind == ConnKind.SYNC:
            return inst.sync_hello_refusal(hello.node)
        if hello.kind == ConnKind.FETCH:
            return inst.fetch_hello_refusal(hello.node)
        return inst.peer_hello_refusal(hello.node)

    def mark_dirty(self, conn: Connection) -> None:
        self._dirty.append(conn)
        if not self._flush_scheduled:
            # A safety net: the entry points flush at their end; this catches any frame
            # queued from elsewhere (a stream task, a timer).
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write every connection's queued frames, one write per connection."""
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()
