"""Many vgroups per node (issue 18, deliver item 5): both targets as ratios from one run.

    python bench/bench_vgroups.py [--reps 3] [--duration 5] [--many 16] [--idle 1,16,64]
                                  [--dir /dev/shm] [--json bench/results/vgroups.json]

1. Throughput: 3 `vrepl node` processes hosting k vgroups (every vgroup on every node,
   quorum 2), 16 load-generator connections spread over the k masters (bench/scaling.py's
   load: batches of 100 rows of ~100 B through the client API). k = 1 and k = --many run
   back to back, --reps times, alternating which goes first; each pair gives a ratio
   rows/s(many) / rows/s(1), and the figure is the median of the pairs' ratios (the
   machine is shared: a ratio of two runs minutes apart would measure the neighbours).
   Target: >= 0.9.
2. Idle memory per vgroup: the same 3 nodes hosting each of --idle vgroup counts, started,
   every vgroup with a master and 2 slaves, left idle for 2 s; the mean resident memory of
   the 3 nodes. Memory per vgroup = (RSS(largest) - RSS(smallest)) / (the vgroups added).
   Target: <= 0.3 MiB (reported as measured / target, <= 1 meets it).

Data directories go to --dir (default /dev/shm, as bench/scaling.py: the figures show the
CPU and thread costs of many vgroups, not the shared disk). Every process is stopped at the
end. The machine's 1-minute load average is recorded with each figure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.scaling import _load, _masters, cpu_s, load1, rss_kib  # noqa: E402

THROUGHPUT_TARGET = 0.9       # rows/s with many vgroups / with one
MEMORY_TARGET_MIB = 0.3       # idle resident memory per added vgroup
CONNECTIONS, BATCH_ROWS, ROW_BYTES = 16, 100, 100


def _cluster(base: Path, k: int):
    from vrepl.node.local import LocalCluster
    d = Path(tempfile.mkdtemp(prefix=f"vgroups{k}-", dir=base))
    c = LocalCluster(str(d), 3, vgroup=1, vgroup_count=k, quorum=2, log_level="WARNING")
    c.start()
    c.wait_ready(timeout_s=60)
    masters = c.wait_for(f"{k} vgroups with a master and 2 slaves",
                         lambda: _masters(c, c.vgroup_ids), 120, 0.2)
    return c, d, masters


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _records_per_commit(c) -> float:
    """WAL records per group commit over every vgroup of the 3 nodes (/metrics): how many
    requests one WAL write + fdatasync, one forward frame and one ack carried."""
    records = commits = 0.0
    for node in c.nodes.values():
        with urllib.request.urlopen(f"http://{node.http}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith("vrepl_durable_version{"):
                records += float(line.split()[-1])
            elif line.startswith("vrepl_wal_group_commits_total{"):
                commits += float(line.split()[-1])
    return round(records / max(1.0, commits), 2)


def throughput(base: Path, k: int, duration_s: float) -> dict:
    c, d, masters = _cluster(base, k)
    try:
        pids = [n.proc.pid for n in c.nodes.values()]
        time.sleep(1.0)
        cpu0 = sum(cpu_s(p) for p in pids)
        la = load1()
        t0 = os.times()
        res = asyncio.run(_load(masters, CONNECTIONS, BATCH_ROWS, ROW_BYTES, duration_s, 1.0))
        t1 = os.times()
        cpu = sum(cpu_s(p) for p in pids) - cpu0 + (t1.user - t0.user) + (t1.system - t0.system)
        rows_all = res["rows"] * (duration_s + 1.0) / duration_s
        return {"vgroups": k, "loadavg_1min": la, "rows_per_s": round(res["rows_per_s"]),
                "records_per_group_commit": _records_per_commit(c),
                "p50_ms": round(res["p50_ms"], 2) if res["p50_ms"] else None,
                "cpu_us_per_row": round(cpu / max(1, rows_all) * 1e6, 2),
                "threads_per_node": [_threads(p) for p in pids],
                "master_nodes": len(set(masters.values())), "errors": res["errors"]}
    finally:
        c.close()
        shutil.rmtree(d, ignore_errors=True)


def idle_rss(base: Path, k: int) -> dict:
    c, d, _ = _cluster(base, k)
    try:
        pids = [n.proc.pid for n in c.nodes.values()]
        time.sleep(2.0)
        rss = [rss_kib(p) / 1024 for p in pids]
        return {"vgroups": k, "rss_mib_per_node": [round(x, 1) for x in rss],
                "rss_mib_mean": round(sum(rss) / len(rss), 2),
                "threads_per_node": [_threads(p) for p in pids]}
    finally:
        c.close()
        shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="pairs of runs (1 and --many vgroups)")
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    ap.add_argument("--many", type=int, default=16)
    ap.add_argument("--idle", default="1,16,64", help="vgroup counts for the idle memory")
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--json", type=Path, default=REPO / "bench/results/vgroups.json")
    args = ap.parse_args(argv)
    idle_counts = sorted(int(x) for x in args.idle.split(","))
    base = Path(tempfile.mkdtemp(prefix="vrepl-vgroups-", dir=args.dir))
    out: dict = {"command": "python bench/bench_vgroups.py " + " ".join(argv or sys.argv[1:]),
                 "cpus": os.cpu_count(), "dir": args.dir, "loadavg_start": load1(),
                 "started_at": time.strftime("%Y-%m-%d %H:%M %Z"), "runs": [], "idle": []}
    try:
        print(f"throughput: 1 vs {args.many} vgroups per node (3 nodes, quorum 2, client API,"
              f" {CONNECTIONS} connections x {BATCH_ROWS} rows x {ROW_BYTES} B):", flush=True)
        ratios = []
        for rep in range(args.reps):
            order = (1, args.many) if rep % 2 == 0 else (args.many, 1)
            pair = {}
            for k in order:
                r = throughput(base, k, args.duration)
                pair[k] = r
                out["runs"].append({"rep": rep, **r})
                print(f"  rep {rep}: {k:3d} vgroups: {r['rows_per_s']:>9,} rows/s, p50"
                      f" {r['p50_ms']} ms, {r['cpu_us_per_row']} CPU-µs/row, records/group commit"
                      f" {r['records_per_group_commit']}, threads/node"
                      f" {r['threads_per_node']}, load {r['loadavg_1min']}, errors"
                      f" {r['errors'] or 0}", flush=True)
            ratios.append(pair[args.many]["rows_per_s"] / max(1, pair[1]["rows_per_s"]))
            print(f"  rep {rep}: ratio {ratios[-1]:.3f}", flush=True)
        ratio = statistics.median(ratios)
        print(f"idle memory ({', '.join(map(str, idle_counts))} vgroups per node):", flush=True)
        for k in idle_counts:
            r = idle_rss(base, k)
            out["idle"].append(r)
            print(f"  {k:3d} vgroups: RSS per node {r['rss_mib_per_node']} MiB, threads per node"
                  f" {r['threads_per_node']}", flush=True)
        lo, hi = out["idle"][0], out["idle"][-1]
        per_vg = (hi["rss_mib_mean"] - lo["rss_mib_mean"]) / max(1, hi["vgroups"] - lo["vgroups"])
        out["summary"] = {
            "throughput_ratio_pairs": [round(x, 3) for x in ratios],
            "throughput_ratio": round(ratio, 3), "throughput_target": THROUGHPUT_TARGET,
            "throughput_met": ratio >= THROUGHPUT_TARGET,
            "idle_mib_per_vgroup": round(per_vg, 3), "idle_mib_target": MEMORY_TARGET_MIB,
            "idle_ratio_to_target": round(per_vg / MEMORY_TARGET_MIB, 3),
            "idle_met": per_vg <= MEMORY_TARGET_MIB}
        s = out["summary"]
        print(f"{args.many} vgroups / 1 vgroup rows/s: {ratio:.3f} (median of"
              f" {s['throughput_ratio_pairs']}; target >= {THROUGHPUT_TARGET}:"
              f" {'met' if s['throughput_met'] else 'missed'})")
        print(f"idle memory per vgroup: {per_vg:.3f} MiB = {s['idle_ratio_to_target']:.2f} x the"
              f" {MEMORY_TARGET_MIB} MiB target ({'met' if s['idle_met'] else 'missed'})")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out["loadavg_end"] = load1()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
