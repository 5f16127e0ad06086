"""The reference vnode: a small time-series store a sync instance embeds (docs/vnode.md).

Owns: the table schemas, the memtable, the archived files (through ArchiveStore), the
applied and archived versions (a flush archives only up to the limit it is given: the
group's commit index, docs/vnode.md §5), and the callbacks of the embedding API (docs/embedding.md):
write_to_cache, confirm_forward, get_file_info, get_wal_info, get_version, notify_role,
notify_file_synced, notify_flow_control. Must not: write the WAL (the sync instance owns
`<data path>/wal`; the vnode only reads it to recover and tells the owner, or a writer it is
given, which versions are archived), open sockets, or decide roles.

Threads (one lock, `self._lock`, guards all state; every public method takes it):
* the vgroup's write thread (writes to one vnode are single-threaded, seed 数据转发流程):
  prepare_write, apply_local, write_to_cache / apply_record, flush / maybe_flush, recover,
  close;
* the sync instance's threads: get_file_info, get_wal_info, get_version, confirm_forward,
  notify_* (confirm_forward only touches the confirmation table, which has its own
  condition so client threads can wait on it without holding the vnode lock);
* client threads: query (reads archived files outside the lock), status, wait_confirmed.
A flush holds the lock while it writes Parquet: writes wait for it (docs/vnode.md §flush).
"""
from __future__ import annotations

import copy
import os
import shutil
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vrepl.errors import ConfigError
from vrepl.killpoints import killpoint, register
from vrepl.vnode import ingest as I
from vrepl.vnode import rows as R
from vrepl.vnode import staging as S
from vrepl.vnode.config import VnodeConfig, config_invalid
from vrepl.vnode.errors import ApplyError, ArchiveError, VnodeClosedError, VnodeError
from vrepl.vnode.files import (MANIFEST_NAME, ArchivedFile, ArchiveStore, Manifest,
                               arrow_schema, conform, file_magic, name_invalid, newest_per_ts,
                               rank)
from vrepl.vnode.memtable import Memtable, TableLog
from vrepl.wal import WalReader, inspect, list_wal_files  # read only: the WAL is the sync's

WAL_DIR = "wal"
MSG_TYPE_DATA = 1            # vrepl.wal.MSG_TYPE_DATA: records the vnode decodes
QUERY_RETRIES = 3            # a query that lost a race with a flush's file swap tries again

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


@dataclass(frozen=True)
class FileInfo:
    """getFileInfo's answer (seed 数据恢复流程 rule 4); magic 0 = no such file / no more files."""

    index: int
    name: str       # relative to the data path; "" when there is no file
    size: int
    magic: int


@dataclass(frozen=True)
class WalInfo:
    """getWalInfo's answer (seed rule 5): more 0 = the last WAL file, 1 = newer ones follow;
    name "" = no WAL file."""

    more: int
    index: int
    name: str       # relative to the data path ("wal/000000000003.wal")


