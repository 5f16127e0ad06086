"""The Spark writer against the plain client API (issue 17's target: `vrepl.spark.write`
loading 10 M rows on local[2] at >= 0.5 of the plain client-API rate for the same rows;
figures in docs/benchmarks.md §Transactions).

    python bench/bench_spark_writer.py [--rows 10000000] [--tables 4] [--batch 5000]
                                       [--threads 2] [--partitions 2] [--master local[2]]
                                       [--dir DIR]

Three `vrepl node` processes on 127.0.0.1 holding two vgroups (1 and 2, quorum 2), and in
the same run the same rows (`--tables` tables t0.., ts = T0 + i, columns x, y (float) and
n (int)) loaded twice:
(a) by the plain client API into vgroup 1: `Client.write` in batches of `--batch` rows, by
    `--threads` client threads (each its own Client), building each batch's rows in Python
    as a loader would;
(b) by `vrepl.spark.write` into vgroup 2, one transaction, on a SparkSession of `--master`
    with `--partitions` partitions of a DataFrame built by Spark (`spark.range`), begin to
    VISIBLE.
Each is timed from its first request to its last answer (the session is started and warmed
before); both counts are checked on the master afterwards (every row once). Printed: rows/s
of each and the ratio (b)/(a).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from vrepl.client import Client  # noqa: E402
from vrepl.node.local import LocalCluster  # noqa: E402

PLAIN_VG, SPARK_VG = 1, 2
T0 = 1_700_000_000_000
GIB = 1024 ** 3


def batch_rows(start: int, end: int, tables: int) -> list:
    """Rows start..end-1 as a loader builds them: [table, ts, {x, y, n}]."""
    return [[f"t{i % tables}", T0 + i, {"x": i * 0.5, "y": i * 0.25, "n": i}]
            for i in range(start, end)]


def plain(c: LocalCluster, rows: int, tables: int, batch: int, threads: int) -> float:
    """(a) rows/s of Client.write in batches from `threads` threads."""
    starts = list(range(0, rows, batch))
    errors: list[BaseException] = []

    def loader(k: int) -> None:
        try:
            with Client(c.endpoints, timeout_s=60) as cl:
                for s in starts[k::threads]:
                    cl.write(PLAIN_VG, batch_rows(s, min(rows, s + batch), tables))
        except BaseException as exc:   # reported after the join
            errors.append(exc)
    ts = [threading.Thread(target=loader, args=(k,)) for k in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    took = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return rows / took


def spark_df(spark, rows: int, tables: int, partitions: int):
    return spark.range(0, rows, numPartitions=partitions).selectExpr(
        f"concat('t', cast(id % {tables} as string)) as table", f"{T0} + id as ts",
        "cast(id * 0.5 as double) as x", "cast(id * 0.25 as double) as y", "id as n")


def count_rows(c: LocalCluster, vg: int, tables: int) -> int:
    with Client(c.endpoints) as cl:
        doc = cl.tables(vg)
    return sum(t["archived_rows"] + t["memtable_rows"] for t in doc["tables"]
               if t["name"] in {f"t{k}" for k in range(tables)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--batch", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    import vrepl.spark
    from vrepl.spark.session import start_session, stop_jvm
    base = tempfile.mkdtemp(prefix="bench-spark-writer-", dir=args.dir)
    c = LocalCluster(os.path.join(base, "c"), 3, vgroup=PLAIN_VG, vgroup_count=2,
                     txn={"max_staged_bytes": 64 * GIB, "timeout_ms": 3_600_000})
    spark = None
    try:
        c.start()
        c.wait_ready()
        for vg in (PLAIN_VG, SPARK_VG):
            c.wait_for(f"vg{vg} has a master", lambda vg=vg: Client(c.endpoints).find_master(vg), 30)
        spark = start_session(args.master, app_name="bench-spark-writer",
                              log_path=os.path.join(base, "spark.log"))
        warm = spark_df(spark, 2000, 1, args.partitions).selectExpr("'warm' as table", "ts",
                                                                    "x", "y", "n")
        vrepl.spark.write(warm, c.endpoints, SPARK_VG, "warm", batch_rows=args.batch)
        with Client(c.endpoints) as cl:
            cl.write(PLAIN_VG, [["warm", T0 + i, {"x": 0.5, "y": 0.5, "n": 1}] for i in range(2000)])

        a = plain(c, args.rows, args.tables, args.batch, args.threads)
        print(f"(a) plain client API: {args.rows} rows in batches of {args.batch},"
              f" {args.threads} threads: {a:,.0f} rows/s", flush=True)
        df = spark_df(spark, args.rows, args.tables, args.partitions)
        t0 = time.perf_counter()
        done = vrepl.spark.write(df, c.endpoints, SPARK_VG, "bench", batch_rows=args.batch,
                                 timeout_ms=3_600_000)
        b = args.rows / (time.perf_counter() - t0)
        print(f"(b) vrepl.spark.write on {args.master}, {args.partitions} partitions:"
              f" {args.rows} rows, one transaction ({done['state']} at"
              f" v{done['visible_version']}): {b:,.0f} rows/s", flush=True)
        got = (count_rows(c, PLAIN_VG, args.tables), count_rows(c, SPARK_VG, args.tables))
        if got != (args.rows, args.rows) or done["rows"] != args.rows:
            print(f"row counts on the master: plain {got[0]}, spark {got[1]}"
                  f" (the commit said {done['rows']}); expected {args.rows} each")
            return 1
        print(f"ratio spark/plain: {b / a:.2f} (target >= 0.5); rows checked on the master")
    finally:
        if spark is not None:
            spark.stop()
            stop_jvm()
        c.close()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
