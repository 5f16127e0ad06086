"""Rounds of ingested files: the format-8 payload, the staging area, the file check (§9).

Owns: the WAL payload that names a round of files (format 8, docs/vnode.md §2 and §9.2:
`IngestRecord`, `encode_ingest_payload`, `decode_ingest_payload`), the layout of a vgroup's
staging area (`<path>/ingest/incoming/` where producers write, `<path>/ingest/staged/<round>/
<k>.parquet` where a round waits for its record to be applied), the names a round's files
take in the archive, the check that a producer's file is an archived file of this vnode's
format (`check_file`, on the master before the record exists), the presence check of a
staged round, moving a producer's file into the staging area durably, and the removal of
what no record names any more (`clean_staging`, at open).
Must not: hold the vnode lock, touch the manifest or the memtable (vnode.py applies a
round), or open sockets (the node fetches missing files, vrepl/node/ingest.py).
"""
from __future__ import annotations

import json
import mmap
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from vrepl._core.crc32c import crc32c
from vrepl.vnode.config import VnodeConfig
from vrepl.vnode.errors import PayloadError
from vrepl.vnode.files import ARROW_TYPES, DATA_DIR, fsync_all
from vrepl.vnode.rows import (
    COLUMN_NAME_RE,
    INT64_MAX,
    INT64_MIN,
    PAYLOAD_FORMAT_FILES,
    PAYLOAD_MAGIC,
    RESERVED_COLUMNS,
    TABLE_NAME_RE,
    TYPE_NAMES,
    type_accepts,
)
from vrepl.vnode.stagingfault import fsync_staged

PAYLOAD_HEADER_FILES = PAYLOAD_MAGIC + bytes([PAYLOAD_FORMAT_FILES])

INGEST_DIR = "ingest"
INCOMING_DIR = f"{INGEST_DIR}/incoming"
STAGED_DIR = f"{INGEST_DIR}/staged"
PART_SUFFIX = ".part"

MAX_ROUND_FILES = 1000
MAX_META_BYTES = 64 * 1024
MAX_NAME_BYTES = 255
MAX_ORIGIN_BYTES = 128
ROUND_RE = re.compile(r"[0-9a-f]{16}")
KIND_RE = re.compile(r"[a-z][a-z0-9_.-]{0,31}")
KIND_RULE = "[a-z][a-z0-9_.-]{0,31}"
NAME_PART_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
NAME_RULE = "'/'-separated components of [A-Za-z0-9_.-] not starting with '.'"
ARCHIVE_NAME_RE = re.compile(r"b(-?\d+)-i(\d+)-(\d+)\.parquet")
# Types of value columns in a file, as a table schema names them.
FILE_TYPES = {v: k for k, v in ARROW_TYPES.items()}
CRC_CHUNK_BYTES = 64 * 1024 * 1024
# The JSON's "v": absent in version 1 (adds only); 2 adds "remove" (and names the adds "add").
RECORD_VERSION_REMOVES = 2



def name_invalid(name: Any) -> str | None:
    """Why a producer's file name (relative to the incoming directory) is refused, or None."""
    if not isinstance(name, str) or not name:
        return "empty file name"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"file name longer than {MAX_NAME_BYTES} bytes"
    if any(NAME_PART_RE.fullmatch(p) is None for p in name.split("/")):
        return f"file name {name[:80]!r} is not {NAME_RULE}"
    return None


def origin_invalid(origin: Any) -> str | None:
    if not isinstance(origin, str):
        return "origin is not a string"
    if len(origin.encode("utf-8", "surrogatepass")) > MAX_ORIGIN_BYTES:
        return f"origin longer than {MAX_ORIGIN_BYTES} bytes"
    if not origin.isprintable():
        return f"origin {origin[:40]!r} holds a non-printable character"
    return None


@dataclass(frozen=True)
class IngestEntry:
    """One file of a round, as the record names it (docs/vnode.md §9.2)."""

    name: str               # the producer's name (relative to incoming/): provenance only
    table: str
    bucket: int
    size: int
    crc32c: int             # the magic: CRC-32C of the bytes, 1 if that is 0
    rows: int
    ts_min: int
    ts_max: int
    min_version: int        # the origin's _version / _epoch range of the rows
    max_version: int
    min_epoch: int
    max_epoch: int
    origin: str
    columns: Mapping[str, str] = field(default_factory=dict)   # value column -> type

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "table": self.table, "bucket": self.bucket,
                "size": self.size, "crc32c": self.crc32c, "rows": self.rows,
                "ts_min": self.ts_min, "ts_max": self.ts_max,
                "min_version": self.min_version, "max_version": self.max_version,
                "min_epoch": self.min_epoch, "max_epoch": self.max_epoch,
                "origin": self.origin, "columns": dict(self.columns)}


