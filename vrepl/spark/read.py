"""`read_vgroup(spark, path)`: a vgroup's archived rows as a Spark DataFrame (docs/validation.md
§Reading a vgroup from Spark; issue 16 Deliver 5).

Owns: reading one vnode data path's manifest on the driver and loading exactly the Parquet
files it names (never a directory scan: files a flush superseded, orphans and the staging
area are not read), with the "later version wins" rule of docs/vnode.md §3 and the rank rule
of §9.4 applied per (table, ts) unless the caller asks for the raw rows.
Must not: import pyspark at import time, read the WAL (rows not archived yet are not in the
result), or write into the data path.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from vrepl.errors import InputError
from vrepl.spark.checks import canonical_columns
from vrepl.vnode.errors import ArchiveError
from vrepl.vnode.files import DATA_DIR, MANIFEST_NAME, Manifest


def _spark_type(T: Any, t: str) -> Any:
    return {"int": T.LongType(), "float": T.DoubleType(), "str": T.StringType(),
            "str*": T.StringType(), "bool": T.BooleanType()}[t]


def load_manifest(path: str) -> Manifest:
    """The manifest of the vnode data path `path`; InputError (one line) if there is none or
    it is unreadable."""
    mpath = os.path.join(path, *MANIFEST_NAME.split("/"))
    try:
        with open(mpath, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise InputError(f"{path}: no {MANIFEST_NAME} (not a vnode data path, or"
                         " nothing archived yet)") from None
    except OSError as exc:
        raise InputError(f"{mpath}: {exc.strerror}") from None
    try:
        return Manifest.from_bytes(data, mpath)
    except (ArchiveError, ValueError) as exc:
        raise InputError(f"{mpath}: {exc}") from None


def read_vgroup(spark: Any, path: str, tables: Sequence[str] | None = None, *,
                resolve: bool = True) -> Any:
    """The archived rows of the vnode data path `path` (a vgroup's directory on one replica:
    `<data_dir>/vg<id>`) as a DataFrame with columns `table`, `ts` (timestamp), `_version`,
    `_epoch`, then every value column of the tables read (union over tables, sorted by name;
    a column whose type differs between tables is a string). Only the files the manifest
    names are loaded (`tables`: only those tables' files).

    `resolve` (default): one row per (table, ts), the one of the highest rank (an ingested
    file's row ranks by the version of the record that ingested it, any other by its own
    `_version`; docs/vnode.md §9.4), as a query of the vnode answers once everything is
    archived. `resolve=False`: every row of every file, plus `_rank` and `_file` (the
    manifest's name of its file).

    The files are read lazily (when an action runs): a flush of a running node that
    supersedes a file meanwhile makes the read fail; read a stopped node's copy, a restored
    copy, or retry. InputError when there is no manifest; an empty DataFrame (with the
    columns above) when it names no file."""
    m = load_manifest(path)
    wanted = None if tables is None else set(tables)
    return read_files(spark, path, m, [f for f in m.files if wanted is None or f.table in wanted],
                      resolve=resolve)


def read_files(spark: Any, path: str, m: Manifest, files: Sequence[Any], *, resolve: bool = True,
               columns: dict[str, str] | None = None) -> Any:
    """read_vgroup's rows of the manifest entries `files` of `m` (the manifest of the data
    path `path`) only: the same columns and rank rule, over those files alone. `columns`:
    the value columns (name -> type) of the result, instead of the union of the tables'."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    canon = columns if columns is not None else \
        canonical_columns([m.schemas.get(t, {}) for t in sorted({f.table for f in files})])
    base = [T.StructField("table", T.StringType()), T.StructField("ts", T.TimestampType()),
            T.StructField("_version", T.LongType()), T.StructField("_epoch", T.LongType())]
    out_schema = T.StructType(base + [T.StructField(c, _spark_type(T, t)) for c, t in canon.items()]
                              + ([T.StructField("_rank", T.LongType()),
                                  T.StructField("_file", T.StringType())] if not resolve else []))
    if not files:
        return spark.createDataFrame([], out_schema)
    frames = []
    # One read per group of files with one Parquet schema: a table's flushed files share its
    # schema; its ingested files too, unless the table has a float column (an ingested file
    # may hold it as int64, docs/vnode.md §9.1: then each such file is read alone, and cast
    # like the vnode does).
    groups: dict[tuple, list] = {}
    for f in files:
        alone = f.ingest_version and "float" in m.schemas.get(f.table, {}).values()
        key = (f.table, f.name if alone else bool(f.ingest_version))
        groups.setdefault(key, []).append(f)
    for (table, _), fs in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        own = m.schemas.get(table, {})
        paths = [os.path.join(path, *f.name.split("/")) for f in fs]
        names = {os.path.basename(p): f for p, f in zip(paths, fs)}
        df = spark.read.parquet(*paths)
        fname = F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1)
        # The rank of a row: its file's ingest_version (in the name, b<bucket>-i<version>-
        # <k>.parquet, for ingested files), else the row's _version.
        ingested = {n: f.ingest_version for n, f in names.items() if f.ingest_version}
        rank = F.col("_version")
        if ingested:
            rank = F.coalesce(F.element_at(F.create_map(*[x for n, v in ingested.items()
                                                           for x in (F.lit(n), F.lit(v))]),
                                           fname), F.col("_version"))
        cols = [F.lit(table).alias("table"), F.col("ts").cast("timestamp").alias("ts"),
                F.col("_version").cast("long").alias("_version"),
                F.col("_epoch").cast("long").alias("_epoch")]
        for c, t in canon.items():
            e = F.col(c) if c in df.columns and c in own else F.lit(None)
            cols.append(e.cast(_spark_type(T, t)).alias(c))
        cols += [rank.cast("long").alias("_rank"),
                 F.concat(F.lit(f"{DATA_DIR}/{table}/"), fname).alias("_file")]
        frames.append(df.select(*cols))
    rows = frames[0]
    for fr in frames[1:]:
        rows = rows.union(fr)
    if not resolve:
        return rows
    w = Window.partitionBy("table", "ts").orderBy(F.col("_rank").desc(), F.col("_version").desc())
    return (rows.withColumn("_n", F.row_number().over(w)).filter(F.col("_n") == 1)
            .drop("_n", "_rank", "_file"))
