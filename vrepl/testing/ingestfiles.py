"""Archived-format Parquet files for ingest tests and tools (docs/vnode.md §9.1).

Owns: `write_round_file()`, which writes rows as a file `VgroupHost.ingest()` accepts (ts in
the vnode's precision, the origin's `_version`/`_epoch`, typed value columns, sorted by ts),
and `origin_rows()`, the rows such a file holds as a vnode query returns them. Used by the
unit, integration and Spark tests and by producers' tests. Must not: touch a vgroup's
archive or WAL.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from vrepl.vnode.files import ARROW_TYPES, parquet_options


def write_round_file(path: str, rows: Sequence[tuple[int, int, int, dict[str, Any]]],
                     columns: dict[str, str], precision: str = "ms") -> str:
    """Write `rows` = [(ts, origin version, origin epoch, {column: value})] (sorted by ts, one
    per ts) with value columns `columns` ({name: "int"|"float"|"str"|"bool"}) to `path`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    arrays = [pa.array([r[0] for r in rows], pa.timestamp(precision)),
              pa.array([r[1] for r in rows], pa.int64()),
              pa.array([r[2] for r in rows], pa.int64())]
    names = ["ts", "_version", "_epoch"]
    for c, t in columns.items():
        arrays.append(pa.array([r[3].get(c) for r in rows], ARROW_TYPES[t]))
        names.append(c)
    pq.write_table(pa.Table.from_arrays(arrays, names=names), path, **parquet_options(names))
    return path


def origin_rows(n: int, ts0: int = 0, version0: int = 1000, epoch: int = 7,
                step: int = 1, tag: str = "o") -> list[tuple[int, int, int, dict[str, Any]]]:
    """n rows ts0, ts0+step, ... with origin versions version0.. and value columns x (int),
    y (float), tag (str)."""
    return [(ts0 + i * step, version0 + i, epoch, {"x": i, "y": i / 4, "tag": tag})
            for i in range(n)]


ORIGIN_COLUMNS = {"x": "int", "y": "float", "tag": "str"}
