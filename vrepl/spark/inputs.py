"""Driver-side reading of replica directories: manifest, archived-file checks, WAL scan.

Owns: everything the validation job reads with plain Python on the driver, before Spark
sees anything: each replica's manifest, the files check (size and magic = CRC-32C of every
archived file against the manifest, the Parquet footer, row counts and version/ts ranges
from the footer statistics, each file's columns against the manifest schema), the WAL scan
(every record header: versions, epochs, where they are; a torn tail or corruption as a
finding, never an exception) and the rows of WAL records above the archived version (what
the vnode would replay on recovery, later version wins). docs/validation.md §checks.

Why on the driver: the magic is CRC-32C, which vrepl computes in its compiled extension
(vrepl._core.crc32c, GB/s). Doing it here means executors never need vrepl; the driver
reads each archived file once, with threads (the CRC releases the GIL on large buffers).
Must not: touch Spark, write into a replica directory, or raise for damaged data (damage is
a Finding; only inputs that cannot be read at all raise InputError).
"""
from __future__ import annotations

import errno
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vrepl import wal as _wal
from vrepl._core import record as _rec
from vrepl.errors import InputError
from vrepl.spark.model import Finding, ReplicaSpec
from vrepl.spark.txnreplay import PublishedTxn, TxnReplay, published_keys
from vrepl.txn.record import HEADER as TXN_HEADER
from vrepl.txn.record import is_txn_payload
from vrepl.vnode.errors import ArchiveError, PayloadError
from vrepl.vnode.files import ARROW_TYPES, MANIFEST_NAME, ArchivedFile, Manifest, file_magic
from vrepl.vnode import staging as S
from vrepl.vnode.ingest import decode_checked, staged_rows
from vrepl.vnode.rows import type_accepts

WAL_DIR = "wal"
FILE_TYPES = {v: k for k, v in ARROW_TYPES.items()}   # Arrow type -> table type name
MSG_TYPE_DATA = 1
FILE_CHECK_THREADS = 4          # archived files read and checksummed at once on the driver
WAL_NAME = re.compile(r"^(\d{12})\.wal$")


@dataclass
class DataFile:
    """One archived file of one replica and what the files check made of it."""

    entry: ArchivedFile
    path: str                      # absolute
    readable: bool = False         # size, magic, footer and columns passed: Spark may read it
    columns: dict[str, str] = field(default_factory=dict)   # value columns in the file


@dataclass
class WalScan:
    """Every record header of one replica's WAL, in file order."""

    versions: np.ndarray                     # int64
    epochs: np.ndarray                       # int64
    msg_types: np.ndarray                    # uint8
    file_index: np.ndarray                   # int32: position in `files`
    offsets: np.ndarray                      # int64: byte offset in that file
    files: list[str]                         # names relative to the data path

    @property
    def count(self) -> int:
        return len(self.versions)

    def where(self, i: int) -> str:
        return f"{self.files[int(self.file_index[i])]}@{int(self.offsets[i])}"


@dataclass
class PendingRound:
    """A round of ingested files whose format-8 record lies above the archived version
    (docs/vnode.md §9.3): its staged files are part of the replica's state, ranked by the
    record's version. `files`: (table, path, value columns) of each staged file."""

    version: int
    epoch: int
    round: str
    files: list[tuple[str, str, dict[str, str]]]
    removes: list[str] = field(default_factory=list)   # archive names it removes (§9.2)


@dataclass
class ReplicaData:
    spec: ReplicaSpec
    manifest: Manifest
    has_manifest: bool
    files: list[DataFile]
    wal: WalScan
    schemas: dict[str, dict[str, str]]        # manifest schemas + columns the WAL adds
    # (table, ts) -> (version, epoch, values): WAL rows above the archived version
    wal_rows: dict[tuple[str, int], tuple[int, int, dict[str, Any]]]
    findings: list[Finding]
    pending: list[PendingRound] = field(default_factory=list)   # rounds above the archive
    # transaction id -> (label, state, visible version, rows): the labels file and the WAL
    txns: dict[int, tuple[str, str, int, int]] = field(default_factory=dict)
    # transaction id -> its published keys, for those whose batches the WAL still holds
    published: dict[int, PublishedTxn] = field(default_factory=dict)

    @property
    def ranked(self) -> bool:
        """Whether rows of this replica compete by rank (ingested files or pending rounds,
        docs/vnode.md §9.4) rather than by version alone."""
        return bool(self.pending) or any(df.entry.ingest_version for df in self.files)

    @property
    def archived_version(self) -> int:
        return self.manifest.archived_version

    @property
    def last_version(self) -> int:
        """The highest version this replica holds: archived or in its WAL."""
        wal_last = int(self.wal.versions.max()) if self.wal.count else 0
        return max(self.archived_version, wal_last)


