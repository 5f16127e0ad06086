"""The per-transaction check of `vrepl validate` (docs/validation.md §versions,
Transactions): on each replica, every transaction published in the vgroup is entirely
present at its publish version, except the rows later writes replaced.

Owns: `txn_presence()`. The expected keys come from the staged batches still in some
replica's WAL (vrepl/spark/txnreplay.py `published_keys`: the batches the state machine
published, below the archive too); each key is looked up in each replica's state (the
rows check's rows: archive + replayed WAL, later version winning) in one Spark join:
* the state row has the publish version: **present**;
* otherwise, when some replica's state holds the key at a later version (a later write in
  the log), or, on a replica whose rows compete by rank, the key has a row of any version
  (an ingested file may outrank it): **replaced**, as the vnode does;
* otherwise (no row, or an older version): **missing**.
A transaction with a missing key on a replica that reached its publish version is a
`txn_rows_missing` finding (under *versions*) naming the replica, the transaction, its
label and version, how many rows are missing / present / replaced and one missing key.
Must not: read files, or judge a transaction whose batches no WAL holds (counted as not
checkable).
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from vrepl.spark.inputs import ReplicaData
from vrepl.spark.job import TS_UNITS_US
from vrepl.spark.model import Finding

PRESENT, REPLACED, MISSING = 2, 1, 0


def expected_keys(replicas: list[ReplicaData], precision: dict[int, str]
                  ) -> tuple[pa.Table, dict[tuple[int, int], tuple[str, int, int]], int]:
    """(the keys every published transaction must show: vgroup, txn, pv, table, ts_us;
    (vgroup, txn) -> (label, pv, keys); how many VISIBLE transactions no WAL has batches
    of). The replicas of a vgroup hold the same log, so any one of them that still has a
    transaction's records gives its keys."""
    known: dict[tuple[int, int], Any] = {}
    visible: set[tuple[int, int]] = set()
    for r in replicas:
        vg = r.spec.vgroup
        for tid, p in r.published.items():
            known.setdefault((vg, tid), p)
        visible |= {(vg, tid) for tid, (_l, state, _v, _n) in r.txns.items()
                    if state == "VISIBLE"}
    cols: dict[str, list] = {"vgroup": [], "txn": [], "pv": [], "table": [], "ts_us": []}
    meta = {}
    for (vg, tid), p in sorted(known.items()):
        unit = TS_UNITS_US[precision.get(vg, "ms")]
        meta[(vg, tid)] = (p.label, p.version, len(p.keys))
        for table, ts in p.keys:
            cols["vgroup"].append(vg)
            cols["txn"].append(tid)
            cols["pv"].append(p.version)
            cols["table"].append(table)
            cols["ts_us"].append(ts * unit)
    schema = pa.schema([("vgroup", pa.int32()), ("txn", pa.int64()), ("pv", pa.int64()),
                        ("table", pa.string()), ("ts_us", pa.int64())])
    return pa.table(cols, schema=schema), meta, len(visible - set(known))


def txn_presence(spark: Any, state_rows: Any, replicas: list[ReplicaData],
                 precision: dict[int, str]) -> tuple[list[Finding], dict[str, int]]:
    """Findings (`txn_rows_missing`) and counts (txns_checked, txn_keys_checked,
    txns_not_checkable) of the per-transaction check; `state_rows` is the rows check's
    DataFrame (vgroup, replica, table, ts_us, version, ...)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    exp, meta, unknown = expected_keys(replicas, precision)
    counts = {"txns_checked": len(meta), "txn_keys_checked": exp.num_rows,
              "txns_not_checkable": unknown}
    if not meta:
        return [], counts
    reps = spark.createDataFrame(pa.table({
        "vgroup": pa.array([r.spec.vgroup for r in replicas], pa.int32()),
        "replica": pa.array([r.spec.replica for r in replicas], pa.int32()),
        "last": pa.array([r.last_version for r in replicas], pa.int64()),
        "ranked": pa.array([r.ranked for r in replicas], pa.bool_())}))
    want = (spark.createDataFrame(exp).join(F.broadcast(reps), "vgroup")
            .filter(F.col("last") >= F.col("pv")))       # the replica reached the publish
    have = state_rows.select("vgroup", "replica", "table", "ts_us", "version")
    keys = ["vgroup", "replica", "txn", "pv", "ranked", "table", "ts_us"]
    here = (want.join(have, ["vgroup", "replica", "table", "ts_us"], "left")
            .groupBy(*keys)               # a key held twice: one line
            .agg(F.max((F.col("version") == F.col("pv")).cast("int")).alias("at_pv"),
                 F.max("version").alias("vmax")))
    # A later write of the key exists in the log when any replica holds a later version
    # (so a replica that also lost the later row does not blame the transaction).
    later = F.max("vmax").over(Window.partitionBy("vgroup", "txn", "table", "ts_us"))
    status = (F.when(F.col("at_pv") == 1, PRESENT)
              .when((later > F.col("pv")) | (F.col("ranked") & F.col("vmax").isNotNull()),
                    REPLACED)
              .otherwise(MISSING))
    per_key = here.withColumn("s", status)
    per_txn = (per_key.groupBy("vgroup", "replica", "txn", "pv")
               .agg(F.sum((F.col("s") == PRESENT).cast("long")).alias("present"),
                    F.sum((F.col("s") == REPLACED).cast("long")).alias("replaced"),
                    F.sum((F.col("s") == MISSING).cast("long")).alias("missing"),
                    F.min(F.when(F.col("s") == MISSING, F.struct("table", "ts_us")))
                    .alias("example"))
               .filter(F.col("missing") > 0)
               .orderBy("vgroup", "txn", "replica"))
    out = []
    for row in per_txn.collect():
        vg, rep, tid, pv = row["vgroup"], row["replica"], row["txn"], row["pv"]
        label, _v, n = meta[(vg, tid)]
        unit = TS_UNITS_US[precision.get(vg, "ms")]
        ex = row["example"]
        whole = "all" if row["missing"] == n else row["missing"]
        out.append(Finding(
            "versions", "txn_rows_missing",
            f"transaction {tid} (label {label}, VISIBLE at v{pv}): {whole} of its {n} rows"
            f" missing at v{pv} ({row['present']} present, {row['replaced']} replaced by"
            f" later writes), e.g. table {ex['table']!r} ts {ex['ts_us'] // unit}",
            vg, rep, None,
            {"txn": tid, "label": label, "version": pv, "keys": n,
             "missing": row["missing"], "present": row["present"],
             "replaced": row["replaced"],
             "example": {"table": ex["table"], "ts": ex["ts_us"] // unit}}))
    return out, counts
