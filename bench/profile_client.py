"""Where the CPU of a client-API write goes, per process and per thread (docs/perf.md §13).

    python bench/profile_client.py [--variants compare-json,e2e-loadgen] [--duration 6]
                                   [--dir /dev/shm] [--py-spy SECONDS] [--json]

Starts 3 `vrepl node` processes (one vgroup, quorum 2) once, then runs each variant's write
load against them for `--duration` seconds and reports, for the whole load: confirmed rows/s,
CPU-µs per confirmed row, over the measured window only (after start-up and warm-up), of
each node (and of each node's threads, from /proc/<pid>/task/*/stat) and of the client
processes (or of this process, which runs the e2e load generator), and the context switches per row of each node (the wake-ups). Variants:

  compare-json         the compare harness's vrepl-client load (bench/compare drivers): 8
                       client processes, vrepl.client.Client, rows of a base64 100-byte value,
                       a request id per write
  compare-json-norid   the same without the request id (payload format 1, no dedup entry)
  compare-json-short   the same with a 70-byte plain value (rows of ~100 B, as bench_e2e's)
  compare-arrow        the binary client system (Arrow IPC body, request id)
  compare-lp           the line-protocol client system (POST /api/v2/write)
  e2e-loadgen          bench_e2e's load generator: one asyncio process, `--e2e-clients`
                       connections, ~100-byte rows, no request id

`--py-spy S` records the master for S seconds of each variant (`py-spy record --gil
--idle=false -f raw`) and prints its 15 hottest functions (inclusive share of the samples).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.compare.drivers.base import ThroughputSpec
from bench.compare.workload import run_client_processes
from vrepl.node.loadgen import run_load
from vrepl.node.local import LocalCluster

TICK = os.sysconf("SC_CLK_TCK")
# When the client processes start writing (plus 0.1 s per client): late enough that 8
# interpreters importing vrepl.client and pyarrow on a loaded machine are ready by then, so
# the measured window holds no client's start-up (run_client_processes waits for them all).
CLIENT_START_S = 5.0


def _py_spy_bin() -> str:
    return shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")


def _thread_names(pid: int) -> dict[str, str]:
    """{native thread id: Python thread name} from `py-spy dump` (CPython 3.11 does not give
    its threads OS names), or {} without py-spy."""
    try:
        text = subprocess.run([_py_spy_bin(), "dump", "--pid", str(pid), "--nonblocking"],
                              check=False, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(re.findall(r'^Thread (\d+) \(\w+\): "([^"]*)"', text, re.MULTILINE))


def _task_stats(pid: int, names: dict[str, str]) -> dict[str, tuple[float, int]]:
    """{thread name: (CPU seconds, context switches)} of a process's threads (summed per
    name; names from _thread_names, else the OS's)."""
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            name = names.get(tid)
            if name is None:
                with open(f"{base}/{tid}/comm") as fh:
                    name = "os:" + fh.read().strip()
            switches = 0
            with open(f"{base}/{tid}/status") as fh:
                for line in fh:
                    if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
                        switches += int(line.split()[1])
        except OSError:
            continue     # a thread that ended meanwhile
        acc = out[name]
        acc[0] += (int(fields[11]) + int(fields[12])) / TICK
        acc[1] += switches
    return {k: (v[0], int(v[1])) for k, v in out.items()}