def _input_error(spec: ReplicaSpec, what: str) -> InputError:
    return InputError(f"{spec.label()}: {what}")


def _read_bytes(spec: ReplicaSpec, path: str, rel: str) -> bytes | None:
    """A file's bytes; None if it does not exist; InputError if it cannot be read or is not
    a regular file (a FIFO named like a WAL file would block a plain open forever: opened
    non-blocking and checked with fstat first)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _input_error(spec, f"{rel}: not a regular file; refused")
            os.set_blocking(fd, True)
            return fh.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise _input_error(spec, f"{rel}: is a directory, not a file") from None
    except OSError as exc:
        raise _input_error(spec, f"{rel}: cannot read: {exc.strerror or exc}") from None


# -- manifest ------------------------------------------------------------------------------

def _load_manifest(spec: ReplicaSpec) -> tuple[Manifest, bool]:
    path = os.path.join(spec.path, *MANIFEST_NAME.split("/"))
    data = _read_bytes(spec, path, MANIFEST_NAME)
    if data is None:
        # Never flushed (or the manifest is lost): nothing archived; the WAL is everything.
        return Manifest("ms", 0), False
    try:
        return Manifest.from_bytes(data, MANIFEST_NAME), True
    except ArchiveError as exc:
        raise _input_error(spec, str(exc)) from None


# -- files check ---------------------------------------------------------------------------

def _footer_ranges(md: pq.FileMetaData, name: str) -> tuple[int, int] | None:
    """(min, max) of an int64 column from the row groups' statistics, None if absent."""
    try:
        idx = md.schema.names.index(name)
    except ValueError:
        return None
    lo = hi = None
    for g in range(md.num_row_groups):
        st = md.row_group(g).column(idx).statistics
        if st is None or not st.has_min_max:
            return None
        a, b = st.min_raw, st.max_raw
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    return None if lo is None else (int(lo), int(hi))


