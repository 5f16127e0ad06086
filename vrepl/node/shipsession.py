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

import json
import logging
import os
import time
from typing import TYPE_CHECKING

from vrepl._core import crc32c as _crc
from vrepl.errors import InvariantViolation
from vrepl.killpoints import killpoint, register
from vrepl.node.ingest import IngestError
from vrepl.node.shipdirs import (
    FILES_LIST,
    PART_SUFFIX,
    RECEIVER_DIR,
    ROUNDS_FILE,
    RSYNC_LOG,
    SYNC_END,
    SenderDirR,
    SenderStatus,
    entry_refusal,
    read_manifest_of,
    recover,
)
from vrepl.node.shipload import SessionHost, SessionLoading
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
    PeerGone,
    Refused,
    ShipError,
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
    ListSummary,
    SyncLog,
    entry_line,
)
from vrepl.ship.stream import ShipStream
from vrepl.transport import codec
from vrepl.vnode.files import write_atomic
from vrepl.vnode.rows import COLUMN_NAME_RE, TABLE_NAME_RE, TYPE_NAMES, type_accepts

if TYPE_CHECKING:
    pass

log = logging.getLogger("vrepl.ship")

RESULT_BATCH = 32  # RESULTs sent in one write while more files are coming (_result)


KP_RECEIVED = register(
    "ship.receiver.after_receive",
    "a file's bytes are whole and verified (renamed into data/, in sync.log); not yet handed to ingest",
)
KP_SYNC_END = register(
    "ship.receiver.after_sync_end", "the round is received and loaded, sync.end written; sync.log not folded"
)


