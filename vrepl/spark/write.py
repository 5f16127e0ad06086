"""The Spark writer: `vrepl.spark.write(df, ...)` loads a DataFrame into a vgroup in one
transaction (docs/transactions.md §11).

Owns: the two phases of a job. The driver checks the DataFrame's columns and begins the
transaction under the caller's label; Spark's JVM turns each row into JSON (`toJSON` of
(ts, table, struct of the values): no per-row Python objects from Spark, which cost four
times as much), and each executor task cuts its partition's JSON lines into the
transaction's rows and stages them in batches of `batch_rows` rows numbered `partition *
2**20 + chunk` (the batch's `seq`), with up to `puts_in_flight` puts waiting for the vgroup
at once. A retried or speculative task re-sends batches the vgroup already staged and they
are answered, not staged again; the driver commits once every task succeeded and aborts
when the job failed. A job run again with the same label finds the transaction: still open
(it stages the missing batches and commits) or already VISIBLE (nothing is loaded again).
Must not: import pyspark at import time, or keep a client across tasks (each task makes its
own, on the executor).
"""
from __future__ import annotations

import collections
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable

from vrepl.client import Client
from vrepl.errors import WriteInputError

SEQ_PER_PARTITION = 1 << 20        # chunks of one partition (a partition of 2**20 batches...)
VALUE_TYPES = "integer, floating point, decimal (sent as float), string or boolean"
INTEGER_TYPES = ("ByteType", "ShortType", "IntegerType", "LongType")
VALUE_TYPE_NAMES = INTEGER_TYPES + ("FloatType", "DoubleType", "DecimalType", "StringType",
                                    "VarcharType", "CharType", "BooleanType", "NullType")
TIMESTAMP_TYPES = ("TimestampType", "TimestampNTZType")
# The JSON line Spark writes per row: {"a":<ts>,"b":<table>,"c":{<values>}} (null fields
# left out). Inside a JSON string a quote is escaped, so `,"b":` and `,"c":` can only be
# the separators.
TS_KEY, TABLE_SEP, VALUES_SEP = '{"a":', ',"b":', ',"c":'


def check_columns(fields: dict[str, str], table: str | None, table_column: str,
                  ts_column: str) -> list[str]:
    """The value columns of a DataFrame whose columns are `fields` (name -> Spark type
    class name); WriteInputError for a missing ts or table column or a column of a type
    the vnode has no column for."""
    names = list(fields)
    if ts_column not in fields:
        raise WriteInputError(f"the DataFrame has no ts column {ts_column!r} (columns:"
                              f" {', '.join(names)})")
    if fields[ts_column] not in INTEGER_TYPES + TIMESTAMP_TYPES:
        raise WriteInputError(f"ts column {ts_column!r} is {fields[ts_column]}: it must be an"
                              " integer in the vnode's precision or a timestamp")
    if table is None:
        if table_column not in fields:
            raise WriteInputError(f"the DataFrame has no table column {table_column!r}"
                                  " (give table= for a single table)")
        if fields[table_column] not in ("StringType", "VarcharType", "CharType"):
            raise WriteInputError(f"table column {table_column!r} is {fields[table_column]},"
                                  " not a string")
    values = [n for n in names if n != ts_column and (table is not None or n != table_column)]
    for n in values:
        if fields[n] not in VALUE_TYPE_NAMES:
            raise WriteInputError(f"column {n!r} is {fields[n]}: a vnode value is {VALUE_TYPES}")
    return values


def spark_fields(df: Any) -> dict[str, str]:
    """A DataFrame's columns: name -> Spark type class name."""
    return {f.name: type(f.dataType).__name__ for f in df.schema.fields}


def json_lines(df: Any, table: str | None, table_column: str, ts_column: str,
               precision: str) -> Any:
    """(driver) The RDD of one JSON line per row of `df`, made by Spark's JVM:
    {"a": ts in the vnode's precision, "b": table, "c": {value columns}}. Making the RDD
    may run `df`'s shuffles already (adaptive execution plans them first)."""
    from pyspark.sql import functions as F

    fields = spark_fields(df)
    values = check_columns(fields, table, table_column, ts_column)
    ts = F.col(f"`{ts_column}`")
    if fields[ts_column] in TIMESTAMP_TYPES:       # floor to the precision
        ts = F.unix_micros(ts.cast("timestamp"))
        if precision != "us":
            ts = F.floor(ts / 1000).cast("long")
    vals = [F.col(f"`{n}`").cast("double").alias(n) if fields[n] == "DecimalType"
            else F.col(f"`{n}`") for n in values]
    name = F.lit(table) if table is not None else F.col(f"`{table_column}`")
    rows = df.select(ts.alias("a"), name.alias("b"), F.struct(*vals).alias("c"))
    with warnings.catch_warnings():   # pyspark 4 says toJSON may return a DataFrame one day
        warnings.simplefilter("ignore", UserWarning)
        out = rows.toJSON()
    return out if hasattr(out, "mapPartitionsWithIndex") else out.rdd.map(lambda r: r[0])