def check_file(spec: ReplicaSpec, manifest: Manifest, f: ArchivedFile
               ) -> tuple[DataFile, list[Finding]]:
    """The files check of one archived file (runs in a driver thread)."""
    path = os.path.join(spec.path, *f.name.split("/"))
    df = DataFile(f, path)
    out: list[Finding] = []

    def finding(check: str, kind: str, msg: str, **details: Any) -> None:
        out.append(Finding(check, kind, f"{f.name}: {msg}", spec.vgroup, spec.replica,
                           f.name, details))

    data = _read_bytes(spec, path, f.name)
    if data is None:
        finding("files", "missing", "named by the manifest but absent")
        return df, out
    magic = file_magic(data)
    if len(data) != f.size or magic != f.magic:
        finding("files", "magic_mismatch",
                f"{len(data)} bytes with magic (CRC-32C) {magic:#010x}; the manifest says"
                f" {f.size} bytes, {f.magic:#010x}",
                size=len(data), magic=magic, manifest_size=f.size, manifest_magic=f.magic)
        return df, out
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        schema = pf.schema_arrow
        md = pf.metadata
    except (pa.ArrowException, OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        finding("files", "corrupt_parquet", f"not a readable Parquet file: {reason}")
        return df, out
    # Columns: ts, _version, _epoch as the vnode writes them, the rest in the table schema.
    expected = {"ts": pa.timestamp(manifest.precision), "_version": pa.int64(),
                "_epoch": pa.int64()}
    table_schema = manifest.schemas.get(f.table, {})
    problems = []
    for name, typ in expected.items():
        if name not in schema.names:
            problems.append(f"no column {name!r}")
        elif schema.field(name).type != typ:
            problems.append(f"column {name!r} is {schema.field(name).type}, expected {typ}")
    for fld in schema:
        if fld.name in expected:
            continue
        want = table_schema.get(fld.name)
        if want is None:
            problems.append(f"column {fld.name!r} is not in the manifest schema of"
                            f" table {f.table!r}")
        elif ARROW_TYPES[want] == fld.type:
            df.columns[fld.name] = want
        elif f.ingest_version and fld.type in FILE_TYPES and type_accepts(want, FILE_TYPES[fld.type]):
            # An ingested file may hold an int64 column of a float table column (docs/vnode.md
            # §9.1): the vnode reads it as float, and so does the job.
            df.columns[fld.name] = FILE_TYPES[fld.type]
        else:
            problems.append(f"column {fld.name!r} is {fld.type}, the manifest says {want}")
    if problems:
        finding("schemas", "file_schema", "; ".join(problems), problems=problems)
        return df, out
    df.readable = True
    if md.num_rows != f.rows:
        finding("files", "row_count_mismatch",
                f"{md.num_rows} rows, the manifest says {f.rows}",
                rows=md.num_rows, manifest_rows=f.rows)
    for col, lo_name, hi_name in (("ts", "ts_min", "ts_max"),
                                  ("_version", "min_version", "max_version")):
        rng = _footer_ranges(md, col)
        want = (getattr(f, lo_name), getattr(f, hi_name))
        if rng is not None and md.num_rows and rng != want:
            finding("files", "range_mismatch",
                    f"{col} spans {rng[0]}..{rng[1]}, the manifest says {want[0]}..{want[1]}",
                    column=col, file_range=list(rng), manifest_range=list(want))
    return df, out


# -- WAL scan ------------------------------------------------------------------------------

def stop_is_torn(data: bytes, sc: Any, max_record_bytes: int) -> tuple[bool, str]:
    """(whether a scan stopped at what a crash mid-write leaves, the reason), following
    docs/wal-format.md §torn tails: the bytes end inside a record, or zeros run to the end,
    or a record with a bad checksum that no valid record header follows. Anything else
    (and any of these in a file that is not the last) is corruption."""
    reason = sc.reason or "unknown"
    off = sc.end
    if sc.status == _rec.STATUS_BAD_SIGNATURE and off == 0:
        return False, "not a vrepl WAL file (no record signature)"
    if sc.status == _rec.STATUS_INCOMPLETE:
        return True, reason
    if sc.status == _rec.STATUS_ZERO:
        if data.count(0, off) == len(data) - off:
            return True, reason
        return False, "zero bytes followed by non-zero data"
    if sc.status in (_rec.STATUS_BAD_HEADER_CRC, _rec.STATUS_BAD_PAYLOAD_CRC):
        sig = _rec.RECORD_SIGNATURE.to_bytes(4, "little")
        pos = data.find(sig, off + 1)
        while pos >= 0:
            if _rec.header_invalid(data, pos, max_record_bytes) is None:
                return False, f"{reason}, followed by valid records"
            pos = data.find(sig, pos + 1)
        return True, reason
    return False, reason


def _wanted(data: bytes, sc: Any, from_version: int) -> np.ndarray:
    """Which scanned records to keep: those at or above from_version, and below it the
    transaction (format 9) records, whose staged batches the per-transaction check needs
    (the replay skips them like any record at or below the archive)."""
    n = sc.count
    above = sc.versions[:n] >= from_version
    offs = sc.offsets[:n].astype(np.int64) + _rec.HEADER_SIZE_BYTES
    cand = (~above) & (sc.msg_types[:n] == MSG_TYPE_DATA) & (sc.lengths[:n] >= len(TXN_HEADER))
    if cand.any():
        buf = np.frombuffer(data, np.uint8)
        idx = np.nonzero(cand)[0]
        magic = np.ones(len(idx), bool)
        for j, b in enumerate(TXN_HEADER):
            magic &= buf[offs[idx] + j] == b
        cand[idx] = magic
    return above | cand


def scan_wal(spec: ReplicaSpec, max_record_bytes: int, from_version: int
             ) -> tuple[WalScan, list[tuple[int, int, int, bytes]], list[Finding]]:
    """(headers of every record, records with version >= from_version, and transaction
    (format 9) records below it, as (version, epoch, msg_type, payload), findings). Reads each WAL file whole (a file is at most
    max_file_bytes, 64 MiB by default)."""
    wal_dir = os.path.join(spec.path, WAL_DIR)
    findings: list[Finding] = []
    empty = WalScan(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint8),
                    np.zeros(0, np.int32), np.zeros(0, np.int64), [])
    if not os.path.isdir(wal_dir):
        return empty, [], findings
    try:
        names = sorted(n for n in os.listdir(wal_dir) if WAL_NAME.match(n))
    except OSError as exc:
        raise _input_error(spec, f"{WAL_DIR}: cannot list: {exc.strerror or exc}") from None
    parts: dict[str, list[np.ndarray]] = {k: [] for k in
                                          ("versions", "epochs", "msg_types", "file", "off")}
    records: list[tuple[int, int, int, bytes]] = []
    rels = [f"{WAL_DIR}/{n}" for n in names]
    prev_index = None
    for i, (name, rel) in enumerate(zip(names, rels)):
        index = int(WAL_NAME.match(name).group(1))
        if prev_index is not None and index != prev_index + 1:
            findings.append(Finding("versions", "wal_file_gap",
                                    f"{rel}: WAL file index gap: {prev_index:012d}.wal is"
                                    f" followed by {name}", spec.vgroup, spec.replica, rel))
        prev_index = index
        path = os.path.join(wal_dir, name)
        data = _read_bytes(spec, path, rel)
        if data is None:
            continue     # removed while we listed (recycled): nothing to check
        sc = _rec.scan(data, max_payload_len=max_record_bytes)
        n = sc.count
        if n:
            parts["versions"].append(sc.versions.astype(np.int64))
            parts["epochs"].append(sc.epochs.astype(np.int64))
            parts["msg_types"].append(sc.msg_types.astype(np.uint8))
            parts["file"].append(np.full(n, i, np.int32))
            parts["off"].append(sc.offsets.astype(np.int64))
            want = np.nonzero(_wanted(data, sc, from_version))[0] if from_version > 0 else []
            for k in want:
                off = int(sc.offsets[k]) + _rec.HEADER_SIZE_BYTES
                records.append((int(sc.versions[k]), int(sc.epochs[k]), int(sc.msg_types[k]),
                                data[off:off + int(sc.lengths[k])]))
        if not sc.ok:
            last_good = int(sc.versions[-1]) if n else 0
            torn, reason = stop_is_torn(data, sc, max_record_bytes)
            if torn and i == len(names) - 1:
                findings.append(Finding(
                    "versions", "wal_torn_tail",
                    f"{rel}: torn tail at offset {sc.end}: {reason} (last good version"
                    f" {last_good}; 'vrepl wal repair' truncates it)",
                    spec.vgroup, spec.replica, rel,
                    {"offset": sc.end, "last_good_version": last_good}))
            else:
                where = " in a sealed file (only the last file may be torn)" if torn else ""
                findings.append(Finding(
                    "versions", "wal_corrupt",
                    f"{rel}: corrupt at offset {sc.end}: {reason}{where} (last good version"
                    f" {last_good}; later records of this file are not read)",
                    spec.vgroup, spec.replica, rel,
                    {"offset": sc.end, "last_good_version": last_good}))
    if not parts["versions"]:
        empty.files = rels
        return empty, records, findings
    scan = WalScan(np.concatenate(parts["versions"]), np.concatenate(parts["epochs"]),
                   np.concatenate(parts["msg_types"]), np.concatenate(parts["file"]),
                   np.concatenate(parts["off"]), rels)
    return scan, records, findings


