"""The memtable: rows not yet archived, per table, as typed column logs.

Owns: the rows applied above the archived version, per table, in the order they were
applied (vrepl/_core/memcols.pyx: int64 ts/version/epoch and one typed column per value
column), the size/age figures that trigger a flush, and the two views readers need: the
newest row per ts in a time range (queries) and the whole table as Arrow, newest row per
ts, sorted by ts (flush), and the cut at a version a flush archives up to (split_above:
the committed rows go to files, the rest stays, docs/vnode.md §5). Must not: do I/O, validate (rows arrive validated, and their
columns are already in the schemas it is given), or lock (the Vnode's lock covers it).

Same ts written twice: the later version wins (docs/vnode.md §later-version-wins). Rows are
applied in version order, so "later" is simply "appended later"; within one batch a later
row for the same (table, ts) replaces an earlier one. A log keeps both rows until the
flush, which writes only the newest; readers never see the older one.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from vrepl._core.memcols import KIND_STR, Staged, TableLog, apply_rows
from vrepl.vnode.rows import row_bytes

# One row as queries see it: (version, epoch, {column: value or None}).
MemRow = tuple[int, int, dict]


def newest_positions(ts: np.ndarray, increasing: bool, start: int | None = None,
                     end: int | None = None) -> np.ndarray:
    """Positions of the rows a reader sees, in ts order: for each ts (within [start, end)
    if given) the last row appended with it."""
    n = len(ts)
    if increasing:   # sorted, no repeats: the common case of a time series
        lo = 0 if start is None else int(np.searchsorted(ts, start, "left"))
        hi = n if end is None else int(np.searchsorted(ts, end, "left"))
        return np.arange(lo, hi, dtype=np.int64)
    pos = np.arange(n, dtype=np.int64)
    if start is not None:
        pos = pos[(ts >= start) & (ts < end)]
    sel = ts[pos]
    order = np.lexsort((-pos, sel))            # by ts, the last appended first
    sel = sel[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sel[1:] != sel[:-1]
    return pos[order[first]]


def column_to_arrow(col: Any, n: int, typ: pa.DataType) -> pa.Array:
    """Column `col` of a TableLog (rows [0, n)) as an Arrow array of type `typ`."""
    values, valid, offsets = col.arrays(n)
    allvalid = bool(valid.all()) if n else True
    bitmap = None if allvalid else pa.py_buffer(np.packbits(valid, bitorder="little"))
    if col.kind == KIND_STR:
        arr = pa.Array.from_buffers(pa.large_string(), n, [bitmap, pa.py_buffer(offsets),
                                                           pa.py_buffer(values)])
        return arr.cast(typ) if typ != arr.type else arr
    if values.dtype == np.bool_:
        arr = pa.array(values, pa.bool_(), mask=None if allvalid else ~valid)
    else:
        arr = pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), n,
                                    [bitmap, pa.py_buffer(values)])
    return arr.cast(typ) if typ != arr.type else arr


class Memtable:
    def __init__(self) -> None:
        self.tables: dict[str, TableLog] = {}
        self.bytes = 0              # estimated bytes applied since the last flush (not reduced
                                    # by overwrites: a flush trigger, not an accounting)
        self.rows = 0               # rows appended (an overwrite of a ts counts again)
        self.min_version = 0        # lowest / highest version applied since the last flush
        self.max_version = 0
        self.max_epoch = 0
        self.first_write_at: float | None = None   # clock reading of the first unflushed row

    def __len__(self) -> int:
        return self.rows

    def apply(self, version: int, epoch: int, rows: Sequence[Sequence[Any]], now: float,
              nbytes: int | None, schemas: dict[str, dict[str, str]]) -> None:
        """Append a validated batch written by `version`: a Staged batch (parsed straight
        into columns) or a list of rows; `schemas` holds its columns."""
        if type(rows) is Staged:
            tables = self.tables
            for table, src in rows.tables.items():
                log = tables.get(table)
                if log is None:
                    log = tables[table] = TableLog()
                log.extend(src, version, epoch)
            self.rows += rows.rows
            self.bytes += rows.nbytes if nbytes is None else nbytes
        else:
            self.rows += apply_rows(self.tables, rows, version, epoch, schemas)
            self.bytes += sum(map(row_bytes, rows)) if nbytes is None else nbytes
        if not self.min_version:
            self.min_version = version
        self.max_version = max(self.max_version, version)
        self.max_epoch = max(self.max_epoch, epoch)
        if self.first_write_at is None:
            self.first_write_at = now

    def range(self, table: str, start: int, end: int, limit: int | None = None
              ) -> list[tuple[int, MemRow]]:
        """(ts, (version, epoch, values)) for start <= ts < end, in ts order, newest per ts;
        the first `limit` of them when given. `values` holds every column the table's log
        has (None where the row has none)."""
        log = self.tables.get(table)
        if log is None or end <= start:
            return []
        ts, ver, ep = log.arrays()
        pos = newest_positions(ts, log.increasing, start, end)[:limit]
        if not len(pos):
            return []
        n = log.n
        cols = [(name, col.py_values(pos, n)) for name, col in log.columns.items()]
        out = []
        for k, (t, v, e) in enumerate(zip(ts[pos].tolist(), ver[pos].tolist(),
                                          ep[pos].tolist())):
            out.append((t, (v, e, {name: vals[k] for name, vals in cols})))
        return out

    def to_arrow(self, table: str, schema: pa.Schema) -> pa.Table:
        """The table's newest row per ts, sorted by ts, in `schema` (ts, _version, _epoch,
        value columns; a column this log lacks is all null)."""
        log = self.tables[table]
        n = log.n
        ts, ver, ep = log.arrays()
        arrays = [pa.Array.from_buffers(schema.field("ts").type, n, [None, pa.py_buffer(ts)]),
                  pa.array(ver, pa.int64()), pa.array(ep, pa.int64())]
        for f in list(schema)[3:]:
            col = log.columns.get(f.name)
            arrays.append(pa.nulls(n, f.type) if col is None
                          else column_to_arrow(col, n, f.type))
        tbl = pa.Table.from_arrays(arrays, schema=schema)
        if not log.increasing:
            tbl = tbl.take(pa.array(newest_positions(ts, False)))
        return tbl

    def rows_in_order(self) -> list[tuple[str, int, int, int, dict]]:
        """Every row as (table, ts, version, epoch, values), in the order applied per table
        (for merging memtables after a failed flush: not a hot path)."""
        out = []
        for table, log in self.tables.items():
            ts, ver, ep = log.arrays()
            pos = np.arange(log.n, dtype=np.int64)
            cols = [(name, col.py_values(pos, log.n)) for name, col in log.columns.items()]
            for k in range(log.n):
                values = {name: vals[k] for name, vals in cols if vals[k] is not None}
                out.append((table, int(ts[k]), int(ver[k]), int(ep[k]), values))
        return out

    def split_above(self, version: int, now: float) -> "Memtable":
        """Move the rows written by versions above `version` into a new memtable (returned);
        this one keeps the rest. Per table a prefix cut in C (TableLog.split_at): versions
        never go down in a log's append order. The moved rows count their age from `now`
        (the flush that kept them back, docs/vnode.md §5); bytes are split in proportion to
        rows (an estimate, like the figure itself)."""
        kept = Memtable()
        if not self.rows or self.max_version <= version:
            return kept
        total_rows = self.rows
        max_version = max_epoch = 0
        min_kept = 0
        for table, log in list(self.tables.items()):
            ver = log.arrays()[1]
            pos = int(np.searchsorted(ver, version, "right"))
            if pos == log.n:
                max_version = max(max_version, int(ver[-1]))
                max_epoch = max(max_epoch, int(log.arrays()[2][-1]))
                continue
            first_kept = int(ver[pos])
            min_kept = first_kept if not min_kept else min(min_kept, first_kept)
            if pos:
                max_version = max(max_version, int(ver[pos - 1]))
                max_epoch = max(max_epoch, int(log.arrays()[2][pos - 1]))
            suffix = log.split_at(pos)
            kept.tables[table] = suffix
            kept.rows += suffix.n
            kept.max_epoch = max(kept.max_epoch, int(suffix.arrays()[2][-1]))
            if log.n == 0:
                del self.tables[table]
        kept.min_version = min_kept
        kept.max_version = self.max_version
        kept.first_write_at = now if kept.rows else None
        kept.bytes = self.bytes * kept.rows // total_rows
        self.rows -= kept.rows
        self.bytes -= kept.bytes
        self.max_version = max_version
        self.max_epoch = max_epoch
        if not self.rows:
            self.min_version = 0
            self.first_write_at = None
        return kept

    def seal(self) -> None:
        """Pad every column to its log's length. A flush reads a sealed memtable outside
        the vnode lock while queries read it under the lock: reading pads a short column
        (a write), so it must find nothing left to pad."""
        for log in self.tables.values():
            log.seal()

    def clear(self) -> None:
        self.__init__()