def txn_row(line: str) -> str:
    """One JSON line of json_lines() as the transaction's row: [table, ts, {values}]."""
    i = line.find(TABLE_SEP)
    k = line.find(VALUES_SEP, i)
    if not line.startswith(TS_KEY) or i < 0 or k < 0:
        what = "ts" if not line.startswith(TS_KEY) else "table"
        raise WriteInputError(f"a row without a {what}: {line[:200]}")
    return f"[{line[i + 5:k]},{line[5:i]},{line[k + 5:-1]}]"


def _stage_partition(index: int, lines: Iterable[str], nodes: list[str], vgroup: int,
                     txn: int, label: str, batch_rows: int, client_kw: dict,
                     puts_in_flight: int = 2) -> int:
    """(executor) Stage one partition's rows (the JSON lines of json_lines(), in partition
    order); returns how many it staged. Chunk k is the partition's rows k*batch_rows.. in
    order, so a retried task sends the same batches under the same seqs."""
    local = threading.local()
    clients: list[Client] = []
    lock = threading.Lock()

    def put(body: bytes, seq: int) -> None:
        t = getattr(local, "txn", None)
        if t is None:
            cl = Client(nodes, **client_kw)
            with lock:
                clients.append(cl)
            t = local.txn = cl.transaction(vgroup, label)
            t.id = txn
        t.put(body, seq=seq)

    staged, chunk = 0, 0
    waiting: collections.deque[Future] = collections.deque()
    pool = ThreadPoolExecutor(puts_in_flight, thread_name_prefix="vrepl-put")

    def send(rows: list[str]) -> None:
        nonlocal chunk, staged
        body = f"[{','.join(rows)}]".encode()
        while len(waiting) >= puts_in_flight:      # a failed put raises here
            waiting.popleft().result()
        waiting.append(pool.submit(put, body, index * SEQ_PER_PARTITION + chunk))
        chunk += 1
        staged += len(rows)

    try:
        rows: list[str] = []
        for line in lines:
            rows.append(txn_row(line))
            if len(rows) >= batch_rows:
                send(rows)
                rows = []
        if rows:
            send(rows)
        while waiting:
            waiting.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for cl in clients:
            cl.close()
    return staged


def write(df: Any, nodes: list[str] | str, vgroup: int, label: str, *, table: str | None = None,
          table_column: str = "table", ts_column: str = "ts", batch_rows: int = 5000,
          timeout_ms: int | None = None, precision: str = "ms",
          client_kw: dict | None = None, puts_in_flight: int = 2) -> dict:
    """Load `df` into `vgroup` in one transaction under `label` and return the commit's
    answer (`state` VISIBLE, `visible_version`, `rows`, ...). Rows: `ts_column` (an integer
    in the vnode's precision, or a timestamp), the table from `table` or `table_column`,
    every other column a value (integer, floating point, decimal sent as float, string or
    boolean; nulls left out). WriteInputError (nothing begun) for a DataFrame that cannot
    be written. A job that fails aborts the transaction (and raises); run again with the
    same label (and the same batch_rows), it loads at most once."""
    nodes = [n for n in nodes.split(",") if n] if isinstance(nodes, str) else list(nodes)
    if batch_rows < 1 or puts_in_flight < 1:
        raise WriteInputError("batch_rows and puts_in_flight must be at least 1")
    check_columns(spark_fields(df), table, table_column, ts_column)
    kw = dict(client_kw or {})
    with Client(nodes, **kw) as cl:
        txn = cl.transaction(vgroup, label, timeout_ms).begin()
        if txn.already_done:
            return txn.last
        args = (nodes, vgroup, txn.id, label, batch_rows, kw, puts_in_flight)
        try:
            lines = json_lines(df, table, table_column, ts_column, precision)
            lines.mapPartitionsWithIndex(lambda i, it: [_stage_partition(i, it, *args)]).sum()
        except BaseException:
            try:
                txn.abort("spark job failed")
            except Exception:       # the master's timeout aborts it anyway
                pass
            raise
        return txn.commit()
