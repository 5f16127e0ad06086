"""The chaos clients: the writers of a run and the harness's only hands on the network.

    python -m vrepl.testing.chaos.workload CONFIG.json

Runs in the client namespace (or on 127.0.0.1 in the loopback fallback) and talks to the
`vrepl node` processes only through their HTTP client API (docs/client-api.md), as any
client would. The harness, in the root namespace, never opens a socket: it drives this
process through stdin and reads its stdout.

Config: `nodes` ({node id: "host:port"} of the nodes' HTTP APIs), `vgroup`, `clients`,
`history_path`, `op_timeout_s` (one write, the client's retries included),
`request_timeout_s` (one HTTP exchange), `think_ms`, `run` (a tag in every key), `ts_step`.

Commands (stdin, one per line; each runs in its own thread, answers carry the ID):
    start                     the writers begin                         -> started
    stop                      the writers finish their write and stop   -> stopped (counts)
    status ID NODE            GET /v1/status of NODE, this vgroup's part -> status
    write ID NODE KEY         one write of the harness's own to NODE: one attempt, raw HTTP
                              (http.client), no following, no retry  -> write
    read ID PATH              every table of every node (the workload's and any other its
                              GET .../tables lists), written to PATH as JSON -> read
    quit (or EOF)             exit

Writers: `clients` threads. Even ones use `vrepl.client.Client` (it follows the master and
re-sends the same request id after an unknown outcome, docs/client-api.md §Retries); odd ones
send raw HTTP, one attempt per write (a new key each time, so a master cut off from its
slaves keeps receiving new writes it cannot confirm), following `master_http` hints. Every
write carries its key as request id. Client c writes
table `chaos_c<c>`, one row per write, a fresh ts each time (so no write overwrites
another), values {k: the write's unique key, c: client, x: seq / 8}. The harness's own writes
go to table `chaos_h`. Every finished write is one JSON line in the history (appended as it
finishes): key, table, ts, values, client (-1: the harness), node, t0/t1 (CLOCK_MONOTONIC,
shared with the harness), status and, for ok, version, epoch, duplicate. Status rules
(docs/reliability.md §Workload):
  ok       200: confirmed by a quorum (possibly on a retry: duplicate true)
  fail     certainly not written: NotWrittenError, or an answer with outcome `not_written`,
           or a connection that could not be opened
  unknown  the outcome could not be learnt: OutcomeUnknownError, a 504/503 `unknown`, a
           connection lost after the request was sent, a writer still busy at stop
Must not: connect anywhere but the node addresses it was given.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from typing import Any

from vrepl.child import die_with_parent
from vrepl.client import BadRequestError, Client, NotWrittenError, OutcomeUnknownError

HARNESS_TABLE = "chaos_h"
TS_BASE = 1_700_000_000_000   # ms: the first ts of every table


def client_table(cid: int) -> str:
    return f"chaos_c{cid}"


def emit(event: str, **fields: object) -> None:
    line = json.dumps({"event": event, "t": time.monotonic(), **fields})
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


_out_lock = threading.Lock()


def post_once(conn: http.client.HTTPConnection, vgroup: int, rec: dict) -> dict:
    """One raw HTTP write attempt of rec's row on `conn` (kept open for the next one unless
    it failed); returns the node's answer document (with "code") and updates rec's status:
    ok on 200, unknown on an answer saying so or a connection lost after sending, fail
    otherwise (nothing was written)."""
    body = json.dumps([[rec["table"], rec["ts"], rec["values"]]]).encode()
    sent = False
    try:
        if conn.sock is None:
            conn.connect()             # a refused connect sent nothing: fail, not unknown
        sent = True
        conn.request("POST", f"/v1/vgroups/{vgroup}/write?request_id={rec['key']}", body,
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        code, doc = resp.status, json.loads(resp.read() or b"{}")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        conn.close()
        rec.update(status="unknown" if sent else "fail", detail=f"{type(exc).__name__}: {exc}"[:200])
        return {"code": "connection"}
    if code == 200:
        rec.update(status="ok", version=doc["version"], epoch=doc["epoch"], node=doc.get("node"),
                   duplicate=doc.get("duplicate", False))
    else:
        rec.update(status="unknown" if doc.get("outcome") == "unknown" else "fail",
                   detail=f"{code} {doc.get('code')}: {doc.get('error')}"[:200])
        if 400 <= code < 500 and doc.get("code") != "not_master":
            rec["refused"] = True
    return doc


class Writer(threading.Thread):
    """One client: writes unique rows back to back (think_ms apart) until told to stop.
    Even clients use `vrepl.client.Client`; odd ones raw HTTP, one attempt per write."""

    def __init__(self, cid: int, w: "Workload") -> None:
        super().__init__(daemon=True, name=f"client-{cid}")
        self.cid = cid
        self.w = w
        self.seq = 0
        self.raw = cid % 2 == 1
        # Each client starts with another node, so a fault of one node meets some client.
        self.eps = list(w.nodes.values())
        k = cid % len(self.eps)
        self.eps = self.eps[k:] + self.eps[:k]
        self.target = self.eps[0]
        self.conns: dict[str, http.client.HTTPConnection] = {}
        self.client = Client(self.eps, timeout_s=w.op_timeout_s, request_timeout_s=w.request_timeout_s)

    def run(self) -> None:
        w = self.w
        table = client_table(self.cid)
        while not w.stopping.is_set():
            self.seq += 1
            key = f"{w.run_tag}-c{self.cid}-{self.seq}"
            rec: dict[str, Any] = {"key": key, "table": table, "ts": TS_BASE + self.seq * w.ts_step,
                                   "values": {"k": key, "c": self.cid, "x": self.seq / 8},
                                   "client": self.cid, "raw": self.raw, "t0": time.monotonic()}
            w.inflight[self.cid] = rec
            if self.raw:
                self._raw_write(rec)
            else:
                self._client_write(rec)
            rec["t1"] = time.monotonic()
            w.record(rec)
            w.inflight.pop(self.cid, None)
            if rec["status"] == "fail":
                w.stopping.wait(w.retry_ms / 1000)
            elif w.think_ms:
                w.stopping.wait(w.think_ms / 1000)
        self.client.close()
        for conn in self.conns.values():
            conn.close()

    def _client_write(self, rec: dict) -> None:
        try:
            r = self.client.write(self.w.vgroup, [[rec["table"], rec["ts"], rec["values"]]],
                                  request_id=rec["key"])
            rec.update(status="ok", version=r.version, epoch=r.epoch, node=r.node,
                       duplicate=r.duplicate, attempts=r.attempts)
        except OutcomeUnknownError as exc:
            rec.update(status="unknown", detail=str(exc)[:200])
        except NotWrittenError as exc:
            rec.update(status="fail", detail=str(exc)[:200])
        except BadRequestError as exc:   # a bug of the workload or the node: flagged
            rec.update(status="fail", detail=f"refused: {exc}"[:200], refused=True)

    def _raw_write(self, rec: dict) -> None:
        """One attempt at the node this client believes is master; then follow the answer's
        `master_http` hint, or move to the next node after an error or no hint."""
        ep = self.target
        conn = self.conns.get(ep)
        if conn is None:
            host, _, port = ep.rpartition(":")
            conn = self.conns[ep] = http.client.HTTPConnection(host, int(port),
                                                               timeout=self.w.request_timeout_s)
        rec["node_http"] = ep
        doc = post_once(conn, self.w.vgroup, rec)
        if rec["status"] == "ok" or doc.get("code") == "timeout":
            return
        hint = doc.get("master_http")
        if hint in self.eps and hint != ep:
            self.target = hint
        else:
            self.target = self.eps[(self.eps.index(ep) + 1) % len(self.eps)]


class Workload:
    def __init__(self, conf: dict) -> None:
        self.nodes = {int(k): v for k, v in conf["nodes"].items()}
        self.vgroup = int(conf["vgroup"])
        self.clients = int(conf.get("clients", 4))
        self.op_timeout_s = float(conf.get("op_timeout_s", 6.0))
        self.request_timeout_s = float(conf.get("request_timeout_s", 3.0))
        self.think_ms = float(conf.get("think_ms", 5))
        self.retry_ms = float(conf.get("retry_ms", 50))
        self.ts_step = int(conf.get("ts_step", 100))
        self.run_tag = conf.get("run", "r")
        self.tables = [client_table(c) for c in range(self.clients)] + [HARNESS_TABLE]
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.counts = {"ok": 0, "fail": 0, "unknown": 0}
        self.inflight: dict[int, dict] = {}  # a stuck writer's write is logged unknown at stop
        self.writers: list[Writer] = []
        self.harness_ts = 0
        self.hist = open(conf["history_path"], "a", buffering=1)

    def record(self, rec: dict) -> None:
        with self.lock:
            if self.hist.closed:
                return
            if rec["client"] >= 0:
                self.counts[rec["status"]] += 1
            self.hist.write(json.dumps(rec) + "\n")

    # -- commands ----------------------------------------------------------------------------
    def start(self) -> None:
        self.writers = [Writer(i, self) for i in range(self.clients)]
        for t in self.writers:
            t.start()
        emit("started", clients=self.clients)

    def stop(self) -> None:
        self.stopping.set()
        for t in self.writers:
            t.join(self.op_timeout_s + self.request_timeout_s + 2)
        for cid, rec in list(self.inflight.items()):
            if "t1" not in rec:
                self.record({**rec, "status": "unknown", "detail": "stuck at stop", "t1": time.monotonic()})
        emit("stopped", **self.counts, stuck=sum(t.is_alive() for t in self.writers))

    def status(self, ident: int, node: int) -> None:
        c = Client([self.nodes[node]], request_timeout_s=1.0)
        try:
            doc = c.status(self.nodes[node])
            vg = next((v for v in doc["vgroups"] if v["vgroup"] == self.vgroup), None)
            emit("status", id=ident, node=node, vgroup=vg)
        except Exception as exc:
            emit("status", id=ident, node=node, vgroup=None, error=f"{type(exc).__name__}: {exc}"[:200])
        finally:
            c.close()

    def write(self, ident: int, node: int, key: str) -> None:
        """One attempt at NODE (no following, no retry): what the harness asks for, exactly."""
        with self.lock:
            self.harness_ts += 1
            ts = TS_BASE + self.harness_ts
        values = {"k": key}
        rec: dict[str, Any] = {"key": key, "table": HARNESS_TABLE, "ts": ts, "values": values,
                               "client": -1, "node": node, "t0": time.monotonic()}
        host, _, port = self.nodes[node].rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=15.0)
        try:
            post_once(conn, self.vgroup, rec)
        finally:
            conn.close()
        rec["t1"] = time.monotonic()
        self.record(rec)
        emit("write", id=ident, **rec)

    def read(self, ident: int, path: str) -> None:
        """Every table of every node, paged by ts: {node: {table: rows} or {"error": ...}}."""
        out: dict[str, Any] = {}
        for node, ep in self.nodes.items():
            c = Client([ep], request_timeout_s=30.0)
            try:
                tables = {}
                # The workload's tables and whatever else this replica says it holds.
                held = [t["name"] for t in c.tables(self.vgroup, node=ep)["tables"]]
                for table in sorted(set(self.tables) | set(held)):
                    rows: list[dict] = []
                    start = None
                    while True:
                        doc = c.read(self.vgroup, table, start=start, node=ep)
                        rows += doc["rows"]
                        if not doc["truncated"] or not doc["rows"]:
                            break
                        start = doc["rows"][-1]["ts"] + 1
                    tables[table] = rows
                out[str(node)] = tables
            except Exception as exc:
                out[str(node)] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            finally:
                c.close()
        with open(path, "w") as fh:
            json.dump(out, fh)
        emit("read", id=ident, path=path,
             rows={n: (sum(len(r) for r in t.values()) if "error" not in t else t["error"])
                   for n, t in out.items()})

    def main(self) -> None:
        emit("ready", tables=self.tables)
        for line in sys.stdin:
            parts = line.split()
            if not parts:
                continue
            cmd, args = parts[0], parts[1:]
            if cmd == "quit":
                break
            if cmd == "start":
                self.start()
            elif cmd == "stop":
                threading.Thread(target=self.stop, daemon=True).start()
            elif cmd == "status":
                threading.Thread(target=self.status, args=(int(args[0]), int(args[1])), daemon=True).start()
            elif cmd == "write":
                threading.Thread(target=self.write, args=(int(args[0]), int(args[1]), args[2]),
                                 daemon=True).start()
            elif cmd == "read":
                threading.Thread(target=self.read, args=(int(args[0]), args[1]), daemon=True).start()
            else:
                emit("error", text=f"unknown command {cmd}")
        self.stopping.set()
        with self.lock:
            self.hist.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    with open(argv[0]) as fh:
        Workload(json.load(fh)).main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