class Session(SessionLoading):
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
        # Keys of the files this session wrote and checksummed as the bytes arrived (whose
        # CRC-32C equals their magic): their load takes the CRC without reading them again
        # (IngestFile.crc_on_write). A file found in data/ from an earlier session is not
        # here, so its load reads it (a crash may have damaged it since).
        self.crc_on_write: set[Key] = set()
        self.round: P.Begin | None = None
        self.log: SyncLog | None = None
        self.bytes_in = 0
        self.archived: set[Key] | None = None  # keys of this sender's archived files
        self.outstanding = 0  # files the WANTs asked for whose DATA has not come yet
        self.results: list[P.Result] = []  # RESULTs not sent yet (_result)
        self.released = False  # the sender's session slot and status are given up (_release)
        self._init_loader()

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
            self._stop_loader()  # before sync.log closes: the loader syncs it
            if self.log is not None:
                self.log.close()
            if uuid is not None:
                self._release(uuid)
            self.stream.close()

    def _release(self, uuid: str) -> None:
        """This sender may begin its next session: called before DONE is sent (the round is
        over then; a sender that reconnects at once must not find this session still
        registered and be refused as a second process) and again when the thread ends.
        From then on the sender's status record is the next session's to write."""
        with self.svc._lock:
            if self.svc._active.get(uuid) is self:
                del self.svc._active[uuid]
                if self.status is not None:
                    self.status.connected = False
                self.released = True

    def _completed(self, seq: int, held_files: int, offered: int = 0, received_bytes: int = 0) -> None:
        """The status of a round that completed (docs/ship.md §9): its figures replace the
        previous round's, with or without anything new, and it clears the last error."""
        st = self.status
        if st is None:
            raise InvariantViolation("self.status is not set")
        st.last_round, st.last_round_at, st.files = seq, time.time(), held_files
        st.last_round_files, st.last_round_bytes = offered, received_bytes
        st.files_behind = st.bytes_behind = 0
        st.last_error = ""

    def _note_error(self, reason: str) -> None:
        if self.status is not None and not self.released:
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
        # What STATE says of files.txt; parsed only when it changed since the last round.
        held, parsed = sd.summary(self.svc.list_memo)
        if parsed:
            self.svc.m_list_parsed.labels(str(vg.id)).inc()
        if self.status is None:
            raise InvariantViolation("self.status is not set")
        self.status.files = held.files
        match = held.digest == b.last_digest and held.files == b.last_files
        self._check_lineage(b, held)
        if b.new or b.deleted or not match or b.flags & P.FLAG_RESYNC:
            # The sender may log this round in its sync.log once STATE is answered, and fold
            # it into its list's "last round" even if the round is cut: remember it first.
            sd.note_begun(b.round_id)
        self.stream.send(P.State(held.seq, held.round_id, match, held.files, held.digest))
        msg = self.stream.recv()
        if type(msg) is P.ListRequest:
            self._send_list(sd.files())
            msg = self.stream.recv()
        if type(msg) is P.End:  # nothing new: no sync.log at all
            self._completed(b.seq, held.files)
            self._release(uuid)
            self.stream.send(P.Done(b.seq, held.files, held.digest))
            return
        tables = self._schema(msg)
        t_data = time.monotonic()
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
        t_end = time.monotonic()
        self._stop_loader()
        self._raise_load_error()
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
        held, _ = sd.summary(self.svc.list_memo)  # parsed here: the next round's is not
        self._completed(b.seq, held.files, len(self.offers), self.bytes_in)
        self._release(uuid)
        self.stream.send(P.Done(b.seq, held.files, held.digest))
        log.info(
            "ship %s vg%d: round %d: %d offered, %d deleted, %d B received in %.3f s (schema to END),"
            " loaded %.3f s after END; %d files held",
            uuid,
            vg.id,
            b.seq,
            len(self.offers),
            len(self.deleted),
            self.bytes_in,
            t_end - t_data,
            time.monotonic() - t_end,
            held.files,
        )

    def _check_lineage(self, b: P.Begin, fl: ListSummary) -> None:
        """A cloned UUID shipping at another time (docs/ship.md §7.1): the sender's last
        round must be this receiver's last completed round of the UUID, or a round begun
        since (a sender that crashed mid-round folds it). 0 (a sender that lost its state
        directory) and a receiver without history accept any. Without history means no
        completed round in files.txt (a new master, a lost or unreadable files.txt), even if
        rounds.json still names rounds begun since: they are only known relative to the
        completed round they followed, which is gone."""
        if self.sd is None:
            raise InvariantViolation("self.sd is not set")
        if not fl.round_id or not b.last_round_id:
            return
        known = {x for x in (fl.round_id, *self.sd.read_begun()) if x}
        if b.last_round_id in known:
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
        held: list[int] = []
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
                held.append(e.index)
            elif os.path.exists(path):
                items.append((e.index, P.WANT_RECEIVED, 0))
                self._log_received(e)
                held.append(e.index)
            else:
                try:
                    have = os.path.getsize(path + PART_SUFFIX)
                except FileNotFoundError:
                    have = 0
                items.append((e.index, P.WANT_SEND, have if have <= e.size else 0))
                self.outstanding += 1
        self.stream.send(P.Want(tuple(items)))
        for i in held:
            self._received(i)

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
            # vrepl_ingest_checksum_bytes_total: the bytes checksummed as they arrived, and a
            # cut file's prefix read back from disk to resume its checksum.
            self.vg.rounds.count("checksum_bytes_received", msg.size)
            if msg.offset:
                self.vg.rounds.count("checksum_bytes_reread", msg.offset)
            if self.status is not None:
                self.status.bytes_behind = max(0, self.status.bytes_behind - msg.size)
            if (state[0] or 1) != e.magic:
                os.close(fd)
                fd = -1
                os.unlink(part)
                self.svc.m_retries.labels(str(self.vg.id)).inc()
                self.outstanding -= 1
                self._result(
                    P.Result(msg.index, P.RESULT_BAD, f"checksum {state[0] or 1:#010x}, announced {e.magic:#010x}"),
                    now=True,
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
        if state[0] == e.magic:  # not a CRC of 0, which the magic writes as 1
            self.crc_on_write.add(e.key)
        self._log_received(e)
        if self.status is not None:
            self.status.files_behind = max(0, self.status.files_behind - 1)
        killpoint(KP_RECEIVED)
        self.outstanding -= 1
        self._result(P.Result(msg.index, P.RESULT_OK))
        self._received(msg.index)

    def _result(self, r: P.Result, now: bool = False) -> None:
        """Send RESULT `r`, batched: up to RESULT_BATCH go in one write, sent at once when
        `now` (a bad file, resent by the sender) or when no file the WANTs asked for is
        still coming (the sender may be waiting for them). One write per file made the
        session thread give the GIL up and wait for it once more per file."""
        self.results.append(r)
        if now or self.outstanding <= 0 or len(self.results) >= RESULT_BATCH:
            batch, self.results = self.results, []
            self.stream.send_many(batch)
