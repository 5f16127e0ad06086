"""One `vrepl ship` connection on the receiver: the receiver's half of the protocol
(docs/ship.md §3.3) and the load of verified files into the vgroup through ingest records.

Owns: `Session` (a thread per connection: BEGIN, STATE, the list, the schema and owner check,
DELETE, OFFER/WANT, DATA with its whole-file CRC-32C, END, LOADED, DONE), the batches of
received files handed to the vgroup's ingest (at most MAX_ROUND_FILES per record), load.log
once a record committed, and the receiver's kill points.
Must not: block the node's I/O thread (it reaches the vgroup through
`asyncio.run_coroutine_threadsafe`), write into the archive or the WAL (ingest does), or
trust a byte the sender sent before checking it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import Counter

from vrepl._core import crc32c as _crc
from vrepl.errors import InvariantViolation
from vrepl.killpoints import killpoint, register
from vrepl.node.ingest import IngestError, IngestFile, IngestRemove
from vrepl.node.shipdirs import (
    DATA_DIR,
    DELETE_LINE,
    FILES_LIST,
    INGEST_BUSY_RETRY_S,
    INGEST_BUSY_TRIES,
    INGEST_TIMEOUT_S,
    LOAD_LINE,
    PART_SUFFIX,
    RECEIVER_DIR,
    ROUNDS_FILE,
    RSYNC_LOG,
    SYNC_END,
    SenderDirR,
    SenderStatus,
    _link_or_copy,
    _remove_tree,
    entry_refusal,
    key_text,
    read_manifest_of,
    recover,
)
from vrepl.ship import protocol as P
from vrepl.ship.errors import (
    ERR_BAD_DATA,
    ERR_BUSY,
    ERR_CONFIG,
    ERR_DISK_FULL,
    ERR_IN_USE,
    ERR_LINEAGE,
    ERR_LOAD,
    ERR_NOT_MASTER,
    ERR_OWNER,
    ERR_PROTOCOL,
    ERR_TYPE,
    ERR_UNSAFE_NAME,
    ERROR_NAMES,
    PeerGone,
    Refused,
    ShipError,
    refused,
)
from vrepl.ship.state import (
    LOG_DELETED_END,
    LOG_DELETED_START,
    LOG_END,
    LOG_LOADED,
    LOG_REMOVED,
    LOG_TSFILE_END,
    LOG_TSFILE_START,
    FileList,
    Key,
    SyncLog,
    entry_line,
    fsync_dir,
)
from vrepl.ship.stream import ShipStream
from vrepl.transport import codec
from vrepl.vnode.files import write_atomic
from vrepl.vnode.rows import COLUMN_NAME_RE, TABLE_NAME_RE, TYPE_NAMES, type_accepts
from vrepl.vnode.staging import MAX_ROUND_FILES

if TYPE_CHECKING:
    from vrepl.node.vgroup import VgroupHost

log = logging.getLogger("vrepl.ship")


class SessionHost(Protocol):
    """What a Session needs of its ShipService (vrepl/node/shipreceiver.py, which creates
    the sessions: not imported here, so the two modules do not import each other)."""

    vgroups: "dict[int, VgroupHost]"
    fsync: bool
    status_of: dict[str, SenderStatus]
    _lock: threading.Lock
    _active: dict[str, Any]  # uuid -> its running Session
    m_rounds: Counter
    m_bytes: Counter
    m_files: Counter
    m_retries: Counter
    m_refusals: Counter

    def claim(self, vg: "VgroupHost", uuid: str, tables: list[str]) -> str | None: ...


KP_RECEIVED = register(
    "ship.receiver.after_receive",
    "a file's bytes are whole and verified (renamed into data/, in sync.log); not yet handed to ingest",
)
KP_INGESTED = register(
    "ship.receiver.after_ingest", "the ingest record of a batch is committed; load.log does not name its files"
)
KP_LOAD_LOGGED = register("ship.receiver.after_load_log", "load.log names the batch; LOADED not yet sent to the sender")
KP_SYNC_END = register(
    "ship.receiver.after_sync_end", "the round is received and loaded, sync.end written; sync.log not folded"
)


class Session:
    """One sender's connection (a thread): the receiver's half of docs/ship.md §3."""

    def __init__(self, svc: SessionHost, stream: ShipStream, hello: codec.Hello) -> None:
        self.svc = svc
        self.stream = stream
        self.hello = hello
        self.vg = svc.vgroups[hello.vgroup_id]
        self.sd: SenderDirR | None = None
        self.status: SenderStatus | None = None
        self.offers: dict[int, P.FileEntry] = {}
        self.deleted: list[P.FileEntry] = []
        self.received: list[int] = []  # verified offers, not loaded yet
        self.round: P.Begin | None = None
        self.log: SyncLog | None = None
        self.bytes_in = 0
        self.archived: set[Key] | None = None  # keys of this sender's archived files

    # -- errors ----------------------------------------------------------------------------------
    def refuse(self, code: int, reason: str) -> Refused:
        self.svc.m_refusals.labels(ERROR_NAMES.get(code, "other")).inc()
        return refused(code, reason)

    def run(self) -> None:
        uuid = None
        try:
            begin = self.stream.recv()
            if type(begin) is not P.Begin:
                raise self.refuse(ERR_PROTOCOL, f"expected begin, got {begin.describe()}")
            uuid = begin.uuid.hex()
            with self.svc._lock:
                other = self.svc._active.get(uuid)
                if other is not None:
                    raise self.refuse(
                        ERR_IN_USE,
                        f"sender {uuid} is shipping from {other.stream.peer}"
                        " already (a second process, or a cloned UUID)",
                    )
                self.svc._active[uuid] = self
                self.status = self.svc.status_of.setdefault(uuid, SenderStatus(uuid))
            self.status.sender_id, self.status.host = self.hello.node, begin.host
            self.status.peer, self.status.vgroup, self.status.connected = self.stream.peer, self.vg.id, True
            self.status.files_behind, self.status.bytes_behind = begin.new, begin.new_bytes
            self._round(begin)
            self.svc.m_rounds.labels(str(self.vg.id), "ok").inc()
        except Refused as exc:
            log.warning("ship %s vg%d from %s: refused: %s", uuid or "?", self.vg.id, self.stream.peer, exc.reason)
            self._note_error(exc.reason)
            self.svc.m_rounds.labels(str(self.vg.id), "refused").inc()
            self.stream.send_error(exc.code, exc.reason)
        except PeerGone as exc:
            log.info("ship %s vg%d from %s: connection ended: %s", uuid or "?", self.vg.id, self.stream.peer, exc)
            self._note_error(f"connection ended: {exc}")
            self.svc.m_rounds.labels(str(self.vg.id), "cut").inc()
        except OSError as exc:
            reason = f"{exc.strerror or exc}"
            log.error("ship %s vg%d: %s", uuid or "?", self.vg.id, reason)
            self._note_error(reason)
            self.svc.m_rounds.labels(str(self.vg.id), "failed").inc()
            self.stream.send_error(ERR_DISK_FULL if exc.errno == 28 else ERR_LOAD, reason)
        except Exception as exc:  # a bug here must not take the node down
            log.exception("ship %s vg%d: session failed", uuid or "?", self.vg.id)
            self._note_error(repr(exc))
            self.stream.send_error(ERR_LOAD, f"receiver error: {exc!r}")
        finally:
            if self.log is not None:
                self.log.close()
            if uuid is not None:
                with self.svc._lock:
                    if self.svc._active.get(uuid) is self:
                        del self.svc._active[uuid]
            if self.status is not None:
                self.status.connected = False
            self.stream.close()

    def _note_error(self, reason: str) -> None:
        if self.status is not None:
            self.status.last_error, self.status.last_error_at = reason, time.time()

    # -- the round ---------------------------------------------------------------------------------
    def _round(self, b: P.Begin) -> None:
        vg = self.vg
        if vg.role != "master" or vg.vnode is None:
            raise self.refuse(
                ERR_NOT_MASTER, f"vg{vg.id} on n{vg.node_id} is {vg.role}, not the master (master: n{vg.master})"
            )
        cfg = vg.node_cfg.vnode
        if (b.precision, b.file_span_ms) != (cfg.precision, cfg.file_span_ms):
            raise self.refuse(
                ERR_CONFIG,
                f"the sender's vnode has precision {b.precision} and file_span_ms"
                f" {b.file_span_ms}, vg{vg.id} here {cfg.precision} and {cfg.file_span_ms}",
            )
        self.round = b
        uuid = b.uuid.hex()
        sd = self.sd = SenderDirR(vg.path, uuid, self.svc.fsync)
        sd.ensure()
        # The seed's refusal: the previous round must be loaded first. Its recovery runs now
        # (loading what it can); if that fails the round is refused and the sender retries.
        try:
            done = recover(sd, self, vnode=vg.vnode)
        except (IngestError, ShipError) as exc:
            raise self.refuse(
                ERR_BUSY, f"the previous round of sender {uuid} is not loaded yet ({exc}); retry later"
            ) from None
        if done:
            log.info("ship %s vg%d: recovered before the round: %s", uuid, vg.id, "; ".join(done))
        fl = sd.files()
        if self.status is None:
            raise InvariantViolation("self.status is not set")
        self.status.files = len(fl.entries)
        digest = fl.digest()
        match = digest == b.last_digest and len(fl.entries) == b.last_files
        self._check_lineage(b, fl)
        if b.new or b.deleted or not match or b.flags & P.FLAG_RESYNC:
            # The sender may log this round in its sync.log once STATE is answered, and fold
            # it into its list's "last round" even if the round is cut: remember it first.
            sd.note_begun(b.round_id)
        self.stream.send(P.State(fl.seq, fl.round_id, match, len(fl.entries), digest))
        msg = self.stream.recv()
        if type(msg) is P.ListRequest:
            self._send_list(fl)
            msg = self.stream.recv()
        if type(msg) is P.End:  # nothing new: no sync.log at all
            self.stream.send(P.Done(b.seq, len(fl.entries), digest))
            self.status.last_round, self.status.last_round_at = b.seq, time.time()
            self.status.files_behind = self.status.bytes_behind = 0
            return
        tables = self._schema(msg)
        self.log = SyncLog.start(sd.p(RSYNC_LOG), b.seq, b.round_id, self.svc.fsync)
        self.log.write([LOG_DELETED_START])
        msg = self.stream.recv()
        while type(msg) is P.Delete:
            for e in msg.entries:
                why = entry_refusal(e)
                if why:
                    raise self.refuse(ERR_UNSAFE_NAME, why)
            self.deleted.extend(msg.entries)
            self.log.write([LOG_REMOVED + entry_line(e) for e in msg.entries])
            msg = self.stream.recv()
        self.log.write([LOG_DELETED_END, LOG_TSFILE_START])
        del tables
        while True:
            t = type(msg)
            if t is P.Offer:
                self._offer(msg)  # type: ignore[arg-type]
            elif t is P.Data:
                self._data(msg)  # type: ignore[arg-type]
            elif t is P.End:
                break
            else:
                raise self.refuse(ERR_PROTOCOL, f"unexpected {msg.describe()}")
            msg = self.stream.recv()
        end: P.End = msg  # type: ignore[assignment]
        if end.offered != len(self.offers) or end.deleted != len(self.deleted):
            raise self.refuse(
                ERR_PROTOCOL,
                f"end counts {end.offered}/{end.deleted}, received"
                f" {len(self.offers)} offers, {len(self.deleted)} deletions",
            )
        self._load_received(final=True)
        self.log.write([LOG_TSFILE_END, LOG_END])
        self.log.close()
        self.log = None
        write_atomic(sd.p(SYNC_END), b"", self.svc.fsync)
        killpoint(KP_SYNC_END)
        recover(sd, self, keep_parts=False, vnode=vg.vnode)
        fl = sd.files()
        self.stream.send(P.Done(b.seq, len(fl.entries), fl.digest()))
        st = self.status
        st.last_round, st.last_round_at, st.files = b.seq, time.time(), len(fl.entries)
        st.last_round_files, st.last_round_bytes = len(self.offers), self.bytes_in
        st.files_behind = st.bytes_behind = 0
        st.last_error = ""
        log.info(
            "ship %s vg%d: round %d: %d offered, %d deleted, %d B received; %d files held",
            uuid,
            vg.id,
            b.seq,
            len(self.offers),
            len(self.deleted),
            self.bytes_in,
            len(fl.entries),
        )

    def _check_lineage(self, b: P.Begin, fl: FileList) -> None:
        """A cloned UUID shipping at another time (docs/ship.md §7.1): the sender's last
        round must be this receiver's last completed round of the UUID, or a round begun
        since (a sender that crashed mid-round folds it). 0 (a sender that lost its state
        directory) and a receiver without history (a new master) accept any."""
        if self.sd is None:
            raise InvariantViolation("self.sd is not set")
        known = {x for x in (fl.round_id, *self.sd.read_begun()) if x}
        if not known or not b.last_round_id or b.last_round_id in known:
            return
        uuid = b.uuid.hex()
        raise self.refuse(
            ERR_LINEAGE,
            f"sender {uuid} ({b.host or '?'}) says its last round is"
            f" {b.last_round_id:016x}, but this receiver's last completed round of that UUID is"
            f" {fl.round_id:016x} (round {fl.seq}) and no round since has that id: another copy"
            f" of the sender (a cloned data directory) ships under the same UUID; give this copy"
            f" its own identity (remove <data>/ship/ on it, then release or transfer its tables),"
            f" or, if it is the original, remove {RECEIVER_DIR}/{uuid}/{ROUNDS_FILE} and"
            f" {RECEIVER_DIR}/{uuid}/{FILES_LIST} on the receiver's master",
        )

    def _send_list(self, fl: FileList) -> None:
        entries = sorted(fl.entries.values(), key=lambda e: e.key)
        for k in range(0, len(entries), P.MAX_ENTRIES_PER_FRAME):
            self.stream.send(P.ListPart(tuple(entries[k : k + P.MAX_ENTRIES_PER_FRAME])))
        self.stream.send(P.ListEnd(len(entries), fl.digest()))

    def _schema(self, first: P.ShipMessage) -> list[str]:
        """SCHEMA* SCHEMA_END: the round's tables and their column types; refused before
        anything is staged on a type conflict or a table another source owns."""
        tables: dict[str, dict[str, str] | None] = {}
        msg = first
        while type(msg) is P.Schema:
            try:
                doc = json.loads(msg.chunk.decode("utf-8"))
                part = doc["tables"]
                if not isinstance(part, dict):
                    raise ValueError("tables is not an object")
            except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as exc:
                raise self.refuse(ERR_PROTOCOL, f"malformed schema: {exc}") from None
            tables.update(part)
            msg = self.stream.recv()
        if type(msg) is not P.SchemaEnd:
            raise self.refuse(ERR_PROTOCOL, f"expected schema, got {msg.describe()}")
        m = read_manifest_of(self.vg.path)
        mine = m.schemas if m is not None else {}
        for table, cols in tables.items():
            if not isinstance(table, str) or TABLE_NAME_RE.fullmatch(table) is None:
                raise self.refuse(ERR_UNSAFE_NAME, f"table name {str(table)[:80]!r} is not a table name")
            if cols is None:
                continue
            if not isinstance(cols, dict):
                raise self.refuse(ERR_PROTOCOL, f"schema of {table} is not an object")
            here = mine.get(table, {})
            for col, typ in cols.items():
                if not isinstance(col, str) or COLUMN_NAME_RE.fullmatch(col) is None or typ not in TYPE_NAMES:
                    raise self.refuse(ERR_PROTOCOL, f"table {table}: bad column {str(col)[:40]!r} {str(typ)[:20]!r}")
                have = here.get(col)
                if have is not None and not type_accepts(have, typ):
                    raise self.refuse(
                        ERR_TYPE,
                        f"type conflict: {table}.{col} is {typ} on the sender,"
                        f" {have} on the receiver; nothing of this round was staged",
                    )
        if self.round is None:
            raise InvariantViolation("self.round is not set")
        why = self.svc.claim(self.vg, self.round.uuid.hex(), sorted(tables))
        if why:
            raise self.refuse(ERR_OWNER, why)
        self.stream.send(P.SchemaOk())
        return sorted(tables)

    def _offer(self, msg: P.Offer) -> None:
        if self.sd is None:
            raise InvariantViolation("self.sd is not set")
        fl = self.sd.files()
        if self.archived is None:
            # Files of this sender the archive holds though files.txt does not name them (a
            # receiver whose list was lost or restored, a load whose load.log line was lost):
            # answered "held", never loaded twice. Read once per round.
            self.archived = set(self.sd.archive(self.vg.vnode))
        items = []
        for e in msg.entries:
            why = entry_refusal(e)
            if why:
                raise self.refuse(ERR_UNSAFE_NAME, why)
            if e.index in self.offers:
                raise self.refuse(ERR_PROTOCOL, f"offer #{e.index} twice")
            self.offers[e.index] = e
            path = self.sd.data_file(e)
            if e.key in fl.entries or e.key in self.archived:
                items.append((e.index, P.WANT_LOADED, 0))
                self._log_received(e)
                self.received.append(e.index)
            elif os.path.exists(path):
                items.append((e.index, P.WANT_RECEIVED, 0))
                self._log_received(e)
                self.received.append(e.index)
            else:
                try:
                    have = os.path.getsize(path + PART_SUFFIX)
                except FileNotFoundError:
                    have = 0
                items.append((e.index, P.WANT_SEND, have if have <= e.size else 0))
        self.stream.send(P.Want(tuple(items)))
        if len(self.received) >= MAX_ROUND_FILES:
            self._load_received()

    def _log_received(self, e: P.FileEntry) -> None:
        if self.log is None:
            raise InvariantViolation("self.log is not set")
        self.log.write([LOG_LOADED + entry_line(e)], durable=False)

    def _data(self, msg: P.Data) -> None:
        """DATA: raw bytes of offer `index` from `offset`; checked against the whole-file
        CRC-32C announced in the offer once the file is complete."""
        if self.sd is None:
            raise InvariantViolation("self.sd is not set")
        e = self.offers.get(msg.index)
        if e is None:
            raise self.refuse(ERR_PROTOCOL, f"data for #{msg.index}, never offered")
        if msg.offset + msg.size != e.size:
            raise self.refuse(
                ERR_BAD_DATA,
                f"data for {e.describe()} claims bytes {msg.offset}..{msg.offset + msg.size}, the file is {e.size} B",
            )
        path = self.sd.data_file(e)
        part = path + PART_SUFFIX
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            have = os.fstat(fd).st_size
            if msg.offset > have:
                raise self.refuse(ERR_PROTOCOL, f"data for {e.describe()} from {msg.offset}, {have} B held")
            os.ftruncate(fd, msg.offset)
            crc = 0
            pos = 0
            while pos < msg.offset:  # the checksum of what a cut left
                chunk = os.pread(fd, min(16 << 20, msg.offset - pos), pos)
                if not chunk:
                    break
                crc = _crc.crc32c(chunk, crc)
                pos += len(chunk)
            os.lseek(fd, msg.offset, os.SEEK_SET)
            state = [crc]

            counter = self.svc.m_bytes.labels(str(self.vg.id))

            def sink(view: memoryview) -> None:
                state[0] = _crc.crc32c(view, state[0])
                rest = view
                while rest:  # a short write (a full disk) is followed by ENOSPC, never ignored
                    rest = rest[os.write(fd, rest) :]
                counter.inc(len(view))  # as it arrives: a cut transfer counts what came
                self.bytes_in += len(view)

            self.stream.recv_raw(msg.size, sink)
            if self.status is not None:
                self.status.bytes_behind = max(0, self.status.bytes_behind - msg.size)
            if (state[0] or 1) != e.magic:
                os.close(fd)
                fd = -1
                os.unlink(part)
                self.svc.m_retries.labels(str(self.vg.id)).inc()
                self.stream.send(
                    P.Result(msg.index, P.RESULT_BAD, f"checksum {state[0] or 1:#010x}, announced {e.magic:#010x}")
                )
                return
            # No fsync here: ingest fsyncs the file when it stages it (docs/vnode.md §9.1); a
            # file a crash damaged before its load fails the CRC check of recovery and is
            # sent again (recover()).
        finally:
            if fd >= 0:
                os.close(fd)
        # The rename and the sync.log line become durable before the file is loaded
        # (_load_received): a crash before that loses them, and the sender sends the file again.
        os.replace(part, path)
        self._log_received(e)
        if self.status is not None:
            self.status.files_behind = max(0, self.status.files_behind - 1)
        killpoint(KP_RECEIVED)
        self.received.append(msg.index)
        self.stream.send(P.Result(msg.index, P.RESULT_OK))
        if len(self.received) >= MAX_ROUND_FILES:
            self._load_received()

    # -- loading -------------------------------------------------------------------------------
    def _load_received(self, final: bool = False) -> None:
        """Load what was received (and verified) so far, then tell the sender. The round's
        deletions go with its `final` load (at END): in one record with the last files, so
        a superseded file leaves the archive when the file that replaces it arrives, and a
        cut round removes nothing (docs/ship.md §3.3)."""
        deletions = list(range(len(self.deleted))) if final else []
        if not self.received and not deletions:
            return
        if self.sd is None:
            raise InvariantViolation("self.sd is not set")
        if self.log is not None:
            self.log.sync()
        if self.svc.fsync:
            fsync_dir(self.sd.p(DATA_DIR))
        fl = self.sd.files()
        batch = [self.offers[i] for i in self.received]
        held = self.archived or set()
        fresh = [e for e in batch if e.key not in fl.entries and e.key not in held]
        loaded, removed = self.sd.load_log_keys()
        fresh = [e for e in fresh if key_text(e.key) not in loaded]
        dels = [self.deleted[i] for i in deletions if key_text(self.deleted[i].key) not in removed]
        version = epoch = 0
        if fresh or dels:
            version, epoch = self.load(fresh, dels)
        indexes = tuple(self.received)
        self.received = []
        self.stream.send(P.Loaded(version, epoch, indexes, tuple(deletions)))

    def load(self, files: list[P.FileEntry], deletions: list[P.FileEntry] | None = None) -> tuple[int, int]:
        """Ingest `files` (each in data/) and remove the archived files of `deletions` (this
        sender's, by key) by ingest records of at most MAX_ROUND_FILES adds and as many
        removals, the deletions in the last records; load.log names each batch once its
        record committed. (version, epoch) of the last record."""
        if self.sd is None:
            raise InvariantViolation("self.sd is not set")
        sd, vg = self.sd, self.vg
        arch = sd.archive(vg.vnode) if deletions else {}
        removals: list[tuple[P.FileEntry, list[IngestRemove]]] = [
            (e, [IngestRemove(*x) for x in arch.get(e.key, ())]) for e in deletions or ()
        ]
        del_batches: list[list[tuple[P.FileEntry, list[IngestRemove]]]] = []
        for item in removals:  # at most MAX_ROUND_FILES removals per record
            if not del_batches or sum(len(r) for _, r in del_batches[-1]) + len(item[1]) > MAX_ROUND_FILES:
                del_batches.append([])
            del_batches[-1].append(item)
        add_batches = [files[k : k + MAX_ROUND_FILES] for k in range(0, len(files), MAX_ROUND_FILES)]
        n = max(len(add_batches), len(del_batches))
        add_batches = [[]] * (n - len(add_batches)) + add_batches
        del_batches = [[]] * (n - len(del_batches)) + del_batches  # with the last adds
        version = epoch = 0
        for batch, dbatch in zip(add_batches, del_batches):
            remove = [r for _, rs in dbatch for r in rs]
            lines = [LOAD_LINE + key_text(e.key) for e in batch] + [DELETE_LINE + key_text(e.key) for e, _ in dbatch]
            if not batch and not remove:  # deletions of files the archive no longer holds
                sd.append_load_log(lines)
                continue
            sub = f"ship-{sd.uuid}-{os.urandom(6).hex()}"
            incoming = os.path.join(vg.staging_dir(), sub)
            specs = []
            if batch:
                os.makedirs(incoming, exist_ok=True)
            for k, e in enumerate(batch):
                _link_or_copy(sd.data_file(e), os.path.join(incoming, f"{k}.parquet"))
                specs.append(IngestFile(f"{sub}/{k}.parquet", e.table, sd.origin, e.size, e.magic))
            meta = {
                "sender": sd.uuid,
                "round": self.round.round_id if self.round else 0,
                "seq": self.round.seq if self.round else 0,
            }
            t0 = time.monotonic()
            try:
                res = self._ingest(specs, meta, remove)
            finally:
                _remove_tree(incoming)
            log.info(
                "ship %s vg%d: %d files loaded, %d removed by record v%d in %.3f s",
                sd.uuid,
                vg.id,
                len(batch),
                len(remove),
                res.version,
                time.monotonic() - t0,
            )
            killpoint(KP_INGESTED)
            sd.append_load_log(lines)
            killpoint(KP_LOAD_LOGGED)
            for e in batch:
                try:
                    os.unlink(sd.data_file(e))
                except FileNotFoundError:
                    pass
            self.svc.m_files.labels(str(vg.id)).inc(len(batch))
            version, epoch = res.version, res.epoch
        return version, epoch

    def _ingest(self, specs: list[IngestFile], meta: dict[str, Any], remove: list[IngestRemove]) -> Any:
        vg = self.vg
        loop = vg.loop
        if loop is None:
            raise self.refuse(ERR_NOT_MASTER, f"vg{vg.id} is not running")
        for _ in range(INGEST_BUSY_TRIES):
            fut = asyncio.run_coroutine_threadsafe(vg.ingest(specs, "ship", meta, remove), loop)
            try:
                return fut.result(INGEST_TIMEOUT_S)
            except IngestError as exc:
                if exc.code in ("busy", "overloaded"):
                    time.sleep(INGEST_BUSY_RETRY_S)
                    continue
                if exc.code == "not_master":
                    raise self.refuse(ERR_NOT_MASTER, str(exc)) from None
                if exc.code == "bad_files":
                    raise self.refuse(ERR_BAD_DATA, f"the vgroup refused a file: {exc}") from None
                raise self.refuse(ERR_LOAD, f"load failed ({exc.code}): {exc}") from None
            except TimeoutError:
                raise self.refuse(ERR_LOAD, f"load not confirmed within {INGEST_TIMEOUT_S:g} s") from None
        raise self.refuse(ERR_BUSY, "the vgroup stayed busy with other rounds; retry later")
