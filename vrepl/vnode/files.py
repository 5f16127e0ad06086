"""Archived data files (Parquet) and the manifest that lists them (docs/vnode.md §files).

Owns: the layout under `<data path>/data/`, writing and reading one Parquet file per
(table, time bucket), the file "magic" (CRC-32C, never 0), committing the manifest
(replaced atomically; its format, `Manifest` with each file's index, relative name, size,
magic, table, ts range and version range, the table schemas and the archived version, is
vrepl/manifest.py's), and the removal of files no manifest names. Must not: know the
memtable or the WAL, or hold a lock (the Vnode does).

Index rule (seed 数据恢复流程 rules 1 and 4): the files of a manifest are ordered by
(bucket, table), oldest time range first; a file's index is its position, so indexes are
always the contiguous range 0..n-1, and index n is the manifest itself (the last file a
restore sends, so a slave never holds a manifest naming files it lacks). Rewriting a file set
gives it a new name; indexes are recomputed with every manifest and are only meaningful
together with it (a restore restarts when files change, seed: inotify).
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vrepl._core.crc32c import crc32c
# The manifest's format and durable writes have their own modules, which `vrepl ship` reads
# without pyarrow (issue 16); imported here also for the callers that take them from here.
from vrepl.durable import fsync_all, write_atomic
from vrepl.manifest import DATA_DIR, MANIFEST_NAME, ArchivedFile, Manifest
from vrepl.names import TABLE_NAME_RE
from vrepl.vnode.config import VnodeConfig
from vrepl.vnode.errors import ArchiveError

# The transactions' labels file (vrepl/vnode/txnapply.py), written with each manifest commit
# and listed by getFileInfo just before the manifest (docs/restore.md §3).
LABELS_FILE_NAME = "data/txn_labels.json"
PARQUET_COMPRESSION = "zstd"
# `ts` is sorted and unique in every archived file: delta encoding stores a regular series
# in a few hundred bytes and decodes it in under a third of the time its dictionary took (30,000
# rows: 0.17 against 0.57 ms; docs/benchmarks.md §Shipping, ninth session), which every
# ingest check and query of the file pays.
TS_ENCODING = "DELTA_BINARY_PACKED"


def parquet_options(names: Sequence[str]) -> dict[str, Any]:
    """`pq.write_table` options for an archived file whose columns are `names`: zstd, `ts`
    delta-encoded, the other columns dictionary-encoded where pyarrow finds it pays (its
    default)."""
    return {"compression": PARQUET_COMPRESSION, "use_dictionary": [n for n in names if n != "ts"],
            "column_encoding": {"ts": TS_ENCODING}}
META_PREFIX = b"vrepl."

ARROW_TYPES = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(),
               "bool": pa.bool_()}


def file_magic(data: bytes | memoryview | pa.Buffer) -> int:
    """The magic of a file's bytes: CRC-32C, or 1 if that is 0 (magic 0 means "no file")."""
    return crc32c(data) or 1


def data_file_name(table: str, bucket: int, version: int) -> str:
    """Relative name of the file of (table, bucket) written by the flush up to `version`.

    Unique per flush (archived versions only grow) and the same on every replica that
    flushed the same log prefix at the same point.
    """
    return f"{DATA_DIR}/{table}/b{bucket}-v{version}.parquet"


def rank(f: ArchivedFile, row_version: int) -> int:
    """What "later version wins" compares for a row of file `f` (docs/vnode.md §9.4): the
    ingest record's version for an ingested file, the row's own _version otherwise."""
    return f.ingest_version or row_version


