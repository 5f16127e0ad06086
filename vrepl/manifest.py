"""The manifest of a vnode's archived files: its on-disk format (docs/vnode.md §files).

Owns: `Manifest` (JSON, format 1: precision, file span, archived version and epoch, the
table schemas, and one `ArchivedFile` entry per file: index, relative name, size, magic,
table, bucket, ts and version ranges, rows, and for an ingested file its record), its
encoding and its validating parser, the file names a manifest may hold (`name_invalid`),
and where the manifest and the data files live under a data path. vrepl/vnode/files.py
writes the files and commits manifests; `vrepl ship` reads a vnode's manifest through this
module alone. Must not: import pyarrow or numpy, or anything of vrepl.vnode (the package
loads the whole vnode: `vrepl ship` starts without it, issue 16).

Index rule (seed 数据恢复流程 rules 1 and 4): the files of a manifest are ordered by
(bucket, table), oldest time range first; a file's index is its position, so indexes are
always the contiguous range 0..n-1, and index n is the manifest itself (docs/vnode.md
§files; vrepl/vnode/files.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vrepl.errors import ArchiveError
from vrepl.names import COLUMN_NAME_RE, TABLE_NAME_RE, TYPE_NAMES

DATA_DIR = "data"
MANIFEST_NAME = "data/manifest.json"
MANIFEST_FORMAT = 1


def name_invalid(name: Any) -> str | None:
    """Why a relative file name (from a peer) is not one this vnode could own, or None."""
    if not isinstance(name, str) or not name:
        return "empty file name"
    if name.startswith("/") or "\\" in name or "\0" in name:
        return f"file name {name!r} is not a relative path"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return f"file name {name!r} has an empty, '.' or '..' component"
    if name == MANIFEST_NAME:
        return None
    if (
        len(parts) != 3
        or parts[0] != DATA_DIR
        or TABLE_NAME_RE.fullmatch(parts[1]) is None
        or not parts[2].endswith(".parquet")
    ):
        return f"file name {name!r} is not data/<table>/<file>.parquet"
    return None


@dataclass(frozen=True)
class ArchivedFile:
    """One archived file as the manifest records it."""

    name: str  # relative to the data path, '/'-separated
    size: int
    magic: int
    table: str
    bucket: int  # ts // file span
    ts_min: int
    ts_max: int
    min_version: int
    max_version: int
    rows: int
    # An ingested file (docs/vnode.md §9): the version and epoch of the record that added it
    # (0 for a file a flush wrote) and who wrote its rows. Its rows keep their origin's
    # _version/_epoch (min/max_version above are the origin's); merges rank them by
    # ingest_version (rank()).
    ingest_version: int = 0
    ingest_epoch: int = 0
    origin: str = ""

    def to_json(self, index: int) -> dict[str, Any]:
        # Field by field, in the dataclass's order (the bytes asdict gave): asdict deep-copies
        # and took half of a 2,000-file manifest's to_bytes, which an ingest writes per batch.
        doc = {
            "index": index,
            "name": self.name,
            "size": self.size,
            "magic": self.magic,
            "table": self.table,
            "bucket": self.bucket,
            "ts_min": self.ts_min,
            "ts_max": self.ts_max,
            "min_version": self.min_version,
            "max_version": self.max_version,
            "rows": self.rows,
        }
        if self.ingest_version:  # else a flushed file: the entry of manifest format 1
            doc["ingest_version"] = self.ingest_version
            doc["ingest_epoch"] = self.ingest_epoch
            doc["origin"] = self.origin
        return doc


@dataclass
class Manifest:
    precision: str
    file_span_ms: int
    archived_version: int = 0
    archived_epoch: int = 0
    schemas: dict[str, dict[str, str]] = field(default_factory=dict)
    files: list[ArchivedFile] = field(default_factory=list)  # index = position

    def sort(self) -> None:
        self.files.sort(key=lambda f: (f.bucket, f.table, f.ingest_version, f.name))

    def to_bytes(self) -> bytes:
        doc = {
            "format": MANIFEST_FORMAT,
            "precision": self.precision,
            "file_span_ms": self.file_span_ms,
            "archived_version": self.archived_version,
            "archived_epoch": self.archived_epoch,
            "schemas": self.schemas,
            "files": [f.to_json(i) for i, f in enumerate(self.files)],
        }
        return json.dumps(doc, indent=1).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> "Manifest":
        def bad(reason: str) -> ArchiveError:
            return ArchiveError(path, f"bad manifest: {reason}")

        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise bad(f"not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
            raise bad(f"unknown format {doc.get('format') if isinstance(doc, dict) else doc!r}")
        try:
            m = cls(
                str(doc["precision"]),
                int(doc["file_span_ms"]),
                int(doc["archived_version"]),
                int(doc["archived_epoch"]),
            )
            schemas = doc["schemas"]
            if not isinstance(schemas, dict):
                raise bad("schemas is not an object")
            for table, cols in schemas.items():
                if (
                    TABLE_NAME_RE.fullmatch(table) is None
                    or not isinstance(cols, dict)
                    or any(COLUMN_NAME_RE.fullmatch(c) is None or t not in TYPE_NAMES for c, t in cols.items())
                ):
                    raise bad(f"schema of table {table!r} is malformed")
                m.schemas[table] = dict(cols)
            for i, f in enumerate(doc["files"]):
                if f.get("index") != i:
                    raise bad(f"file {i} has index {f.get('index')!r} (indexes must be contiguous from 0)")
                af = ArchivedFile(
                    str(f["name"]),
                    int(f["size"]),
                    int(f["magic"]),
                    str(f["table"]),
                    int(f["bucket"]),
                    int(f["ts_min"]),
                    int(f["ts_max"]),
                    int(f["min_version"]),
                    int(f["max_version"]),
                    int(f["rows"]),
                    int(f.get("ingest_version", 0)),
                    int(f.get("ingest_epoch", 0)),
                    str(f.get("origin", "")),
                )
                reason = name_invalid(af.name)
                if reason is not None or af.name == MANIFEST_NAME:
                    raise bad(reason or "a file entry names the manifest")
                if af.magic == 0:
                    raise bad(f"file {af.name} has magic 0")
                m.files.append(af)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ArchiveError):
                raise
            raise bad(f"missing or malformed field ({exc!r})") from None
        return m
