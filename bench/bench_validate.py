"""Benchmark of `vrepl validate` (issue 6 Targets): 10 million rows x 3 replicas on local[2],
the whole job with the JVM start within 60 s, and the comparison part on 1 vs 2 cores.

    python bench/bench_validate.py [--rows 10000000] [--tables 10] [--dir DIR] [--keep]

Data: one vgroup, `--tables` tables of one schema (a super table: current float, voltage
int, phase float, location str), one row per second per table, written straight into the
reference vnode's format with pyarrow (Parquet files per (table, 10-day bucket), zstd,
columns ts/_version/_epoch/values, key-value metadata, and a manifest with size, magic,
ranges and counts), 1000 rows per version; the WAL is small and real (encoded row batches
in vrepl records): 100 records below the archived version (not yet recycled) and 50 above it. Replica
1 is generated, replicas 2 and 3 are copies. Each measurement runs in a fresh process (one
JVM per run): `total_s` is from before the SparkSession starts to the report; `compare_s`
is the Spark part (rows digests + diff + epochs) without start-up and driver checks.
Prints a table and one JSON line per run (figures go to docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from vrepl.child import python_argv

DAY_MS = 86_400_000
FILE_SPAN_MS = 10 * DAY_MS
T0 = 1_700_000_000_000 - (1_700_000_000_000 % FILE_SPAN_MS)
ROWS_PER_VERSION = 1000
WAL_BELOW = 100
WAL_ABOVE = 50


def generate(path: str, rows: int, tables: int) -> dict:
    """Replica 1's data path in the vnode's on-disk format; returns what was written."""
    import numpy as np
    import pyarrow as pa

    import pyarrow.parquet as pq

    from vrepl.vnode.files import Manifest, ArchivedFile, file_magic
    from vrepl.vnode.rows import encode_rows
    from vrepl._core.record import encode_record

    per_table = rows // tables
    per_version_per_table = ROWS_PER_VERSION // tables
    versions = per_table // per_version_per_table
    rng = np.random.default_rng(1)
    schema_cols = {"current": "float", "voltage": "int", "phase": "float", "location": "str"}
    schema = pa.schema([pa.field("ts", pa.timestamp("ms"), nullable=False),
                        pa.field("_version", pa.int64(), nullable=False),
                        pa.field("_epoch", pa.int64(), nullable=False),
                        pa.field("current", pa.float64()), pa.field("voltage", pa.int64()),
                        pa.field("phase", pa.float64()), pa.field("location", pa.string())])
    m = Manifest("ms", FILE_SPAN_MS, versions, 1)
    locations = pa.array([f"site-{i:02d}" for i in range(16)])
    os.makedirs(os.path.join(path, "data"), exist_ok=True)
    for t in range(tables):
        table = f"d{t:04d}"
        m.schemas[table] = dict(schema_cols)
        i = np.arange(per_table, dtype=np.int64)
        ts = T0 + i * 1000
        ver = i // per_version_per_table + 1
        buckets = ts // FILE_SPAN_MS
        os.makedirs(os.path.join(path, "data", table), exist_ok=True)
        for b in np.unique(buckets):
            sel = np.nonzero(buckets == b)[0]
            n = len(sel)
            tbl = pa.table({
                "ts": pa.array(ts[sel], pa.timestamp("ms")),
                "_version": pa.array(ver[sel]), "_epoch": pa.array(np.ones(n, np.int64)),
                "current": pa.array(rng.normal(10, 1, n).round(3)),
                "voltage": pa.array(rng.integers(200, 240, n)),
                "phase": pa.array(rng.random(n).round(4)),
                "location": locations.take(pa.array(rng.integers(0, 16, n)))},
                schema=schema)
            tbl = tbl.replace_schema_metadata({
                b"vrepl.table": table.encode(), b"vrepl.bucket": str(int(b)).encode(),
                b"vrepl.archived_version": str(versions).encode(), b"vrepl.precision": b"ms"})
            sink = pa.BufferOutputStream()
            pq.write_table(tbl, sink, compression="zstd")
            buf = sink.getvalue()
            name = f"data/{table}/b{int(b)}-v{versions}.parquet"
            with open(os.path.join(path, name), "wb") as fh:
                fh.write(buf)
            m.files.append(ArchivedFile(name, buf.size, file_magic(buf), table, int(b),
                                        int(ts[sel[0]]), int(ts[sel[-1]]),
                                        int(ver[sel[0]]), int(ver[sel[-1]]), n))
    m.sort()
    with open(os.path.join(path, "data", "manifest.json"), "wb") as fh:
        fh.write(m.to_bytes())
    # The WAL: a small tail of the log, as a node keeps it between recycles. Records up to
    # the archived version repeat archived rows; those above it are new rows.
    first = versions - WAL_BELOW + 1
    records = []
    for v in range(first, versions + WAL_ABOVE + 1):
        base = (v - 1) * per_version_per_table       # v > versions: new ts after the files
        batch = [(f"d{t:04d}", T0 + (base + k) * 1000,
                  {"current": 10.0, "voltage": 220, "phase": 0.5, "location": "site-00"})
                 for t in range(tables) for k in range(per_version_per_table)]
        records.append(encode_record(1, v, 1, encode_rows(batch)))
    os.makedirs(os.path.join(path, "wal"), exist_ok=True)
    with open(os.path.join(path, "wal", "000000000000.wal"), "wb") as fh:
        fh.write(b"".join(records))
    size = sum(f.size for f in m.files)
    return {"rows": per_table * tables, "tables": tables, "files": len(m.files),
            "bytes": size, "archived_version": versions,
            "wal_records": WAL_BELOW + WAL_ABOVE}


def run_once(dirs: list[str], master: str, out: str) -> dict:
    """One validation in this process (a fresh JVM), with timings."""
    from vrepl.spark.validation import validate
    t0 = time.perf_counter()
    report = validate({1: dirs}, master=master, log_path=os.path.join(out, "spark.log"))
    total = time.perf_counter() - t0
    t = report.timings_s
    return {"master": master, "exit_code": report.exit_code, "total_s": round(total, 2),
            "spark_start_s": round(t["spark_start"], 2),
            "driver_checks_s": round(t["driver_checks"], 2),
            "rows_s": round(t["rows"], 2), "epochs_s": round(t["epochs"], 2),
            "compare_s": round(t["compare"], 2),
            "rows_compared": report.checks["rows"].counts["rows"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--tables", type=int, default=10)
    ap.add_argument("--dir", default=None, help="where to generate (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--masters", default="local[2],local[1]",
                    help="comma-separated masters, one fresh process each")
    ap.add_argument("--run", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:           # child: --run MASTER OUT DIR...
        master, out, *dirs = args.run
        print(json.dumps(run_once(dirs, master, out)))
        return 0
    root = args.dir or tempfile.mkdtemp(prefix="vrepl-bench-validate-")
    try:
        t = time.perf_counter()
        n1 = os.path.join(root, "n1")
        if os.path.exists(os.path.join(n1, "data", "manifest.json")):
            info = {"rows": None, "note": "reused existing data"}
        else:
            info = generate(n1, args.rows, args.tables)
        dirs = [n1]
        for i in (2, 3):
            d = os.path.join(root, f"n{i}")
            if not os.path.exists(d):
                shutil.copytree(n1, d)
            dirs.append(d)
        print(f"data: {info} in {time.perf_counter() - t:.1f} s at {root}", file=sys.stderr)
        results = []
        for master in args.masters.split(","):
            out = tempfile.mkdtemp(prefix="vrepl-bench-out-")
            proc = subprocess.run(python_argv(__file__, "--run", master, out, *dirs),
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append(res)
            print(json.dumps(res))
            shutil.rmtree(out, ignore_errors=True)
        print(f"{'master':<10} {'total s':>8} {'start s':>8} {'driver s':>9} {'rows s':>7}"
              f" {'epochs s':>9} {'compare s':>10}", file=sys.stderr)
        for r in results:
            print(f"{r['master']:<10} {r['total_s']:>8} {r['spark_start_s']:>8}"
                  f" {r['driver_checks_s']:>9} {r['rows_s']:>7} {r['epochs_s']:>9}"
                  f" {r['compare_s']:>10}", file=sys.stderr)
        return 0
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
