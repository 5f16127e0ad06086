"""Replication benchmark: 3 node processes on 127.0.0.1, quorum 2, 128-byte records.

    python bench/bench_replication.py [--records N] [--inflight N] [--batch N] [--latency N] [--failovers N]

Prints (issue 3 targets in brackets):
  * confirmed records/s with many forwards in flight, per vgroup        [>= 300,000/s]
  * single-forward confirm latency p50 / p99                             [<= 0.3 ms / 2 ms]
  * time from SIGKILL of the master to a new master, and to its first
    confirmed forward                                                    [<= 0.5 s]
  * time from SIGSTOP of the master to a new master                      [<= heartbeat timeout + 0.5 s]

Each node is `python -m vrepl.testing.node_runner` with its own WAL (group commit) in a
temporary directory; the throughput and latency loops run inside the master process (the
library level: the app thread calls forward(), confirmations come back on the I/O thread).
Timestamps of role changes come from the node processes (CLOCK_MONOTONIC is system-wide).
The WAL directory is TMPDIR (e.g. TMPDIR=/dev/shm to take the disk's fdatasync out).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from vrepl.config import SyncConfig  # noqa: E402
from vrepl.testing.cluster import ProcessCluster  # noqa: E402


def bench_steady(c: ProcessCluster, records: int, inflight: int, latency_n: int, rounds: int, batch: int = 0) -> None:
    m = c.wait_master(slaves=2, timeout_s=20)
    rates = []
    how = f"forward_many() of {batch}" if batch else "forward() per record"
    for _ in range(rounds):
        t = time.monotonic()
        c.send(m, f"bench_throughput {records} 128 {inflight} {batch}")
        ev = c.wait_for("throughput", lambda: c.event(m, "bench", after=t, kind="throughput"), 300)
        rates.append(ev["records_per_s"])
        print(f"  throughput: {ev['records_per_s']:>10,.0f} confirmed records/s"
              f" ({records} x 128 B, {inflight} in flight, {how}, {ev['seconds']:.2f} s, not ok {ev['other']})")
    print(f"throughput median {statistics.median(rates):,.0f} records/s, best {max(rates):,.0f}")
    if latency_n <= 0:
        return
    t = time.monotonic()
    c.send(m, f"bench_latency {latency_n} 128")
    ev = c.wait_for("latency", lambda: c.event(m, "bench", after=t, kind="latency"), 300)
    print(f"single forward latency over {latency_n}: p50 {ev['p50_ms']:.3f} ms  p90 {ev['p90_ms']:.3f} ms"
          f"  p99 {ev['p99_ms']:.3f} ms  max {ev['max_ms']:.3f} ms  (not ok {ev['not_ok']})")


def bench_failover(c: ProcessCluster, rounds: int, sig: int) -> None:
    name = "SIGKILL" if sig == signal.SIGKILL else "SIGSTOP"
    elected, serving = [], []
    for _ in range(rounds):
        m = c.wait_master(slaves=2, timeout_s=20)
        c.send(m, "forward 1000 128")
        time.sleep(0.3)
        others = [n for n in c.nodes if n != m]
        t0 = time.monotonic()
        c.signal(m, sig)
        new = c.wait_master(among=others, timeout_s=10)
        role_ev = c.event(new, "role", after=t0, role="master")
        t_role = (role_ev["t"] if role_ev else time.monotonic()) - t0
        c.send(new, "forward 1 128")
        confirm = c.wait_for("first confirm", lambda: next(
            (e for e in c.confirms(new, t0) if e["status"] == "ok"), None), 10)
        elected.append(t_role)
        serving.append(confirm["t"] - t0)
        print(f"  {name} n{m}: n{new} master after {t_role * 1000:.0f} ms, first confirmed forward after"
              f" {(confirm['t'] - t0) * 1000:.0f} ms")
        if sig == signal.SIGSTOP:
            c.signal(m, signal.SIGCONT)
        else:
            c.start(m)
        c.wait_for(f"n{m} back as slave", lambda: c.nodes[m].role() == "slave", 20)
    print(f"{name} of the master: new master median {statistics.median(elected) * 1000:.0f} ms"
          f" (max {max(elected) * 1000:.0f}), accepting forwards median {statistics.median(serving) * 1000:.0f} ms"
          f" (max {max(serving) * 1000:.0f})")


def main() -> int:
    ap = argparse.ArgumentParser(description="vrepl replication benchmark (3 processes on loopback)")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--inflight", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency", type=int, default=5000)
    ap.add_argument("--failovers", type=int, default=3)
    ap.add_argument("--batch", type=int, default=0, metavar="N",
                    help="forward records in runs of N with forward_many() (default 0: one forward() per record)")
    ap.add_argument("--inline-sync", type=int, default=SyncConfig.max_wal_inline_sync_bytes, metavar="BYTES",
                    help="max_wal_inline_sync_bytes: fsync small batches on the I/O thread (default: the"
                         f" library's, {SyncConfig.max_wal_inline_sync_bytes}; 0: off)")
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, WAL in {tempfile.gettempdir()}")
    with tempfile.TemporaryDirectory(prefix="vrepl-bench-") as d:
        with ProcessCluster(d, 3, quorum=2, lifetime_s=900, max_inflight_forwards=max(100_000, args.inflight * 2),
                            flow_control_lag_versions=10 * args.inflight,
                            max_wal_inline_sync_bytes=args.inline_sync) as c:
            c.start()
            bench_steady(c, args.records, args.inflight, args.latency, args.rounds, args.batch)
            if args.failovers:
                bench_failover(c, args.failovers, signal.SIGKILL)
                bench_failover(c, args.failovers, signal.SIGSTOP)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