@dataclass(frozen=True)
class IngestRemove:
    """An archived file a round removes (docs/vnode.md §9.2, record version 2): an ingested
    file, by its archive name (the same on every replica), with the size and magic the
    manifest names it with."""

    name: str               # data/<table>/b<bucket>-i<version>-<k>.parquet
    size: int
    crc32c: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "crc32c": self.crc32c}


@dataclass(frozen=True)
class IngestRecord:
    """The decoded payload of a format-8 record: a round of files to add, and (record
    version 2) archived files to remove, all at one flush point."""

    round: str
    kind: str
    meta: Mapping[str, Any]
    files: tuple[IngestEntry, ...]
    removes: tuple[IngestRemove, ...] = ()

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    def staged_name(self, k: int) -> str:
        """File k's name, relative to the vgroup path, while the round is staged."""
        return staged_name(self.round, k)

    def archive_name(self, version: int, k: int) -> str:
        """File k's name in the archive once the record at `version` is applied."""
        f = self.files[k]
        return archive_name(f.table, f.bucket, version, k)

    def columns(self) -> dict[str, dict[str, str]]:
        """Value columns per table over the round's files."""
        out: dict[str, dict[str, str]] = {}
        for f in self.files:
            out.setdefault(f.table, {}).update(f.columns)
        return out


def staged_name(round_id: str, k: int) -> str:
    return f"{STAGED_DIR}/{round_id}/{k}.parquet"


def archive_name(table: str, bucket: int, version: int, k: int) -> str:
    return f"{DATA_DIR}/{table}/b{bucket}-i{version}-{k}.parquet"


# -- payload format 8 --------------------------------------------------------------------------

def is_ingest_payload(payload: bytes | memoryview) -> bool:
    return len(payload) >= 4 and payload[3] == PAYLOAD_FORMAT_FILES \
        and bytes(payload[:3]) == PAYLOAD_MAGIC


def encode_ingest_payload(rec: IngestRecord) -> bytes:
    """Record version 1 (`files`) when the round removes nothing, else version 2 (`"v": 2`,
    `add` and `remove`): a node that reads only version 1 refuses a version-2 record (no
    `files` key) instead of applying its adds without its removals."""
    doc: dict[str, Any] = {"round": rec.round, "kind": rec.kind, "meta": dict(rec.meta)}
    if rec.removes:
        doc["v"] = RECORD_VERSION_REMOVES
        doc["add"] = [f.to_json() for f in rec.files]
        doc["remove"] = [r.to_json() for r in rec.removes]
    else:
        doc["files"] = [f.to_json() for f in rec.files]
    return PAYLOAD_HEADER_FILES + json.dumps(doc, ensure_ascii=False, allow_nan=False,
                                             separators=(",", ":")).encode("utf-8")


