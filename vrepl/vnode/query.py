"""Reading a vnode: queries by time range and the table list (the mixin VnodeQuery of Vnode,
vrepl/vnode/vnode.py; docs/vnode.md).

Owns: merging the memtable, the memtable being flushed (`imem`), the archived files and the
rounds applied but not yet archived (their staged files and a published transaction's
inline rows, as the flush will archive them) into rows, the newest version per ts winning
(by rank for ingested files, docs/vnode.md §9.4), and the table list from the manifest,
the pending rounds and the memtables.
The state it reads lives on Vnode; it snapshots it under Vnode._lock and reads archived
and staged files outside the lock (a flush's file swap, or the removal of a round's staged
copies once archived, makes it snapshot again).
Must not: change any state of the vnode.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from vrepl.vnode import rows as R
from vrepl.vnode import staging as S
from vrepl.vnode.errors import VnodeError
from vrepl.vnode.files import ArchivedFile, arrow_schema, conform, rank
from vrepl.vnode.memtable import Memtable

QUERY_RETRIES = 3            # a query that lost a race with a flush's file swap tries again


class VnodeQuery:
    def _readable_rounds(self) -> list[Any]:
        """(lock held) The rounds applied here and not yet archived that a read shows, in
        version order. A round is read from the archive once its flush (a flush point, due
        at once) archived it, milliseconds after it is applied: so none, as long as every
        pending round can be archived now. While an open transaction holds the archive
        below one of them (docs/transactions.md §4: no flush passes its begin; it may stay
        open up to its timeout), its readers must not wait with it: then every pending
        round is read as its flush will archive it, up to the first whose files are not
        all staged here, since a flush archives them in that order and none past it."""
        out = []
        for p in self._ingests.values():
            if not p.staged:
                break
            out.append(p)
        if not out or self.txns.flush_limit(self.applied_version) >= out[-1].version:
            return []
        return out

    def _held_rows(self, p: Any) -> Memtable | None:
        """(lock held) A published transaction's inline rows as a memtable (built once, as
        the flush builds them), or None for a round without any."""
        held = getattr(p.record, "held_rows", ())
        if not held:
            return None
        if p.held is None:
            m = Memtable()
            m.apply(p.version, p.epoch, held, self._clock(), None, self._schemas)
            p.held = m
        return p.held

    def has_table(self, table: str) -> bool:
        """Whether this vnode holds at least one row of `table` (archived, in memory, or in
        a round applied and not yet archived)."""
        with self._lock:
            if (table in self._mem.tables
                    or (self._imem is not None and table in self._imem.tables)
                    or any(f.table == table for f in self._store.manifest.files)):
                return True
            for p in self._readable_rounds():
                held = self._held_rows(p)
                if any(f.table == table for f in p.record.files) or (held is not None
                                                                    and table in held.tables):
                    return True
            return False

    def tables(self) -> list[dict[str, Any]]:
        """The tables this vnode holds rows of, by name: {"name", "columns" ({column:
        type}, the columns with a type, in the order first seen), "archived_rows" (rows in
        archived files: exact), "memtable_rows" (rows applied since the last flush: an
        overwrite of a ts counts again; a round applied and not yet archived counts its
        files' rows here)}. From the manifest, the pending rounds and the memtable: no file
        is read."""
        with self._lock:
            archived: dict[str, int] = {}
            for f in self._store.manifest.files:
                archived[f.table] = archived.get(f.table, 0) + f.rows
            mem: dict[str, int] = {}
            rounds = self._readable_rounds()
            for p in rounds:
                for f in p.record.files:
                    mem[f.table] = mem.get(f.table, 0) + f.rows
            for m in (self._mem, self._imem, *(self._held_rows(p) for p in rounds)):
                if m is not None:
                    for table, tlog in m.tables.items():
                        mem[table] = mem.get(table, 0) + tlog.n
            return [{"name": t, "columns": dict(self._schemas.get(t, {})),
                     "archived_rows": archived.get(t, 0), "memtable_rows": mem.get(t, 0)}
                    for t in sorted(archived.keys() | mem.keys())]

    def query(self, table: str, start: int, end: int, seen: list[int] | None = None,
              limit: int | None = None) -> list[dict[str, Any]]:
        """Rows of `table` with start <= ts < end, in ts order, newest version per ts; with
        `limit`, only the first `limit` of them.

        Each row is {"ts", "_version", "_epoch", <every column of the table's schema>}
        (None where a row has no value). Archived files are verified (size, magic) as read.
        `seen`, when given, gets the applied version the rows were taken at (the visible
        version: every published transaction up to it, docs/transactions.md §4).
        `limit` is applied to each source before its rows become Python objects: each one
        (a file, the memtable) holds a ts once and in order, so the first `limit` ts of the
        merge are among each source's first `limit`, and every row that competes for one of
        them is kept. Without it, a read of one row of a table holding a 100 MiB file
        turned every row into a dict, for seconds with the GIL held: the node's I/O thread
        starved and the replica lost its role (docs/benchmarks.md §Transactions, bulk).
        """
        if type(table) is not str or R.TABLE_NAME_RE.fullmatch(table) is None:
            raise VnodeError(f"table name {table!r} does not match {R.TABLE_NAME_RULE}")
        if end <= start:
            return []
        span = self.config.file_span
        lo, hi = start // span, (end - 1) // span
        for attempt in range(QUERY_RETRIES):
            with self._lock:
                self._check_open()
                mem_rows = self._mem.range(table, start, end, limit)
                imem_rows = self._imem.range(table, start, end, limit) if self._imem else []
                files = self._store.files_of(table, lo, hi)
                held_rows = []
                # Rounds applied and not yet archived, read as their flush will archive
                # them: what each removes leaves, its staged files join (ranked by its
                # version), and a transaction's inline rows rank by its publish version.
                for p in self._readable_rounds():
                    rec = p.record
                    files, _ = S.apply_removes(files, rec.removes)
                    files += [ArchivedFile(rec.staged_name(k), f.size, f.crc32c, f.table, f.bucket,
                                           f.ts_min, f.ts_max, f.min_version, f.max_version, f.rows,
                                           p.version, p.epoch, f.origin)
                              for k, f in enumerate(rec.files)
                              if f.table == table and lo <= f.bucket <= hi]
                    held = self._held_rows(p)
                    if held is not None:
                        held_rows += held.range(table, start, end, limit)
                columns = dict(self._schemas.get(table, {}))
                if seen is not None:
                    seen.append(self.applied_version)
            try:
                archived = [self._store.read(f) for f in files]
                break
            except FileNotFoundError:
                # A flush replaced a file between our snapshot and the read, or archived a
                # round and removed its staged copies: snapshot again.
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
                if limit is not None:
                    tbl = tbl.slice(0, limit)
                for row in tbl.to_pylist():
                    r = rank(f, row["_version"])
                    prev = ranks.get(row["ts"])
                    if prev is None or r >= prev:
                        out[row["ts"]] = row
                        ranks[row["ts"]] = r
        floats = [c for c, t in columns.items() if t == R.TYPE_FLOAT]

        def as_row(ts: int, version: int, epoch: int, values: dict[str, Any]) -> dict[str, Any]:
            row = {"ts": ts, "_version": version, "_epoch": epoch}
            for c in columns:
                row[c] = values.get(c)
            for c in floats:
                if type(row[c]) is int:
                    row[c] = float(row[c])
            return row

        # A pending transaction's inline rows rank by its publish version, as the file its
        # flush writes them into will.
        for ts, (version, epoch, values) in held_rows:
            prev = ranks.get(ts)
            if prev is None or version >= prev:
                out[ts] = as_row(ts, version, epoch, values)
                ranks[ts] = version
        for ts, (version, epoch, values) in (*imem_rows, *mem_rows):
            prev = ranks.get(ts)
            if prev is not None and prev > version:
                continue
            out[ts] = as_row(ts, version, epoch, values)
        return [out[ts] for ts in sorted(out)[:limit]]