def _py_spy(pid: int, seconds: float, out_path: str) -> subprocess.Popen:
    return subprocess.Popen([_py_spy_bin(), "record", "--pid", str(pid), "--gil",
                             "-r", "200", "-d", str(int(seconds)), "-f", "raw", "-o", out_path,
                             "--nonblocking"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _top_functions(raw_path: str, n: int = 12) -> dict[str, list[tuple[str, float]]]:
    """From py-spy's raw (collapsed) output: the functions with the most samples of their
    own ("self"), and the vrepl functions with the largest inclusive share ("vrepl"), each
    as (function (file), percent of the samples)."""
    total = 0
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()

    def name(frame: str) -> str:
        func, _, where = frame.partition(" (")
        return f"{func} ({where.split(':')[0].rsplit('/', 1)[-1]})" if where else func

    try:
        with open(raw_path) as fh:
            for line in fh:
                stack, _, count = line.rstrip().rpartition(" ")
                if not count.isdigit():
                    continue
                k = int(count)
                total += k
                frames = stack.split(";")
                own[name(frames[-1])] += k
                # py-spy names a file relative to its sys.path entry ("vrepl/node/http.py")
                for f in {name(x) for x in frames if "(vrepl/" in x or "/vrepl/" in x}:
                    incl[f] += k
    except OSError:
        return {}
    if not total:
        return {}
    return {"self": [(f, 100.0 * k / total) for f, k in own.most_common(n)],
            "vrepl": [(f, 100.0 * k / total) for f, k in incl.most_common(n)]}


def _compare_factory(kind: str, endpoints: list[str]):
    from bench.compare.drivers import vrepl_driver as vd
    if kind == "compare-json":
        return vd.VreplHttpClientFactory(endpoints, 1)
    if kind == "compare-json-norid":
        return vd.VreplHttpClientFactory(endpoints, 1, request_ids=False)
    if kind == "compare-json-short":
        return vd.VreplHttpClientFactory(endpoints, 1, plain_values=True)
    if kind == "compare-arrow":
        return vd.VreplArrowClientFactory(endpoints, 1)
    if kind == "compare-lp":
        return vd.VreplLineClientFactory(endpoints, 1)
    raise SystemExit(f"unknown variant {kind!r}")


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _client_pids(exclude: set[int]) -> list[int]:
    """This process's children that are not nodes (the client processes), and itself (the
    e2e load generator runs here)."""
    me = os.getpid()
    out = [me]
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in exclude or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me:
            out.append(int(d))
    return out


class _Window:
    """CPU of the nodes (per thread) and of the clients between two moments: the measured
    window of the load, so start-up and warm-up are left out."""

    def __init__(self, pids: dict[str, int], names: dict[str, dict[str, str]]) -> None:
        self.pids, self.names = pids, names
        self.samples: list[tuple[float, dict, dict[int, float]]] = []

    def sample(self) -> None:
        nodes = {role: _task_stats(pid, self.names[role]) for role, pid in self.pids.items()}
        clients = {}
        for pid in _client_pids(set(self.pids.values())):
            try:
                clients[pid] = _proc_cpu(pid)
            except OSError:
                pass
        self.samples.append((time.monotonic(), nodes, clients))

    def at(self, delay_s: float) -> threading.Timer:
        t = threading.Timer(delay_s, self.sample)
        t.start()
        return t


def run_variant(cluster: LocalCluster, kind: str, args) -> dict:
    master = cluster.master()
    pids = {("master" if nid == master else f"slave{nid}"): n.proc.pid
            for nid, n in cluster.nodes.items() if n.proc is not None}
    spy = None
    spy_path = os.path.join(tempfile.gettempdir(), f"vrepl-prof-{kind}-{os.getpid()}.txt")
    names = {role: _thread_names(pid) for role, pid in pids.items()}
    window = _Window(pids, names)
    load0 = os.getloadavg()[0]
    # The measured window starts after the start-up (client processes: CLIENT_START_S + 0.1 s per
    # client, see run_client_processes) and the 1 s warm-up, and lasts args.duration.
    lead = 1.0 if kind == "e2e-loadgen" else CLIENT_START_S + 0.1 * args.clients + 1.0
    timers = [window.at(lead + 0.05), window.at(lead + args.duration - 0.05)]
    if args.py_spy:
        timers.append(threading.Timer(lead, lambda: spies.append(
            _py_spy(pids["master"], args.py_spy, spy_path))))
        timers[-1].start()
    spies: list = []
    if kind == "e2e-loadgen":
        res = run_load(cluster.endpoints, 1, args.e2e_clients, 100, 100, args.duration, 1.0)
        rate = res.rows_per_s
    else:
        spec = ThroughputSpec(clients=args.clients, batch=100, value_size=100,
                              duration_s=args.duration, warmup_s=1.0)
        res = run_client_processes(_compare_factory(kind, cluster.endpoints), spec,
                                   start_delay_s=CLIENT_START_S)
        rate = res["writes_per_s"]
    for t in timers:
        t.join()
    spy = spies[0] if spies else None
    (w0, nodes0, cl0), (w1, nodes1, cl1) = window.samples[:2]
    wall = w1 - w0
    rows = rate * wall

    def per_row(s: float) -> float:
        return s / max(1.0, rows) * 1e6
    nodes = {}
    for role in pids:
        threads = {}
        cpu = sw = 0.0
        for name, (c1, x1) in nodes1[role].items():
            cb, xb = nodes0[role].get(name, (0.0, 0))
            threads[name] = round(per_row(c1 - cb), 3)
            cpu += c1 - cb
            sw += x1 - xb
        nodes[role] = {"cpu_us_per_row": round(per_row(cpu), 3),
                       "switches_per_100_rows": round(sw / max(1.0, rows) * 100, 2),
                       "cores": round(cpu / wall, 2),
                       "threads": {k: v for k, v in sorted(threads.items(), key=lambda kv: -kv[1])
                                   if v >= 0.05}}
    clients_cpu = sum(cl1[p] - cl0[p] for p in cl1 if p in cl0)
    out = {"variant": kind, "rows_per_s": round(rate), "load_before": round(load0, 2),
           "load_after": round(os.getloadavg()[0], 2), "nodes": nodes,
           "nodes_cpu_us_per_row": round(sum(v["cpu_us_per_row"] for v in nodes.values()), 3),
           "clients_cpu_us_per_row": round(per_row(clients_cpu), 3),
           "clients_cores": round(clients_cpu / wall, 2)}
    if spy is not None:
        spy.wait(timeout=args.py_spy + 30)
        out["master_gil_top"] = {k: [(f, round(p, 1)) for f, p in v]
                                 for k, v in _top_functions(spy_path).items()}
        os.unlink(spy_path) if os.path.exists(spy_path) else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="compare-json,e2e-loadgen")
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--clients", type=int, default=8, help="client processes (compare-*)")
    ap.add_argument("--e2e-clients", type=int, default=8, help="connections (e2e-loadgen)")
    ap.add_argument("--rounds", type=int, default=1, help="run the variant list this often")
    ap.add_argument("--dir", help="base directory (default: a temporary one, on disk)")
    ap.add_argument("--py-spy", type=float, default=0, metavar="SECONDS")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="vrepl-prof-", dir=args.dir)
    cluster = LocalCluster(base, 3, vgroup=1, quorum=2, log_level="WARNING")
    results = []
    try:
        cluster.start()
        cluster.wait_ready()
        cluster.wait_master(slaves=2)
        for _ in range(args.rounds):
            for kind in args.variants.split(","):
                r = run_variant(cluster, kind, args)
                results.append(r)
                if args.json:
                    print(json.dumps(r), flush=True)
                    continue
                print(f"{kind}: {r['rows_per_s']:,} rows/s (load {r['load_before']} ->"
                      f" {r['load_after']}); CPU-us per row: nodes {r['nodes_cpu_us_per_row']}"
                      f" + clients {r['clients_cpu_us_per_row']}", flush=True)
                for role, v in r["nodes"].items():
                    print(f"  {role}: {v['cpu_us_per_row']} us/row ({v['cores']} cores),"
                          f" {v['switches_per_100_rows']} switches/100 rows; threads "
                          + ", ".join(f"{k} {x}" for k, x in v["threads"].items()))
                for what, top in r.get("master_gil_top", {}).items():
                    print(f"    master, GIL samples, {what}: "
                          + "; ".join(f"{f} {p}%" for f, p in top))
                time.sleep(1.0)
        return 0
    finally:
        cluster.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
