"""Scaling figures (issue 8, deliver item 3): how vrepl's throughput moves with vgroups per
node, record size and replica count, and what a vgroup costs in memory.

    python bench/scaling.py [--quick] [--only vgroups,size,replicas] [--dir /dev/shm]
                            [--json bench/results/scaling.json]

1. vgroups per node (1, 4, 16): 3 `vrepl node` processes hosting k vgroups (every vgroup on
   every node, quorum 2), 16 load-generator connections spread over the k masters, batches
   of 100 rows of ~100 B through the client API; confirmed rows/s, CPU per row, and the
   nodes' resident memory idle (after start) and after the load. Memory per vgroup = the
   growth of one node's idle RSS per added vgroup.
2. record size (64 B .. 64 KiB), library level: 3 replicas (bench/compare/vrepl_lib_node.py,
   the vrepl-lib driver's node), writers in the master's process, quorum 2; records/s and
   MB/s. Batches shrink as records grow so a batch stays <= 1 MiB.
3. replicas (1, 2 + arbitrator, 3, 5), library level, quorum = a majority (1, 2, 2, 3; with 2
   replicas the arbitrator process only breaks election ties); confirmed records/s (8 writers
   x batches of 100 x 100 B) and single-writer latency p50/p99.

Data directories go to --dir (default /dev/shm: the WAL's fdatasync costs nothing there, so
the figures show CPU scaling, not the shared disk). Every process is stopped at the end
(bench/compare/procs.py). The machine's 1-minute load average is recorded with each figure:
on a shared machine compare figures of one run only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.compare import jsonline  # noqa: E402
from bench.compare.drivers.base import LatencySpec, ThroughputSpec  # noqa: E402
from bench.compare.procs import (ProcessRegistry, bench_module_argv, free_ports,  # noqa: E402
                                 install_exit_handlers)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


# -- 1. vgroups per node ------------------------------------------------------------------------

def _masters(cluster, vgroups: list[int]) -> dict[int, str] | None:
    """vgroup -> master http endpoint, once every vgroup has a master and 2 slaves."""
    roles: dict[int, list[tuple[str, str]]] = {vg: [] for vg in vgroups}
    for nid, node in cluster.nodes.items():
        st = cluster.status(nid, 1.0)
        if st is None:
            return None
        for v in st["vgroups"]:
            roles[v["vgroup"]].append((v["role"], node.http))
    out = {}
    for vg, rs in roles.items():
        masters = [ep for r, ep in rs if r == "master"]
        if len(masters) != 1 or sum(1 for r, _ in rs if r == "slave") < 2:
            return None
        out[vg] = masters[0]
    return out


async def _load(masters: dict[int, str], clients: int, batch: int, row_bytes: int,
                duration_s: float, warmup_s: float) -> dict:
    from vrepl.client import Client
    from vrepl.node.loadgen import _client
    access = Client(sorted(set(masters.values())))
    loop = asyncio.get_running_loop()
    t_measure = loop.time() + warmup_s
    t_end = t_measure + duration_s
    lat: list[float] = []
    counts: Counter = Counter()
    stats = {"rows": 0, "requests": 0}
    tasks = []
    vgs = sorted(masters)
    for i in range(max(clients, len(vgs))):
        vg = vgs[i % len(vgs)]
        host, _, port = masters[vg].rpartition(":")
        tasks.append(asyncio.create_task(_client(
            i, host, int(port), b"/v1/vgroups/%d/write" % vg, batch, row_bytes, t_end,
            t_measure, lat, counts, stats, access)))
    res = await asyncio.gather(*tasks, return_exceptions=True)
    for r in res:
        if isinstance(r, BaseException):
            counts[f"client error: {type(r).__name__}: {r}"] += 1
    lat.sort()
    return {"rows": stats["rows"], "rows_per_s": stats["rows"] / duration_s,
            "p50_ms": lat[len(lat) // 2] * 1000 if lat else None, "errors": dict(counts),
            "connections": len(tasks)}


def bench_vgroups(base: Path, counts: list[int], duration_s: float) -> list[dict]:
    from vrepl.node.local import LocalCluster
    out = []
    for k in counts:
        d = Path(tempfile.mkdtemp(prefix=f"vgroups{k}-", dir=base))
        cluster = LocalCluster(str(d), 3, vgroup=1, vgroup_count=k, quorum=2,
                               log_level="WARNING")
        try:
            cluster.start()
            cluster.wait_ready(timeout_s=60)
            masters = cluster.wait_for(f"{k} vgroups with a master and 2 slaves",
                                       lambda: _masters(cluster, cluster.vgroup_ids), 90, 0.2)
            pids = [n.proc.pid for n in cluster.nodes.values()]
            time.sleep(1.0)
            idle = [rss_kib(p) for p in pids]
            cpu0 = sum(cpu_s(p) for p in pids)
            la = load1()
            t0 = os.times()
            res = asyncio.run(_load(masters, 16, 100, 100, duration_s, 1.0))
            t1 = os.times()
            cpu_nodes = sum(cpu_s(p) for p in pids) - cpu0
            cpu_gen = (t1.user - t0.user) + (t1.system - t0.system)
            rows_all = res["rows"] * (duration_s + 1.0) / duration_s
            after = [rss_kib(p) for p in pids]
            row = {"vgroups": k, "loadavg_1min": la, **res,
                   "cpu_us_per_row": (cpu_nodes + cpu_gen) / max(1, rows_all) * 1e6,
                   "masters_per_node": dict(Counter(masters.values())),
                   "rss_idle_mib_per_node": [round(x / 1024, 1) for x in idle],
                   "rss_after_load_mib_per_node": [round(x / 1024, 1) for x in after]}
            out.append(row)
            print(f"  {k:2d} vgroups: {res['rows_per_s']:>9,.0f} rows/s, "
                  f"{row['cpu_us_per_row']:.1f} CPU-µs/row, idle RSS/node "
                  f"{sum(idle) / 3 / 1024:.1f} MiB, after {sum(after) / 3 / 1024:.1f} MiB, "
                  f"load {la}, errors {res['errors'] or 0}", flush=True)
        finally:
            cluster.close()
            shutil.rmtree(d, ignore_errors=True)
    base_idle = sum(out[0]["rss_idle_mib_per_node"]) / 3
    for row in out[1:]:
        k = row["vgroups"]
        row["mib_per_added_vgroup_idle"] = round(
            (sum(row["rss_idle_mib_per_node"]) / 3 - base_idle) / (k - out[0]["vgroups"]), 2)
    return out


# -- library-level clusters (2, 3) -------------------------------------------------------------

class LibCluster:
    """n bench/compare/vrepl_lib_node.py processes (+ an arbitrator for n == 2)."""

    def __init__(self, base: Path, procs: ProcessRegistry, n: int, quorum: int = 0) -> None:
        self.procs = procs
        self.nodes: list[subprocess.Popen] = []
        self.arb = None
        self.master: subprocess.Popen | None = None
        ports = free_ports(n)
        replicas = [[i + 1, f"127.0.0.1:{p}"] for i, p in enumerate(ports)]
        secret = "vrepl-scaling"
        arb_addr = None
        if n == 2:
            from vrepl.testing.arbitrator_proc import ArbitratorProcess
            self.arb = ArbitratorProcess(str(base / "arb"), secret.encode())
            arb_addr = self.arb.address
        for i in range(n):
            d = base / f"lib{i + 1}"
            d.mkdir(parents=True)
            conf = {"vgroup_id": 1, "replicas": replicas, "self_index": i,
                    "data_path": str(d / "data"), "secret": secret, "quorum": quorum,
                    "arbitrator": arb_addr, "log_file": str(d / "node.log"),
                    "lifetime_s": 86400, "print_confirms": False, "options": {}}
            path = d / "conf.json"
            path.write_text(json.dumps(conf))
            self.nodes.append(procs.spawn(
                f"lib{n}-{i + 1}", bench_module_argv("bench.compare.vrepl_lib_node", str(path)),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO))
        deadline = time.monotonic() + 40
        while True:
            states = [self.ask(p, {"cmd": "status"}).get("role") for p in self.nodes]
            if states.count("master") == 1 and states.count("slave") == n - 1:
                self.master = self.nodes[states.index("master")]
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} replicas: no master with {n - 1} slaves: {states}")
            time.sleep(0.2)

    @staticmethod
    def ask(node: subprocess.Popen, msg: dict) -> dict:
        return jsonline.ask(node, msg, "vrepl_lib_node")

    def throughput(self, spec: ThroughputSpec) -> dict:
        return self.ask(self.master, {"cmd": "throughput", "spec": asdict(spec)})

    def latency(self, spec: LatencySpec) -> dict:
        return self.ask(self.master, {"cmd": "latency", "spec": asdict(spec)})

    def close(self) -> None:
        jsonline.quit_all(self.nodes, kill_on_timeout=True)
        if self.arb is not None:
            self.arb.stop()
        self.procs.stop_all()


def bench_sizes(base: Path, procs: ProcessRegistry, sizes: list[int], duration_s: float
                ) -> list[dict]:
    d = Path(tempfile.mkdtemp(prefix="sizes-", dir=base))
    c = LibCluster(d, procs, 3, quorum=2)
    out = []
    try:
        c.latency(LatencySpec(count=50, warmup=0, value_size=64))
        for size in sizes:
            batch = max(1, min(100, (1 << 20) // size))
            la = load1()
            r = c.throughput(ThroughputSpec(clients=8, batch=batch, value_size=size - 16,
                                            duration_s=duration_s, warmup_s=0.5))
            mbs = r["writes_per_s"] * size / 1e6
            out.append({"record_bytes": size, "batch": batch, "loadavg_1min": la,
                        "records_per_s": r["writes_per_s"], "mb_per_s": mbs,
                        "errors": r["errors"]})
            print(f"  {size:6d} B records (batches of {batch:3d}): {r['writes_per_s']:>9,.0f} "
                  f"records/s, {mbs:7.1f} MB/s, load {la}", flush=True)
    finally:
        c.close()
        shutil.rmtree(d, ignore_errors=True)
    return out


def bench_replicas(base: Path, procs: ProcessRegistry, counts: list[int], duration_s: float
                   ) -> list[dict]:
    out = []
    for n in counts:
        d = Path(tempfile.mkdtemp(prefix=f"replicas{n}-", dir=base))
        c = LibCluster(d, procs, n)
        try:
            la = load1()
            lat = c.latency(LatencySpec(count=1000, warmup=100, value_size=100))
            thr = c.throughput(ThroughputSpec(clients=8, batch=100, value_size=100,
                                              duration_s=duration_s, warmup_s=0.5))
            label = f"{n}" + (" + arbitrator" if n == 2 else "")
            out.append({"replicas": label, "quorum": n // 2 + 1, "loadavg_1min": la,
                        "records_per_s": thr["writes_per_s"], "p50_us": lat["p50_us"],
                        "p99_us": lat["p99_us"], "errors": thr["errors"] + lat["errors"]})
            print(f"  {label:>15} (quorum {n // 2 + 1}): {thr['writes_per_s']:>9,.0f} records/s,"
                  f" latency p50 {lat['p50_us']:.0f} µs p99 {lat['p99_us']:.0f} µs, load {la}",
                  flush=True)
        finally:
            c.close()
            shutil.rmtree(d, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter measurements")
    ap.add_argument("--only", default="vgroups,size,replicas")
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--json", type=Path, default=REPO / "bench/results/scaling.json")
    args = ap.parse_args(argv)
    only = {x.strip() for x in args.only.split(",")}
    dur = 3.0 if args.quick else 6.0
    base = Path(tempfile.mkdtemp(prefix="vrepl-scaling-", dir=args.dir))
    procs = ProcessRegistry(base)
    install_exit_handlers(procs)
    results: dict = {"command": "python bench/scaling.py " + " ".join(argv or sys.argv[1:]),
                     "cpus": os.cpu_count(), "dir": args.dir, "loadavg_start": load1(),
                     "started_at": time.strftime("%Y-%m-%d %H:%M %Z")}
    try:
        if "vgroups" in only:
            print("vgroups per node (3 nodes, quorum 2, client API, 16 connections):", flush=True)
            results["vgroups"] = bench_vgroups(base, [1, 4, 16], dur)
        if "size" in only:
            print("record size (library level, 3 replicas, quorum 2, 8 writers):", flush=True)
            results["record_size"] = bench_sizes(
                base, procs, [64, 256, 1024, 4096, 16384, 65536], dur)
        if "replicas" in only:
            print("replicas (library level, quorum = majority, 8 writers x 100 x 100 B):",
                  flush=True)
            results["replicas"] = bench_replicas(base, procs, [1, 2, 3, 5], dur)
    finally:
        procs.stop_all()
        shutil.rmtree(base, ignore_errors=True)
    results["loadavg_end"] = load1()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
