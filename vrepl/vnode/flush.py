"""Flushing a vnode: archiving the memtable's committed rows and the rounds of ingested
files (the mixin VnodeFlush of Vnode, vrepl/vnode/vnode.py; docs/vnode.md §5, §9.3).

Owns: when a flush is due (size, age, a committed round), where each flush step cuts (the
limit it is given, stopping at a pending round), turning the memtable's rows up to the cut
into the immutable `imem` and writing them, merged with the current files, as new archived
files, linking a staged round's files into the archive, and the manifest commit of each
step; the apply kill points of a round (vrepl/killpoints.py).
The state it works on (the memtable, the archive store, the schemas, the pending rounds, the
locks) lives on Vnode and is set up by its __init__; the lock order is _flush_lock, then
_lock.
Must not: archive a version above the limit it is given (the group's commit index), write
the WAL (it may ask a given writer to recycle it once archived), or hold _lock while it
writes Parquet files.
"""
from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from vrepl.directio import drop_cached
from vrepl.killpoints import killpoint, register
from vrepl.vnode import staging as S
from vrepl.vnode.errors import VnodeError
from vrepl.vnode.files import ArchivedFile, Manifest, arrow_schema, conform, newest_per_ts
from vrepl.vnode.memtable import Memtable, TableLog

# Kill points of applying a round (docs/vnode.md §9.5; vrepl/killpoints.py).
KP_APPLY_FILES = register("ingest.apply.after_flush_files",
                          "applying a round: the memtable rows below it are written to new"
                          " files; the round's files are still only staged, the manifest is"
                          " the old one")
KP_APPLY_LINK = register("ingest.apply.after_link",
                         "applying a round: its files are linked into data/ too; the manifest"
                         " is still the old one (they are orphans until it changes)")
KP_APPLY_MANIFEST = register("ingest.apply.after_manifest",
                             "applying a round: the manifest naming its files is durable; the"
                             " staged copies are not removed yet")
KP_APPLY_CLEANUP = register("ingest.apply.after_cleanup",
                            "applying a round: done, the staged copies are removed")


@dataclass
class PendingIngest:
    """A format-8 record applied to the vnode (its version taken) whose round is not yet in
    the archive: it goes in at the first flush whose limit reaches its version, once every
    file it names is staged (docs/vnode.md §9.3)."""

    version: int
    epoch: int
    record: S.IngestRecord
    staged: bool
    # A published transaction's inline rows as a memtable, built by the first read that
    # needs them while the round waits for its flush (vrepl/vnode/query.py).
    held: Memtable | None = None