def arrow_schema(precision: str, columns: dict[str, str]) -> pa.Schema:
    fields = [pa.field("ts", pa.timestamp(precision), nullable=False),
              pa.field("_version", pa.int64(), nullable=False),
              pa.field("_epoch", pa.int64(), nullable=False)]
    fields += [pa.field(c, ARROW_TYPES[t]) for c, t in columns.items()]
    return pa.schema(fields)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """The table with exactly the schema's columns (missing ones null, types cast)."""
    cols = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def newest_per_ts(table: pa.Table) -> pa.Table:
    """One row per ts, the one with the highest _version, sorted by ts (later version wins)."""
    if table.num_rows == 0:
        return table
    ts = pc.cast(table.column("ts"), pa.int64()).to_numpy()
    ver = table.column("_version").to_numpy()
    order = np.lexsort((-ver, ts))           # by ts, then newest version first
    ts_sorted = ts[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = ts_sorted[1:] != ts_sorted[:-1]
    return table.take(pa.array(order[first]))


class ArchiveStore:
    """The archived files of one vnode and their manifest, under `<path>/data`."""

    def __init__(self, path: str, cfg: VnodeConfig):
        self.path = path
        self.cfg = cfg
        self.data_dir = os.path.join(path, DATA_DIR)
        os.makedirs(self.data_dir, exist_ok=True)
        self.manifest_path = os.path.join(path, MANIFEST_NAME)
        self.manifest, self.manifest_bytes = self._load()
        self.remove_orphans()

    # -- manifest -------------------------------------------------------------------------
    def _load(self) -> tuple[Manifest, bytes]:
        try:
            with open(self.manifest_path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            m = Manifest(self.cfg.precision, self.cfg.file_span_ms)
            return m, b""
        m = Manifest.from_bytes(data, self.manifest_path)
        if (m.precision, m.file_span_ms) != (self.cfg.precision, self.cfg.file_span_ms):
            raise ArchiveError(self.manifest_path,
                               f"written with precision {m.precision!r} and file_span_ms"
                               f" {m.file_span_ms}; configured {self.cfg.precision!r} and"
                               f" {self.cfg.file_span_ms} (they cannot change)")
        return m, data

    def reload(self) -> None:
        """Read the manifest again (after a restore replaced it) and drop unnamed files."""
        self.manifest, self.manifest_bytes = self._load()
        self.remove_orphans()

    def commit(self, manifest: Manifest, superseded: Iterable[ArchivedFile] = ()) -> None:
        """Make `manifest` the current one (atomically, durably), then delete superseded files.

        A crash before the rename leaves the old manifest and its files; after it, the
        superseded files are orphans that the next load removes.
        """
        manifest.sort()
        data = manifest.to_bytes()
        write_atomic(self.manifest_path, data, self.cfg.fsync)
        self.manifest, self.manifest_bytes = manifest, data
        for f in superseded:
            try:
                os.unlink(self.abspath(f.name))
            except FileNotFoundError:
                pass

    def remove_orphans(self) -> list[str]:
        """Delete data files and temp files no manifest names (left by a crash mid-flush)."""
        named = {f.name for f in self.manifest.files}
        removed = []
        for table in os.listdir(self.data_dir):
            tdir = os.path.join(self.data_dir, table)
            if not os.path.isdir(tdir) or TABLE_NAME_RE.fullmatch(table) is None:
                continue
            for fname in os.listdir(tdir):
                rel = f"{DATA_DIR}/{table}/{fname}"
                if (fname.endswith(".parquet") and rel not in named) or \
                        fname.endswith(".parquet.tmp"):
                    os.unlink(os.path.join(tdir, fname))
                    removed.append(rel)
        tmp = self.manifest_path + ".tmp"
        if os.path.exists(tmp):
            os.unlink(tmp)
        return removed

    # -- files ----------------------------------------------------------------------------
    def link_in(self, links: Iterable[tuple[str, str]]) -> None:
        """Put staged files into the archive: each (source path, name) becomes a second
        link under `name`; the staged copy stays until the manifest naming `name` is
        durable (a crash before that leaves `name` an orphan, removed at open, and the
        round still staged). The directories that gained a name are fsynced once each,
        together (and `data/` when a table's directory is new)."""
        dirs: set[str] = set()
        for src, name in links:
            dst = self.abspath(name)
            d = os.path.dirname(dst)
            if d not in dirs and not os.path.isdir(d):
                os.makedirs(d)
                dirs.add(os.path.dirname(d))
            dirs.add(d)
            try:
                os.unlink(dst)          # left by an apply that failed before its commit
            except FileNotFoundError:
                pass
            os.link(src, dst)
        if self.cfg.fsync:
            fsync_all(sorted(dirs))

    def entry(self, name: str) -> ArchivedFile | None:
        """The manifest's entry of the file called `name`, if it names one."""
        return next((f for f in self.manifest.files if f.name == name), None)

    def abspath(self, name: str) -> str:
        return os.path.join(self.path, *name.split("/"))

    def files_of(self, table: str, bucket_lo: int, bucket_hi: int) -> list[ArchivedFile]:
        """Files of a table whose bucket is in [bucket_lo, bucket_hi]."""
        return [f for f in self.manifest.files
                if f.table == table and bucket_lo <= f.bucket <= bucket_hi]

    def read(self, f: ArchivedFile) -> pa.Table:
        """The rows of an archived file, verified against its size and magic."""
        path = self.abspath(f.name)
        with open(path, "rb") as fh:      # FileNotFoundError: the caller may retry
            data = fh.read()
        if len(data) != f.size:
            raise ArchiveError(path, f"corrupt archived file: {len(data)} bytes, the manifest"
                               f" says {f.size}")
        magic = file_magic(data)
        if magic != f.magic:
            raise ArchiveError(path, f"corrupt archived file: magic (CRC-32C) {magic:#010x},"
                               f" the manifest says {f.magic:#010x}")
        return self.parse(data, path)

    def parse(self, data: bytes, path: str) -> pa.Table:
        try:
            return pq.read_table(pa.BufferReader(data))
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ArchiveError(path, f"corrupt Parquet file: {exc}") from None

    def write(self, table: str, bucket: int, version: int, rows: pa.Table) -> ArchivedFile:
        """Write one archived file (temp, fsync, rename) and describe it."""
        name = data_file_name(table, bucket, version)
        path = self.abspath(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        vers = rows.column("_version")
        ts = pc.cast(rows.column("ts"), pa.int64())
        meta = {b"vrepl.table": table.encode(), b"vrepl.bucket": str(bucket).encode(),
                b"vrepl.archived_version": str(version).encode(),
                b"vrepl.precision": self.cfg.precision.encode()}
        rows = rows.replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        pq.write_table(rows, sink, **parquet_options(rows.column_names))
        buf = sink.getvalue()
        write_atomic(path, buf, self.cfg.fsync)
        return ArchivedFile(name, buf.size, file_magic(buf), table, bucket,
                            pc.min(ts).as_py(), pc.max(ts).as_py(),
                            pc.min(vers).as_py(), pc.max(vers).as_py(), rows.num_rows)
