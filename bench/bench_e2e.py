"""End-to-end figures through the client API (issue 4 targets).

    python bench/bench_e2e.py [--duration 10] [--clients 16] [--dir /dev/shm/x] [--json]
                              [--replicas 3]

Starts 3 `vrepl node` processes on 127.0.0.1 (one vgroup, quorum 2, logs at WARNING) in a
temporary directory (or --dir: e.g. tmpfs to take the disk out), waits for a master and two
slaves, then runs the load generator (vrepl/node/loadgen.py) in this process. `--replicas
N` runs N nodes with a majority quorum instead (1: what HTTP, JSON and the vnode cost
without replication):

1. throughput: `--clients` concurrent keep-alive connections, batches of 100 rows of ~100
   JSON bytes, confirmed rows/s (target >= 200,000);
2. latency: one client, one row per request, p50 (target <= 1 ms).

Everything runs on the same machine: the load generator, the master and both slaves share
its cores, so the figures say what the whole system costs per row, not what one node
could do with its own machine. Prints both results and the targets; every process is
killed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from vrepl.node.loadgen import run_load  # noqa: E402
from vrepl.node.local import LocalCluster  # noqa: E402


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(cluster: LocalCluster, fn, per_node: dict | None = None):
    """fn()'s result, the nodes' CPU seconds and this process's; per_node (if given) gets
    each node's CPU seconds by role ("master", "slave2", ...)."""
    master = cluster.master()
    pids = {nid: n.proc.pid for nid, n in cluster.nodes.items() if n.proc is not None}
    before = {nid: _cpu_s(p) for nid, p in pids.items()}
    t0 = os.times()
    res = fn()
    t1 = os.times()
    used = {nid: _cpu_s(p) - before[nid] for nid, p in pids.items()}
    if per_node is not None:
        per_node.update({("master" if nid == master else f"slave{nid}"): s
                         for nid, s in used.items()})
    nodes_cpu = sum(used.values())
    gen_cpu = (t1.user - t0.user) + (t1.system - t0.system)
    return res, nodes_cpu, gen_cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--row-bytes", type=int, default=100)
    ap.add_argument("--latency-duration", type=float, default=5.0)
    ap.add_argument("--dir", help="base directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--replicas", type=int, default=3, help="nodes (quorum: a majority)")
    args = ap.parse_args()
    if not 1 <= args.replicas <= 9:
        ap.error("--replicas takes 1 to 9")
    base = tempfile.mkdtemp(prefix="vrepl-e2e-", dir=args.dir)
    cluster = LocalCluster(base, args.replicas, vgroup=1, quorum=args.replicas // 2 + 1,
                           log_level="WARNING")
    try:
        cluster.start()
        cluster.wait_ready()
        cluster.wait_master(slaves=args.replicas - 1)
        load = os.getloadavg()
        per_node: dict = {}
        thr, nodes_cpu, gen_cpu = _measure(cluster, lambda: run_load(
            cluster.endpoints, 1, args.clients, args.batch, args.row_bytes, args.duration, 1.0),
            per_node)
        # CPU per confirmed row (the nodes + load generator; the warm-up second is included in
        # the CPU but not in the rows, so this slightly overstates the cost).
        rows_all = thr.rows * (args.duration + 1.0) / args.duration
        cpu_us_per_row = (nodes_cpu + gen_cpu) / max(1, rows_all) * 1e6
        bound = os.cpu_count() / (cpu_us_per_row / 1e6) if cpu_us_per_row else 0
        split = {k: v / max(1, rows_all) * 1e6 for k, v in sorted(per_node.items())}
        split["loadgen"] = gen_cpu / max(1, rows_all) * 1e6
        time.sleep(0.5)
        lat = run_load(cluster.endpoints, 1, 1, 1, args.row_bytes, args.latency_duration, 0.5)
        out = {"throughput": asdict(thr), "latency": asdict(lat), "cpus": os.cpu_count(),
               "cpu_s_nodes": nodes_cpu, "cpu_s_loadgen": gen_cpu,
               "cpu_us_per_row": cpu_us_per_row, "cpu_us_per_row_by_process": split,
               "cpu_bound_rows_per_s": bound,
               "loadavg_before": load, "dir": base, "replicas": args.replicas}
        if args.json:
            print(json.dumps(out))
        else:
            print(f"machine: {os.cpu_count()} CPUs, load average before the run"
                  f" {load[0]:.2f}; {args.replicas} nodes, quorum {args.replicas // 2 + 1};"
                  f" data in {base}")
            print("throughput: " + thr.describe())
            print(f"  target >= 200,000 rows/s: {'met' if thr.rows_per_s >= 200_000 else 'NOT met'}")
            print(f"  CPU: nodes {nodes_cpu:.1f} s + load generator {gen_cpu:.1f} s ="
                  f" {cpu_us_per_row:.1f} CPU-us per confirmed row: {os.cpu_count()} idle CPUs"
                  f" could confirm at most ~{bound:,.0f} rows/s")
            print("  CPU-us per row by process: " + ", ".join(f"{k} {v:.2f}"
                                                             for k, v in split.items()))
            print("latency:    " + lat.describe())
            print(f"  target p50 <= 1 ms: {'met' if lat.p50_ms <= 1.0 else 'NOT met'}")
        return 0
    finally:
        cluster.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