def replay_wal(spec: ReplicaSpec, archived_version: int, schemas: dict[str, dict[str, str]],
               records: list[tuple[int, int, int, bytes]], findings: list[Finding],
               pending: list[PendingRound] | None = None, txns: TxnReplay | None = None
               ) -> dict[tuple[str, int], tuple[int, int, dict[str, Any]]]:
    """The rows a vnode would replay from the WAL on recovery (docs/vnode.md §6): records
    above the archived version in log order, each applied only if its version is above the
    last applied one (a duplicate is ignored), later version wins per (table, ts).
    Adds the columns the WAL introduces to `schemas` (first non-null value's type). A
    format-8 record (a round of ingested files, docs/vnode.md §9) goes to `pending` with its
    staged files; a round whose files are not staged is a finding (`round_not_staged`)."""
    rows: dict[tuple[str, int], tuple[int, int, dict[str, Any]]] = {}
    applied = archived_version
    txns = txns or TxnReplay(spec)   # format 9: rows appear at their publish record's version
    for version, epoch, msg_type, payload in records:
        if version <= applied:
            continue
        applied = version
        if msg_type != MSG_TYPE_DATA:
            continue
        if S.is_ingest_payload(payload):
            _pending_round(spec, version, epoch, payload, schemas, findings, pending)
            continue
        if is_txn_payload(payload):
            txns.apply(version, epoch, payload, schemas, findings, rows)
            continue
        try:
            batch, added, conflict = decode_checked(payload, version, None, schemas)
        except PayloadError as exc:
            findings.append(Finding("versions", "wal_bad_payload", str(exc), spec.vgroup,
                                    spec.replica, None, {"version": version}))
            continue
        if conflict is not None:
            findings.append(Finding("schemas", "wal_type_conflict",
                                    f"version {version}: {conflict} (the record is not"
                                    f" applied)", spec.vgroup, spec.replica, None,
                                    {"version": version}))
            continue
        for table, cols in added.items():
            schemas.setdefault(table, {}).update(cols)
        for table, ts, values in (batch if isinstance(batch, list) else staged_rows(batch)):
            rows[(table, ts)] = (version, epoch, values)
    return rows