class VnodeFlush:
    # -- flush ----------------------------------------------------------------------------
    def flush_due(self, now: float | None = None, up_to_version: int | None = None
                  ) -> str | None:
        """Why the memtable should be flushed now, or None.

        `up_to_version` is the limit a flush would archive up to (docs/vnode.md §5: the
        group's commit index; None = everything applied): a memtable with no row at or
        below it has nothing to archive, so no flush is due, whatever its size or age.
        A round of ingested files (§9) at or below the limit whose files are all staged is
        due at once; one whose files are not all staged yet stops the limit below it.
        """
        cfg = self.config
        with self._lock:
            p = next(iter(self._ingests.values()), None)
            mem = self._mem
            why = None
            if not mem.rows:
                pass
            elif mem.bytes >= cfg.max_memtable_bytes:
                why = f"memtable holds {mem.bytes} bytes >= max_memtable_bytes"
            elif mem.rows >= cfg.max_memtable_rows:
                why = f"memtable holds {mem.rows} rows >= max_memtable_rows"
            else:
                age_ms = ((self._clock() if now is None else now) - mem.first_write_at) * 1000
                if age_ms >= cfg.max_memtable_age_ms:
                    why = f"oldest unflushed row is {age_ms:.0f} ms old >= max_memtable_age_ms"
            if why is None and p is None:
                return None     # nothing due whatever the limit: skip computing it
            # The limit (the open transactions' rule walks finished ones) only once due.
            limit = self._next_cut(self._limit(up_to_version), up_to_version is None)[0]
            if p is not None and p.staged and p.version <= limit:
                return f"round {p.record.round} of ingested files at v{p.version} is committed"
            if not mem.rows or mem.min_version > limit:
                return None
            return why

    def maybe_flush(self, wal: Any = None, up_to_version: int | None = None
                    ) -> list[ArchivedFile]:
        """flush(wal, up_to_version) if flush_due(); the files written (none if not due)."""
        with self._lock:
            if self.flush_due(up_to_version=up_to_version) is None:
                return []
            return self.flush(wal, up_to_version)

    def archive_held_by(self, version: int) -> int | None:
        """The transaction (its id: its begin version) whose begin holds the archive below
        `version` now (docs/transactions.md §4: a flush never passes the begin of an open
        transaction), or None. A round at `version` is then readable but not archived
        until that transaction finishes."""
        with self._lock:
            # Judged at the applied version: a transaction finished since is no holder.
            cut = self.txns.flush_limit(max(version, self.applied_version))
            return cut + 1 if cut < version else None

    def _limit(self, up_to_version: int | None) -> int:
        limit = self.applied_version if up_to_version is None \
            else min(up_to_version, self.applied_version)
        # Never past the begin of a transaction unfinished at the cut (docs/transactions.md
        # §4): its staged rows are rebuilt from the WAL above the archive.
        return self.txns.flush_limit(limit)

    def _next_cut(self, limit: int, strict: bool) -> tuple[int, PendingIngest | None]:
        """(lock held) Where the next flush step cuts, and the round it applies if any: the
        limit, or the version of the first pending round at or below it (applied with the
        rows below it when its files are staged; otherwise the cut stops just below it:
        nothing above an unapplied round is archived; `strict` refuses that instead)."""
        p = next(iter(self._ingests.values()), None)
        if p is None or p.version > limit:
            return limit, None
        if p.staged:
            return p.version, p
        if strict:
            # A tool that owns the whole log (vrepl replay) must archive everything applied.
            raise VnodeError(f"v{p.version}: the round {p.record.round} of ingested files is"
                             f" not staged in {S.staged_round_path(self.path, p.record.round)}"
                             f" (missing files {S.missing_staged(self.path, p.record)}): copy"
                             f" the vgroup's ingest/ directory along with its WAL")
        return p.version - 1, None

    def flush(self, wal: Any = None, up_to_version: int | None = None) -> list[ArchivedFile]:
        """Archive the memtable's rows written by versions <= up_to_version, and every
        round of ingested files up to it; returns the files written by flushing rows.

        `up_to_version` is the highest version the group has committed (docs/vnode.md §5):
        a version above it may still be cut from the log (a deposed master's suffix), and
        archived files cannot be cut. None archives everything applied, for a tool that
        owns the whole log (`vrepl replay`). Rows above the limit stay in the memtable (and
        the WAL); the manifest's archived_version is the limit actually archived.

        Under the lock, the memtable's rows up to the cut become the immutable `imem`
        (still queried) and a new memtable takes the rest and the writes; the files are
        written outside the lock, so writes and queries go on meanwhile. For every (table,
        bucket) imem touches: merge the current flushed file (if any) with imem's rows,
        newest version per ts winning, and write a new file; then, under the lock again,
        commit a manifest naming the new files with archived_version = the cut, delete the
        replaced files and drop imem. Only then may the WAL below archived_version + 1 go:
        `wal.recycle(archived_version + 1)` if a WalWriter is given, else the owner reads
        `archived_version`.

        A pending round (§9) is a flush point: the cut stops at its version, and the same
        manifest commit adds its files (linked in from the staging area) with
        archived_version = its version; the next step goes on above it. A round whose
        files are not all staged stops the flush just below it.
        """
        written: list[ArchivedFile] = []
        applied: list[str] = []     # the files of the rounds this flush archived
        archived = 0
        with self._flush_lock:
            with self._lock:
                limit = self._limit(up_to_version)     # fixed: later writes wait
            while True:
                with self._lock:
                    self._check_open()
                    cut, ingest = self._next_cut(limit, up_to_version is None)
                    mem: Memtable | None = self._mem
                    if not mem.rows or mem.min_version > cut:
                        mem = None
                    if mem is None and ingest is None:
                        break
                    if mem is not None:
                        self._mem = mem.split_above(cut, self._clock())
                        mem.seal()    # read outside the lock from here on: nothing to pad
                        self._imem = mem
                    old = self._store.manifest
                    epoch = max(old.archived_epoch, mem.max_epoch if mem is not None else 0,
                                ingest.epoch if ingest is not None else 0)
                    schemas = copy.deepcopy(self._schemas)
                linked: list[ArchivedFile] = []
                try:
                    wmem = mem
                    # A published transaction's inline rows (docs/transactions.md §4.1) go
                    # into this step's files from a memtable no query reads: they become
                    # visible with the transaction's files, in the same manifest commit.
                    held = getattr(ingest.record, "held_rows", ()) if ingest is not None else ()
                    if held:
                        wmem = Memtable()
                        wmem.apply(ingest.version, ingest.epoch, held, self._clock(), None,
                                   schemas)
                        if mem is not None:
                            wmem = self._merge_back(mem, wmem, schemas)
                    if wmem is not None:
                        step, superseded, files = self._write_files(wmem, old, cut, schemas)
                    else:
                        step, superseded, files = [], [], list(old.files)
                    if ingest is not None:
                        killpoint(KP_APPLY_FILES)
                        # Record version 2: the files it removes leave this manifest and
                        # are deleted once it is durable (as superseded files are).
                        files, removed = S.apply_removes(files, ingest.record.removes)
                        superseded = superseded + removed
                        linked = self._link_round(ingest)
                        files += linked
                        killpoint(KP_APPLY_LINK)
                except BaseException:
                    if mem is not None:
                        with self._lock:   # keep the rows: put imem back under newer writes
                            self._mem = self._merge_back(mem, self._mem, self._schemas)
                            self._imem = None
                    raise
                with self._lock:
                    # The labels of the transactions finished up to the cut, before the
                    # manifest that archives it (docs/transactions.md §4).
                    self.txns.save(cut)
                    manifest = Manifest(old.precision, old.file_span_ms, cut, epoch, schemas,
                                        files)
                    self._store.commit(manifest, superseded)
                    self._imem = None
                    if ingest is not None:
                        del self._ingests[ingest.version]
                written += step
                archived = cut
                if ingest is not None:
                    killpoint(KP_APPLY_MANIFEST)
                    # Fsynced when staged, read again only by queries: out of the page cache
                    # once the lock is free (vrepl/directio.py drop_cached says why).
                    applied += [self._store.abspath(f.name) for f in linked]
                    # Durable in the manifest: the staged copies may go (a crash before this
                    # leaves them to clean_staging at the next open).
                    for rid in getattr(ingest.record, "staged_rounds", (ingest.record.round,)):
                        shutil.rmtree(S.staged_round_path(self.path, rid), ignore_errors=True)
                    killpoint(KP_APPLY_CLEANUP)
        if wal is not None and archived:
            wal.recycle(archived + 1)
        for path in applied:
            drop_cached(path)
        return written

    def _link_round(self, p: PendingIngest) -> list[ArchivedFile]:
        """Link the staged files of round `p` into the archive; their manifest entries."""
        rec = p.record
        missing = S.missing_staged(self.path, rec)
        if missing:     # removed or damaged since it was found staged
            raise VnodeError(f"v{p.version}: files {missing} of round {rec.round} are no"
                             f" longer staged")
        out = []
        self._store.link_in((S.abspath(self.path, rec.staged_name(k)), rec.archive_name(p.version, k))
                            for k in range(len(rec.files)))
        for k, f in enumerate(rec.files):
            name = rec.archive_name(p.version, k)
            out.append(ArchivedFile(name, f.size, f.crc32c, f.table, f.bucket, f.ts_min,
                                    f.ts_max, f.min_version, f.max_version, f.rows,
                                    p.version, p.epoch, f.origin))
        return out

    def _write_files(self, mem: Memtable, old: Manifest, version: int,
                     schemas: dict[str, dict[str, str]]):
        store = self._store
        span = self.config.file_span
        # Ingested files (§9) stay as they are: a flush merges only with its own files.
        current = {(f.table, f.bucket): f for f in old.files if not f.ingest_version}
        files = dict(current)
        written, superseded = [], []
        for table in mem.tables:
            schema = arrow_schema(self.config.precision, schemas.get(table, {}))
            tbl = mem.to_arrow(table, schema)      # newest row per ts, sorted by ts
            ts = tbl.column("ts").to_numpy().astype(np.int64)
            buckets = ts // span
            cuts = np.flatnonzero(buckets[1:] != buckets[:-1]) + 1
            for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(ts)]):
                bucket = int(buckets[lo])
                new = tbl.slice(lo, hi - lo)
                prev = current.get((table, bucket))
                if prev is not None:
                    new = newest_per_ts(pa.concat_tables(
                        [conform(store.read(prev), schema), new]))
                    superseded.append(prev)
                af = store.write(table, bucket, version, new)
                files[(table, bucket)] = af
                written.append(af)
        return written, superseded, [f for f in old.files if f.ingest_version] + list(files.values())

    @staticmethod
    def _merge_back(older: Memtable, newer: Memtable,
                    schemas: dict[str, dict[str, str]]) -> Memtable:
        """A failed flush: one memtable holding older's rows overwritten by newer's."""
        merged = Memtable()
        for m in (older, newer):
            for table, ts, version, epoch, values in m.rows_in_order():
                log = merged.tables.get(table)
                if log is None:
                    log = merged.tables[table] = TableLog()
                log.append_row(ts, version, epoch, values, schemas.get(table))
            merged.rows += m.rows
            merged.min_version = merged.min_version or m.min_version
            merged.max_version = max(merged.max_version, m.max_version)
            merged.max_epoch = max(merged.max_epoch, m.max_epoch)
            if merged.first_write_at is None:
                merged.first_write_at = m.first_write_at
        merged.bytes = older.bytes + newer.bytes
        return merged
