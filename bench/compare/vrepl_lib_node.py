"""One vrepl replica at library level in its own process, driven by the harness over stdio.

Usage (by drivers/vrepl_driver.py only):
    python -m bench.compare.vrepl_lib_node CONFIG.json

The replica is vrepl.testing.node_runner's Runner: a SyncInstance with its own WAL (group
commit) and replication server, whose app on a slave acks every forwarded record at once
(write_to_cache_batch -> ack_forward, after the WAL append is durable: the sync instance
acks only durable records). The writers of both workloads run here, in the master's
process, as threads calling `SyncInstance.forward_many()` (docs/embedding.md): a write is
one record (key + value); a single write is a run of one record, a batch of N writes is one
`forward_many()` call of N records (the library's equivalent of N pipelined SETs and one
WAIT), and the writer waits for all N together. Confirmations arrive on the I/O thread
(confirm_forward_range) and wake the writer whose last record they cover.

Protocol: one JSON object per line on stdin, one JSON reply per line on stdout:
    {"cmd": "status"}                    -> {"role": "master" | "slave" | ...}
    {"cmd": "latency", "spec": {...}}    -> workload.latency_loop result
    {"cmd": "throughput", "spec": {...}} -> workload.run_client_threads result
    {"cmd": "quit"}                      -> exits
Errors come back as {"error": "..."}.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import traceback


class LibWriters:
    """Versions for writer threads and the wake-up of each one when its records are
    confirmed. Versions must reach forward_many() strictly in order: one lock covers taking the
    versions and forwarding them."""

    def __init__(self, inst) -> None:
        self.inst = inst
        self.lock = threading.Lock()
        self.next_version = inst.roles()["last_version"] + 1
        self.waiters: dict[int, list] = {}      # last version -> [event, failed versions]
        self.wlock = threading.Lock()

    def on_confirm(self, first: int, last: int, status) -> None:
        from vrepl.replica import ConfirmStatus
        ok = status == ConfirmStatus.OK
        with self.wlock:
            done = [v for v in self.waiters if v <= last]
            if not ok:   # a waiter whose range overlaps a failed range fails
                for v, w in self.waiters.items():
                    if w[2] <= last and v >= first:
                        w[1] = f"v{first}..v{last}: {status.describe()}"
            for v in done:
                self.waiters.pop(v)[0].set()

    def forward(self, payloads: list[bytes]) -> None:
        from vrepl.sync import FlowControlError
        ev = threading.Event()
        box = [ev, None, 0]
        with self.lock:
            first = self.next_version
            last = first + len(payloads) - 1
            box[2] = first
            with self.wlock:
                self.waiters[last] = box
            while True:   # the whole batch in one call (docs/embedding.md, forward_many)
                try:
                    self.inst.forward_many(first, payloads)
                    break
                except FlowControlError:
                    ev.wait(0.0005)
            self.next_version = last + 1
        if not ev.wait(10):
            with self.wlock:
                self.waiters.pop(last, None)
            raise TimeoutError(f"v{first}..v{last} not confirmed within 10 s")
        if box[1] is not None:
            raise RuntimeError(f"not confirmed: {box[1]}")


def main(argv: list[str]) -> int:
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
    import vrepl.testing.node_runner as nr

    from bench.compare.drivers.base import LatencySpec, ThroughputSpec
    from bench.compare.workload import latency_loop, run_client_threads

    nr.emit = lambda *a, **k: None     # stdout carries this protocol's replies only
    with open(argv[0]) as fh:
        conf = json.load(fh)
    logging.basicConfig(level=logging.WARNING, handlers=[logging.FileHandler(conf["log_file"])],
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s %(message)s")
    runner = nr.Runner(conf)
    runner.start()
    writers: LibWriters | None = None

    class Client:
        def write_one(self, key: bytes, value: bytes) -> None:
            writers.forward([key + value])

        def write_batch(self, items: list[tuple[bytes, bytes]]) -> None:
            writers.forward([k + v for k, v in items])

        def close(self) -> None:
            pass

    out = sys.stdout
    for line in sys.stdin:
        try:
            msg = json.loads(line)
            cmd = msg["cmd"]
            if cmd == "quit":
                break
            if cmd == "status":
                reply = {"role": runner.inst.roles().get("role")}
            elif cmd in ("latency", "throughput"):
                if writers is None:
                    writers = LibWriters(runner.inst)
                    runner.bench_hook = writers.on_confirm
                if cmd == "latency":
                    reply = latency_loop(Client(), LatencySpec(**msg["spec"]))
                else:
                    reply = run_client_threads(Client, ThroughputSpec(**msg["spec"]))
            else:
                reply = {"error": f"unknown command {cmd!r}"}
        except Exception:
            reply = {"error": traceback.format_exc(limit=5)}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    try:
        runner.inst.stop()
    except Exception:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