class Vnode:
    """One vnode's storage: `Vnode(path, config)` loads the manifest; `recover()` replays the
    WAL above the archived version. See the module doc for which thread calls what."""

    def __init__(self, path: str, config: VnodeConfig | None = None, *,
                 clock: Callable[[], float] = time.monotonic):
        self.config = cfg = config or VnodeConfig()
        reason = config_invalid(cfg)
        if reason is not None:
            raise ConfigError(f"vnode config: {reason}")
        self.path = os.path.abspath(path)
        os.makedirs(self.path, exist_ok=True)
        self.wal_dir = os.path.join(self.path, WAL_DIR)
        self._clock = clock
        self._lock = threading.RLock()
        self._store = ArchiveStore(self.path, cfg)
        self._mem = Memtable()
        # The memtable being written to files by a flush (TDengine's imem): still queried,
        # no longer written. One flush at a time (_flush_lock, taken before _lock).
        self._imem: Memtable | None = None
        self._flush_lock = threading.RLock()
        # Request id -> version of the newest writes that carried one (docs/client-api.md
        # §retries): a retried request whose id is here is answered, not written again.
        self._rids: OrderedDict[str, int] = OrderedDict()
        self._closed = False
        self._load_from_manifest()
        self.role = "unsynced"
        self.flow_control = 0
        self._confirm_cond = threading.Condition()
        self._confirmed: OrderedDict[int, Any] = OrderedDict()

    def _load_from_manifest(self) -> None:
        m = self._store.manifest
        # Schemas of tables seen since: the manifest's plus what the memtable adds (replay).
        self._schemas: dict[str, dict[str, str]] = copy.deepcopy(m.schemas)
        self.applied_version = m.archived_version
        self.applied_epoch = m.archived_epoch
        # Rounds of files applied above the archive, in version order (docs/vnode.md §9.3).
        self._ingests: OrderedDict[int, PendingIngest] = OrderedDict()

    # -- properties -----------------------------------------------------------------------
    @property
    def archived_version(self) -> int:
        """Every version up to this one is in archived files: the WAL below it may go."""
        with self._lock:
            return self._store.manifest.archived_version

    @property
    def schemas(self) -> dict[str, dict[str, str]]:
        with self._lock:
            return copy.deepcopy(self._schemas)

    def _check_open(self) -> None:
        if self._closed:
            raise VnodeClosedError(f"vnode {self.path} is closed")

    # -- write path -----------------------------------------------------------------------
    def validate(self, rows: Any) -> str | None:
        """Why a client batch is refused (nothing is changed), or None."""
        with self._lock:
            return R.check_rows(rows, self.config, self._schemas, len(self._schemas))[0]

    def prepare_write(self, rows: Any) -> tuple[str | None, bytes]:
        """Validate a client batch and encode its WAL payload: (reason, b"") or (None, payload).

        On success the batch's new columns are added to the schemas at once, so a second
        batch validated before the first is applied cannot give a column another type.
        (A column added by a write that then fails keeps its type; docs/vnode.md §rows.)
        """
        with self._lock:
            self._check_open()
            reason, added, _ = R.check_rows(rows, self.config, self._schemas,
                                            len(self._schemas))
            if reason is not None:
                return reason, b""
            payload = R.encode_rows(rows)
            if len(payload) > self.config.max_payload_bytes:
                return (f"encoded batch is {len(payload)} bytes, above max_payload_bytes"
                        f" {self.config.max_payload_bytes}"), b""
            self._add_columns(added)
            return None, payload

    def _add_columns(self, added: dict[str, dict[str, str]]) -> None:
        for table, cols in added.items():
            self._schemas.setdefault(table, {}).update(cols)

    def prepare_raw(self, body: bytes, request_id: str | None = None
                    ) -> tuple[str | None, Any, bytes]:
        """prepare_write for a client's JSON body (an array of rows): (reason, [], b"") or
        (None, rows, payload), rows being a Staged batch (parsed straight into columns) or
        a list of rows (the reference path). The payload embeds the client's bytes as they
        are (they were just parsed and checked, so every replica decodes the same rows),
        which saves encoding the batch again; a request id makes it a format-2 payload."""
        if request_id is not None and R.REQUEST_ID_RE.fullmatch(request_id) is None:
            return f"request_id {request_id[:70]!r} does not match {R.REQUEST_ID_RULE}", [], b""
        with self._lock:
            self._check_open()
            staged = R.parse_staged(body, self.config, self._schemas, len(self._schemas))
            if staged is not None:
                return self._prepared(body, request_id, staged, staged.added)
        # Not the fast parser's kind of body: the reference path decides and explains.
        try:
            rows = R.loads_json(body)
        except UnicodeDecodeError as exc:
            return f"body is not UTF-8 ({exc.reason} at byte {exc.start})", [], b""
        except RecursionError:
            return "body nests too deeply", [], b""
        except ValueError as exc:
            return f"body is not JSON ({exc})", [], b""
        with self._lock:
            self._check_open()
            reason, added, _ = R.check_rows(rows, self.config, self._schemas,
                                            len(self._schemas))
            if reason is not None:
                return reason, [], b""
            return self._prepared(body, request_id, rows, added)

    def prepare_arrow(self, body: bytes, request_id: str | None = None
                      ) -> tuple[str | None, Any, bytes]:
        """prepare_raw for an Arrow IPC stream body (docs/client-api.md §Binary writes):
        (reason, [], b"") or (None, Staged rows, a format-4 payload embedding the stream)."""
        if request_id is not None and R.REQUEST_ID_RE.fullmatch(request_id) is None:
            return f"request_id {request_id[:70]!r} does not match {R.REQUEST_ID_RULE}", [], b""
        vunit = I.VNODE_UNIT[self.config.precision]
        with self._lock:
            self._check_open()
            staged, reason = I.arrow_staged(body, self.config, self._schemas,
                                            len(self._schemas), vunit)
            if staged is None:
                return reason, [], b""
            return self._accepted(I.encode_arrow_payload(body, request_id, vunit), staged)

    def prepare_lines(self, body: bytes, unit: int, max_line_bytes: int,
                      request_id: str | None = None) -> tuple[str | None, int, Any, bytes]:
        """prepare_raw for a body of InfluxDB line protocol whose timestamps are in `unit`
        (ingest.UNIT_CODES): (reason, line number, [], b"") or (None, 0, Staged rows, a
        format-5 payload embedding the lines). A line without a timestamp gets this
        moment, in the vnode's precision (the payload carries it: every replica agrees)."""
        if request_id is not None and R.REQUEST_ID_RE.fullmatch(request_id) is None:
            return (f"request_id {request_id[:70]!r} does not match {R.REQUEST_ID_RULE}", 0,
                    [], b"")
        vunit = I.VNODE_UNIT[self.config.precision]
        now = time.time_ns() // (1000 if vunit == I.VNODE_UNIT["us"] else 1_000_000)
        with self._lock:
            self._check_open()
            staged, reason, line, at = I.lines_staged(body, self.config, self._schemas,
                                                     len(self._schemas), unit, vunit, now,
                                                     max_line_bytes)
            if staged is None:
                mv = memoryview(body)
                end = bytes(mv[at:at + 200]).find(b"\n")
                text = bytes(mv[at:at + (end if end >= 0 else 200)]).decode("utf-8", "replace")
                return (f"line {line}: unable to parse {text[:100]!r}: {reason}", line, [],
                        b"")
            payload = I.encode_lines_payload(body, request_id, unit, vunit, now)
            reason, rows, payload = self._accepted(payload, staged)
            return reason, 0, rows, payload

    def _accepted(self, payload: bytes, staged: Any) -> tuple[str | None, Any, bytes]:
        """(lock held) A checked batch's answer: the payload, or why it is too big; its new
        columns are reserved only when it is accepted."""
        if len(payload) > self.config.max_payload_bytes:
            return (f"encoded batch is {len(payload)} bytes, above max_payload_bytes"
                    f" {self.config.max_payload_bytes}"), [], b""
        self._add_columns(staged.added)
        return None, staged, payload

    def _prepared(self, body: bytes, request_id: str | None, rows: Any,
                  added: dict[str, dict[str, str]]) -> tuple[str | None, Any, bytes]:
        """prepare_raw's answer for checked rows (lock held): the payload, or the reason
        it is too big; the batch's new columns are reserved only when it is accepted."""
        payload = R.encode_payload(body, request_id)
        if len(payload) > self.config.max_payload_bytes:
            return (f"encoded batch is {len(payload)} bytes, above max_payload_bytes"
                    f" {self.config.max_payload_bytes}"), [], b""
        self._add_columns(added)
        return None, rows, payload

    def apply_prepared(self, version: int, epoch: int, rows: Sequence[Sequence[Any]],
                       nbytes: int, request_id: str | None = None) -> bool:
        """Apply rows that prepare_raw/prepare_write accepted on this vnode (the master's
        path: they were checked and their columns reserved, so they are not checked again).
        False if `version` was already applied."""
        with self._lock:
            self._check_open()
            if version <= self.applied_version:
                return False
            self._mem.apply(version, epoch, rows, self._clock(), nbytes, self._schemas)
            self.applied_version = version
            self.applied_epoch = max(self.applied_epoch, epoch)
            if request_id is not None:
                self._note_rid(request_id, version)
            return True

    def _note_rid(self, rid: str, version: int) -> None:
        rids = self._rids
        rids[rid] = version
        rids.move_to_end(rid)
        if len(rids) > self.config.max_dedup_entries:
            rids.popitem(last=False)

    def request_version(self, request_id: str) -> int | None:
        """The version that applied a write carrying `request_id`, if remembered."""
        with self._lock:
            return self._rids.get(request_id)

    def apply_local(self, version: int, epoch: int, rows: Sequence[Sequence[Any]],
                    nbytes: int | None = None) -> bool:
        """Apply a batch written at `version` to the memtable; False if already applied.

        Rows must have the shape check_rows accepts; their types are checked against the
        schemas (ApplyError names the version on a conflict, and nothing is applied). The
        memtable keeps references to the rows' value dicts: do not change them afterwards.
        """
        with self._lock:
            self._check_open()
            if version <= self.applied_version:
                return False     # idempotent: a replayed or re-forwarded version
            reason, added, _ = R.check_rows(rows, None, self._schemas)
            if reason is not None:
                raise ApplyError(f"version {version}: cannot apply: {reason}")
            self._apply_locked(version, epoch, rows, added, nbytes)
            return True

    def _apply_locked(self, version: int, epoch: int, rows: Sequence[Sequence[Any]],
                      added: dict[str, dict[str, str]], nbytes: int | None) -> None:
        self._add_columns(added)
        self._mem.apply(version, epoch, rows, self._clock(), nbytes, self._schemas)
        self.applied_version = version
        self.applied_epoch = max(self.applied_epoch, epoch)

    def write_to_cache(self, version: int, epoch: int, payload: bytes,
                       msg_type: int = MSG_TYPE_DATA) -> bool:
        """The sync callback: apply a WAL record's payload; False if already applied.

        Records of other message types only advance the applied version. A malformed
        payload raises PayloadError, a type conflict with the schemas ApplyError; both name
        the version, and nothing is applied.
        """
        with self._lock:
            self._check_open()
            if version <= self.applied_version:
                return False
            if msg_type == MSG_TYPE_DATA and S.is_ingest_payload(payload):
                self._note_ingest(version, epoch, payload)
                return True
            if msg_type != MSG_TYPE_DATA or R.is_noop(payload):
                # No rows: only the version advances (a no-op, docs/vnode.md §2).
                self.applied_version = version
                self.applied_epoch = max(self.applied_epoch, epoch)
                return True
            staged = I.decode_staged(payload, self.config.max_payload_bytes, self._schemas)
            if staged is not None:
                self._apply_locked(version, epoch, staged, staged.added, len(payload))
            else:
                rows, added, conflict = I.decode_checked(payload, version,
                                                         self.config.max_payload_bytes,
                                                         self._schemas)
                if conflict is not None:
                    raise ApplyError(f"version {version}: cannot apply: {conflict}")
                self._apply_locked(version, epoch, rows, added, len(payload))
            if payload[3] in R.RID_FORMATS:
                rid = R.payload_request_id(payload)
                if rid is not None:
                    self._note_rid(rid, version)
            return True

    def _note_ingest(self, version: int, epoch: int, payload: bytes) -> None:
        """(lock held) A round's record: check its columns against the schemas, take its
        version, and remember it until a flush archives it (docs/vnode.md §9.3)."""
        rec = S.decode_ingest_payload(payload, version)
        added: dict[str, dict[str, str]] = {}
        for table, cols in rec.columns().items():
            known = self._schemas.get(table, {})
            for col, typ in cols.items():
                have = known.get(col) or added.get(table, {}).get(col)
                if have is None:
                    added.setdefault(table, {})[col] = typ
                elif not R.type_accepts(have, typ):
                    raise ApplyError(f"version {version}: cannot apply: column {col!r} of"
                                     f" table {table!r} is {have}, the round's file has {typ}"
                                     f" (a column's type cannot change)")
        self._add_columns(added)
        staged = not S.missing_staged(self.path, rec)
        self._ingests[version] = PendingIngest(version, epoch, rec, staged)
        self.applied_version = version
        self.applied_epoch = max(self.applied_epoch, epoch)

    # -- rounds of ingested files (docs/vnode.md §9) ----------------------------------------
    def pending_ingests(self) -> list[PendingIngest]:
        """Rounds whose record is applied but not yet archived, in version order."""
        with self._lock:
            return list(self._ingests.values())

    def pending_ingest(self, version: int) -> PendingIngest | None:
        with self._lock:
            return self._ingests.get(version)

    def first_unstaged_ingest(self) -> int | None:
        """The version of the first pending round whose files are not all staged, or None."""
        with self._lock:
            return next((v for v, p in self._ingests.items() if not p.staged), None)

    def ingest_staged(self, version: int) -> bool:
        """Check again whether every file of the round at `version` is staged (the node
        staged the missing ones); True if so (or if it is no longer pending)."""
        with self._lock:
            p = self._ingests.get(version)
            if p is None:
                return True
            p.staged = not S.missing_staged(self.path, p.record)
            return p.staged

    def reserve_columns(self, record: S.IngestRecord) -> str | None:
        """(master, before forwarding a round) Why the round's columns conflict with the
        schemas now, or None: then they are reserved, as prepare_write does for rows."""
        with self._lock:
            self._check_open()
            added: dict[str, dict[str, str]] = {}
            for table, cols in record.columns().items():
                known = self._schemas.get(table, {})
                if table not in self._schemas and len(self._schemas) + len(added) \
                        >= self.config.max_tables:
                    return f"table {table!r} would exceed max_tables {self.config.max_tables}"
                for col, typ in cols.items():
                    have = known.get(col)
                    if have is not None and not R.type_accepts(have, typ):
                        return (f"column {col!r} of table {table!r} is {have}, the round's"
                                f" file has {typ} (a column's type cannot change)")
                    if have is None:
                        added.setdefault(table, {})[col] = typ
                if len(known) + len(added.get(table, {})) > self.config.max_columns_per_table:
                    return (f"table {table!r} would have more than max_columns_per_table"
                            f" {self.config.max_columns_per_table} columns")
            self._add_columns(added)
            return None

    def archived_entry(self, name: str) -> ArchivedFile | None:
        """The manifest's entry of the archived file `name`, if it names one."""
        with self._lock:
            return self._store.entry(name)

    def apply_record(self, record: Any) -> bool:
        """write_to_cache for a vrepl._core.record.Record (or anything with its fields)."""
        return self.write_to_cache(record.version, record.epoch, record.payload,
                                   getattr(record, "msg_type", MSG_TYPE_DATA))

    def get_version(self) -> int:
        """The highest version applied (memtable or archived)."""
        with self._lock:
            return self.applied_version

    # -- confirmations, role, flow control (sync callbacks) --------------------------------
    def confirm_forward(self, version: int, status: Any) -> None:
        """Remember a forward's outcome for wait_confirmed (the newest max_confirmations)."""
        with self._confirm_cond:
            self._confirmed[version] = status
            while len(self._confirmed) > self.config.max_confirmations:
                self._confirmed.popitem(last=False)
            self._confirm_cond.notify_all()

    def wait_confirmed(self, version: int, timeout_s: float | None = None) -> Any:
        """The status confirm_forward gave `version`, or None after timeout_s."""
        with self._confirm_cond:
            self._confirm_cond.wait_for(lambda: version in self._confirmed, timeout_s)
            return self._confirmed.get(version)

    def notify_role(self, role: Any) -> None:
        with self._lock:
            self.role = getattr(role, "value", role)

    def notify_flow_control(self, level: int) -> None:
        with self._lock:
            self.flow_control = int(level)

    def notify_file_synced(self, *_: Any) -> None:
        """A restore replaced archived files: reload the manifest, drop the memtable.

        Called after the file phase of a restore and before its WAL phase, which then
        replays (write_to_cache) everything above the new get_version().
        """
        with self._lock:
            self._check_open()
            self._store.reload()
            self._mem.clear()
            self._load_from_manifest()

    # -- restore callbacks ----------------------------------------------------------------
    def get_file_info(self, index: int, name: str | None = None) -> FileInfo:
        """getFileInfo (seed 数据恢复流程 rule 4).

        Without a name (the master's call): the file at `index` (0 = oldest); index n, just
        after the n data files, is the manifest; beyond it magic 0 (no more files). With a
        name (the slave's call): this node's file of that name, size and magic computed from
        its bytes, magic 0 if it has none. An unusable name or an I/O error raises
        ArchiveError (the sync layer answers -1 and stops the restore, rule 6).
        """
        with self._lock:
            files = self._store.manifest.files
            n = len(files)
            if not name:
                if 0 <= index < n:
                    f = files[index]
                    return FileInfo(index, f.name, f.size, f.magic)
                mb = self._store.manifest_bytes
                if index == n and mb:
                    return FileInfo(n, MANIFEST_NAME, len(mb), file_magic(mb))
                return FileInfo(index, "", 0, 0)
            reason = name_invalid(name)
            if reason is not None:
                raise ArchiveError(name, reason)
            if name == MANIFEST_NAME:
                index = n
            else:
                index = next((i for i, f in enumerate(files) if f.name == name), index)
        try:
            with open(self._store.abspath(name), "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return FileInfo(index, name, 0, 0)
        except OSError as exc:
            raise ArchiveError(name, f"cannot read: {exc.strerror}") from exc
        return FileInfo(index, name, len(data), file_magic(data))

    def get_wal_info(self, index: int = 0) -> WalInfo:
        """getWalInfo (seed rule 5) over `<data path>/wal`: index 0 = the oldest file."""
        if not os.path.isdir(self.wal_dir):
            return WalInfo(0, index, "")
        files = list_wal_files(self.wal_dir)
        if not files:
            return WalInfo(0, index, "")
        wf = files[0] if index == 0 else next((f for f in files if f.index == index), None)
        if wf is None:
            return WalInfo(0, index, "")
        more = 0 if wf is files[-1] else 1
        return WalInfo(more, wf.index, f"{WAL_DIR}/{os.path.basename(wf.path)}")

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
            limit = self._next_cut(self._limit(up_to_version), up_to_version is None)[0]
            p = next(iter(self._ingests.values()), None)
            if p is not None and p.staged and p.version <= limit:
                return f"round {p.record.round} of ingested files at v{p.version} is committed"
            mem = self._mem
            if not mem.rows or mem.min_version > limit:
                return None
            if mem.bytes >= cfg.max_memtable_bytes:
                return f"memtable holds {mem.bytes} bytes >= max_memtable_bytes"
            if mem.rows >= cfg.max_memtable_rows:
                return f"memtable holds {mem.rows} rows >= max_memtable_rows"
            age_ms = ((self._clock() if now is None else now) - mem.first_write_at) * 1000
            if age_ms >= cfg.max_memtable_age_ms:
                return f"oldest unflushed row is {age_ms:.0f} ms old >= max_memtable_age_ms"
            return None

    def maybe_flush(self, wal: Any = None, up_to_version: int | None = None
                    ) -> list[ArchivedFile]:
        """flush(wal, up_to_version) if flush_due(); the files written (none if not due)."""
        with self._lock:
            if self.flush_due(up_to_version=up_to_version) is None:
                return []
            return self.flush(wal, up_to_version)

    def _limit(self, up_to_version: int | None) -> int:
        return self.applied_version if up_to_version is None \
            else min(up_to_version, self.applied_version)

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
                try:
                    if mem is not None:
                        step, superseded, files = self._write_files(mem, old, cut, schemas)
                    else:
                        step, superseded, files = [], [], list(old.files)
                    if ingest is not None:
                        killpoint(KP_APPLY_FILES)
                        # Record version 2: the files it removes leave this manifest and
                        # are deleted once it is durable (as superseded files are).
                        files, removed = S.apply_removes(files, ingest.record.removes)
                        superseded = superseded + removed
                        files += self._link_round(ingest)
                        killpoint(KP_APPLY_LINK)
                except BaseException:
                    if mem is not None:
                        with self._lock:   # keep the rows: put imem back under newer writes
                            self._mem = self._merge_back(mem, self._mem, self._schemas)
                            self._imem = None
                    raise
                with self._lock:
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
                    # Durable in the manifest: the staged copies may go (a crash before this
                    # leaves them to clean_staging at the next open).
                    shutil.rmtree(S.staged_round_path(self.path, ingest.record.round),
                                  ignore_errors=True)
                    killpoint(KP_APPLY_CLEANUP)
        if wal is not None and archived:
            wal.recycle(archived + 1)
        return written

    def _link_round(self, p: PendingIngest) -> list[ArchivedFile]:
        """Link the staged files of round `p` into the archive; their manifest entries."""
        rec = p.record
        missing = S.missing_staged(self.path, rec)
        if missing:     # removed or damaged since it was found staged
            raise VnodeError(f"v{p.version}: files {missing} of round {rec.round} are no"
                             f" longer staged")
        out = []
        for k, f in enumerate(rec.files):
            name = rec.archive_name(p.version, k)
            self._store.link_in(S.abspath(self.path, rec.staged_name(k)), name)
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

    # -- query ----------------------------------------------------------------------------
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

    def query(self, table: str, start: int, end: int) -> list[dict[str, Any]]:
        """Rows of `table` with start <= ts < end, in ts order, newest version per ts.

        Each row is {"ts", "_version", "_epoch", <every column of the table's schema>}
        (None where a row has no value). Archived files are verified (size, magic) as read.
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

    # -- recovery, verification, status, close ----------------------------------------------
    def recover(self, wal_dir: str | None = None, clean_staging: bool = True) -> int:
        """Crash recovery: replay WAL records above the applied version; returns how many.

        The manifest was loaded by the constructor; every version up to archived_version is
        in the files. A WAL that starts after archived_version + 1 lost records the files do
        not have: VnodeError, never a silent gap. Then (clean_staging) the staging area
        keeps only the rounds the replayed records name (docs/vnode.md §9.5): applied
        rounds, rounds cut from the log and rounds a master staged but never forwarded go,
        with partial fetches and the producers' incoming/ directory.
        """
        wal_dir = wal_dir or self.wal_dir
        with self._lock:
            self._check_open()
            n = 0
            if os.path.isdir(wal_dir):
                start = self.applied_version + 1
                for rec in WalReader(wal_dir, self.config.max_payload_bytes).iter_records(start):
                    if n == 0 and rec.version > start:
                        raise VnodeError(f"{wal_dir}: WAL resumes at version {rec.version} but"
                                         f" this vnode holds versions up to {start - 1}:"
                                         f" versions {start}..{rec.version - 1} are lost")
                    self.write_to_cache(rec.version, rec.epoch, rec.payload, rec.msg_type)
                    n += 1
            if clean_staging:
                S.clean_staging(self.path, {p.record.round for p in self._ingests.values()})
            return n

    def rebuild(self, wal_dir: str | None = None) -> int:
        """Drop the memtable, reload the manifest and recover() again; returns records replayed.

        For a WAL truncated after a version (design.md §4.3): valid while the kept version
        is at or above archived_version; VnodeError otherwise (archived files hold versions
        the log no longer has: the node needs a restore).
        """
        with self._flush_lock, self._lock:
            self._check_open()
            self._store.reload()
            self._mem = Memtable()
            self._load_from_manifest()
            wal_dir = wal_dir or self.wal_dir
            archived = self.applied_version
            if os.path.isdir(wal_dir):
                # An empty WAL (all recycled) says nothing; a WAL ending below the archived
                # version was truncated under archived rows.
                last = inspect(wal_dir, self.config.max_payload_bytes).last_version
                if 0 < last < archived:
                    raise VnodeError(f"{wal_dir}: the WAL ends at version {last}, below the"
                                     f" archived version {archived}: archived files hold"
                                     f" versions the log no longer has; this vnode needs a"
                                     f" restore")
            # Staged rounds stay: the node may be about to forward one (docs/vnode.md §9.5).
            n = self.recover(wal_dir, clean_staging=False)
            # Writes above the kept version were cut from the log: forget their ids.
            for rid in [r for r, v in self._rids.items() if v > self.applied_version]:
                del self._rids[rid]
            return n

    def verify_files(self) -> list[str]:
        """Read every archived file against its manifest entry; one reason per bad file."""
        bad = []
        with self._lock:
            files = list(self._store.manifest.files)
        for f in files:
            try:
                self._store.read(f)
            except (ArchiveError, OSError) as exc:
                bad.append(str(exc))
        return bad

    def status(self) -> dict[str, Any]:
        with self._lock:
            m = self._store.manifest
            return {"path": self.path, "role": self.role, "version": self.applied_version,
                    "epoch": self.applied_epoch, "archived_version": m.archived_version,
                    "memtable_rows": self._mem.rows, "memtable_bytes": self._mem.bytes,
                    "flushing": self._imem is not None,
                    "files": len(m.files), "tables": len(self._schemas),
                    "flow_control": self.flow_control}

    def close(self, wal: Any = None, up_to_version: int | None = None) -> None:
        """Flush (durably) the rows up to `up_to_version` (None: all; see flush) and refuse
        further calls; idempotent. Rows above the limit are not lost: the WAL holds them
        and the next start replays them."""
        with self._flush_lock:
            with self._lock:
                if self._closed:
                    return
            self.flush(wal, up_to_version)
            with self._lock:
                self._closed = True

    def __enter__(self) -> "Vnode":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
