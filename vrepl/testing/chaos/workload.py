"""The chaos clients: concurrent writers of unique keys, each write logged ok / fail / unknown.

    python -m vrepl.testing.chaos.workload CONFIG.json

Runs in the client namespace (or on 127.0.0.1 in the loopback fallback). Config: `nodes`
({node id: "host:port"} of the nodes' write APIs), `clients`, `history_path`, `op_timeout_s`,
`think_ms`, `run` (a tag in every key). Stdin: `stop` (or EOF) ends the run; stdout: JSON
events `started`, `stopped` (counts).

History (one JSON line per finished write, appended as it finishes): key, client, node,
status, version/epoch for ok, detail, t0/t1 (CLOCK_MONOTONIC, shared with the harness).
Status rules (docs/reliability.md §Workload):
  ok       the node confirmed the write (OK)
  fail     nothing was written: NM (not master) or ER, or the connection could not be opened
  unknown  anything else: FL (failed / timed_out after queueing), no reply within
           op_timeout_s, connection lost after the request was sent
A client never reuses a key; after an unknown it moves on with a new key.
Must not: connect anywhere but the node addresses it was given.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time


def emit(event: str, **fields: object) -> None:
    sys.stdout.write(json.dumps({"event": event, "t": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


class Client(threading.Thread):
    def __init__(self, cid: int, w: "Workload") -> None:
        super().__init__(daemon=True, name=f"client-{cid}")
        self.cid = cid
        self.w = w
        self.nodes = sorted(w.nodes)
        self.target = self.nodes[cid % len(self.nodes)]
        self.sock: socket.socket | None = None
        self.fh = None
        self.seq = 0

    def _close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = self.fh = None

    def _rotate(self, hint: str | None = None) -> None:
        self._close()
        if hint and hint.isdigit() and int(hint) in self.w.nodes and int(hint) != self.target:
            self.target = int(hint)
        else:
            i = self.nodes.index(self.target)
            self.target = self.nodes[(i + 1) % len(self.nodes)]

    def run(self) -> None:
        w = self.w
        while not w.stopping.is_set():
            self.seq += 1
            key = f"{w.run_tag}-c{self.cid}-{self.seq}"
            node = self.target
            t0 = time.monotonic()
            rec = {"key": key, "client": self.cid, "node": node, "t0": t0}
            sent = False
            w.inflight[self.cid] = rec
            try:
                if self.sock is None:
                    host, port = w.nodes[node]
                    self.sock = socket.create_connection((host, port), timeout=w.connect_timeout_s)
                    self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.fh = self.sock.makefile("rb")
                self.sock.settimeout(w.op_timeout_s)
                self.sock.sendall(f"W {key}\n".encode())
                sent = True
                line = self.fh.readline().decode()
                if not line:
                    raise ConnectionError("connection closed")
                parts = line.split()
                code = parts[0]
                if code == "OK":
                    rec.update(status="ok", version=int(parts[2]), epoch=int(parts[3]))
                elif code in ("NM", "ER"):
                    rec.update(status="fail", detail=" ".join(parts[2:]) or code)
                    self._rotate(parts[2] if code == "NM" and len(parts) > 2 else None)
                else:
                    rec.update(status="unknown", detail=" ".join(parts[2:]) or code)
            except (OSError, ConnectionError) as exc:
                rec.update(status="unknown" if sent else "fail", detail=f"{type(exc).__name__}")
                self._rotate()
            rec["t1"] = time.monotonic()
            w.record(rec)
            w.inflight.pop(self.cid, None)
            if rec["status"] == "fail":
                w.stopping.wait(w.retry_ms / 1000)
            elif w.think_ms:
                w.stopping.wait(w.think_ms / 1000)
        self._close()


class Workload:
    def __init__(self, conf: dict) -> None:
        self.nodes = {int(k): (v.rsplit(":", 1)[0], int(v.rsplit(":", 1)[1])) for k, v in conf["nodes"].items()}
        self.clients = int(conf.get("clients", 4))
        self.op_timeout_s = float(conf.get("op_timeout_s", 5.0))
        self.connect_timeout_s = float(conf.get("connect_timeout_s", 1.0))
        self.think_ms = float(conf.get("think_ms", 5))
        self.retry_ms = float(conf.get("retry_ms", 50))
        self.run_tag = conf.get("run", "r")
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.counts = {"ok": 0, "fail": 0, "unknown": 0}
        self.inflight: dict[int, dict] = {}  # a stuck client's write is logged unknown at stop
        self.hist = open(conf["history_path"], "a", buffering=1)

    def record(self, rec: dict) -> None:
        with self.lock:
            if self.hist.closed:
                return
            self.counts[rec["status"]] += 1
            self.hist.write(json.dumps(rec) + "\n")

    def main(self) -> None:
        threads = [Client(i, self) for i in range(self.clients)]
        for t in threads:
            t.start()
        emit("started", clients=self.clients)
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        self.stopping.set()
        for t in threads:
            t.join(self.op_timeout_s + self.connect_timeout_s + 2)
        for cid, rec in list(self.inflight.items()):
            if "t1" not in rec:
                self.record({**rec, "status": "unknown", "detail": "stuck at stop", "t1": time.monotonic()})
        with self.lock:
            self.hist.flush()
            self.hist.close()
            emit("stopped", **self.counts, stuck=sum(t.is_alive() for t in threads))


def main(argv: list[str] | None = None) -> int:
    from vrepl.testing.node_runner import _die_with_parent

    argv = sys.argv[1:] if argv is None else argv
    _die_with_parent()
    with open(argv[0]) as fh:
        Workload(json.load(fh)).main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
