"""Reading a vnode: queries by time range and the table list (the mixin VnodeQuery of Vnode,
vrepl/vnode/vnode.py; docs/vnode.md).

Owns: merging the memtable, the memtable being flushed (`imem`) and the archived files into
rows, the newest version per ts winning (by rank for ingested files, docs/vnode.md §9.4),
and the table list from the manifest and the memtables.
The state it reads lives on Vnode; it snapshots it under Vnode._lock and reads archived
files outside the lock (a flush's file swap makes it snapshot again).
Must not: change any state of the vnode.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from vrepl.vnode import rows as R
from vrepl.vnode.errors import VnodeError
from vrepl.vnode.files import arrow_schema, conform, rank

QUERY_RETRIES = 3            # a query that lost a race with a flush's file swap tries again


class VnodeQuery:
    def has_table(self, table: str) -> bool:
        """Whether this vnode holds at least one row of `table` (archived or in memory)."""
        with self._lock:
            return (table in self._mem.tables
                    or (self._imem is not None and table in self._imem.tables)
                    or any(f.table == table for f in self._store.manifest.files))

    def tables(self) -> list[dict[str, Any]]:
        """The tables this vnode holds rows of, by name: {"name", "columns" ({column:
        type}, the columns with a type, in the order first seen), "archived_rows" (rows in
        archived files: exact), "memtable_rows" (rows applied since the last flush: an
        overwrite of a ts counts again)}. From the manifest and the memtable: no file is
        read."""
        with self._lock:
            archived: dict[str, int] = {}
            for f in self._store.manifest.files:
                archived[f.table] = archived.get(f.table, 0) + f.rows
            mem: dict[str, int] = {}
            for m in (self._mem, self._imem):
                if m is not None:
                    for table, tlog in m.tables.items():
                        mem[table] = mem.get(table, 0) + tlog.n
            return [{"name": t, "columns": dict(self._schemas.get(t, {})),
                     "archived_rows": archived.get(t, 0), "memtable_rows": mem.get(t, 0)}
                    for t in sorted(archived.keys() | mem.keys())]

    def query(self, table: str, start: int, end: int, seen: list[int] | None = None
              ) -> list[dict[str, Any]]:
        """Rows of `table` with start <= ts < end, in ts order, newest version per ts.

        Each row is {"ts", "_version", "_epoch", <every column of the table's schema>}
        (None where a row has no value). Archived files are verified (size, magic) as read.
        `seen`, when given, gets the applied version the rows were taken at (the visible
        version: every published transaction up to it, docs/transactions.md §4).
        """
        if type(table) is not str or R.TABLE_NAME_RE.fullmatch(table) is None:
            raise VnodeError(f"table name {table!r} does not match {R.TABLE_NAME_RULE}")
        if end <= start:
            return []
        span = self.config.file_span
        for attempt in range(QUERY_RETRIES):
            with self._lock:
                self._check_open()
                mem_rows = self._mem.range(table, start, end)
                imem_rows = self._imem.range(table, start, end) if self._imem else []
                files = self._store.files_of(table, start // span, (end - 1) // span)
                columns = dict(self._schemas.get(table, {}))
                if seen is not None:
                    seen.append(self.applied_version)
            try:
                archived = [self._store.read(f) for f in files]
                break
            except FileNotFoundError:
                # A flush replaced a file between our snapshot and the read: snapshot again.
                if attempt == QUERY_RETRIES - 1:
                    raise
        # Later version wins, by rank (docs/vnode.md §9.4): a row's own _version, or for the
        # rows of an ingested file the version of the record that ingested it.
        out: dict[int, dict[str, Any]] = {}
        ranks: dict[int, int] = {}
        if archived:
            qschema = arrow_schema(self.config.precision, columns)
            qschema = qschema.set(0, pa.field("ts", pa.int64()))
            for f, tbl in zip(files, archived):
                tbl = conform(tbl, qschema)
                ts = tbl.column("ts")
                tbl = tbl.filter(pc.and_(pc.greater_equal(ts, start), pc.less(ts, end)))
                for row in tbl.to_pylist():
                    r = rank(f, row["_version"])
                    prev = ranks.get(row["ts"])
                    if prev is None or r >= prev:
                        out[row["ts"]] = row
                        ranks[row["ts"]] = r
        floats = [c for c, t in columns.items() if t == R.TYPE_FLOAT]
        for ts, (version, epoch, values) in (*imem_rows, *mem_rows):
            prev = ranks.get(ts)
            if prev is not None and prev > version:
                continue
            row = {"ts": ts, "_version": version, "_epoch": epoch}
            for c in columns:
                row[c] = values.get(c)
            for c in floats:
                if type(row[c]) is int:
                    row[c] = float(row[c])
            out[ts] = row
        return [out[ts] for ts in sorted(out)]
