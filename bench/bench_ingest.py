"""What one write body costs to build (client), to check, stage and apply (master) and to
decode and apply (replica), per format:
JSON rows, an Arrow IPC stream, InfluxDB line protocol (docs/perf.md §13).

    python bench/bench_ingest.py [--rows 1,16,64,100,1000] [--rounds 7]

For each batch size and two row shapes (the compare harness's row: one 136-byte base64
string; a metrics row: 5 floats and an int), prints the nanoseconds per row of
`Vnode.prepare_raw` (JSON), `prepare_arrow` and `prepare_lines` (the master's parse, checks
and staging into columns; no WAL, no replication), the same followed by the memtable apply
(`apply_prepared`), a replica's decode and apply of the WAL payload (`write_to_cache`), the
body's bytes per row, and the client's `json.dumps` against `vrepl.client.rows_to_arrow`. Each figure is
the best of `--rounds` timed loops in this one process, so it is the code's cost, not the
machine's load. Does not start a node.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from vrepl.client import rows_to_arrow
from vrepl.vnode import Vnode, VnodeConfig
from vrepl.vnode.ingest import UNIT_CODES

B64 = base64.b64encode(b"v" * 100).decode()
SHAPES: dict[str, Callable[[int], list]] = {
    "compare row (one 136-B string)": lambda i: ["c03", 1000 + i, {"v": B64}],
    "metrics row (5 floats, 1 int)": lambda i: ["cpu", 1000 + i, {
        "a": 0.5 + i, "b": 1.5, "c": 2.5, "d": 3.5, "e": 4.5, "n": i}],
}


def best_ns(fn: Callable[[], Any], loops: int, rounds: int) -> float:
    """The fastest of `rounds` timed loops of `loops` calls: ns per call."""
    out = []
    for _ in range(rounds):
        t = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        out.append((time.perf_counter_ns() - t) / loops)
    return min(out)


def line_of(row: list) -> str:
    def field(k: str, x: Any) -> str:
        if isinstance(x, str):
            return f'{k}="{x}"'
        return f"{k}={x}i" if isinstance(x, int) else f"{k}={x!r}"
    return f"{row[0]} {','.join(field(k, x) for k, x in row[2].items())} {row[1]}\n"


def applied_ns(kind: str, body: bytes, base: str, loops: int, rounds: int
               ) -> tuple[float, float]:
    """(the master's prepare + apply_prepared, a replica's write_to_cache of the payload):
    ns per call, each on a vnode of its own (the same ts again: the memtable keeps its size)."""
    def prepare(v: Vnode):
        if kind == "json":
            return v.prepare_raw(body)
        if kind == "arrow":
            return v.prepare_arrow(body)
        reason, _, staged, payload = v.prepare_lines(body, UNIT_CODES["ms"], 65536)
        return reason, staged, payload

    cfg = VnodeConfig(max_rows_per_batch=100_000)
    master, replica = Vnode(tempfile.mkdtemp(dir=base), cfg), Vnode(tempfile.mkdtemp(dir=base), cfg)
    try:
        versions = [0, 0]
        payload = prepare(master)[2]

        def on_master() -> None:
            _, staged, got = prepare(master)
            versions[0] += 1
            master.apply_prepared(versions[0], 1, staged, len(got))

        def on_replica() -> None:
            versions[1] += 1
            replica.write_to_cache(versions[1], 1, payload)
        return best_ns(on_master, loops, rounds), best_ns(on_replica, loops, rounds)
    finally:
        master.close()
        replica.close()


def measure(n: int, make: Callable[[int], list], rounds: int, base: str) -> dict:
    rows = [make(i) for i in range(n)]
    js = json.dumps(rows, separators=(",", ":")).encode()
    arrow = rows_to_arrow(rows)
    assert arrow is not None
    lines = "".join(line_of(r) for r in rows).encode()
    loops = max(20, 30_000 // n)
    v = Vnode(tempfile.mkdtemp(dir=base), VnodeConfig(max_rows_per_batch=max(n, 1000)))
    try:
        for check in (v.prepare_raw(js)[0], v.prepare_arrow(arrow)[0],
                      v.prepare_lines(lines, UNIT_CODES["ms"], 65536)[0]):
            assert check is None, check
        node = {"json": best_ns(lambda: v.prepare_raw(js), loops, rounds),
                "arrow": best_ns(lambda: v.prepare_arrow(arrow), loops, rounds),
                "lines": best_ns(lambda: v.prepare_lines(lines, UNIT_CODES["ms"], 65536),
                                 loops, rounds)}
        applied = {k: applied_ns(k, body, base, loops, rounds)
                   for k, body in (("json", js), ("arrow", arrow), ("lines", lines))}
    finally:
        v.close()
    client = {"json": best_ns(lambda: json.dumps(rows, separators=(",", ":")).encode(),
                              max(10, loops // 3), rounds),
              "arrow": best_ns(lambda: rows_to_arrow(rows), max(10, loops // 3), rounds)}
    return {"rows": n, "node_ns_per_row": {k: round(x / n) for k, x in node.items()},
            "master_apply_ns_per_row": {k: round(x[0] / n) for k, x in applied.items()},
            "replica_ns_per_row": {k: round(x[1] / n) for k, x in applied.items()},
            "client_ns_per_row": {k: round(x / n) for k, x in client.items()},
            "bytes_per_row": {"json": round(len(js) / n), "arrow": round(len(arrow) / n),
                              "lines": round(len(lines) / n)}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,16,64,100,1000")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="vrepl-bench-ingest-")
    try:
        for name, make in SHAPES.items():
            for n in (int(x) for x in args.rows.split(",")):
                r = measure(n, make, args.rounds, base)
                if args.json:
                    print(json.dumps({"shape": name, **r}), flush=True)
                    continue
                nd, cl, b = r["node_ns_per_row"], r["client_ns_per_row"], r["bytes_per_row"]
                ma, rp = r["master_apply_ns_per_row"], r["replica_ns_per_row"]
                print(f"{name}, {n} rows: master ns/row JSON {nd['json']}, Arrow {nd['arrow']},"
                      f" lines {nd['lines']} (with the apply {ma['json']} / {ma['arrow']} /"
                      f" {ma['lines']}; a replica's decode + apply {rp['json']} /"
                      f" {rp['arrow']} / {rp['lines']}); bytes/row {b['json']} / {b['arrow']} /"
                      f" {b['lines']}; client ns/row json.dumps {cl['json']},"
                      f" rows_to_arrow {cl['arrow']}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