def meta_invalid(meta: Any) -> str | None:
    if not isinstance(meta, dict):
        return "meta is not a JSON object"
    try:
        n = len(json.dumps(meta, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    except (TypeError, ValueError) as exc:
        return f"meta is not JSON-serialisable ({exc})"
    if n > MAX_META_BYTES:
        return f"meta is {n} bytes of JSON, above {MAX_META_BYTES}"
    return None


def _int(doc: Mapping[str, Any], key: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    v = doc[key]
    if type(v) is not int or not lo <= v <= hi:
        raise ValueError(f"{key} {v!r} is not an integer in {lo}..{hi}")
    return v


def _entry(doc: Any) -> IngestEntry:
    if not isinstance(doc, dict):
        raise ValueError("a file entry is not an object")
    name, table, origin = doc["name"], doc["table"], doc["origin"]
    reason = name_invalid(name) or origin_invalid(origin)
    if reason is None and (type(table) is not str or TABLE_NAME_RE.fullmatch(table) is None):
        reason = f"table {str(table)[:80]!r} is not a table name"
    if reason is not None:
        raise ValueError(reason)
    cols = doc["columns"]
    if not isinstance(cols, dict) or any(
            type(c) is not str or COLUMN_NAME_RE.fullmatch(c) is None or c in RESERVED_COLUMNS
            or t not in TYPE_NAMES for c, t in cols.items()):
        raise ValueError(f"columns of {name!r} are malformed")
    e = IngestEntry(name, table, _int(doc, "bucket"), _int(doc, "size", 0),
                    _int(doc, "crc32c", 1, 0xFFFFFFFF), _int(doc, "rows", 1),
                    _int(doc, "ts_min"), _int(doc, "ts_max"), _int(doc, "min_version"),
                    _int(doc, "max_version"), _int(doc, "min_epoch"), _int(doc, "max_epoch"),
                    origin, dict(cols))
    if e.ts_min > e.ts_max or e.min_version > e.max_version or e.min_epoch > e.max_epoch:
        raise ValueError(f"file {name!r} has an empty range")
    return e


def removal_name_invalid(name: Any) -> str | None:
    """Why a removal's name is not the archive name of an ingested file, or None."""
    if type(name) is not str:
        return "a removal's name is not a string"
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != DATA_DIR or TABLE_NAME_RE.fullmatch(parts[1]) is None \
            or ARCHIVE_NAME_RE.fullmatch(parts[2]) is None:
        return (f"removal {name[:80]!r} is not the archive name of an ingested file"
                f" ({DATA_DIR}/<table>/b<bucket>-i<version>-<k>.parquet)")
    return None


def _remove(doc: Any) -> IngestRemove:
    if not isinstance(doc, dict):
        raise ValueError("a removal is not an object")
    reason = removal_name_invalid(doc["name"])
    if reason is not None:
        raise ValueError(reason)
    return IngestRemove(doc["name"], _int(doc, "size", 0), _int(doc, "crc32c", 1, 0xFFFFFFFF))


def counts_invalid(adds: int, removes: int) -> str | None:
    """Why a round of `adds` files and `removes` removals cannot be one record, or None."""
    if not removes and not 1 <= adds <= MAX_ROUND_FILES:
        return f"a round names 1..{MAX_ROUND_FILES} files, got {adds}"
    if not 0 <= adds <= MAX_ROUND_FILES or not 0 <= removes <= MAX_ROUND_FILES \
            or adds + removes == 0:
        return (f"a round names 0..{MAX_ROUND_FILES} files to add and 0..{MAX_ROUND_FILES}"
                f" to remove, at least one in all (got {adds} and {removes})")
    return None


def decode_ingest_payload(payload: bytes | memoryview, version: int | None = None
                          ) -> IngestRecord:
    """The round a format-8 payload names; PayloadError (naming the version) if malformed."""
    if not is_ingest_payload(payload):
        raise PayloadError("not an ingest payload (format 8)", version)
    try:
        doc = json.loads(bytes(payload[len(PAYLOAD_HEADER_FILES):]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"ingest payload is not JSON ({exc})", version) from None
    try:
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        rid, kind, meta = doc["round"], doc["kind"], doc["meta"]
        if "v" not in doc:              # record version 1: adds only, at least one
            files, removes = doc["files"], []
            if isinstance(files, list) and not files:
                raise ValueError(f"a round names 1..{MAX_ROUND_FILES} files")
        elif doc["v"] == RECORD_VERSION_REMOVES:
            files, removes = doc["add"], doc["remove"]
        else:
            raise ValueError(f"record version {str(doc['v'])[:20]} (this node reads 1 and"
                             f" {RECORD_VERSION_REMOVES})")
        if type(rid) is not str or ROUND_RE.fullmatch(rid) is None:
            raise ValueError(f"round {str(rid)[:40]!r} is not 16 lowercase hex digits")
        if type(kind) is not str or KIND_RE.fullmatch(kind) is None:
            raise ValueError(f"kind {str(kind)[:40]!r} does not match {KIND_RULE}")
        reason = meta_invalid(meta)
        if reason is not None:
            raise ValueError(reason)
        if not isinstance(files, list) or not isinstance(removes, list):
            raise ValueError("add, remove or files is not a list")
        reason = counts_invalid(len(files), len(removes))
        if reason is not None:
            raise ValueError(reason)
        rec = IngestRecord(rid, kind, meta, tuple(_entry(f) for f in files),
                           tuple(_remove(r) for r in removes))
        if len({r.name for r in rec.removes}) != len(rec.removes):
            raise ValueError("a file is removed twice")
        return rec
    except (KeyError, TypeError, ValueError) as exc:
        raise PayloadError(f"malformed ingest payload: {exc}", version) from None


def removes_invalid(removes: tuple[IngestRemove, ...],
                    archived: Callable[[str], tuple[int, int, int] | None],
                    pending: Mapping[str, tuple[int, int]]) -> str | None:
    """(master, before forwarding) Why a round's removals do not each name an ingested file
    of the archive (`archived(name)`: (size, magic, ingest_version) or None) or of a pending
    round (`pending`: archive name -> (size, magic)) with the size and magic given, or None.
    Applying a removal whose file is gone by then (another round removed it) is a no-op on
    every replica alike."""
    seen: set[str] = set()
    for r in removes:
        reason = removal_name_invalid(r.name)
        if reason is not None:
            return reason
        if r.name in seen:
            return f"{r.name} is removed twice"
        seen.add(r.name)
        got = archived(r.name)
        have = (got[0], got[1]) if got is not None and got[2] else pending.get(r.name)
        if have is None:
            return f"{r.name}: no such ingested file in the archive (nothing to remove)"
        if have != (r.size, r.crc32c):
            return (f"{r.name}: the archive names it with {have[0]} bytes, magic"
                    f" {have[1]:#010x}; the removal says {r.size}, {r.crc32c:#010x}")
    return None


def apply_removes(files: list[Any], removes: tuple[IngestRemove, ...]
                  ) -> tuple[list[Any], list[Any]]:
    """(applying a round) The manifest's entries `files` without those the round removes
    (named, ingested, with the size and magic given), and the removed entries."""
    if not removes:
        return files, []
    gone = {(r.name, r.size, r.crc32c) for r in removes}
    keep, removed = [], []
    for f in files:
        if f.ingest_version and (f.name, f.size, f.magic) in gone:
            removed.append(f)
        else:
            keep.append(f)
    return keep, removed


# -- the staging area ----------------------------------------------------------------------------

def incoming_path(path: str) -> str:
    return os.path.join(path, *INCOMING_DIR.split("/"))


def staged_round_path(path: str, round_id: str) -> str:
    return os.path.join(path, *STAGED_DIR.split("/"), round_id)


def abspath(path: str, name: str) -> str:
    return os.path.join(path, *name.split("/"))


def confined_incoming(path: str, name: str) -> str:
    """The absolute path of a producer's file; ValueError when the name is refused or a
    component on the way (under the vgroup path) is a symlink."""
    reason = name_invalid(name)
    if reason is not None:
        raise ValueError(reason)
    full = path
    for part in (*INCOMING_DIR.split("/"), *name.split("/")):
        full = os.path.join(full, part)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode):
            raise ValueError(f"{name}: {full} is a symlink (never followed)")
    return os.path.join(incoming_path(path), *name.split("/"))


def missing_staged(path: str, rec: IngestRecord) -> list[int]:
    """Indexes of the round's files not (completely) staged: absent, or of another size.
    Staged files got there by a rename after their CRC was checked and they were fsynced,
    so size is the check that is left."""
    out = []
    for k, f in enumerate(rec.files):
        try:
            if os.stat(abspath(path, rec.staged_name(k))).st_size != f.size:
                out.append(k)
        except FileNotFoundError:
            out.append(k)
    return out


def file_crc_magic(fd: int) -> tuple[int, int]:
    """(size, magic) of an open regular file, read through a memory map."""
    size = os.fstat(fd).st_size
    crc = 0
    if size:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                for off in range(0, size, CRC_CHUNK_BYTES):
                    crc = crc32c(view[off:off + CRC_CHUNK_BYTES], crc)
            finally:
                view.release()
    return size, crc or 1


def stage_files(path: str, round_id: str, moves: Sequence[tuple[str, int]],
                fsync: bool = True) -> None:
    """Move checked files (a producer's, or fetched into a .part) to their staged names,
    durably: `moves` is (source path, k) pairs. Every file is fsynced first (together), then
    renamed, then the round's directory fsynced once (and `ingest/staged/`, which names it):
    a name is durable only once its bytes are."""
    if not moves:
        return
    rdir = staged_round_path(path, round_id)
    os.makedirs(rdir, exist_ok=True)
    if fsync:
        fsync_staged([src for src, _ in moves])
    for src, k in moves:
        os.replace(src, abspath(path, staged_name(round_id, k)))
    if fsync:
        fsync_all([rdir, os.path.dirname(rdir)])


def new_round_id() -> str:
    """A fresh round id (16 lowercase hex digits): the staged files' directory name on every
    replica, chosen by the master before the record's version exists."""
    return os.urandom(8).hex()


def stage_round(path: str, rec: IngestRecord, sources: list[str], fsync: bool = True) -> None:
    """(master) Move a checked round's files from `sources` (in the incoming directory) to
    their staged names, durably, before the record that names them is forwarded."""
    stage_files(path, rec.round, [(src, k) for k, src in enumerate(sources)], fsync)


def clean_staging(path: str, keep_rounds: set[str], clear_incoming: bool = True) -> list[str]:
    """At open: delete staged rounds no record above the archive names (applied, or cut
    from the log, or staged by a master that crashed before forwarding), partial files of
    interrupted fetches, and (by default) everything in incoming/. Returns what went."""
    removed = []
    staged = os.path.join(path, *STAGED_DIR.split("/"))
    if os.path.isdir(staged):
        for name in os.listdir(staged):
            full = os.path.join(staged, name)
            if name not in keep_rounds or not os.path.isdir(full):
                shutil.rmtree(full, ignore_errors=True) if os.path.isdir(full) \
                    else os.unlink(full)
                removed.append(f"{STAGED_DIR}/{name}")
                continue
            for fname in os.listdir(full):
                if fname.endswith(PART_SUFFIX):
                    os.unlink(os.path.join(full, fname))
                    removed.append(f"{STAGED_DIR}/{name}/{fname}")
    incoming = incoming_path(path)
    if clear_incoming and os.path.isdir(incoming):
        for name in os.listdir(incoming):
            full = os.path.join(incoming, name)
            shutil.rmtree(full, ignore_errors=True) if os.path.isdir(full) else os.unlink(full)
            removed.append(f"{INCOMING_DIR}/{name}")
    return removed


# -- checking a producer's file -------------------------------------------------------------------

KEY_COLUMNS = ["ts", "_version", "_epoch"]
KEYS_BY_TABLE_ROWS = 1_000_000     # above: the key columns are read by pq.read_table


def check_file(full: str, name: str, table: str, origin: str, cfg: VnodeConfig,
               schemas: Mapping[str, Mapping[str, str]], size: int | None = None,
               magic: int | None = None, magic_from_write: bool = False
               ) -> tuple[str | None, IngestEntry | None]:
    """(reason, None) or (None, entry): whether the file at `full` is an archived file of
    this vnode's format whose rows can go into `table` (docs/vnode.md §9.1).
    `magic_from_write`: `magic` is the CRC-32C the caller computed over these bytes as it
    wrote them in this process (an upload's sink), so the file is not read again for it:
    only its size (fstat), footer and key columns are (docs/vnode.md §9.1, one pass). Then
    `size` and `magic` must be given."""
    if magic_from_write and (size is None or magic is None):
        raise ValueError("check_file: magic_from_write needs the size and magic written")
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return f"{name}: no such file in the staging directory", None
    except OSError as exc:
        return f"{name}: cannot open: {exc.strerror}", None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"{name}: not a regular file", None
        # The CRC computed while writing covers the bytes written: reading them back to
        # checksum again is a second full pass for nothing (issue 16's profile: a fifth of
        # the master's samples). The size still catches a file cut or grown since.
        got_size, got_magic = (st.st_size, magic) if magic_from_write and magic is not None \
            else file_crc_magic(fd)
    finally:
        os.close(fd)
    if size is not None and got_size != size:
        return f"{name}: {got_size} bytes, the producer says {size}", None
    if magic is not None and got_magic != magic:
        return (f"{name}: magic (CRC-32C) {got_magic:#010x}, the producer says"
                f" {magic:#010x}"), None
    try:
        with pa.memory_map(full) as src:
            pf = pq.ParquetFile(src, pre_buffer=False)
            schema = pf.schema_arrow
            if not all(c in schema.names for c in KEY_COLUMNS):
                keys = None
            elif pf.metadata.num_rows > KEYS_BY_TABLE_ROWS:
                # A large file: read_table reads the three columns in about half the time
                # ParquetFile.read takes on one thread (12 vs 23 ms for 2.1 M rows,
                # docs/benchmarks.md §Bulk) ...
                keys = pq.read_table(src, columns=KEY_COLUMNS, use_threads=False)
            else:
                # ... a small one (a shipped file: 30,000 rows) in about half of read_table's
                # time through the footer already parsed (0.7-1.1 against 1.2-3.3 ms): the
                # dataset read_table builds costs more than the columns (docs/benchmarks.md
                # §Shipping, fifth session).
                keys = pf.read(columns=KEY_COLUMNS, use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"{name}: not a readable Parquet file: {first}", None
    if keys is None:
        return f"{name}: needs the columns ts, _version and _epoch", None
    want = {"ts": pa.timestamp(cfg.precision), "_version": pa.int64(), "_epoch": pa.int64()}
    for col, typ in want.items():
        if schema.field(col).type != typ:
            return f"{name}: column {col!r} is {schema.field(col).type}, expected {typ}", None
    known = schemas.get(table, {})
    columns: dict[str, str] = {}
    for fld in schema:
        if fld.name in want:
            continue
        if COLUMN_NAME_RE.fullmatch(fld.name) is None or fld.name in RESERVED_COLUMNS:
            return f"{name}: column name {fld.name[:80]!r} is not a value column name", None
        vtype = FILE_TYPES.get(fld.type)
        if vtype is None:
            return (f"{name}: column {fld.name!r} is {fld.type} (int64, float64, string or"
                    f" bool)"), None
        ctype = known.get(fld.name)
        if ctype is not None and not type_accepts(ctype, vtype):
            return (f"{name}: column {fld.name!r} of table {table!r} is {ctype}, the file's"
                    f" is {vtype} (a column's type cannot change)"), None
        columns[fld.name] = vtype
    n = keys.num_rows
    if n == 0:
        return f"{name}: no rows", None
    if any(keys.column(c).null_count for c in want):
        return f"{name}: ts, _version and _epoch must not be null", None
    ts = _int64s(keys.column("ts"))
    if n > 1 and not bool((ts[1:] > ts[:-1]).all()):
        return f"{name}: ts is not strictly increasing (one row per ts, sorted)", None
    ts_min, ts_max = int(ts[0]), int(ts[-1])
    if ts_min < cfg.ts_lo or ts_max > cfg.ts_hi:
        return f"{name}: ts {ts_min}..{ts_max} is outside [{cfg.ts_lo}, {cfg.ts_hi}]", None
    span = cfg.file_span
    bucket = ts_min // span
    if ts_max // span != bucket:
        return (f"{name}: ts {ts_min}..{ts_max} spans buckets {bucket}..{ts_max // span} of"
                f" file_span_ms {cfg.file_span_ms} (one bucket per file: split it)"), None
    ver, ep = _int64s(keys.column("_version")), _int64s(keys.column("_epoch"))
    return None, IngestEntry(name, table, bucket, got_size, got_magic, n, ts_min, ts_max,
                             int(ver.min()), int(ver.max()), int(ep.min()), int(ep.max()),
                             origin, columns)


def _int64s(col: pa.ChunkedArray) -> Any:
    """A key column without nulls as numpy int64 (a view when it is one chunk): no
    pyarrow.compute call, each of which gives the GIL up and waits to take it back."""
    arr = col.to_numpy()
    return arr.view("int64") if arr.dtype.kind == "M" else arr


def round_invalid(entries: list[IngestEntry], removes: int = 0) -> str | None:
    """Why a checked round cannot be one record: two files of a table overlap in ts (their
    rows would tie: one record, one rank), or the round is empty or too large."""
    reason = counts_invalid(len(entries), removes)
    if reason is not None:
        return reason
    by_table: dict[str, list[IngestEntry]] = {}
    for e in entries:
        by_table.setdefault(e.table, []).append(e)
    for table, es in by_table.items():
        es.sort(key=lambda e: e.ts_min)
        for a, b in zip(es, es[1:]):
            if b.ts_min <= a.ts_max:
                return (f"{a.name} and {b.name} both hold ts of table {table!r} in"
                        f" {b.ts_min}..{min(a.ts_max, b.ts_max)} (files of one table in a"
                        f" round must not overlap)")
    return None