def _pending_round(spec: ReplicaSpec, version: int, epoch: int, payload: bytes,
                   schemas: dict[str, dict[str, str]], findings: list[Finding],
                   pending: list[PendingRound] | None) -> None:
    try:
        rec = S.decode_ingest_payload(payload, version)
    except PayloadError as exc:
        findings.append(Finding("versions", "wal_bad_payload", str(exc), spec.vgroup,
                                spec.replica, None, {"version": version}))
        return
    added: dict[str, dict[str, str]] = {}
    for table, cols in rec.columns().items():
        for col, typ in cols.items():
            have = schemas.get(table, {}).get(col) or added.get(table, {}).get(col)
            if have is None:
                added.setdefault(table, {})[col] = typ
            elif not type_accepts(have, typ):
                findings.append(Finding("schemas", "wal_type_conflict",
                                        f"version {version}: column {col!r} of table {table!r}"
                                        f" is {have}, the round's file has {typ} (the record is"
                                        f" not applied)", spec.vgroup, spec.replica, None,
                                        {"version": version}))
                return
    for table, cols in added.items():
        schemas.setdefault(table, {}).update(cols)
    missing = S.missing_staged(spec.path, rec)
    if missing:
        findings.append(Finding("files", "round_not_staged",
                                f"version {version}: files {missing} of the round {rec.round}"
                                f" are not in {S.STAGED_DIR}/{rec.round}/ (its rows are not"
                                f" compared on this replica)", spec.vgroup, spec.replica, None,
                                {"version": version, "round": rec.round, "missing": missing}))
        return
    if pending is not None:
        pending.append(PendingRound(version, epoch, rec.round, [
            (f.table, S.abspath(spec.path, rec.staged_name(k)), dict(f.columns))
            for k, f in enumerate(rec.files)], [r.name for r in rec.removes]))


# -- a whole replica -----------------------------------------------------------------------

def load_replica(spec: ReplicaSpec, max_record_bytes: int = _wal.DEFAULT_MAX_RECORD_BYTES,
                 pool: ThreadPoolExecutor | None = None) -> ReplicaData:
    """Read one replica directory; InputError if it is missing, empty or unreadable."""
    if not os.path.exists(spec.path):
        raise _input_error(spec, "no such directory")
    if not os.path.isdir(spec.path):
        raise _input_error(spec, "not a directory")
    if not os.access(spec.path, os.R_OK | os.X_OK):
        raise _input_error(spec, f"cannot read: {os.strerror(errno.EACCES)}")
    manifest, has_manifest = _load_manifest(spec)
    wal_dir = os.path.join(spec.path, WAL_DIR)
    has_wal = os.path.isdir(wal_dir) and any(WAL_NAME.match(n) for n in os.listdir(wal_dir))
    if not has_manifest and not has_wal:
        raise _input_error(spec, f"empty replica directory: no {MANIFEST_NAME} and no WAL"
                           f" files in {WAL_DIR}/ (is this a vnode data path?)")
    findings: list[Finding] = []
    own_pool = pool is None
    pool = pool or ThreadPoolExecutor(FILE_CHECK_THREADS)
    try:
        results = list(pool.map(lambda f: check_file(spec, manifest, f), manifest.files))
    finally:
        if own_pool:
            pool.shutdown()
    files = []
    for df, fs in results:
        files.append(df)
        findings.extend(fs)
    scan, records, wal_findings = scan_wal(spec, max_record_bytes,
                                           manifest.archived_version + 1)
    findings.extend(wal_findings)
    schemas = {t: dict(c) for t, c in manifest.schemas.items()}
    pending: list[PendingRound] = []
    txns = TxnReplay(spec)
    txns.load(manifest.archived_version, findings)
    wal_rows = replay_wal(spec, manifest.archived_version, schemas, records, findings, pending,
                          txns)
    # A pending round that removes archived files (record version 2): their rows are no
    # longer the replica's state (applying the round deletes them).
    removed = {name for p in pending for name in p.removes}
    if removed:
        files = [df for df in files if df.entry.name not in removed]
    return ReplicaData(spec, manifest, has_manifest, files, scan, schemas, wal_rows, findings,
                       pending, txns.outcomes(), published_keys(records))


def load_replicas(specs: list[ReplicaSpec],
                  max_record_bytes: int = _wal.DEFAULT_MAX_RECORD_BYTES) -> list[ReplicaData]:
    with ThreadPoolExecutor(FILE_CHECK_THREADS) as pool:
        return [load_replica(s, max_record_bytes, pool) for s in specs]
