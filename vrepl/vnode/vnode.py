"""The reference vnode: a small time-series store a sync instance embeds (docs/vnode.md).

Owns: the table schemas, the memtable, the archived files (through ArchiveStore), the
applied and archived versions (a flush archives only up to the limit it is given: the
group's commit index, docs/vnode.md §5), and the callbacks of the embedding API (docs/embedding.md):
write_to_cache, confirm_forward, get_file_info, get_wal_info, get_version, notify_role,
notify_file_synced, notify_flow_control. Must not: write the WAL (the sync instance owns
`<data path>/wal`; the vnode only reads it to recover and tells the owner, or a writer it is
given, which versions are archived), open sockets, or decide roles.
Three mixins hold parts of Vnode, on the state this module sets up: flush.py (archiving the
memtable and the rounds of ingested files), query.py (queries, the table list) and
restoreinfo.py (get_file_info, get_wal_info).

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
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Sequence

from vrepl.errors import ConfigError
from vrepl.txn.machine import Outcome
from vrepl.txn.record import is_txn_payload
from vrepl.vnode import ingest as I
from vrepl.vnode import rows as R
from vrepl.vnode import staging as S
from vrepl.vnode.config import VnodeConfig, config_invalid
from vrepl.vnode.errors import ApplyError, ArchiveError, VnodeClosedError, VnodeError
from vrepl.vnode.files import ArchivedFile, ArchiveStore
from vrepl.vnode.flush import (
    KP_APPLY_CLEANUP,
    KP_APPLY_FILES,
    KP_APPLY_LINK,
    KP_APPLY_MANIFEST,
    PendingIngest,
    VnodeFlush,
)
from vrepl.vnode.memtable import Memtable
from vrepl.vnode.query import QUERY_RETRIES, VnodeQuery
from vrepl.vnode.restoreinfo import WAL_DIR, FileInfo, VnodeRestoreInfo, WalInfo
from vrepl.vnode.txnapply import DEFAULT_LABEL_RETENTION_MS, TxnRound, VnodeTxns, round_columns
from vrepl.wal import WalReader, inspect  # read only: the WAL is the sync's

MSG_TYPE_DATA = 1            # vrepl.wal.MSG_TYPE_DATA: records the vnode decodes

# Names other modules import from here (vrepl/vnode/__init__.py, bench/, tests/).
__all__ = ["KP_APPLY_CLEANUP", "KP_APPLY_FILES", "KP_APPLY_LINK", "KP_APPLY_MANIFEST",
           "MSG_TYPE_DATA", "QUERY_RETRIES", "WAL_DIR", "FileInfo", "PendingIngest", "Vnode",
           "WalInfo"]


class Vnode(VnodeFlush, VnodeQuery, VnodeRestoreInfo):
    """One vnode's storage: `Vnode(path, config)` loads the manifest; `recover()` replays the
    WAL above the archived version. See the module doc for which thread calls what."""

    def __init__(self, path: str, config: VnodeConfig | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 txn_label_retention_ms: int = DEFAULT_LABEL_RETENTION_MS):
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
        # Transactions (docs/transactions.md): their table, rebuilt with the memtable.
        self.txns = VnodeTxns(self.path, txn_label_retention_ms, cfg.fsync)
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
        # Transactions finished in the archive (the labels file); the WAL replays the rest.
        self.txns.load(m.archived_version)

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
            if msg_type == MSG_TYPE_DATA and is_txn_payload(payload):
                self._apply_txn(version, epoch, payload)
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

    def apply_txn(self, version: int, epoch: int, payload: bytes) -> Outcome | None:
        """write_to_cache for a transaction record (format 9), returning what applying it
        did (docs/transactions.md §2); None if `version` was already applied."""
        with self._lock:
            self._check_open()
            if version <= self.applied_version:
                return None
            return self._apply_txn(version, epoch, payload)

    def _apply_txn(self, version: int, epoch: int, payload: bytes) -> Outcome:
        """(lock held) A transaction step: staged rows stay out of the memtable; the publish
        (commit record) appends every staged batch at its version, in this one step (a
        Staged batch through the memtable's batch apply, as a plain write's)."""
        out, added, batches, files = self.txns.apply(version, epoch, payload, self._schemas,
                                                     self.path)
        if files is not None:       # a published transaction with files: a flush point
            self._ingests[version] = files
        self._add_columns(added)
        for batch in batches:
            self._mem.apply(version, epoch, batch, self._clock(), None, self._schemas)
        self.applied_version = version
        self.applied_epoch = max(self.applied_epoch, epoch)
        return out

    def _note_ingest(self, version: int, epoch: int, payload: bytes) -> None:
        """(lock held) A round's record: check its columns against the schemas, take its
        version, and remember it until a flush archives it (docs/vnode.md §9.3)."""
        rec = S.decode_ingest_payload(payload, version)
        added = round_columns(self._schemas, rec, version)
        self._add_columns(added)
        staged = not S.missing_staged(self.path, rec)
        self._ingests[version] = PendingIngest(version, epoch, rec, staged)
        self.applied_version = version
        self.applied_epoch = max(self.applied_epoch, epoch)

    # -- rounds of ingested files (docs/vnode.md §9) ----------------------------------------
    def pending_ingests(self) -> list[PendingIngest]:
        """Rounds whose record is applied but not yet archived, in version order, whose
        files the node stages: format-8 rounds and transactions' "files" records (a
        published transaction's TxnRound is staged by those records' jobs)."""
        with self._lock:
            out = [p for p in self._ingests.values() if not isinstance(p.record, TxnRound)]
            return sorted(out + list(self.txns.rounds.values()), key=lambda p: p.version)

    def pending_ingest(self, version: int) -> PendingIngest | None:
        with self._lock:
            p = self._ingests.get(version) or self.txns.rounds.get(version)
            return None if p is None or isinstance(p.record, TxnRound) else p

    def first_unstaged_ingest(self) -> int | None:
        """The version of the first pending round whose files are not all staged, or None."""
        with self._lock:
            return min((v for d in (self._ingests, self.txns.rounds) for v, p in d.items()
                        if not p.staged), default=None)

    def ingest_staged(self, version: int) -> bool:
        """Check again whether every file of the round at `version` is staged (the node
        staged the missing ones); True if so (or if it is no longer pending)."""
        with self._lock:
            staged = self.txns.refresh(version, self.path)
            for p in self._ingests.values():    # a transaction's files serve its TxnRound
                if not p.staged and isinstance(p.record, TxnRound):
                    p.staged = not S.missing_staged(self.path, p.record)
            if staged is not None:
                return staged
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
                keep = {r for p in self._ingests.values()
                        for r in getattr(p.record, "staged_rounds", (p.record.round,))}
                S.clean_staging(self.path, keep | self.txns.staged_rounds())
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
                    "flow_control": self.flow_control, "txn": self.txns.status()}

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
