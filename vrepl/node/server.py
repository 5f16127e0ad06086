"""The node process: `vrepl node --config node.toml` (docs/operations.md).

Owns: the life of one node: crash recovery of every vgroup's vnode (manifest + WAL replay),
one SyncInstance per vgroup (they share the process's replication server and I/O thread),
the HTTP API on that same I/O thread (routes below, docs/client-api.md), the periodic flush
check, and the graceful stop on SIGTERM/SIGINT (stop taking requests, let writes in flight
finish, stop replication, flush every vnode, exit 0), reopening the log file on SIGHUP.
Must not: print anything but its one "ready" line and its one-line errors; logs go to the
configured log file (or stderr), in the shared format (vrepl/logsetup.py).

Routes (each request is counted under its route pattern, docs/operations.md §Metrics):
    GET  /v1/status                                   node and vgroups
    POST /v1/vgroups/{id}/write[?request_id=ID]       body: JSON array of [table, ts, {col: v}],
                                                      or an Arrow IPC stream (Content-Type)
    POST /write?db=vgN[&precision=P]                  InfluxDB v1 line protocol (influx.py)
    POST /api/v2/write?bucket=vgN[&precision=P]       InfluxDB v2 line protocol
    GET  /ping                                        InfluxDB's liveness probe: 204
    GET  /v1/vgroups/{id}/rows?table=T&start=S&end=E[&limit=N]
    GET  /v1/vgroups/{id}/tables                      the tables this replica holds rows of
    POST /v1/vgroups/{id}/ingest                      body: {"files": [...], "kind", "meta"}: a round
                                                      of files in the vgroup's staging directory
    POST /v1/vgroups/{id}/txn                         body {"label": L[, "timeout_ms": T]}: begin;
                                                      [, "rows": [...]][, "commit": true]: one-request load
    GET  /v1/vgroups/{id}/txn[?open=1]                the vgroup's transactions (any replica)
    GET  /v1/vgroups/{id}/txn/{txn}                   one transaction (id, or label:<label>)
    POST /v1/vgroups/{id}/txn/{txn}/rows[?seq=S]      body: JSON rows, staged in the transaction
    POST /v1/vgroups/{id}/txn/{txn}/file?table=T&seq=S[&crc32c=C]  body: a Parquet file (streamed)
    POST /v1/vgroups/{id}/txn/{txn}/precommit|commit|abort   (docs/client-api.md §Transactions)
    GET  /metrics                                     Prometheus text format (vrepl/node/metrics.py)

With http.token_file set, every route needs `Authorization: Bearer <token>` (checked in
vrepl/node/http.py before any route is looked up), /metrics included.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import json
import logging
import os
import signal
import threading
import time
from typing import Any
from urllib.parse import parse_qsl, unquote

import vrepl
from vrepl.dirlock import DirLock, lock_dir
from vrepl.errors import ConfigError, InvariantViolation, ListenError
from vrepl.logsetup import reopen_logs, setup_logging
from vrepl.node import influx
from vrepl.node.config import NodeConfig
from vrepl.node.http import HttpServer, Request, Response, error, server_ssl_context
from vrepl.node.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from vrepl.node.metrics import NodeMetrics
from vrepl.node.shipreceiver import ShipService
from vrepl.node.vgroup import KIND_ARROW, KIND_LINES, VgroupHost
from vrepl.transport.node import NodeTransport
from vrepl.transport.loop import IoLoop
from vrepl.vnode.ingest import ARROW_CONTENT_TYPE
from vrepl.vnode.rows import INT64_MAX, INT64_MIN, TABLE_NAME_RE, TABLE_NAME_RULE

log = logging.getLogger("vrepl.node")

# Route patterns, the `route` label of vrepl_http_requests_total: bounded, never a raw path.
ROUTE_STATUS = "/v1/status"
ROUTE_WRITE = "/v1/vgroups/{id}/write"
ROUTE_ROWS = "/v1/vgroups/{id}/rows"
ROUTE_TABLES = "/v1/vgroups/{id}/tables"
ROUTE_INGEST = "/v1/vgroups/{id}/ingest"
ROUTE_TXNS = "/v1/vgroups/{id}/txn"
ROUTE_TXN = "/v1/vgroups/{id}/txn/{txn}"
ROUTE_TXN_STEP = "/v1/vgroups/{id}/txn/{txn}/{step}"
TXN_STEPS = ("rows", "file", "precommit", "commit", "abort")
ROUTE_METRICS = "/metrics"
ROUTE_INFLUX_V1 = influx.ROUTE_V1_WRITE
ROUTE_INFLUX_V2 = influx.ROUTE_V2_WRITE
ROUTE_PING = influx.ROUTE_PING
ROUTE_OTHER = "other"    # no such route (404)
# Content types of the write route's body: JSON rows (also what curl -d and a request with no
# type send), or an Arrow IPC stream; anything else is 415.
JSON_CONTENT_TYPES = ("", "application/json", "application/x-www-form-urlencoded", "text/plain")
VGROUP_ROUTES = {"write": ROUTE_WRITE, "rows": ROUTE_ROWS, "tables": ROUTE_TABLES,
                 "ingest": ROUTE_INGEST}
# The routes that write: every refusal of theirs says `"outcome": "not_written"`
# (docs/client-api.md §Write, §Ingest), their 404 no_vgroup and 405 included.
WRITING_ROUTES = ("write", "ingest")


def _not_written(resp: Response) -> Response:
    resp.body.setdefault("outcome", "not_written")
    return resp


# The cyclic GC's thresholds in a node process (docs/perf.md §gc). With CPython's default
# (700, 10, 10) a collection runs every 700 container allocations, and the older generations
# keep traversing the memtable's millions of rows (they are referenced, never garbage): it
# cost more than half the CPU of applying a batch on a slave (277 against 74 µs per 100-row
# batch with 2 M rows held). Cycles are rare on the write path, so collect far less often.
GC_THRESHOLDS = (50_000, 20, 100)


def _gc_thresholds() -> tuple[int, ...]:
    """GC_THRESHOLDS, or VREPL_GC_THRESHOLDS="700,10,10" (benchmarks compare settings)."""
    text = os.environ.get("VREPL_GC_THRESHOLDS", "")
    try:
        got = tuple(int(x) for x in text.split(",")) if text else GC_THRESHOLDS
    except ValueError:
        got = GC_THRESHOLDS
    return got if len(got) == 3 and all(x >= 0 for x in got) else GC_THRESHOLDS


class Node:
    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.flush_executor = concurrent.futures.ThreadPoolExecutor(1, "vrepl-flush")
        self.metrics = NodeMetrics(cfg.node_id)
        self.vgroups: dict[int, VgroupHost] = {
            spec.id: VgroupHost(cfg, spec, self.flush_executor, self.metrics.observers(spec.id))
            for spec in cfg.vgroups}
        self.metrics.vgroups = self.vgroups
        # The ship receiver (docs/ship.md): only with [[ship.senders]] configured.
        self.ship: ShipService | None = (
            ShipService(cfg.ship_senders, self.vgroups, self.metrics.registry, cfg.vnode.fsync)
            if cfg.ship_senders else None)
        self.io: IoLoop | None = None
        self.http: HttpServer | None = None
        self.started_at = time.time()
        self._tick: asyncio.TimerHandle | None = None
        self._stopped = False
        self.locks: list[DirLock] = []

    # -- start (main thread) ----------------------------------------------------------------
    def start(self) -> None:
        """Lock the data directories, recover every vnode, start replication, then serve
        HTTP. Raises on failure: DirInUseError (another process holds a data directory;
        nothing was read), ListenError (an address is in use), or what recovery raised."""
        # One process per data directory (vrepl/dirlock.py): the root and each vgroup's,
        # so `vrepl restore --data <data_dir>/vgN` is refused while this node runs. Held
        # until stop(); the node's own restore of a vgroup runs under these locks.
        holder = f"vrepl node {self.cfg.node_id}"
        try:
            self.locks.append(lock_dir(self.cfg.data_dir, holder))
            for vg in self.vgroups.values():
                self.locks.append(lock_dir(vg.path, holder))
            for vg in self.vgroups.values():
                n = vg.open()
                log.info("vg%d: recovered: archived v%d, replayed %d WAL records, now at v%d",
                         vg.id, vg.vnode.archived_version, n, vg.vnode.get_version())  # type: ignore[union-attr]
        except BaseException:
            self._release_locks()
            raise
        if self.ship is not None:
            self.ship.recover_all()
            NodeTransport.ship_acceptors[self.cfg.me.replication] = self.ship
        self.io = IoLoop.shared()
        try:
            for vg in self.vgroups.values():
                vg.start(self.io.loop)
            h = self.cfg.http
            self.http = HttpServer(self.handle, max_body_bytes=h.max_body_bytes,
                                   max_header_bytes=h.max_header_bytes,
                                   max_connections=h.max_connections,
                                   idle_timeout_ms=h.idle_timeout_ms,
                                   header_timeout_ms=h.header_timeout_ms,
                                   body_timeout_ms=h.body_timeout_ms, token=h.token,
                                   shape_refusal=influx.shape_refusal,
                                   body_sink=self._body_sink,
                                   ssl_context=(server_ssl_context(h.tls_cert, h.tls_key)
                                                if h.tls_cert and h.tls_key else None))
            self.metrics.http = self.http
            host, port = self.cfg.http_listen
            if h.listen is None and (host, port) != self.cfg.me.http:
                log.warning("http.listen is not set: the client API listens on %s:%d only,"
                            " not on this node's http address %s (set [http] listen to serve"
                            " other hosts)", host, port, self.cfg.me.http_endpoint)
            try:
                self.io.run(self.http.start(host, port))
            except OSError as exc:
                raise ListenError(f"{host}:{port}", "HTTP API", exc) from None
            self.io.call(self._schedule_tick)
        except BaseException:
            self.stop()
            raise

    def _schedule_tick(self) -> None:
        if self.io is None:
            raise InvariantViolation("the flush tick is scheduled before the I/O loop runs")
        self._tick = self.io.loop.call_later(self.cfg.flush_check_ms / 1000, self._on_tick)

    def _on_tick(self) -> None:
        if self._stopped:
            return
        for vg in self.vgroups.values():
            vg.tick()
        self._schedule_tick()

    # -- stop (main thread) -----------------------------------------------------------------
    def stop(self) -> None:
        """Graceful: stop accepting, wait (stop_timeout_ms) for writes in flight, stop
        replication, flush and close every vnode. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        io = self.io
        if io is not None and self.http is not None:
            try:
                io.call(self.http.close)
                deadline = time.monotonic() + self.cfg.stop_timeout_ms / 1000
                while time.monotonic() < deadline and any(
                        io.call(lambda vg=vg: len(vg.pending)) for vg in self.vgroups.values()):
                    time.sleep(0.01)
            except Exception as exc:  # the loop is gone: nothing to wait for
                log.warning("stopping: %s", exc)
        if io is not None and self._tick is not None:
            io.loop.call_soon_threadsafe(self._tick.cancel)
        if self.ship is not None:
            NodeTransport.ship_acceptors.pop(self.cfg.me.replication, None)
            self.ship.stop()
        for vg in self.vgroups.values():
            try:
                vg.stop()
            except Exception:
                log.exception("vg%d: stop failed", vg.id)
        self.flush_executor.shutdown(wait=True)
        if io is not None:
            io.release()
            self.io = None
        self._release_locks()

    def _release_locks(self) -> None:
        for lock in self.locks:
            lock.release()
        self.locks.clear()

    # -- HTTP routes (I/O thread) -------------------------------------------------------------
    def handle(self, req: Request):
        parts = req.path.strip("/").split("/")
        req.route = ROUTE_OTHER
        if parts == ["metrics"]:
            req.route = ROUTE_METRICS
            if req.method != "GET":
                return error(405, "bad_method", f"{req.method} {req.path}: use GET")
            return Response(200, raw=self.metrics.render(), content_type=METRICS_CONTENT_TYPE)
        if parts[:1] != ["v1"]:
            if influx.is_influx(req.path):
                return self._influx(req)
            return error(404, "no_route", f"no route {req.path[:100]!r}: see docs/client-api.md")
        if parts == ["v1", "status"]:
            req.route = ROUTE_STATUS
            if req.method != "GET":
                return error(405, "bad_method", f"{req.method} {req.path}: use GET")
            return Response(200, self.status())
        if len(parts) == 4 and parts[1] == "vgroups" and parts[3] in VGROUP_ROUTES:
            req.route = VGROUP_ROUTES[parts[3]]
            vg = self._vgroup(parts[2])
            if isinstance(vg, Response):
                return _not_written(vg) if parts[3] in WRITING_ROUTES else vg
            if parts[3] == "write":
                if req.method != "POST":
                    return error(405, "bad_method", f"{req.method} {req.path}: use POST",
                                 outcome="not_written")
                rid = req.query.get("request_id") or req.headers.get("request-id")
                ctype = req.headers.get("content-type", "").partition(";")[0].strip().lower()
                if ctype in JSON_CONTENT_TYPES:
                    return vg.write(req.body, rid)
                if ctype == ARROW_CONTENT_TYPE:
                    return vg.write(req.body, rid, KIND_ARROW)
                return error(415, "unsupported_media_type", f"Content-Type {ctype[:60]!r}:"
                             f" application/json or {ARROW_CONTENT_TYPE}",
                             outcome="not_written")
            if parts[3] == "rows":
                if req.method != "GET":
                    return error(405, "bad_method", f"{req.method} {req.path}: use GET")
                return self._query(vg, req)
            if parts[3] == "tables":
                if req.method != "GET":
                    return error(405, "bad_method", f"{req.method} {req.path}: use GET")
                return vg.tables()
            if parts[3] == "ingest":
                if req.method != "POST":
                    return error(405, "bad_method", f"{req.method} {req.path}: use POST",
                                 outcome="not_written")
                return vg.ingest_http(req.body)
        if 4 <= len(parts) <= 6 and parts[1] == "vgroups" and parts[3] == "txn":
            return self._txn(parts, req)
        if len(parts) == 5 and parts[1] == "vgroups" and parts[3:] == ["ship", "owners"]:
            return self._ship_owners(parts[2], req)
        return error(404, "no_route", f"no route {req.path[:100]!r}: see docs/client-api.md")

    def _body_sink(self, method: str, target: str, headers: dict[str, str], length: int):
        """A transaction's file put streams its body to disk (vrepl/node/txnfile.py): the
        sink, or a refusal before the body is read; None for every other request."""
        path, _, qs = target.partition("?")
        parts = path.strip("/").split("/")
        if len(parts) != 6 or parts[:2] != ["v1", "vgroups"] or parts[3] != "txn" \
                or parts[5] != "file":
            return None
        vg = self._vgroup(parts[2])
        if isinstance(vg, Response):
            return _not_written(vg)
        return vg.txns.files.sink(unquote(parts[4]), dict(parse_qsl(qs)), length)

    def _txn(self, parts: list[str], req: Request):
        """The transaction routes (docs/client-api.md §Transactions, vrepl/node/txnhost.py)."""
        req.route = (ROUTE_TXNS, ROUTE_TXN, ROUTE_TXN_STEP)[len(parts) - 4]
        if len(parts) == 6 and parts[5] not in TXN_STEPS:
            return error(404, "no_route", f"no route {req.path[:100]!r}: a transaction's steps"
                         f" are {', '.join(TXN_STEPS)}")
        # A step (every POST, and any method on a step's route) is a write: its refusals say
        # `"outcome": "not_written"`, their 404 and 405 included, as the write route's do.
        step = req.method == "POST" or len(parts) == 6
        vg = self._vgroup(parts[2])
        if isinstance(vg, Response):
            return _not_written(vg) if step else vg
        want = "GET" if len(parts) == 5 else "POST"
        if len(parts) == 4:
            want = "POST" if req.method == "POST" else "GET"
        if req.method != want:
            resp = error(405, "bad_method", f"{req.method} {req.path}: use {want}")
            return _not_written(resp) if step else resp
        if len(parts) == 4:
            if want == "POST":
                return vg.txns.begin(req.body)
            return vg.txns.list(open_only=req.query.get("open") in ("1", "true"))
        if len(parts) == 5:
            return vg.txns.show(parts[4])
        key, step = parts[4], parts[5]
        if step == "rows":
            return vg.txns.put(key, req.body, req.query.get("seq"))
        if step == "file":
            if req.sink is None:
                return error(400, "bad_txn", "a file put has a body (the Parquet file)")
            return vg.txns.files.put(key, req.query, req.sink)
        if step == "abort":
            return vg.txns.abort(key, req.body)
        return vg.txns.precommit(key) if step == "precommit" else vg.txns.commit(key)

    def _influx(self, req: Request):
        """InfluxDB's routes (vrepl/node/influx.py), answered in InfluxDB's shapes."""
        v1 = influx.is_v1(req.path)
        req.route = req.path
        if req.path == influx.ROUTE_PING:
            if req.method not in ("GET", "HEAD"):
                return influx.shaped(v1, error(405, "bad_method", f"{req.method} {req.path}:"
                                               " use GET"))
            return influx.ping()
        if req.method != "POST":
            return influx.shaped(v1, error(405, "bad_method", f"{req.method} {req.path}: use"
                                           " POST", outcome="not_written"))
        vg_text, unit, refused = influx.write_params(req, v1)
        if refused is not None:
            return refused
        vg = self._vgroup(vg_text)  # type: ignore[arg-type]
        if isinstance(vg, Response):
            return influx.shaped(v1, _not_written(vg))
        body, refused = influx.body_of(req, self.cfg.http.max_body_bytes)
        if refused is not None:
            return influx.shaped(v1, refused)
        rid = req.query.get("request_id") or req.headers.get("request-id")
        return influx.answer(v1, vg.write(body, rid, KIND_LINES, unit))  # type: ignore[arg-type]

    def _ship_owners(self, vgroup: str, req: Request) -> Response:
        """GET: table -> owner of a vgroup's shipped tables; POST {"table": T, "owner": UUID |
        "local" | null}: transfer or (null) release a table (docs/ship.md §7)."""
        vg = self._vgroup(vgroup)
        if isinstance(vg, Response):
            return vg
        if self.ship is None:
            return error(404, "no_ship", f"node {self.cfg.node_id} receives no ship senders ([[ship.senders]])")
        if req.method == "GET":
            return Response(200, {"vgroup": vg.id, "owners": self.ship.owners(vg)})
        if req.method != "POST":
            return error(405, "bad_method", f"{req.method} {req.path}: use GET or POST")
        try:
            doc = json.loads(req.body.decode("utf-8"))
            if not isinstance(doc, dict) or set(doc) != {"table", "owner"} or not isinstance(doc["table"], str) \
                    or not (doc["owner"] is None or isinstance(doc["owner"], str)):
                raise ValueError('the body is {"table": "<table>", "owner": "<uuid>" | "local" | null}')
            own = self.ship.set_owner(vg, doc["table"], doc["owner"])
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            return error(400, "bad_owner", str(exc))
        log.warning("vg%d: ship owner of table %s set to %s by an operator", vg.id, doc["table"],
                    doc["owner"] or "nobody (released)")
        return Response(200, {"vgroup": vg.id, "owners": own})

    def _vgroup(self, text: str) -> VgroupHost | Response:
        if not text.isdigit() or len(text) > 10:
            return error(404, "no_vgroup", f"vgroup {text[:20]!r} is not a vgroup id")
        vg = self.vgroups.get(int(text))
        if vg is None:
            return error(404, "no_vgroup", f"no vgroup {int(text)} on node {self.cfg.node_id}"
                         f" (it hosts {sorted(self.vgroups)})")
        return vg

    def _query(self, vg: VgroupHost, req: Request):
        q = req.query
        table = q.get("table")
        if table is None:
            return error(400, "bad_query", "table is missing")
        if TABLE_NAME_RE.fullmatch(table) is None:
            return error(400, "bad_query", f"table name {table[:80]!r} does not match"
                         f" {TABLE_NAME_RULE} (no path characters)")
        vals = {}
        limit_max = self.cfg.http.max_query_rows
        for name, default in (("start", INT64_MIN), ("end", INT64_MAX), ("limit", limit_max)):
            text = q.get(name)
            if text is None or text == "":
                vals[name] = default
                continue
            try:
                vals[name] = int(text)
            except ValueError:
                return error(400, "bad_query", f"{name} {text[:40]!r} is not an integer")
            if not INT64_MIN <= vals[name] <= INT64_MAX:
                return error(400, "bad_query", f"{name} {text[:40]!r} is outside int64")
        if not 0 < vals["limit"] <= limit_max:
            return error(400, "bad_query", f"limit must be in 1..{limit_max} (max_query_rows)")
        as_of = q.get("as_of")
        if as_of is not None and (not as_of.isdigit() or len(as_of) > 18):
            return error(400, "bad_query", f"as_of {as_of[:40]!r} is not a version (an integer"
                         " >= 0)")
        return vg.query(table, vals["start"], vals["end"], vals["limit"],
                        int(as_of) if as_of is not None else None)

    def status(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "node": cfg.node_id, "version": vrepl.__version__ if hasattr(vrepl, "__version__") else "",
            "pid": os.getpid(), "http": cfg.me.http_endpoint,
            "replication": cfg.me.replication_endpoint,
            "uptime_s": round(time.time() - self.started_at, 3),
            "nodes": {str(n.id): {"http": n.http_endpoint, "replication": n.replication_endpoint}
                      for n in cfg.nodes.values()},
            "vgroups": [vg.status() for vg in self.vgroups.values()],
            "ship_senders": self.ship.status() if self.ship is not None else [],
        }


