"""The Spark half of the validation job: rows (digests, then row diffs) and epochs.

Owns: turning the replicas' archived files and replayed WAL rows into one DataFrame of
comparable rows, the per-(table, time bucket) digests, the row-level diff of the buckets
whose digests differ, and the version/epoch pairs of archived rows. docs/validation.md.

Runs where Spark runs: only built-in Spark SQL expressions (no Python UDFs), and the small
driver-made tables (WAL rows, WAL headers) go to the JVM as Arrow, so executors need
neither vrepl nor a Python worker; they only need to see the replicas' files at the same
paths as the driver (a shared mount on a cluster). Must not: read replica files itself
(inputs.py does, on the driver) or print.

A comparable row is (vgroup, replica, table, ts_us, version, epoch, bucket, h, vals):
`h` = xxhash64 of ts, version, epoch, every value column in the table's canonical order
(checks.canonical_columns) and a null mask (Spark's hashes skip nulls, so without the mask
(null, 1) and (1, null) would collide); `vals` = the values as JSON, only computed for rows
that end up in the diff (Spark prunes it from the digest pass).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from vrepl.spark.checks import canonical_columns
from vrepl.spark.inputs import ReplicaData
from vrepl.spark.model import Finding

TS_UNITS_US = {"ms": 1000, "us": 1}
ROW_COLUMNS = ["vgroup", "replica", "table", "ts_us", "version", "epoch", "bucket", "h", "vals"]
DIFF_COLUMNS = ["vgroup", "table", "ts", "ts_us", "kind", "replica", "version", "epoch",
                "values", "ref_replica", "ref_version", "ref_epoch", "ref_values"]


@dataclass
class RowsResult:
    rows_per_replica: dict[tuple[int, int], int] = field(default_factory=dict)
    buckets: int = 0
    buckets_differing: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {"missing": 0, "extra": 0,
                                                            "differing": 0, "duplicate": 0})
    per_replica: dict[tuple[int, int, str], int] = field(default_factory=dict)
    diffs: pa.Table | None = None          # the first max_diff_rows diff rows
    not_compared: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class EpochsResult:
    conflicts: int = 0
    examples: list[Finding] = field(default_factory=list)
    row_versions: dict[tuple[int, int], tuple[int, int, int]] = field(default_factory=dict)
    pairs: int = 0


def _spark_type(T: Any, t: str) -> Any:
    return {"int": T.LongType(), "float": T.DoubleType(), "str": T.StringType(),
            "str*": T.StringType(), "bool": T.BooleanType()}[t]


def _arrow_type(t: str) -> pa.DataType:
    return {"int": pa.int64(), "float": pa.float64(), "str": pa.string(),
            "bool": pa.bool_()}[t]


class Plan:
    """What to read for every replica, grouped so tables with one schema share one read."""

    def __init__(self, replicas: list[ReplicaData], bucket_ms: int):
        self.replicas = replicas
        self.bucket_us = bucket_ms * 1000
        self.by_vgroup: dict[int, list[ReplicaData]] = defaultdict(list)
        for r in replicas:
            self.by_vgroup[r.spec.vgroup].append(r)
        self.precision: dict[int, str] = {}
        self.canon: dict[int, dict[str, str]] = {}
        self.excluded: dict[int, set[tuple[str, int]]] = defaultdict(set)
        for vg, reps in self.by_vgroup.items():
            with_m = [r for r in reps if r.has_manifest]
            self.precision[vg] = with_m[0].manifest.precision if with_m else "ms"
            # One column list per vgroup: every table's rows are hashed over it (columns a
            # table lacks are null and the null mask tells them apart), so replicas agree
            # on what a row's hash covers whatever tables they hold.
            self.canon[vg] = canonical_columns([cols for r in reps
                                                for cols in r.schemas.values()])
            for r in reps:
                for df in r.files:
                    if not df.readable:
                        self.excluded[vg].add((df.entry.table, df.entry.bucket))

    def precision_of(self, r: ReplicaData) -> str:
        return r.manifest.precision if r.has_manifest else self.precision[r.spec.vgroup]

    @staticmethod
    def compatible_groups(schemas: dict[str, dict[str, str]], tables: list[str]
                          ) -> list[tuple[dict[str, str], list[str]]]:
        """Tables whose columns never disagree on a type share one read schema (usually all
        of a replica's tables: one Parquet scan per replica)."""
        groups: list[tuple[dict[str, str], list[str]]] = []
        for t in sorted(tables):
            cols = schemas.get(t, {})
            for merged, members in groups:
                if all(merged.get(c, typ) == typ for c, typ in cols.items()):
                    merged.update(cols)
                    members.append(t)
                    break
            else:
                groups.append((dict(cols), [t]))
        return groups

    def scan_groups(self, r: ReplicaData) -> list[tuple[dict[str, str], list[str]]]:
        """[(read columns, file paths)] of one replica: the archived files Spark reads."""
        vg = r.spec.vgroup
        files: dict[str, list[str]] = defaultdict(list)
        for df in r.files:
            f = df.entry
            if df.readable and not f.ingest_version and (f.table, f.bucket) not in self.excluded[vg]:
                files[f.table].append(df.path)
        return [(cols, [p for t in members for p in files[t]])
                for cols, members in self.compatible_groups(r.schemas, list(files))]

    def ingested_groups(self, r: ReplicaData) -> list[tuple[dict[str, str], list[str]]]:
        """[(the files' own columns, file paths)] of one replica's ingested files (docs/vnode.md
        §9.4): grouped by their columns as written (an int column of a float table column is
        read as int, then cast like the vnode does)."""
        vg = r.spec.vgroup
        groups: dict[tuple, list[str]] = defaultdict(list)
        for df in r.files:
            f = df.entry
            if df.readable and f.ingest_version and (f.table, f.bucket) not in self.excluded[vg]:
                groups[tuple(sorted(df.columns.items()))].append(df.path)
        return [(dict(cols), paths) for cols, paths in groups.items()]

    def wal_groups(self, r: ReplicaData) -> list[tuple[dict[str, str], list[tuple]]]:
        """[(columns, [(table, ts_us, version, epoch, values)])]: replayed WAL rows."""
        unit = TS_UNITS_US[self.precision_of(r)]
        by_table: dict[str, list[tuple]] = defaultdict(list)
        for (table, ts), (v, e, values) in r.wal_rows.items():
            by_table[table].append((table, ts * unit, v, e, values))
        return [(cols, [row for t in members for row in by_table[t]])
                for cols, members in self.compatible_groups(r.schemas, list(by_table))]


class Frames:
    """The DataFrames of one validation run (built lazily; nothing runs until an action)."""

    def __init__(self, spark: Any, plan: Plan):
        from pyspark.sql import functions as F
        from pyspark.sql import types as T
        self.F, self.T = F, T
        self.spark = spark
        self.plan = plan
        self.archived = None     # comparable rows from archived files (before WAL overrides)
        self.rows = None         # archived rows not replaced by the WAL + replayed WAL rows
        self._build()

    # -- building ------------------------------------------------------------------------
    def _project(self, df: Any, canon: dict[str, str], vgroup: Any, replica: Any,
                 table: Any, rank: Any = None) -> Any:
        """The comparable row (module doc); with `rank`, a last column "rank" (docs/vnode.md
        §9.4) for a replica whose rows compete by rank."""
        F = self.F
        vals = []
        for c, t in canon.items():
            if c in df.columns:
                # The cast is a no-op but for an ingested file's int column of a float
                # table column, which the vnode reads as float.
                e = F.col(c).cast("string") if t == "str*" else F.col(c).cast(_spark_type(self.T, t))
            else:
                e = F.lit(None).cast(_spark_type(self.T, t))
            vals.append(e.alias(c))
        # Null mask: one bit per column, 62 columns per long (Spark's hashes skip nulls).
        masks = []
        for i in range(0, len(vals), 62):
            m = F.lit(0).cast("long")
            for j, e in enumerate(vals[i:i + 62]):
                m = m.bitwiseOR(F.when(e.isNull(), F.lit(1 << j)).otherwise(F.lit(0)))
            masks.append(m)
        b = self.plan.bucket_us
        ts = F.col("ts_us")
        return df.select(
            vgroup.cast("int").alias("vgroup"), replica.cast("int").alias("replica"),
            table.alias("table"), ts.alias("ts_us"),
            F.col("_version").alias("version"), F.col("_epoch").alias("epoch"),
            F.expr(f"(ts_us - pmod(ts_us, {b}L)) div {b}L").alias("bucket"),
            F.xxhash64(ts, F.col("_version"), F.col("_epoch"), *vals, *masks).alias("h"),
            (F.to_json(F.struct(*vals)) if vals else F.lit("{}")).alias("vals"),
            *([rank.cast("long").alias("rank")] if rank is not None else []))

    def _read_schema(self, own: dict[str, str]) -> Any:
        T = self.T
        fields = [T.StructField("ts", T.TimestampType()),
                  T.StructField("_version", T.LongType()),
                  T.StructField("_epoch", T.LongType())]
        fields += [T.StructField(c, _spark_type(T, t)) for c, t in own.items()]
        return T.StructType(fields)

    def _archived_frames(self, r: ReplicaData, ranked: bool = False) -> list[Any]:
        """One Parquet scan per group of compatible tables of one replica (flushed files);
        vgroup and replica are literals, the table is the file's directory name (a cheap
        substring of `_metadata.file_path`, evaluated per row, so no regular expression).
        `ranked`: with a rank column (a flushed row's rank is its version)."""
        F = self.F
        out = []
        path = F.col("_metadata.file_path")
        table = F.substring_index(F.substring_index(path, "/", -2), "/", 1)
        for cols, paths in self.plan.scan_groups(r):
            if not paths:
                continue
            df = self.spark.read.schema(self._read_schema(cols)).parquet(*paths)
            df = df.withColumn("ts_us", F.unix_micros(F.col("ts")))
            out.append(self._project(df, self.plan.canon[r.spec.vgroup],
                                     F.lit(r.spec.vgroup), F.lit(r.spec.replica), table,
                                     F.col("_version") if ranked else None))
        return out

    def _ingested_frames(self, r: ReplicaData) -> list[Any]:
        """Ranked rows of a replica's ingested files and pending rounds (docs/vnode.md §9.4):
        an archived ingested file ranks by the version in its name (`b<bucket>-i<version>-
        <k>.parquet`, the manifest's ingest_version), a staged file of a round above the
        archive by its record's version."""
        F = self.F
        out = []
        vg, rep, canon = r.spec.vgroup, r.spec.replica, self.plan.canon[r.spec.vgroup]
        path = F.col("_metadata.file_path")
        table = F.substring_index(F.substring_index(path, "/", -2), "/", 1)
        rank = F.regexp_extract(path, r"-i([0-9]+)-[0-9]+\.parquet$", 1)
        for cols, paths in self.plan.ingested_groups(r):
            df = self.spark.read.schema(self._read_schema(cols)).parquet(*paths)
            df = df.withColumn("ts_us", F.unix_micros(F.col("ts")))
            out.append(self._project(df, canon, F.lit(vg), F.lit(rep), table, rank))
        for p in r.pending:
            for tbl, fpath, cols in p.files:
                df = self.spark.read.schema(self._read_schema(cols)).parquet(fpath)
                df = df.withColumn("ts_us", F.unix_micros(F.col("ts")))
                out.append(self._project(df, canon, F.lit(vg), F.lit(rep), F.lit(tbl),
                                         F.lit(p.version)))
        return out

    def _wal_frames(self, r: ReplicaData, ranked: bool = False) -> list[Any]:
        F = self.F
        out = []
        for cols, rows in self.plan.wal_groups(r):
            if not rows:
                continue
            arrays: dict[str, Any] = {
                "table": pa.array([x[0] for x in rows], pa.string()),
                "ts_us": pa.array([x[1] for x in rows], pa.int64()),
                "_version": pa.array([x[2] for x in rows], pa.int64()),
                "_epoch": pa.array([x[3] for x in rows], pa.int64())}
            for c, typ in cols.items():
                vals = [x[4].get(c) for x in rows]
                if typ == "float":
                    vals = [float(v) if v is not None else None for v in vals]
                arrays[c] = pa.array(vals, _arrow_type(typ))
            df = self.spark.createDataFrame(pa.table(arrays))
            out.append(self._project(df, self.plan.canon[r.spec.vgroup],
                                     F.lit(r.spec.vgroup), F.lit(r.spec.replica),
                                     F.col("table"), F.col("_version") if ranked else None))
        return out

    def _build(self) -> None:
        F = self.F
        archived_all, rows_all = [], []
        for r in self.plan.replicas:
            arch = self._archived_frames(r)
            archived_all += arch          # flushed rows only: versions and epochs checks
            if r.ranked:
                ranked = self._by_rank(r)
                if ranked is not None:
                    rows_all.append(ranked)
                continue
            wal = self._wal_frames(r)
            if wal and arch and self._wal_overlaps_files(r):
                # docs/vnode.md §3: a WAL row replaces the archived row of the same (table,
                # ts). Broadcast anti-join with this replica's (few) replayed keys; skipped
                # when no WAL row falls in an archived file's ts range (the usual case: the
                # WAL holds the newest data), which saves a join over every archived row.
                keys = _union(wal).select("table", "ts_us")
                live = (_union(arch).join(F.broadcast(keys), ["table", "ts_us"], "left_anti")
                        .select(*ROW_COLUMNS))     # a join puts its keys first
                rows_all += [live] + wal
            else:
                rows_all += arch + wal
        self.archived = _union(archived_all) if archived_all else None
        self.rows = _union(rows_all) if rows_all else None

    def _by_rank(self, r: ReplicaData) -> Any:
        """The state of a replica with ingested files or pending rounds (docs/vnode.md §9.4):
        per (table, ts) the rows of the highest rank (flushed and WAL rows rank by their
        version, ingested rows by their record's). Rows tied at the top all stay, so a key
        held twice in one file is still a duplicate. One shuffle of this replica's rows."""
        from pyspark.sql import Window
        F = self.F
        frames = (self._archived_frames(r, ranked=True) + self._ingested_frames(r)
                  + self._wal_frames(r, ranked=True))
        if not frames:
            return None
        w = Window.partitionBy("table", "ts_us")
        return (_union(frames).withColumn("top", F.max("rank").over(w))
                .filter(F.col("rank") == F.col("top")).select(*ROW_COLUMNS))

    def _wal_overlaps_files(self, r: ReplicaData) -> bool:
        """Whether some replayed WAL row's (table, ts) lies within the manifest's ts range of
        one of the replica's archived files of that table (then it may replace a row)."""
        ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for df in r.files:
            ranges[df.entry.table].append((df.entry.ts_min, df.entry.ts_max))
        for table, ts in r.wal_rows:
            for lo, hi in ranges.get(table, ()):
                if lo <= ts <= hi:
                    return True
        return False

    def small(self, rows: list[tuple], names: list[str]) -> Any:
        """A small DataFrame of ints built on the driver (sent as Arrow, no Python workers)."""
        cols = list(zip(*rows)) if rows else [[] for _ in names]
        return self.spark.createDataFrame(pa.table({n: pa.array(c, pa.int64())
                                                    for n, c in zip(names, cols)}))

    # -- rows check ----------------------------------------------------------------------
    def _replica_count(self) -> Any:
        """vgroup -> number of replicas, as a map literal (no join with a small table)."""
        F = self.F
        kv = []
        for vg, reps in self.plan.by_vgroup.items():
            kv += [F.lit(vg), F.lit(len(reps))]
        return F.create_map(*kv)[F.col("vgroup")]

    def compare_rows(self, max_diff_rows: int) -> RowsResult:
        from pyspark import StorageLevel
        F = self.F
        res = RowsResult()
        plan = self.plan
        for vg, pairs in plan.excluded.items():
            for table, fb in sorted(pairs):
                res.not_compared.append({"vgroup": vg, "table": table, "file_bucket": fb,
                                         "reason": "a replica's file for this table and time"
                                                   " range failed the files check"})
        if self.rows is None:
            return res
        # Stage 1: one digest per (vgroup, table, bucket, replica). Materialised by the
        # first action (one job) before anything else reads it, so concurrent query stages
        # never each scan the sources.
        dig = (self.rows.groupBy("vgroup", "table", "bucket", "replica")
               .agg(F.count(F.lit(1)).alias("n_rows"), F.bit_xor("h").alias("x"),
                    F.sum(F.shiftright("h", 32)).alias("s"))
               .persist(StorageLevel.MEMORY_AND_DISK))
        try:
            for row in dig.groupBy("vgroup", "replica").agg(F.sum("n_rows").alias("n")).collect():
                res.rows_per_replica[(row["vgroup"], row["replica"])] = int(row["n"])
            bkt = (dig.groupBy("vgroup", "table", "bucket")
                   .agg(F.countDistinct("replica").alias("rc"),
                        F.countDistinct(F.concat_ws(":", "n_rows", "x", "s")).alias("dc"))
                   .withColumn("differs", (F.col("rc") < self._replica_count())
                               | (F.col("dc") > 1))
                   .persist(StorageLevel.MEMORY_AND_DISK))
            stats = bkt.agg(F.count(F.lit(1)).alias("b"),
                            F.sum(F.col("differs").cast("int")).alias("d")).collect()[0]
            res.buckets = int(stats["b"] or 0)
            res.buckets_differing = int(stats["d"] or 0)
            if res.buckets_differing:
                self._diff(res, bkt.filter("differs").select("vgroup", "table", "bucket"),
                           max_diff_rows)
            bkt.unpersist()
        finally:
            dig.unpersist()
        return res

    def _diff(self, res: RowsResult, diffb: Any, max_diff_rows: int) -> None:
        """Stage 2: the rows of the differing buckets only, grouped per (vgroup, table, ts):
        one shuffle; the classification is SQL array functions over each key's rows.

        Per key, with n replicas of which p hold it: the reference row is the most common
        hash (ties: the lowest replica number). If p > n/2, or p = n/2 and replica 1 holds
        it, the key should exist: replicas without it have a `missing` row and replicas
        whose hash differs from the reference a `differing` row. Otherwise the replicas that
        hold it have an `extra` row.
        """
        from pyspark import StorageLevel
        F = self.F
        key = ["vgroup", "table", "ts_us"]
        d = self.rows.join(F.broadcast(diffb), ["vgroup", "table", "bucket"])
        per_key = (d.groupBy(*key).agg(F.collect_list(F.struct(
            "replica", "h", "version", "epoch", F.col("vals"))).alias("rs"))
            .withColumn("n", self._replica_count()))
        e = F.expr
        per_key = (per_key
                   .withColumn("present", e("array_distinct(transform(rs, x -> x.replica))"))
                   .withColumn("p", F.size("present"))
                   .withColumn("ref", e("array_max(transform(rs, x -> named_struct("
                                        "'c', size(array_distinct(transform(filter(rs, y -> y.h = x.h),"
                                        " y -> y.replica))),"
                                        " 'nr', -x.replica, 'replica', x.replica, 'h', x.h,"
                                        " 'version', x.version, 'epoch', x.epoch,"
                                        " 'vals', x.vals)))"))
                   .withColumn("majority", e("p * 2 > n OR (p * 2 = n AND"
                                             " array_contains(present, 1))")))
        item = ("named_struct('kind', {kind}, 'replica', {rep}, 'version', {ver},"
                " 'epoch', {ep}, 'values', {vals}, 'ref_replica', {rr}, 'ref_version', {rv},"
                " 'ref_epoch', {re}, 'ref_values', {rvals})")
        with_ref = dict(rr="ref.replica", rv="ref.version", re="ref.epoch", rvals="ref.vals")
        no_ref = dict(rr="CAST(NULL AS INT)", rv="CAST(NULL AS BIGINT)",
                      re="CAST(NULL AS BIGINT)", rvals="CAST(NULL AS STRING)")
        differing = item.format(kind="'differing'", rep="x.replica", ver="x.version",
                                ep="x.epoch", vals="x.vals", **with_ref)
        extra = item.format(kind="'extra'", rep="x.replica", ver="x.version", ep="x.epoch",
                            vals="x.vals", **no_ref)
        missing = item.format(kind="'missing'", rep="r", ver="CAST(NULL AS BIGINT)",
                              ep="CAST(NULL AS BIGINT)", vals="CAST(NULL AS STRING)",
                              **with_ref)
        # A replica holding the key more than once (the same row twice in one file, say):
        # its second copy, once per replica, whatever the other replicas hold.
        second = "element_at(filter(rs, y -> y.replica = r), 2)"
        duplicate = item.format(kind="'duplicate'", rep="r", ver=f"{second}.version",
                                ep=f"{second}.epoch", vals=f"{second}.vals", **with_ref)
        diff_array = e(
            f"concat(CASE WHEN majority THEN concat("
            f"transform(filter(rs, x -> x.h != ref.h), x -> {differing}),"
            f" transform(filter(sequence(1, n), r -> NOT array_contains(present, r)),"
            f" r -> {missing}))"
            f" ELSE transform(rs, x -> {extra}) END,"
            f" transform(filter(present, r -> size(filter(rs, y -> y.replica = r)) > 1),"
            f" r -> {duplicate}))")
        diffs = (per_key.select(*key, F.explode(diff_array).alias("d"))
                 .select(*key, "d.*")
                 .persist(StorageLevel.MEMORY_AND_DISK))
        try:
            for row in diffs.groupBy("vgroup", "replica", "kind").count().collect():
                n = int(row["count"])
                res.counts[row["kind"]] += n
                res.per_replica[(row["vgroup"], row["replica"], row["kind"])] = n
            sample = (diffs.orderBy("vgroup", "table", "ts_us", "replica", "kind")
                      .limit(max_diff_rows).toArrow())
        finally:
            diffs.unpersist()
        res.diffs = self._finish_diffs(sample)

    def _finish_diffs(self, t: pa.Table) -> pa.Table:
        """Add `ts` in each vgroup's own precision; fixed column order and types."""
        vgroups = t.column("vgroup").to_pylist()
        ts_us = t.column("ts_us").to_pylist()
        ts = [u // TS_UNITS_US[self.plan.precision.get(vg, "ms")]
              for vg, u in zip(vgroups, ts_us)]
        types = {"vgroup": pa.int32(), "table": pa.string(), "ts": pa.int64(),
                 "ts_us": pa.int64(), "kind": pa.string(), "replica": pa.int32(),
                 "version": pa.int64(), "epoch": pa.int64(), "values": pa.string(),
                 "ref_replica": pa.int32(), "ref_version": pa.int64(), "ref_epoch": pa.int64(),
                 "ref_values": pa.string()}
        cols = {}
        for name in DIFF_COLUMNS:
            col = pa.array(ts, pa.int64()) if name == "ts" else t.column(name)
            cols[name] = col.cast(types[name])
        return pa.table(cols)

    # -- epochs check and archived row versions ------------------------------------------
    def compare_epochs(self, examples: int) -> EpochsResult:
        from pyspark import StorageLevel
        F = self.F
        res = EpochsResult()
        plan = self.plan
        frames = []
        if self.archived is not None:
            pairs = (self.archived.groupBy("vgroup", "replica", "version", "epoch")
                     .agg(F.count(F.lit(1)).alias("rows"))
                     .persist(StorageLevel.MEMORY_AND_DISK))
            arch = self.small([(r.spec.vgroup, r.spec.replica, r.archived_version)
                               for r in plan.replicas], ["vgroup", "replica", "a"])
            arch = (arch.withColumn("vgroup", F.col("vgroup").cast("int"))
                    .withColumn("replica", F.col("replica").cast("int")))
            out = F.when((F.col("version") > F.col("a")) | (F.col("version") < 1),
                         F.col("rows")).otherwise(0)
            for row in (pairs.join(F.broadcast(arch), ["vgroup", "replica"])
                        .groupBy("vgroup", "replica")
                        .agg(F.min("version").alias("lo"), F.max("version").alias("hi"),
                             F.sum(out).alias("above")).collect()):
                res.row_versions[(row["vgroup"], row["replica"])] = (
                    int(row["lo"]), int(row["hi"]), int(row["above"]))
            frames.append(pairs.select("vgroup", "replica", "version", "epoch",
                                       F.lit("archive").alias("src")))
        else:
            pairs = None
        wal_parts = [r for r in plan.replicas if r.wal.count]
        if wal_parts:
            import numpy as np
            t = pa.table({
                "vgroup": pa.array(np.concatenate([np.full(r.wal.count, r.spec.vgroup, np.int32)
                                                   for r in wal_parts])),
                "replica": pa.array(np.concatenate([np.full(r.wal.count, r.spec.replica,
                                                            np.int32) for r in wal_parts])),
                "version": pa.array(np.concatenate([r.wal.versions for r in wal_parts])),
                "epoch": pa.array(np.concatenate([r.wal.epochs for r in wal_parts]))})
            frames.append(self.spark.createDataFrame(t).withColumn("src", F.lit("wal")))
        try:
            if not frames:
                return res
            e = _union(frames)
            conflicts = (e.groupBy("vgroup", "version")
                         .agg(F.countDistinct("epoch").alias("ne"),
                              F.sort_array(F.collect_set(F.struct("epoch", "replica", "src")))
                              .alias("who"))
                         .filter("ne > 1"))
            conflicts = conflicts.persist()
            res.conflicts = conflicts.count()
            for row in conflicts.orderBy("vgroup", "version").limit(examples).collect():
                by_epoch: dict[int, list[str]] = defaultdict(list)
                for w in row["who"]:
                    by_epoch[int(w["epoch"])].append(f"replica {w['replica']} {w['src']}")
                text = "; ".join(f"epoch {ep} in " + ", ".join(sorted(set(who)))
                                 for ep, who in sorted(by_epoch.items()))
                res.examples.append(Finding(
                    "epochs", "two_epochs", f"version {row['version']} has epochs: {text}",
                    int(row["vgroup"]), None, None,
                    {"version": int(row["version"]),
                     "epochs": {str(ep): sorted(set(who)) for ep, who in by_epoch.items()}}))
            conflicts.unpersist()
        finally:
            if pairs is not None:
                pairs.unpersist()
        return res


def _union(frames: list[Any]) -> Any:
    """Positional union: every frame comes out of _project() with the same columns in the
    same order (cheaper to analyse than unionByName when there are many frames)."""
    out = frames[0]
    for f in frames[1:]:
        out = out.union(f)
    return out
