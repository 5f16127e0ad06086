"""A sync instance's links: its peer connections and its arbitrator connection.

Owns: `PeerLinks`, which is both the driver's `Bus` port (vrepl/driver/ports.py: send a frame
to a node, reset a link, a frame to the arbitrator, send-queue state) and the connection
owner the node transport calls (vrepl/transport/node.py `ConnectionOwner`): the hello
checks of a peer, a connection ready / lost / with messages / with a full send queue, the
client side's connect-and-retry loops (the replica with the lower (host, port) connects,
every `reconnect_interval_ms`). Events go to its `LinkEvents` sink (the driver) as replica
events, each batch ended with `end_batch()`. Sync and backup connections (the restore flow)
and fetch connections (files of an ingested round, docs/vnode.md §9) go to a
`SyncConnectionHandler`. docs/embedding.md §Connections and the hello.
Threads: the I/O thread only.
Must not: decide anything about replication; decode or encode beyond what the Connection
does (the driver encodes frames).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from vrepl.config import ReplicaAddress, SyncConfig, parse_endpoint
from vrepl.errors import InvariantViolation
from vrepl.replica import ArbitratorConnected, ArbitratorLost, PeerConnected, PeerDisconnected
from vrepl.transport import codec
from vrepl.transport.codec import ConnKind
from vrepl.transport.node import Connection, NodeTransport

log = logging.getLogger("vrepl.sync")
_monotonic = time.monotonic


class LinkEvents(Protocol):
    """Where a PeerLinks sends what happens on its links (the driver)."""

    def step(self, event: object) -> None: ...

    def received(self, node: int, messages: list) -> None: ...

    def arbitrator_message(self, msg: object) -> None: ...

    def link_writable(self, node: int) -> None: ...

    def update_flow(self) -> None: ...

    def end_batch(self) -> None: ...


class SyncConnectionHandler(Protocol):
    """Who takes a sync or backup connection (the restore sessions, docs/restore.md)."""

    def sync_hello_refusal(self, node: int) -> str | None: ...

    def backup_hello_refusal(self) -> str | None: ...

    def fetch_hello_refusal(self, node: int) -> str | None: ...

    def on_sync_connection(self, sock: Any, hello: codec.Hello) -> None: ...


class PeerLinks:
    """The links of one sync instance (see the module doc)."""

    def __init__(self, cfg: SyncConfig, *, log_prefix: Any, restore_cfg: Any) -> None:
        self.cfg = cfg
        self.restore_cfg = restore_cfg  # read by the node transport (max_concurrent_restores)
        self.node = cfg.me.node
        self.log_prefix = log_prefix
        self._addr_by_node: dict[int, ReplicaAddress] = {r.node: r for r in cfg.replicas}
        self.events: LinkEvents | None = None  # the driver, bound before start()
        self.sync_handler: SyncConnectionHandler | None = None
        self.nt: NodeTransport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.state = "new"  # the instance's: new -> running -> stopping / failed (set by its owner)
        self.conns: dict[int, Connection] = {}
        self.arb_conn: Connection | None = None
        self.last_heard: dict[int, float] = {}  # peer node -> monotonic time of its last frame
        self._tasks: set[asyncio.Task] = set()
        self.counters: dict[str, int] = dict.fromkeys(
            ("connections_refused", "connections_opened", "connections_closed"), 0
        )

    # -- lifecycle (I/O thread) ------------------------------------------------------------------

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Register with the node's server (started on first use) and start connecting."""
        self.loop = loop
        self.nt = await NodeTransport.acquire(loop, self)
        self.state = "running"
        me = self.cfg.me
        for addr in self.cfg.replicas:
            if addr.node != self.node and me.order_key() < addr.order_key():
                self._spawn(self._connect_loop(addr.node, addr.host, addr.port, ConnKind.PEER))
        if self.cfg.arbitrator_used:
            host, port = parse_endpoint(self.cfg.arbitrator or "")
            self._spawn(self._connect_loop(None, host, port, ConnKind.ARBITRATOR))

    @property
    def running(self) -> bool:
        return self.state == "running"

    def close(self, reason: str) -> None:
        """Stop connecting, close every link (no events follow)."""
        if self.state == "running":
            self.state = "stopping"
        for task in list(self._tasks):
            task.cancel()
        for conn in list(self.conns.values()):
            conn.abort(reason)
        self.conns.clear()
        if self.arb_conn is not None:
            self.arb_conn.abort(reason)
            self.arb_conn = None

    def release(self) -> None:
        if self.nt is not None:
            self.nt.release(self)

    def _spawn(self, coro) -> None:
        if self.loop is None:
            raise InvariantViolation("self.loop is not None")
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("%s: task failed: %r", self.log_prefix(), exc, exc_info=exc)

    async def _connect_loop(self, node: int | None, host: str, port: int, kind: int) -> None:
        """Client side: connect, wait until the connection ends, retry every reconnect interval."""
        if self.loop is None or self.nt is None:
            raise InvariantViolation("self.loop is not None and self.nt is not None")
        pause_s = self.cfg.reconnect_interval_ms / 1000.0
        what = "arbitrator" if kind == ConnKind.ARBITRATOR else f"n{node}"
        failures = 0
        while self.running:
            conn = Connection(self.nt, owner=self, peer_node=node, kind=kind)
            try:
                # create_connection calls the factory before this iteration ends: `conn` is this one
                await asyncio.wait_for(
                    self.loop.create_connection(lambda: conn, host, port),  # noqa: B023
                    timeout=max(pause_s, 1.0),
                )
            except (OSError, asyncio.TimeoutError) as exc:
                failures += 1
                level = logging.INFO if failures == 1 else logging.DEBUG
                log.log(
                    level,
                    "%s: cannot connect to %s at %s:%d: %s",
                    self.log_prefix(),
                    what,
                    host,
                    port,
                    exc or "timeout",
                )
                await asyncio.sleep(pause_s)
                continue
            failures = 0
            self.counters["connections_opened"] += 1
            await asyncio.shield(conn.done)
            await asyncio.sleep(pause_s)

    # -- the Bus port (the driver's) -------------------------------------------------------------

    def connected(self, node: int) -> bool:
        return node in self.conns

    def send(self, node: int, frame: bytes) -> None:
        conn = self.conns.get(node)
        if conn is not None:
            conn.send_frame(frame)

    def reset(self, node: int, reason: str) -> bool:
        conn = self.conns.pop(node, None)
        if conn is None:
            return False
        conn.abort(reason, logging.WARNING)
        return True

    def to_arbitrator(self, frame: bytes) -> None:
        if self.arb_conn is not None:
            self.arb_conn.send_frame(frame)

    def reset_arbitrator(self, reason: str) -> bool:
        conn, self.arb_conn = self.arb_conn, None
        if conn is None:
            return False
        conn.abort(reason, logging.WARNING)
        return True

    def writable(self, node: int) -> bool:
        conn = self.conns.get(node)
        return conn is not None and not conn.paused

    def congested(self) -> bool:
        return any(c.paused for c in self.conns.values())

    def flush(self) -> None:
        if self.nt is not None:
            self.nt.flush()

    # -- the connection owner (the node transport's) -----------------------------------------------

    def peer_hello_refusal(self, node: int) -> str | None:
        """Why a peer connection from `node` is refused by this instance's server side."""
        vg = self.cfg.vgroup_id
        if not self.running:
            return f"vg{vg} is {self.state}"
        addr = self._addr_by_node.get(node)
        if addr is None:
            return f"unknown node n{node}: not a replica of vg{vg}"
        if node == self.node:
            return f"hello from n{node}, which is this node"
        if not addr.order_key() < self.cfg.me.order_key():
            return f"n{node} at {addr.endpoint()} has the higher address: this node opens that connection"
        return None

    def sync_hello_refusal(self, node: int) -> str | None:
        if not self.running or self.sync_handler is None:
            return f"vg{self.cfg.vgroup_id} is {self.state}"
        return self.sync_handler.sync_hello_refusal(node)

    def backup_hello_refusal(self) -> str | None:
        if not self.running or self.sync_handler is None:
            return f"vg{self.cfg.vgroup_id} is {self.state}"
        return self.sync_handler.backup_hello_refusal()

    def fetch_hello_refusal(self, node: int) -> str | None:
        if not self.running or self.sync_handler is None:
            return f"vg{self.cfg.vgroup_id} is {self.state}"
        return self.sync_handler.fetch_hello_refusal(node)

    def on_sync_connection(self, sock: Any, hello: codec.Hello) -> None:
        if not self.running or self.sync_handler is None:
            sock.close()
            return
        self.sync_handler.on_sync_connection(sock, hello)

    def on_connection_ready(self, conn: Connection) -> None:
        """A connection finished its handshake (either side)."""
        ev = self.events
        if not self.running or ev is None:
            conn.abort(f"vg{self.cfg.vgroup_id} is {self.state}")
            return
        if conn.kind == ConnKind.ARBITRATOR:
            self.arb_conn = conn
            log.info("%s: %s ready", self.log_prefix(), conn.describe())
            ev.step(ArbitratorConnected())
            ev.end_batch()
            return
        node = conn.peer_node
        if node is None:
            raise InvariantViolation("node is not None")
        old = self.conns.get(node)
        if old is not None and old is not conn:
            old.abort("replaced by a newer connection from the same peer")
            del self.conns[node]
            ev.step(PeerDisconnected(node))
        self.conns[node] = conn
        log.info("%s: %s ready", self.log_prefix(), conn.describe())
        ev.step(PeerConnected(node))
        ev.end_batch()

    def on_connection_lost(self, conn: Connection) -> None:
        ev = self.events
        if not self.running or ev is None:
            return
        self.counters["connections_closed"] += 1
        if conn.kind == ConnKind.ARBITRATOR:
            if self.arb_conn is conn:
                self.arb_conn = None
                log.info("%s: %s lost: %s", self.log_prefix(), conn.describe(), conn.close_reason)
                ev.step(ArbitratorLost())
        elif conn.peer_node is not None and self.conns.get(conn.peer_node) is conn:
            del self.conns[conn.peer_node]
            log.info("%s: %s lost: %s", self.log_prefix(), conn.describe(), conn.close_reason)
            ev.step(PeerDisconnected(conn.peer_node))
        ev.update_flow()
        ev.end_batch()

    def on_send_queue(self, conn: Connection, paused: bool) -> None:
        """A connection's send queue went above (paused) or back below its high-water mark."""
        ev = self.events
        if ev is None or not self.running:
            return
        if paused:
            log.info(
                "%s: %s send queue above %d bytes", self.log_prefix(), conn.describe(), self.cfg.send_queue_high_bytes
            )
            ev.update_flow()
        elif conn.peer_node is not None and self.conns.get(conn.peer_node) is conn:
            ev.link_writable(conn.peer_node)
        else:
            ev.update_flow()
        ev.end_batch()

    def on_messages(self, conn: Connection, msgs: list) -> None:
        """Decoded frames from one read of one authenticated connection."""
        ev = self.events
        if not self.running or ev is None:
            return
        if conn.kind == ConnKind.ARBITRATOR:
            if self.arb_conn is conn:
                for msg in msgs:
                    ev.arbitrator_message(msg)
                    if self.arb_conn is not conn:
                        break
            ev.end_batch()
            return
        node = conn.peer_node
        if node is None or self.conns.get(node) is not conn:
            return  # a replaced connection still draining
        self.last_heard[node] = _monotonic()  # once per read, not per frame
        ev.received(node, msgs)
        ev.end_batch()

    # -- observability -----------------------------------------------------------------------------

    def link_stats(self) -> dict[int, dict[str, int]]:
        return {
            node: {
                "bytes_sent": c.bytes_sent,
                "bytes_received": c.bytes_received,
                "frames_sent": c.frames_sent,
                "frames_received": c.frames_received,
                "send_queue_bytes": c.transport.get_write_buffer_size() if c.transport else 0,
            }
            for node, c in self.conns.items()
        }
