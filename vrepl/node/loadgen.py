"""The load generator behind `vrepl bench` and bench/bench_e2e.py (docs/benchmarks.md).

Owns: N concurrent clients (asyncio tasks, one keep-alive HTTP connection each) writing
batches of generated rows of about `row_bytes` JSON bytes to a vgroup's master through the
client API, counting only confirmed rows (200 answers), and the latency of every request;
the result: rows/s, requests/s, latency percentiles, and the count of every other answer.
Each client writes its own table with increasing timestamps, so no row overwrites another.
Against nodes with a bearer token or TLS, every connection carries the same token and TLS
context as vrepl.client's (`access`).
Must not: retry (a benchmark reports failures instead of hiding them).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from vrepl.client import Client, ClientError
from vrepl.exitcodes import EXIT_FAILED, EXIT_OK
from vrepl.node.local import LocalCluster

TS0 = 1_600_000_000_000


@dataclass
class BenchResult:
    clients: int
    batch: int
    row_bytes: int
    seconds: float
    rows: int
    requests: int
    rows_per_s: float
    requests_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    errors: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        errs = (", errors " + ", ".join(f"{k}: {v}" for k, v in self.errors.items())
                if self.errors else "")
        return (f"{self.clients} clients x batches of {self.batch} rows (~{self.row_bytes} B):"
                f" {self.rows_per_s:,.0f} rows/s confirmed, {self.requests_per_s:,.0f} requests/s"
                f" over {self.seconds:.1f} s; latency p50 {self.p50_ms:.3f} ms, p90"
                f" {self.p90_ms:.3f} ms, p99 {self.p99_ms:.3f} ms, max {self.max_ms:.1f} ms{errs}")


def _pct(sorted_s: list[float], q: float) -> float:
    if not sorted_s:
        return 0.0
    return sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))] * 1000


def _row_template(table: str, row_bytes: int) -> bytes:
    base = b'["%s",%%d,{"v":%%d,"s":""}]' % table.encode()
    pad = max(1, row_bytes - len(base) - 8)     # ts ~13 digits, v a few
    return b'["%s",%%d,{"v":%%d,"s":"%s"}]' % (table.encode(), b"x" * pad)


async def _client(i: int, host: str, port: int, path: bytes, batch: int, row_bytes: int,
                  t_end: float, t_measure: float, lat: list[float], counts: Counter,
                  stats: dict, access: Client) -> None:
    tls = access.ssl_context
    reader, writer = await asyncio.open_connection(host, port, ssl=tls,
                                                   server_hostname=host if tls else None)
    auth = b"Authorization: Bearer %s\r\n" % access.token.encode() if access.token else b""
    tmpl = _row_template(f"lg_{i}", row_bytes)
    ts = TS0 + i * 10_000_000_000
    seq = 0
    loop = asyncio.get_running_loop()
    try:
        while True:
            now = loop.time()
            if now >= t_end:
                return
            body = b"[" + b",".join([tmpl % (ts + k, seq + k) for k in range(batch)]) + b"]"
            ts += batch
            seq += batch
            t0 = time.perf_counter()
            writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (path, auth, len(body), body))
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            data = await reader.readexactly(length)
            dt = time.perf_counter() - t0
            status = int(head[9:12])
            if loop.time() < t_measure:
                continue
            if status == 200:
                lat.append(dt)
                stats["rows"] += batch
                stats["requests"] += 1
            else:
                try:
                    code = json.loads(data).get("code", str(status))
                except ValueError:
                    code = str(status)
                counts[f"{status} {code}"] += 1
    finally:
        writer.close()


async def _run(master: str, vgroup: int, clients: int, batch: int, row_bytes: int,
               duration_s: float, warmup_s: float, access: Client) -> BenchResult:
    host, _, port = master.rpartition(":")
    loop = asyncio.get_running_loop()
    t_measure = loop.time() + warmup_s
    t_end = t_measure + duration_s
    lat: list[float] = []
    counts: Counter = Counter()
    stats = {"rows": 0, "requests": 0}
    path = b"/v1/vgroups/%d/write" % vgroup
    tasks = [asyncio.create_task(_client(i, host, int(port), path, batch, row_bytes, t_end,
                                         t_measure, lat, counts, stats, access))
             for i in range(clients)]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            counts[f"client error: {type(r).__name__}: {r}"] += 1
    elapsed = duration_s
    lat.sort()
    return BenchResult(clients, batch, row_bytes, elapsed, stats["rows"], stats["requests"],
                       stats["rows"] / elapsed, stats["requests"] / elapsed, _pct(lat, 0.5),
                       _pct(lat, 0.9), _pct(lat, 0.99), _pct(lat, 1.0), dict(counts))


def run_load(nodes: list[str], vgroup: int = 1, clients: int = 16, batch: int = 100,
             row_bytes: int = 100, duration_s: float = 10.0, warmup_s: float = 1.0,
             access: dict | None = None) -> BenchResult:
    """Find the vgroup's master among `nodes` and load it; the result (confirmed rows only).
    `access`: Client keyword arguments (token, tls, cafile, verify) the load clients use too."""
    c = Client(nodes, **(access or {}))
    try:
        master = c.find_master(vgroup)
    finally:
        c.close()
    if master is None:
        raise ClientError(f"no master for vgroup {vgroup} among {nodes}"
                           f"{': ' + c.last_error if c.last_error else ''}")
    return asyncio.run(_run(master, vgroup, clients, batch, row_bytes, duration_s, warmup_s, c))


def run_bench_cli(args: argparse.Namespace, access: dict | None = None) -> int:
    base = None
    cluster = None
    try:
        if args.nodes:
            nodes = [n for n in args.nodes.split(",") if n]
        else:
            base = tempfile.mkdtemp(prefix="vrepl-bench-")
            cluster = LocalCluster(base, 3, vgroup=args.vgroup, quorum=2, log_level="WARNING")
            cluster.start()
            cluster.wait_ready()
            cluster.wait_master(slaves=2)
            nodes = cluster.endpoints
        res = run_load(nodes, args.vgroup, args.clients, args.batch, args.row_bytes,
                       args.duration, args.warmup, access)
        print(json.dumps(asdict(res)) if args.json else res.describe())
        return EXIT_OK
    except (RuntimeError, TimeoutError) as exc:   # a node exited, no master, a wait ran out
        print(f"vrepl: error: bench: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if cluster is not None:
            cluster.close()
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
