"""The Spark writer: `vrepl.spark.write(df, ...)` loads a DataFrame into a vgroup in one
transaction (docs/transactions.md §11).

Owns: the two phases of a job. The driver begins the transaction under the caller's label;
each executor task stages its partition's rows in batches numbered `partition * 2**20 +
chunk` (the batch's `seq`), so a retried or speculative task re-sends batches the vgroup
already staged and they are answered, not staged again; the driver commits once every task
succeeded and aborts when the job failed. A job run again with the same label finds the
transaction: still open (it stages the missing batches and commits) or already VISIBLE
(nothing is loaded again).
Must not: import pyspark at import time, or keep a client across tasks (each task makes its
own, on the executor).
"""
from __future__ import annotations

import datetime
import json
from typing import Any, Iterable, Iterator

from vrepl.client import Client

SEQ_PER_PARTITION = 1 << 20        # chunks of one partition (a partition of 2**20 batches...)


def _ts_value(v: Any, precision: str) -> int:
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.timezone.utc)
        us = int(v.timestamp()) * 1_000_000 + v.microsecond
        return us if precision == "us" else us // 1000
    return int(v)


def _stage_partition(index: int, rows: Iterable[Any], nodes: list[str], vgroup: int, txn: int,
                     label: str, table: str | None, table_column: str, ts_column: str,
                     batch_rows: int, precision: str, client_kw: dict) -> Iterator[int]:
    """(executor) Stage one partition's rows; yields how many it staged."""
    cl = Client(nodes, **client_kw)
    staged, chunk, batch = 0, 0, []
    try:
        t = cl.transaction(vgroup, label)
        t.id = txn

        def send() -> None:
            nonlocal chunk
            body = json.dumps(batch, separators=(",", ":"), allow_nan=False).encode()
            t.put(body, seq=index * SEQ_PER_PARTITION + chunk)
            chunk += 1

        for row in rows:
            d = row.asDict()
            name = table if table is not None else d.pop(table_column)
            ts = _ts_value(d.pop(ts_column), precision)
            if table is None:
                d.pop(table_column, None)
            batch.append([name, ts, {k: v for k, v in d.items() if v is not None}])
            if len(batch) >= batch_rows:
                send()
                staged += len(batch)
                batch = []
        if batch:
            send()
            staged += len(batch)
    finally:
        cl.close()
    yield staged


def write(df: Any, nodes: list[str] | str, vgroup: int, label: str, *, table: str | None = None,
          table_column: str = "table", ts_column: str = "ts", batch_rows: int = 5000,
          timeout_ms: int | None = None, precision: str = "ms",
          client_kw: dict | None = None) -> dict:
    """Load `df` into `vgroup` in one transaction under `label` and return the commit's
    answer (`state` VISIBLE, `visible_version`, `rows`, ...). Rows: `ts_column` (an integer
    in the vnode's precision, or a timestamp), the table from `table` or `table_column`,
    every other column a value (nulls left out). A job that fails aborts the transaction
    (and raises); run again with the same label, it loads at most once."""
    nodes = [n for n in nodes.split(",") if n] if isinstance(nodes, str) else list(nodes)
    kw = dict(client_kw or {})
    with Client(nodes, **kw) as cl:
        txn = cl.transaction(vgroup, label, timeout_ms).begin()
        if txn.already_done:
            return txn.last
        txn_id = txn.id
        args = (nodes, vgroup, txn_id, label, table, table_column, ts_column, batch_rows,
                precision, kw)
        try:
            df.rdd.mapPartitionsWithIndex(
                lambda i, it: _stage_partition(i, it, *args)).sum()
        except BaseException:
            try:
                txn.abort("spark job failed")
            except Exception:       # the master's timeout aborts it anyway
                pass
            raise
        return txn.commit()
