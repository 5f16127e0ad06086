"""The arbitrator process: grants at most one master per vgroup and epoch a renewable lease.

Owns: the arbitrator's TCP server, its connections (authenticated with the same hello as peer
connections: vrepl/transport/handshake.py), the lease table (vrepl/replica/lease.py, shared
with the simulator so the rule is written once) and the state file that carries grants across
a restart. docs/arbitrator.md states the guarantee.

TDengine's arbitrator only held connections, so a 2-replica group whose direct link broke
while both replicas still reached the arbitrator elected two masters. This one answers each
ArbitratorRequest(vgroup, node, epoch, lease_ms) with a grant only if no other node holds a
live lease for that vgroup and no newer epoch was ever granted; the master renews before the
lease runs out and steps down when it cannot.

Must not: grant a lease that cannot back the one asked for (the master counts its lease from
the moment it asked, on its own clock: lease_ms must be at least the asked lease x (1 +
clock_drift_ratio) + lease_allowance_ms, docs/design.md §5), forget a grant across a
restart, or talk to anything but its clients.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass

from vrepl.errors import FrameError, InvariantViolation
from vrepl.replica.lease import (DEFAULT_CLOCK_DRIFT_RATIO, DEFAULT_LEASE_ALLOWANCE_MS,
                                 LeaseTable, lease_margin_refusal)
from vrepl.replica.messages import ArbitratorGrant, ArbitratorRequest
from vrepl.transport import codec
from vrepl.transport.framed import FramedStream, server_handshake
from vrepl.transport.handshake import HANDSHAKE_MAX_FRAME_BYTES, HandshakeError

log = logging.getLogger("vrepl.arbitrator")

STATE_FILE = "arbitrator-state.json"
MAX_REQUEST_FRAME_BYTES = 4096


@dataclass(frozen=True)
class ArbitratorConfig:
    host: str = "127.0.0.1"
    port: int = 6042
    secret: bytes = b""
    state_dir: str = "."
    lease_ms: int = 2500          # how long a grant holds (docs/arbitrator.md: the margin rule)
    clock_drift_ratio: float = DEFAULT_CLOCK_DRIFT_RATIO
    lease_allowance_ms: int = DEFAULT_LEASE_ALLOWANCE_MS
    max_connections: int = 1024
    handshake_timeout_ms: int = 5000
    idle_timeout_ms: int = 30000  # a client silent this long is disconnected


def max_backed_replica_lease_ms(cfg: ArbitratorConfig) -> int:
    """The longest replica lease (arbitrator_lease_ticks x tick_ms) this arbitrator's lease can
    back under the margin rule (0: none)."""
    lo, hi = 0, cfg.lease_ms
    while lo < hi:  # the rule is monotonic in the replica lease: bisect on it
        mid = (lo + hi + 1) // 2
        if lease_margin_refusal(cfg.lease_ms, mid, cfg.clock_drift_ratio,
                                cfg.lease_allowance_ms) is None:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


# LeaseTable's refusal reasons (vrepl/replica/lease.py), as the codes the metrics count.
_REFUSAL_CODES = (("is older than granted", "older_epoch"), ("was granted to", "epoch_taken"),
                  ("lease held by", "lease_held"))


def refusal_code(reason: str) -> str:
    for words, code in _REFUSAL_CODES:
        if words in reason:
            return code
    return "other"


class Arbitrator:
    """One arbitrator: `await start()`, then `await serve_forever()` or `await stop()`."""

    def __init__(self, config: ArbitratorConfig):
        if not config.secret:
            raise ValueError("arbitrator: the cluster secret is empty")
        self.config = config
        # Ticks are milliseconds of the monotonic clock.
        self.leases = LeaseTable(config.lease_ms, unit="ms")
        self._server: asyncio.base_events.Server | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self.grants = 0
        self.refusals = 0
        # For the metrics (arbitrator/metrics.py): grants by kind (new / renewal), refusals
        # and closed connections by reason code.
        self.grant_kinds: dict[str, int] = {"new": 0, "renewal": 0}
        self.refusal_reasons: dict[str, int] = {}
        self.connections_closed: dict[str, int] = {}
        self._margin_warned: set[tuple[int, int, int]] = set()  # (vgroup, node, lease asked)
        self._load_state()

    # -- state across restarts -------------------------------------------------------------
    @property
    def state_path(self) -> str:
        return os.path.join(self.config.state_dir, STATE_FILE)

    def _load_state(self) -> None:
        try:
            with open(self.state_path, encoding="utf-8") as fh:
                saved = json.load(fh)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.state_path}: unreadable arbitrator state: {exc}") from exc
        now = _now_ms()
        for vg, (node, epoch) in saved.get("grants", {}).items():
            self.leases.restore(int(vg), int(node), int(epoch), now)
            log.info("arbitrator: vg%s n%s e%s: grant restored from the state file; held for %d ms",
                     vg, node, epoch, self.config.lease_ms,
                     extra={"event": "grant_restored", "vgroup": int(vg), "node": int(node), "epoch": int(epoch),
                            "lease_ms": self.config.lease_ms})

    def _save_state(self) -> None:
        """Persist the latest grant per vgroup BEFORE the grant is sent (a restart must not
        hand the same epoch, or an older one, to another node)."""
        os.makedirs(self.config.state_dir, exist_ok=True)
        tmp = self.state_path + ".tmp"
        grants = {str(vg): [node, epoch] for vg, (node, epoch) in self.leases.granted().items()}
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"grants": grants}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.state_path)
        dfd = os.open(self.config.state_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # -- decisions -------------------------------------------------------------------------
    def decide(self, req: ArbitratorRequest, now_ms: int | None = None) -> ArbitratorGrant:
        """Answer one request (pure apart from the state file)."""
        now = _now_ms() if now_ms is None else now_ms
        cfg = self.config
        new = False
        level = logging.INFO
        short = lease_margin_refusal(cfg.lease_ms, req.lease_ms, cfg.clock_drift_ratio,
                                     cfg.lease_allowance_ms)
        if short is not None:
            # docs/design.md §5: granting would let the master believe in its lease after
            # this arbitrator may have given it to another node. Renewals repeat the request
            # every heartbeat interval: a warning once per (vgroup, node, lease asked).
            reason = f"lease of {req.lease_ms} ms asked: {short} (raise lease_ms)"
            code = "lease_margin"
            key = (req.vgroup_id, req.node, req.lease_ms)
            level = logging.DEBUG if key in self._margin_warned else logging.WARNING
            self._margin_warned.add(key)
        else:
            before = self.leases.granted().get(req.vgroup_id)
            reason = self.leases.request(req.vgroup_id, req.node, req.epoch, now)
            code = refusal_code(reason) if reason else ""
            new = reason is None and before != (req.node, req.epoch)
            if new:
                self._save_state()
        granted = reason is None
        ids = {"vgroup": req.vgroup_id, "node": req.node, "epoch": req.epoch}
        if granted:
            self.grants += 1
            self.grant_kinds["new" if new else "renewal"] += 1
            # A new holder or epoch is news; the renewals every heartbeat are not.
            log.log(logging.INFO if new else logging.DEBUG, "arbitrator: vg%d n%d e%d: %s, lease %d ms",
                    req.vgroup_id, req.node, req.epoch, "granted" if new else "renewed",
                    cfg.lease_ms, extra={"event": "grant" if new else "renewal", **ids,
                                         "lease_ms": cfg.lease_ms})
        else:
            self.refusals += 1
            self.refusal_reasons[code] = self.refusal_reasons.get(code, 0) + 1
            log.log(level, "arbitrator: vg%d n%d e%d: refused: %s", req.vgroup_id, req.node,
                    req.epoch, reason, extra={"event": "refusal", **ids, "reason": code})
        return ArbitratorGrant(req.vgroup_id, req.node, req.epoch, cfg.lease_ms,
                               1 if granted else 0)

    # -- network ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_client, self.config.host,
                                                  self.config.port)
        addr = self._server.sockets[0].getsockname()
        cfg = self.config
        log.info("arbitrator: listening on %s:%d, lease %d ms (backs replica leases up to %d ms:"
                 " clock_drift_ratio %g, lease_allowance_ms %d), state %s", addr[0], addr[1],
                 cfg.lease_ms, max_backed_replica_lease_ms(cfg), cfg.clock_drift_ratio,
                 cfg.lease_allowance_ms, self.state_path, extra={"event": "listening"})

    @property
    def port(self) -> int:
        if self._server is None:
            raise InvariantViolation("the arbitrator's port is asked before start()")
        return self._server.sockets[0].getsockname()[1]

    async def serve_forever(self) -> None:
        if self._server is None:
            raise InvariantViolation("the arbitrator serves after start()")
        async with self._server:
            await self._server.serve_forever()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._clients):
            w.close()
        if self._server is not None:
            await self._server.wait_closed()

    def _closed(self, reason: str) -> None:
        self.connections_closed[reason] = self.connections_closed.get(reason, 0) + 1

    def snapshot(self) -> dict:
        """What the metrics show, read on the event loop (arbitrator/metrics.py)."""
        now = _now_ms()
        leases = {}
        for vg, (node, epoch) in self.leases.granted().items():
            leases[vg] = {"node": node, "epoch": epoch, "live": self.leases.holder(vg, now) is not None}
        return {"connections": len(self._clients), "grants": dict(self.grant_kinds),
                "refusals": dict(self.refusal_reasons), "closed": dict(self.connections_closed),
                "leases": leases}

    def _check_hello(self, hello: codec.Hello) -> str | None:
        if hello.kind != codec.ConnKind.ARBITRATOR:
            return f"connection kind {hello.kind} is not an arbitrator connection"
        if hello.target_node != codec.ARBITRATOR_NODE_ID:
            return f"hello names node {hello.target_node}, this is the arbitrator"
        return None

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        peer = writer.get_extra_info("peername")
        if len(self._clients) >= self.config.max_connections:
            self._closed("max_connections")
            log.warning("arbitrator: %s refused: %d connections (max_connections)", peer,
                        len(self._clients), extra={"event": "connection_refused", "reason": "max_connections"})
            writer.close()
            return
        self._clients.add(writer)
        stream = FramedStream(reader, writer, max_frame_bytes=HANDSHAKE_MAX_FRAME_BYTES)
        who = f"{peer}"
        try:
            hello = await server_handshake(
                stream, secret=self.config.secret, node=codec.ARBITRATOR_NODE_ID,
                check_hello=self._check_hello, max_frame_bytes=MAX_REQUEST_FRAME_BYTES,
                timeout_s=self.config.handshake_timeout_ms / 1000)
            who = f"vg{hello.vgroup_id} n{hello.node} ({peer[0]}:{peer[1]})"
            log.info("arbitrator: %s connected", who)
            while True:
                msg = await asyncio.wait_for(stream.recv(),
                                             self.config.idle_timeout_ms / 1000)
                if not isinstance(msg, ArbitratorRequest):
                    raise FrameError(f"unexpected {type(msg).__name__} on an arbitrator"
                                     f" connection")
                if (msg.vgroup_id, msg.node) != (hello.vgroup_id, hello.node):
                    raise FrameError(f"request for vg{msg.vgroup_id} n{msg.node} on a"
                                     f" connection authenticated as vg{hello.vgroup_id}"
                                     f" n{hello.node}")
                stream.send(self.decide(msg))
                await stream.drain()
        except (HandshakeError, FrameError) as exc:
            code = exc.code if isinstance(exc, HandshakeError) else "bad_frame"
            self._closed(code)
            log.warning("arbitrator: %s closed: %s", who, exc, extra={"event": "connection_refused", "reason": code})
        except asyncio.TimeoutError:
            self._closed("idle_timeout")
            log.info("arbitrator: %s closed: idle for %d ms", who, self.config.idle_timeout_ms,
                     extra={"event": "connection_closed", "reason": "idle_timeout"})
        except (EOFError, ConnectionError):
            self._closed("disconnected")
            log.info("arbitrator: %s disconnected", who, extra={"event": "connection_closed", "reason": "disconnected"})
        finally:
            self._clients.discard(writer)
            writer.close()
