"""The simulated network and arbitrator of the simulator (docs/simulation.md §What is simulated).

Owns: `SimNetwork`, the part of `World` (vrepl/testing/sim/world.py, which inherits it) that
carries frames: per-connection FIFO channels with latency, the connections between nodes
(generations, breaks, half-open sockets, resets) and to the arbitrator, and the arbitrator
itself (a `LeaseTable` answering encoded requests with encoded grants). Frames are the wire
codec's bytes; delivery decodes them and hands them to the node's driver.
Must not: execute a replica action (the driver does) or use randomness but the world's PRNG.
"""
from __future__ import annotations

from vrepl.replica import (
    ArbitratorConnected,
    ArbitratorGrant,
    ArbitratorLost,
    ArbitratorRequest,
    PeerConnected,
    PeerDisconnected,
)
from vrepl.testing.sim.options import UNITS_PER_TICK
from vrepl.testing.sim.ports import ARB, TICK_MS, VGROUP, Channel, Conn, SimError, SimNode
from vrepl.transport import codec


class SimNetwork:
    """Channels, connections and the arbitrator: a mixin of `World` (its state lives there)."""

    # ================================================================== channels

    def _enqueue(self, ch: Channel, item, delay: int) -> None:
        if ch.dead:
            return
        ready = self.now + delay
        if ch.q:
            ready = max(ready, ch.q[-1][0])
        ch.q.append((ready, item))
        if not ch.armed and len(ch.q) == 1:
            ch.armed = True
            self._push(ready, "chan", ch)

    def _blocked(self, ch: Channel) -> bool:
        if ch.kind == "local":
            return self.nodes[ch.dst].paused
        if ch.kind == "peer":
            return (ch.src, ch.dst) in self.blocked or self.nodes[ch.dst].paused
        if ch.kind == "n2a":
            return (ch.src, ARB) in self.blocked
        return (ARB, ch.dst) in self.blocked or self.nodes[ch.dst].paused  # a2n

    def _on_channel(self, ch: Channel) -> None:
        ch.armed = False
        if ch.dead or not ch.q:
            return
        if self._blocked(ch):
            self._stalled.append(ch)
            return
        _, item = ch.q.popleft()
        if ch.q:
            ch.armed = True
            self._push(max(self.now, ch.q[0][0]), "chan", ch)
        kind = ch.kind
        if kind == "local":
            self._on_local(self.nodes[ch.dst], item)
        elif kind == "peer":
            self._on_peer_item(ch, item)
        elif kind == "n2a":
            self._on_arbitrator_request(ch, item)
        else:
            self._on_arbitrator_item(ch, item)

    def _rearm_stalled(self) -> None:
        stalled, self._stalled = self._stalled, []
        for ch in stalled:
            if not ch.dead and ch.q and not ch.armed:
                ch.armed = True
                self._push(max(self.now, ch.q[0][0]), "chan", ch)

    def _latency(self, src: int, dst: int) -> int:
        o = self.opts
        d = self.rng.randint(o.latency_units_min, o.latency_units_max)
        if o.slow_message_rate and self.rng.random() < o.slow_message_rate:
            d += self.rng.randint(0, o.slow_latency_units_max)
        return d + self.link_slow.get((src, dst), 0)

    def _local(self, sn: SimNode, event, delay: int = 1) -> None:
        if sn.local is not None:
            self._enqueue(sn.local, event, delay)

    # ================================================================== peer connections

    def _pair(self, a: int, b: int) -> tuple[int, int]:
        return (a, b) if a < b else (b, a)

    def _chan(self, kind: str, src: int, dst: int, gen: int) -> Channel:
        key = (kind, src, dst, gen)
        ch = self.channels.get(key)
        if ch is None:
            ch = self.channels[key] = Channel(kind, src, dst, gen)
        return ch

    def _connect(self, a: int, b: int) -> None:
        self._gen += 1
        gen = self._gen
        self.conns[self._pair(a, b)] = Conn(a, b, gen)
        # The hello completes at each side when the other's first bytes arrive: a marker at
        # the head of each direction, so PeerConnected precedes every message of the link.
        self._enqueue(self._chan("peer", a, b, gen), ("connected",), self._latency(a, b))
        self._enqueue(self._chan("peer", b, a, gen), ("connected",), self._latency(b, a))

    def _break(self, a: int, b: int, *, notify: bool) -> None:
        """The connection between a and b dies; what is in flight is lost. With `notify`,
        each side whose socket is still open is told (a RST/FIN) when the path lets it."""
        conn = self.conns.pop(self._pair(a, b), None)
        if conn is None:
            return
        conn.alive = False
        gen = conn.gen
        for s, d in ((a, b), (b, a)):
            ch = self.channels.pop(("peer", s, d, gen), None)
            if ch is not None:
                ch.dead = True
        if notify:
            for s, d in ((a, b), (b, a)):
                if self.nodes[d].sock.get(s) == gen:
                    # A channel of its own (not registered): the close notice outlives the link.
                    self._enqueue(Channel("peer", s, d, gen), ("closed",), self._latency(s, d))

    def reset_link(self, sn: SimNode, peer: int) -> bool:
        """Bus.reset: `sn` closes its socket to `peer` (ResetConnection, a bad frame); True
        when one was open (the driver then steps PeerDisconnected itself)."""
        gen = sn.sock.get(peer)
        if gen is None:
            return False
        sn.sock[peer] = None
        conn = self.conns.get(self._pair(sn.node, peer))
        if conn is not None and conn.gen == gen:
            self._break(sn.node, peer, notify=True)
        return True

    def _on_peer_item(self, ch: Channel, item) -> None:
        dst = self.nodes[ch.dst]
        if not dst.up:
            return
        if isinstance(item, tuple):
            what = item[0]
            if what == "connected":
                conn = self.conns.get(self._pair(ch.src, ch.dst))
                if conn is None or conn.gen != ch.gen:
                    return
                if dst.sock[ch.src] is not None:
                    # A new connection from a peer replaces a half-open one.
                    dst.sock[ch.src] = None
                    self._event(dst, PeerDisconnected(ch.src))
                dst.sock[ch.src] = ch.gen
                self._event(dst, PeerConnected(ch.src))
            elif what == "closed":
                if dst.sock[ch.src] == ch.gen:
                    dst.sock[ch.src] = None
                    self._event(dst, PeerDisconnected(ch.src))
            return
        if dst.sock[ch.src] != ch.gen:
            return
        # The frame as the transport reads it: through the real wire codec.
        msg = codec.decode_bytes(item)
        self._drive(dst, f"n{ch.src}: {msg.describe()}", dst.driver.received, ch.src, [msg])

    def send_frame(self, sn: SimNode, peer: int, frame: bytes) -> None:
        """Bus.send: one encoded frame on the connection `sn` holds to `peer`."""
        gen = sn.sock.get(peer)
        if gen is None:
            return
        conn = self.conns.get(self._pair(sn.node, peer))
        if conn is None or conn.gen != gen:
            return
        if self.faults_on and self.opts.conn_loss_rate and self.rng.random() < self.opts.conn_loss_rate:
            self.stats.conn_losses += 1
            # Lost on the wire: TCP gives up on the connection. Half the time both ends hear
            # of it at once, else only their heartbeat timeouts find out.
            self._break(sn.node, peer, notify=self.rng.random() < 0.5)
            return
        self._enqueue(self._chan("peer", sn.node, peer, gen), frame, self._latency(sn.node, peer))

    # ================================================================== arbitrator

    def _arb_connect(self, sn: SimNode) -> None:
        self._gen += 1
        self.arb_conns[sn.node] = Conn(sn.node, ARB, self._gen)
        self._enqueue(self._chan("a2n", ARB, sn.node, self._gen), ("connected",), self._latency(ARB, sn.node))

    def _arb_break(self, node: int, *, notify: bool = True) -> None:
        conn = self.arb_conns.pop(node, None)
        if conn is None:
            return
        conn.alive = False
        for key in (("n2a", node, ARB, conn.gen), ("a2n", ARB, node, conn.gen)):
            ch = self.channels.pop(key, None)
            if ch is not None:
                ch.dead = True
        sn = self.nodes[node]
        if notify and sn.arb_sock == conn.gen:
            # A channel of its own (not registered): the close notice outlives the link.
            self._enqueue(Channel("a2n", ARB, node, conn.gen), ("closed", conn.gen), self._latency(ARB, node))

    def _on_arbitrator_item(self, ch: Channel, item) -> None:
        sn = self.nodes[ch.dst]
        if not sn.up:
            return
        what = item[0]
        if what == "connected":
            conn = self.arb_conns.get(sn.node)
            if conn is None or conn.gen != ch.gen:
                return
            sn.arb_sock = ch.gen
            self._event(sn, ArbitratorConnected())
        elif what == "closed":
            if sn.arb_sock == item[1]:
                sn.arb_sock = None
                self._event(sn, ArbitratorLost())
        elif sn.arb_sock == ch.gen:  # ("answer", frame)
            msg = codec.decode_bytes(item[1])
            self._drive(sn, f"arbitrator: {msg.describe()}", sn.driver.arbitrator_message, msg)

    def send_to_arbitrator(self, sn: SimNode, frame: bytes) -> None:
        """Bus.to_arbitrator: one encoded frame on this node's arbitrator connection."""
        conn = self.arb_conns.get(sn.node)
        if sn.arb_sock is not None and conn is not None and conn.gen == sn.arb_sock:
            self._enqueue(self._chan("n2a", sn.node, ARB, conn.gen), frame, self._latency(sn.node, ARB))

    def reset_arbitrator_link(self, sn: SimNode) -> bool:
        """Bus.reset_arbitrator: `sn` closes its arbitrator socket."""
        if sn.arb_sock is None:
            return False
        conn = self.arb_conns.get(sn.node)
        if conn is not None and conn.gen == sn.arb_sock:
            self._arb_break(sn.node, notify=False)
        sn.arb_sock = None
        return True

    def _on_arbitrator_request(self, ch: Channel, frame: bytes) -> None:
        req = codec.decode_bytes(frame)
        if type(req) is not ArbitratorRequest:
            raise SimError(f"n{ch.src} sent the arbitrator {req.describe()}")
        node, epoch = req.node, req.epoch
        conn = self.arb_conns.get(node)
        if not self.arb_up or conn is None or conn.gen != ch.gen:
            return
        if self.now < self.arb_refuse_until:
            granted = False  # just restarted without its table: wait out any lease it gave
        else:
            granted = self.arb_table.request(VGROUP, node, epoch, self.now) is None
        self._trace(f"arbitrator {'grants' if granted else 'refuses'} n{node} e{epoch}")
        lease_ms = self.arb_lease_units * TICK_MS // UNITS_PER_TICK
        answer = codec.encode(ArbitratorGrant(req.vgroup_id, node, epoch, lease_ms, int(granted)))
        self._enqueue(self._chan("a2n", ARB, node, ch.gen), ("answer", answer), self._latency(ARB, node))
