"""Transaction benchmarks (docs/transactions.md; figures and targets in docs/benchmarks.md
§Transactions).

    python bench/bench_txn.py [--small 300] [--loaders 8] [--seconds 10] [--dir DIR]
                              [--only stuck]

Three `vrepl node` processes on 127.0.0.1 (vgroup 1, quorum 2), each step through the HTTP
API with the Python client:
1. small transactions one at a time (begin, one row of one table, commit), in two forms:
   three requests (begin, rows, commit: begin -> VISIBLE p50/p99, and COMMITTED -> VISIBLE,
   the commit call alone) and one request (`client.load`: begin, rows and commit forwarded
   back to back; begin -> VISIBLE is the one call).
2. throughput: --loaders threads each running small transactions for --seconds, in both
   forms: committed transactions per second for the vgroup.
3. a paused slave (SIGSTOP): the commit latency p99 with one replica paused, against the
   healthy figure of (1).
4. a transaction stuck in PREPARE (begun on table stuck_a, one batch staged, never
   committed) while --loaders loaders run small transactions on other tables for
   --seconds: their begin -> VISIBLE p50/p99 without and with it, in both forms
   (`--only stuck` runs just this section).
The issue's targets (issue 17): begin->VISIBLE p50 <= 3 ms, p99 <= 10 ms; COMMITTED->VISIBLE
p99 <= 20 ms; >= 500 small transactions/s with 8 loaders; paused slave <= 2x healthy.
Not measured here: the bulk Parquet load (files are not staged through the ingest path yet);
the Spark writer's rate against the client API is bench/bench_spark_writer.py.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from vrepl.client import Client  # noqa: E402
from vrepl.node.local import LocalCluster  # noqa: E402

VG = 1


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def small(cl: Client, label: str, ts: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    txn = cl.transaction(VG, label).begin()
    txn.put([["bench", ts, {"x": 1.0}]], seq=0)
    t1 = time.perf_counter()
    txn.commit()
    t2 = time.perf_counter()
    return (t2 - t0) * 1000, (t2 - t1) * 1000


def small_load(cl: Client, label: str, ts: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    cl.load(VG, label, [["bench", ts, {"x": 1.0}]])
    ms = (time.perf_counter() - t0) * 1000
    return ms, ms


def run_small(c: LocalCluster, n: int, tag: str, one=small) -> tuple[list[float], list[float]]:
    total, commit = [], []
    with Client(c.endpoints) as cl:
        for i in range(n):
            a, b = one(cl, f"{tag}-{i}", i + 1)
            total.append(a)
            commit.append(b)
    return total, commit


def loaded_latency(c: LocalCluster, loaders: int, seconds: float, one=small,
                   tag: str = "ll", ts_base: int = 50_000_000) -> tuple[float, list[float]]:
    """--loaders threads running small transactions (on table "bench") for --seconds:
    (transactions/s, every transaction's begin -> VISIBLE ms)."""
    lats: list[list[float]] = [[] for _ in range(loaders)]
    stop = time.monotonic() + seconds

    def loader(k: int) -> None:
        with Client(c.endpoints) as cl:
            i = 0
            while time.monotonic() < stop:
                ms, _ = one(cl, f"{tag}-{k}-{i}", ts_base + k * 1_000_000 + i)
                lats[k].append(ms)
                i += 1
    threads = [threading.Thread(target=loader, args=(k,)) for k in range(loaders)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for xs in lats for x in xs]
    return len(flat) / (time.monotonic() - t0), flat


def stuck_prepare(c: LocalCluster, loaders: int, seconds: float) -> None:
    """4. A transaction held open in PREPARE on table "stuck_a" (begun, one batch staged,
    never committed) while --loaders loaders run small transactions on table "bench":
    their begin -> VISIBLE p50/p99 without and with the stuck one, in both forms, each
    pair back to back."""
    for name, one in (("3 requests", small), ("1 request", small_load)):
        free_rate, free = loaded_latency(c, loaders, seconds, one, f"free-{name[0]}")
        with Client(c.endpoints) as cl:
            stuck = cl.transaction(VG, f"stuck-{name[0]}", timeout_ms=600_000).begin()
            stuck.put([["stuck_a", 1, {"x": 1.0}]], seq=0)
            try:
                held_rate, held = loaded_latency(c, loaders, seconds, one, f"held-{name[0]}")
                state = stuck.show()["state"]
            finally:
                stuck.abort("bench done")
        print(f"stuck PREPARE, {name}, {loaders} loaders on other tables: without it p50"
              f" {statistics.median(free):.2f} ms p99 {pct(free, 0.99):.2f} ms"
              f" ({free_rate:.0f}/s); with it ({state} throughout) p50"
              f" {statistics.median(held):.2f} ms p99 {pct(held, 0.99):.2f} ms"
              f" ({held_rate:.0f}/s); p99 ratio {pct(held, 0.99) / pct(free, 0.99):.2f}",
              flush=True)


def throughput(c: LocalCluster, loaders: int, seconds: float, one=small, tag: str = "tp") -> float:
    return loaded_latency(c, loaders, seconds, one, tag, 10_000_000)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=300)
    ap.add_argument("--loaders", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--only", choices=("stuck",), default=None,
                    help="run only this section (stuck: 4. a transaction stuck in PREPARE)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="bench-txn-", dir=args.dir)
    c = LocalCluster(os.path.join(base, "c"), 3, vgroup=VG,
                     txn={"max_running": 1000, "label_retention_ms": 600_000})
    try:
        c.start()
        c.wait_ready()
        c.wait_master(slaves=2)
        run_small(c, 30, "warm")
        if args.only == "stuck":
            stuck_prepare(c, args.loaders, args.seconds)
            return 0
        with Client(c.endpoints) as cl:       # the reference: one plain write, same rows
            plain = []
            for i in range(args.small):
                t0 = time.perf_counter()
                cl.write(VG, [["plain", i + 1, {"x": 1.0}]])
                plain.append((time.perf_counter() - t0) * 1000)
        print(f"reference: one plain write p50 {statistics.median(plain):.2f} ms"
              f" p99 {pct(plain, 0.99):.2f} ms (a transaction is 3 such round trips)")
        total, commit = run_small(c, args.small, "small")
        print(f"small transactions, 3 requests ({args.small}, one at a time): begin->VISIBLE"
              f" p50 {statistics.median(total):.2f} ms p99 {pct(total, 0.99):.2f} ms;"
              f" COMMITTED->VISIBLE p50 {statistics.median(commit):.2f} ms"
              f" p99 {pct(commit, 0.99):.2f} ms")
        one, _ = run_small(c, args.small, "load", small_load)
        print(f"small transactions, 1 request ({args.small}, one at a time): begin->VISIBLE"
              f" p50 {statistics.median(one):.2f} ms p99 {pct(one, 0.99):.2f} ms")
        rate = throughput(c, args.loaders, args.seconds)
        print(f"throughput, 3 requests: {rate:.0f} small transactions/s with {args.loaders}"
              " loaders")
        rate = throughput(c, args.loaders, args.seconds, small_load, "tpl")
        print(f"throughput, 1 request: {rate:.0f} small transactions/s with {args.loaders}"
              " loaders")
        m = c.master()
        slave = next(n for n in c.nodes if n != m)
        c.nodes[slave].proc.send_signal(signal.SIGSTOP)
        try:
            _t, paused = run_small(c, args.small, "paused")
        finally:
            c.nodes[slave].proc.send_signal(signal.SIGCONT)
        print(f"one slave paused: COMMITTED->VISIBLE p99 {pct(paused, 0.99):.2f} ms"
              f" ({pct(paused, 0.99) / pct(commit, 0.99):.2f}x the healthy p99)")
        stuck_prepare(c, args.loaders, args.seconds)
    finally:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
