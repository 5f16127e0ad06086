"""The memtable: rows not yet archived, per table, keyed by timestamp.

Owns: the newest row per (table, ts) among versions above the archived version, the version
and epoch that wrote each row, and the size/age figures that trigger a flush. Must not: do
I/O, validate (rows arrive validated), or lock (the Vnode's lock covers it).

Same ts written twice: the later version wins (docs/vnode.md §later-version-wins). Rows are
applied in version order, so "later" is simply "applied later"; within one batch a later row
for the same (table, ts) replaces an earlier one. The replaced row is gone: a memtable keeps
one row per (table, ts), as TDengine's does.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from vrepl.vnode.rows import row_bytes

# One stored row: (version, epoch, values). Values are the client's dict, not copied.
MemRow = tuple[int, int, dict]


@dataclass
class TableMem:
    rows: dict[int, MemRow] = field(default_factory=dict)
    keys: list[int] = field(default_factory=list)   # the ts of `rows`, sorted

    def put(self, ts: int, row: MemRow) -> bool:
        """Store a row; True if the ts is new to this table."""
        new = ts not in self.rows
        self.rows[ts] = row
        if new:
            keys = self.keys
            # Time series mostly arrive in ts order: appending is the common case.
            if not keys or ts > keys[-1]:
                keys.append(ts)
            else:
                bisect.insort(keys, ts)
        return new

    def range(self, start: int, end: int) -> Iterator[tuple[int, MemRow]]:
        """(ts, row) for start <= ts < end, in ts order."""
        keys = self.keys
        lo = bisect.bisect_left(keys, start)
        hi = bisect.bisect_left(keys, end)
        rows = self.rows
        for i in range(lo, hi):
            ts = keys[i]
            yield ts, rows[ts]


class Memtable:
    def __init__(self) -> None:
        self.tables: dict[str, TableMem] = {}
        self.bytes = 0              # estimated bytes applied since the last flush (not reduced
                                    # by overwrites: a flush trigger, not an accounting)
        self.rows = 0               # distinct (table, ts) held
        self.min_version = 0        # lowest / highest version applied since the last flush
        self.max_version = 0
        self.max_epoch = 0
        self.first_write_at: float | None = None   # clock reading of the first unflushed row

    def __len__(self) -> int:
        return self.rows

    def apply(self, version: int, epoch: int, rows: Sequence[Sequence[Any]], now: float,
              nbytes: int | None = None) -> None:
        """Apply a validated batch written by `version` (later rows win, see module doc)."""
        tables = self.tables
        added = 0
        size = 0
        for table, ts, values in rows:
            tm = tables.get(table)
            if tm is None:
                tm = tables[table] = TableMem()
            if tm.put(ts, (version, epoch, values)):
                added += 1
            if nbytes is None:
                size += row_bytes((table, ts, values))
        self.rows += added
        self.bytes += size if nbytes is None else nbytes
        if not self.min_version:
            self.min_version = version
        self.max_version = max(self.max_version, version)
        self.max_epoch = max(self.max_epoch, epoch)
        if self.first_write_at is None:
            self.first_write_at = now

    def range(self, table: str, start: int, end: int) -> list[tuple[int, MemRow]]:
        tm = self.tables.get(table)
        return list(tm.range(start, end)) if tm is not None else []

    def clear(self) -> None:
        self.__init__()