def run_node(cfg: NodeConfig) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code (0 after a graceful stop). SIGHUP
    reopens the log file (logrotate)."""
    if cfg.log_file:
        os.makedirs(os.path.dirname(os.path.abspath(cfg.log_file)), exist_ok=True)
    setup_logging(level=cfg.log_level, log_file=cfg.log_file, log_format=cfg.log_format,
                  node=cfg.node_id)
    # The handlers only set flags; the main thread acts on them (a signal handler that
    # reopened the file itself could run in the middle of this thread's own log call).
    wake = threading.Event()
    asked = {"stop": False, "reopen": False}

    def on_signal(what: str) -> None:
        asked[what] = True
        wake.set()

    signal.signal(signal.SIGTERM, lambda *_: on_signal("stop"))
    signal.signal(signal.SIGINT, lambda *_: on_signal("stop"))
    signal.signal(signal.SIGHUP, lambda *_: on_signal("reopen"))
    node = Node(cfg)
    try:
        node.start()
    except (ConfigError, OSError) as exc:
        if cfg.log_file:   # on stderr, the CLI's one error line says it
            log.error("node %d cannot start: %s", cfg.node_id, exc,
                      extra={"event": "config_error" if isinstance(exc, ConfigError) else "start_failed"})
        raise
    # What recovery loaded lives as long as the process: keep it out of every collection.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_gc_thresholds())
    host, port = cfg.http_listen
    print(json.dumps({"event": "ready", "node": cfg.node_id, "http": f"{host}:{port}",
                      "tls": cfg.http.tls, "token": cfg.http.token is not None,
                      "replication": cfg.me.replication_endpoint, "pid": os.getpid(),
                      "vgroups": sorted(node.vgroups)}), flush=True)
    log.info("node %d ready: http %s:%d", cfg.node_id, host, port, extra={"event": "ready"})
    while not asked["stop"]:
        wake.wait(0.5)
        wake.clear()
        if asked["reopen"]:
            asked["reopen"] = False
            if reopen_logs():   # logging to stderr: nothing to reopen
                log.info("node %d: log file reopened (SIGHUP)", cfg.node_id, extra={"event": "log_reopened"})
    log.info("node %d stopping (signal)", cfg.node_id)
    node.stop()
    log.info("node %d stopped", cfg.node_id, extra={"event": "stopped"})
    return 0
