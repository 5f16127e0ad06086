"""The sending side of `vrepl ship`: one round (docs/ship.md §3, §5.1).

Owns: `Sender.run_round()`: the seed's 同步数据文件 flow over one ship connection. Before
anything, the seed's recovery of the sender directory (vrepl/ship/state.py). Then: select
the round's files by diffing the vnode's manifest against last_local_files.txt (deleted and
new files; no directory scan), hard-link the new ones into snapshot/ (a flush that replaces
a file during the round cannot take it away), open the connection, compare digests with
the receiver (a list reconciliation when they differ), ship the schemas of the round's
tables, the deleted files, then the new files in offers (a cut file resumes from the
receiver's offset; a file whose checksum fails is sent again, up to `file_retries` times,
then the sender checks its own copy), log each file the receiver confirms loaded in
sync.log (fsynced), and fold the log into the list once the receiver says DONE.
The selection itself is vrepl/ship/select.py; the options and the result vrepl/ship/round.py.
Must not: hold the sender lock (the CLI holds it for the life of the process), print
anything (progress goes through `progress(kind, n)`), or write into the vnode's data.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import shutil
import socket
import threading
import time
from typing import Callable, Sequence

from vrepl.errors import InvariantViolation
from vrepl.killpoints import killpoint, register
from vrepl.manifest import Manifest
from vrepl.ship import protocol as P
from vrepl.ship.errors import ERR_NOT_MASTER, BadData, PeerGone, Refused, ShipError
from vrepl.ship.round import RoundResult, SenderOptions
from vrepl.ship.select import Selection, diff, file_magic_of, nothing_archived_yet
from vrepl.ship.state import (
    LAST_LIST,
    LOG_DELETED_END,
    LOG_DELETED_START,
    LOG_END,
    LOG_LOADED,
    LOG_REMOVED,
    LOG_TSFILE_END,
    LOG_TSFILE_START,
    SYNC_LOG,
    FileList,
    Key,
    ListSummary,
    SenderDir,
    SyncLog,
    digest_of_keys,
    entry_line,
    fingerprint,
    fsync_dir,
    load_uuid,
)
from vrepl.ship.stream import ShipStream, connect

log = logging.getLogger("vrepl.ship")

# Kill points of the sender (vrepl/killpoints.py; tests/integration/test_ship_nodes.py).
KP_SNAPSHOT = register(
    "ship.sender.after_snapshot", "the round's new files are hard-linked into snapshot/; sync.log not started"
)
KP_LOG_STARTED = register("ship.sender.after_log_start", "sync.log says 'sync start'; schema and deletions not sent")
KP_MID_FILE = register("ship.sender.mid_file", "part of a file's bytes are sent (a cut transfer the receiver resumes)")
KP_FILE_SENT = register("ship.sender.after_file_sent", "a whole file is sent; its result and load not yet confirmed")
KP_LOADED_LOGGED = register(
    "ship.sender.after_loaded_log", "sync.log names files the receiver confirmed loaded; more may follow"
)
KP_DONE = register(
    "ship.sender.after_done", "the receiver said DONE; sync.log not yet folded into last_local_files.txt"
)

SELECT_ATTEMPTS = 5  # manifest re-reads when a file vanished between read and link


class _Replies(threading.Thread):
    """Reads every receiver message while the main thread sends: WANT and RESULT go to the
    main thread's queue, LOADED is logged to sync.log at once (fsynced), DONE and errors
    end it."""

    def __init__(self, sender: "Sender", stream: ShipStream) -> None:
        super().__init__(name="vrepl-ship-replies", daemon=True)
        self.s = sender
        self.stream = stream
        self.q: "queue.Queue[object]" = queue.Queue()
        self.done: P.Done | None = None
        self.error: ShipError | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            while True:
                msg = self.stream.recv()
                if isinstance(msg, P.Loaded):
                    self.s._on_loaded(msg)
                elif isinstance(msg, P.Done):
                    self.done = msg
                    return
                elif isinstance(msg, (P.Want, P.Result)):
                    self.q.put(msg)
                else:
                    raise PeerGone(f"unexpected {msg.describe()} from the receiver")
        except ShipError as exc:
            self.error = exc
        except Exception as exc:  # a bug here must still end the round, with a reason
            self.error = ShipError(f"reading the receiver's answers failed: {exc!r}")
        finally:
            self.finished.set()
            self.q.put(None)

    def get(self) -> object:
        item = self.q.get()
        if item is None:
            self.q.put(None)  # keep the end marker for the next get()
            raise self.error or PeerGone("the receiver closed the connection")
        return item


class Sender:
    """Ships one vnode directory to one receiver, round after round (see the module doc)."""

    # (receiver, vgroup) -> index of the --to address that was the master last time
    _master_hint: dict[tuple[str, int], int] = {}

    def __init__(self, opt: SenderOptions, progress: Callable[[str, int], None] | None = None) -> None:
        self.opt = opt
        self.progress = progress or (lambda kind, n: None)
        self.sdir = SenderDir(opt.data, opt.receiver, opt.vgroup, fsync=opt.fsync)
        self.uuid: str | None = None
        self._log: SyncLog | None = None
        self._log_lock = threading.Lock()
        self._offered: dict[int, P.FileEntry] = {}
        self._deleted: list[P.FileEntry] = []
        self._res = RoundResult()

    # -- the round -------------------------------------------------------------------------
    def run_round(self) -> RoundResult:
        """One round (recovery first). Raises ShipError; what the receiver confirmed before
        a failure is kept (sync.log), and the next round continues from there."""
        t0 = time.monotonic()
        opt = self.opt
        empty = nothing_archived_yet(self.sdir, opt.data)
        if empty is not None:  # nothing to ship, nothing to write: the next flush is the first
            self._res = RoundResult(receiver=opt.receiver, seq=empty.seq + 1, nothing_new=True, nothing_archived=True)
            self._res.seconds = time.monotonic() - t0
            return self._res
        uuid, note = load_uuid(opt.data, given=opt.uuid, fsync=opt.fsync)
        self.uuid = uuid
        self.sdir.ensure()
        res = self._res = RoundResult(receiver=opt.receiver)
        if note:
            res.repaired.append(note)
        res.repaired += self.sdir.recover()
        state = self.sdir.read_state()
        if state.get("uuid") != uuid:
            self.sdir.write_state({**state, "uuid": uuid, "receiver": opt.receiver, "vgroup": opt.vgroup})
        sel = Selection(self.sdir, opt.data)
        res.manifest_unchanged = sel.unchanged
        deleted, new = sel.diff()
        res.seq = sel.last_summary().seq + 1
        res.round_id = secrets.randbits(64) or 1
        return self._to_master(sel, deleted, new, t0)

    def _to_master(self, sel: Selection, deleted: list[P.FileEntry], new: list[P.FileEntry], t0: float) -> RoundResult:
        """Try each --to address, starting with the one that answered as master last time;
        a node that is not the vgroup's master refuses the BEGIN (nothing happened yet), and
        the next address is tried."""
        opt = self.opt
        n = len(opt.addresses)
        hint = Sender._master_hint.get((opt.receiver, opt.vgroup), self.sdir.read_state().get("master_index", 0))
        first = (hint if isinstance(hint, int) else 0) % n
        last_exc: ShipError | None = None
        for k in range(n):
            host, port = opt.addresses[(first + k) % n]
            try:
                stream = connect(
                    host,
                    port,
                    secret=opt.secret,
                    sender_id=opt.sender_id,
                    vgroup=opt.vgroup,
                    timeout_s=opt.connect_timeout_s,
                    io_timeout_s=opt.io_timeout_s,
                    source_address=(opt.bind, 0) if opt.bind else None,
                )
            except PeerGone as exc:
                last_exc = exc
                if not exc.retry:
                    raise
                continue
            try:
                res = self._session(stream, sel, deleted, list(new), t0)
                master = (first + k) % n
                Sender._master_hint[(opt.receiver, opt.vgroup)] = master
                state = self.sdir.read_state()
                if state.get("master_index") != master:  # remembered for the next process
                    self.sdir.write_state({**state, "master_index": master})
                return res
            except Refused as exc:
                if exc.code != ERR_NOT_MASTER or self._log is not None:
                    raise
                last_exc = exc
            finally:
                if self._log is not None:
                    self._log.close()
                    self._log = None
                stream.close()
        raise last_exc or PeerGone("no receiver address to try")

    def _session(
        self, stream: ShipStream, sel: Selection, deleted: list[P.FileEntry], new: list[P.FileEntry], t0: float
    ) -> RoundResult:
        opt, res = self.opt, self._res
        if self.uuid is None:
            raise InvariantViolation("self.uuid is not set")
        last = sel.last_summary()
        begin = P.Begin(
            res.seq,
            bytes.fromhex(self.uuid),
            res.round_id,
            last.round_id,
            P.FLAG_RESYNC if opt.resync else 0,
            sel.precision,
            sel.file_span_ms,
            last.files,
            last.digest,
            len(deleted),
            len(new),
            sum(e.size for e in new),
            socket.gethostname()[: P.MAX_HOST_BYTES],
        )
        stream.send(begin)
        st = stream.recv()
        if type(st) is not P.State:
            raise PeerGone(f"expected state, got {st.describe()}")
        if not st.match or opt.resync:
            fl = self._reconcile(stream, sel.last, sel.now)
            deleted, new = diff(fl.entries, sel.now)
            last = fl.summary()
            res.reconciled = True
        res.deleted, res.new = len(deleted), len(new)
        res.new_bytes = sum(e.size for e in new)
        self.progress("total_files", len(new))
        self.progress("total_bytes", res.new_bytes)
        if not deleted and not new:
            stream.send(P.End(0, 0))
            done = stream.recv()
            if type(done) is not P.Done:
                raise PeerGone(f"expected done, got {done.describe()}")
            self._check_done(done, last, res)
            res.nothing_new = True
            if not sel.unchanged and not res.reconciled:
                # This diff found nothing: the next round with the same two files skips it.
                self.sdir.write_memo(sel.manifest_fp, sel.list_fp, last, sel.precision, sel.file_span_ms)
            res.seconds = time.monotonic() - t0
            return res
        m = sel.manifest
        snap = self._snapshot(new, sel.now)
        killpoint(KP_SNAPSHOT)
        self._log = SyncLog.start(self.sdir.p(SYNC_LOG), res.seq, res.round_id, opt.fsync)
        killpoint(KP_LOG_STARTED)
        self._schema(stream, m, new)
        self._deleted = deleted
        self._log.write([LOG_DELETED_START])
        for k in range(0, len(deleted), P.MAX_ENTRIES_PER_FRAME):
            stream.send(P.Delete(tuple(deleted[k : k + P.MAX_ENTRIES_PER_FRAME])))
        self._log.write([LOG_DELETED_END, LOG_TSFILE_START])
        replies = _Replies(self, stream)
        replies.start()
        try:
            self._offer_all(stream, replies, new, snap)
            stream.send(P.End(len(self._offered), len(deleted)))
            replies.finished.wait()
            if replies.error is not None:
                raise replies.error
            final = replies.done
            if final is None:
                raise InvariantViolation("done is not set")
        finally:
            if not replies.finished.is_set():
                stream.close()
                replies.join(5)
        killpoint(KP_DONE)
        self._log.write([LOG_TSFILE_END, LOG_END])
        self._log.close()
        self._log = None
        # 文件清理 (seed): fold sync.log into the list, drop the snapshot. The same steps as
        # recovery, so a crash anywhere in here is finished by the next round's recover().
        self.sdir.recover()
        self._note_schema(m, new)
        folded_bytes = self.sdir.read_last_bytes()
        folded = FileList.from_bytes(folded_bytes, self.sdir.p(LAST_LIST))
        summary = folded.summary()
        self._check_done(final, summary, res)
        if not res.failed and diff(folded.entries, sel.now) == ([], []):
            # Everything the manifest named at the start is shipped: until the manifest or
            # the list changes, the next round has nothing new and need not diff.
            self.sdir.write_memo(sel.manifest_fp, fingerprint(folded_bytes), summary, sel.precision, sel.file_span_ms)
        res.seconds = time.monotonic() - t0
        if res.failed:
            raise BadData(
                f"{len(res.failed)} files could not be shipped this round: {res.failed[0]}"
                + (f" (and {len(res.failed) - 1} more)" if len(res.failed) > 1 else ""),
                retry=True,
            )
        return res

    def _check_done(self, done: P.Done, fl: ListSummary, res: RoundResult) -> None:
        """The receiver's DONE carries its digest of what it holds of this sender: it must be
        this sender's list now, or the next round reconciles (never "done" with a file
        missing unnoticed)."""
        if done.digest != fl.digest or done.files != fl.files:
            log.warning(
                "ship to %s: after round %d the receiver holds %d files of this sender, the"
                " sender's list %d (digests differ): the next round reconciles by listing",
                self.opt.receiver,
                res.seq,
                done.files,
                fl.files,
            )
            res.failed.append(
                f"the receiver's state after the round differs from the sender's list"
                f" ({done.files} files there, {fl.files} here)"
            )

    # -- steps -------------------------------------------------------------------------------
    def _reconcile(self, stream: ShipStream, last: FileList, now: dict[Key, P.FileEntry]) -> FileList:
        """The digests differ (a receiver restored from a backup, a sender that lost its
        state, a crash between the receiver's load and our log): take the receiver's own
        list of this sender's files as the new last list."""
        stream.send(P.ListRequest())
        keys: dict[Key, P.FileEntry] = {}
        while True:
            msg = stream.recv()
            if type(msg) is P.ListPart:
                for e in msg.entries:
                    name = now[e.key].name if e.key in now else e.name
                    keys[e.key] = P.FileEntry(0, e.table, e.bucket, e.size, e.magic, e.rows, name)
                continue
            if type(msg) is not P.ListEnd:
                raise PeerGone(f"expected list or list_end, got {msg.describe()}")
            if msg.count != len(keys) or msg.digest != digest_of_keys(keys):
                raise PeerGone(
                    f"the receiver's list does not match its own count/digest ({msg.count} announced,"
                    f" {len(keys)} received)"
                )
            break
        fl = FileList(keys, last.seq, last.round_id)
        self.sdir.write_last(fl)
        self.sdir.reset_schema()
        log.warning(
            "ship to %s: reconciled with the receiver's list: it holds %d files of this sender"
            " (the sender's list had %d)",
            self.opt.receiver,
            len(keys),
            len(last.entries),
        )
        return fl

    def _snapshot(self, new: list[P.FileEntry], now: dict[Key, P.FileEntry]) -> dict[Key, str]:
        """Hard-link the round's new files into snapshot/ (seed: 对所有的新增的文件进行硬链接).
        A file gone since the manifest was read (a flush replaced it) is shipped in a later
        round: the manifest is read again and the round's new list shrinks to what exists."""
        snap = self.sdir.snapshot
        if os.path.exists(snap):
            shutil.rmtree(snap)
        os.makedirs(snap)
        out: dict[Key, str] = {}
        for k, e in enumerate(new):
            src = os.path.join(self.opt.data, *e.name.split("/"))
            dst = os.path.join(snap, f"{k}.parquet")
            try:
                os.link(src, dst, follow_symlinks=False)
            except FileNotFoundError:
                continue  # replaced by a flush since the manifest was read: not this round
            except OSError:
                shutil.copyfile(src, dst, follow_symlinks=False)  # another file system
            if os.lstat(dst).st_size != e.size:
                raise ShipError(f"{e.name} is {os.lstat(dst).st_size} bytes on disk, the manifest says {e.size}")
            out[e.key] = dst
        if self.opt.fsync:
            fsync_dir(snap)
        missing = [e for e in new if e.key not in out]
        if missing:
            log.info(
                "ship to %s: %d files were replaced by a flush since the manifest was read; they go in the next round",
                self.opt.receiver,
                len(missing),
            )
            new[:] = [e for e in new if e.key in out]
        return out

    def _schema(self, stream: ShipStream, m: Manifest, new: list[P.FileEntry]) -> None:
        """Table types first (seed: 同步 schema before the data): every table of the round,
        with its columns where they changed since the receiver last accepted them."""
        known = self.sdir.read_schema()
        tables: dict[str, dict[str, str] | None] = {}
        for e in new:
            cols = m.schemas.get(e.table, {})
            tables[e.table] = None if known.get(e.table) == cols else cols
        # Chunks of whole tables, each a JSON document of its own.
        items = list(tables.items())
        chunk: dict[str, object] = {}
        size = 0
        for name, spec in items:
            piece = len(name) + len(json.dumps(spec)) + 8
            if chunk and size + piece > P.MAX_SCHEMA_CHUNK_BYTES - 64:
                stream.send(P.Schema(json.dumps({"tables": chunk}, separators=(",", ":")).encode()))
                chunk, size = {}, 0
            chunk[name] = spec
            size += piece
        if chunk or not items:
            stream.send(P.Schema(json.dumps({"tables": chunk}, separators=(",", ":")).encode()))
        stream.send(P.SchemaEnd(len(tables)))
        ok = stream.recv()
        if type(ok) is not P.SchemaOk:
            raise PeerGone(f"expected schema_ok, got {ok.describe()}")

    def _note_schema(self, m: Manifest, new: list[P.FileEntry]) -> None:
        known = self.sdir.read_schema()
        changed = False
        for e in new:
            cols = m.schemas.get(e.table, {})
            if known.get(e.table) != cols:
                known[e.table] = dict(cols)
                changed = True
        if changed:
            self.sdir.write_schema(known)

    def _offer_all(self, stream: ShipStream, replies: _Replies, new: list[P.FileEntry], snap: dict[Key, str]) -> None:
        opt, res = self.opt, self._res
        todo = list(new)
        tries: dict[Key, int] = {}
        awaiting: dict[int, P.FileEntry] = {}  # sent, waiting for RESULT
        index = 0
        while todo or awaiting:
            batch, todo = todo[: opt.offer_files], todo[opt.offer_files :]
            if batch:
                entries = []
                for e in batch:
                    entries.append(P.FileEntry(index, e.table, e.bucket, e.size, e.magic, e.rows, e.name))
                    self._offered[index] = e
                    index += 1
                stream.send(P.Offer(tuple(entries)))
                want = self._next(replies, P.Want, awaiting, todo, tries, snap)
                items = {i: (s, o) for i, s, o in want.items}
                for ent in entries:
                    status, offset = items.get(ent.index, (None, 0))
                    e = self._offered[ent.index]
                    if status is None:
                        raise PeerGone(f"the receiver's want does not name offer #{ent.index}")
                    if status == P.WANT_LOADED:
                        res.skipped += 1
                        self._confirm_loaded([e])
                        self.progress("file_bytes", e.size)
                        self.progress("files", 1)
                        continue
                    if status == P.WANT_RECEIVED:
                        res.skipped += 1
                        self.progress("file_bytes", e.size)
                        self.progress("files", 1)
                        continue
                    if not 0 <= offset <= e.size:
                        raise PeerGone(f"the receiver asks for {e.name} from offset {offset}, beyond its size {e.size}")
                    self._send(stream, ent.index, e, snap[e.key], offset)
                    awaiting[ent.index] = e
                # Results of this batch come while the next batch is offered.
                self._drain(replies, awaiting, todo, tries, snap, block=False)
            else:
                self._drain(replies, awaiting, todo, tries, snap, block=True)

    def _next(
        self,
        replies: _Replies,
        want_type: type,
        awaiting: dict[int, P.FileEntry],
        todo: list[P.FileEntry],
        tries: dict[Key, int],
        snap: dict[Key, str],
    ) -> P.Want:
        while True:
            msg = replies.get()
            if type(msg) is want_type:
                return msg  # type: ignore[return-value]
            self._on_result(msg, awaiting, todo, tries, snap)  # type: ignore[arg-type]

    def _drain(
        self,
        replies: _Replies,
        awaiting: dict[int, P.FileEntry],
        todo: list[P.FileEntry],
        tries: dict[Key, int],
        snap: dict[Key, str],
        block: bool,
    ) -> None:
        while awaiting:
            if not block and replies.q.empty():
                return
            msg = replies.get()
            if type(msg) is not P.Result:
                raise PeerGone(f"unexpected {msg.describe()} while waiting for file results")  # type: ignore[attr-defined]
            self._on_result(msg, awaiting, todo, tries, snap)
            if block:
                return

    def _on_result(
        self,
        msg: P.Result,
        awaiting: dict[int, P.FileEntry],
        todo: list[P.FileEntry],
        tries: dict[Key, int],
        snap: dict[Key, str],
    ) -> None:
        e = awaiting.pop(msg.index, None)
        if e is None:
            raise PeerGone(f"a result for #{msg.index}, which is not waiting for one")
        if msg.status == P.RESULT_OK:
            self.progress("files", 1)
            return
        n = tries[e.key] = tries.get(e.key, 0) + 1
        log.warning(
            "ship to %s: %s failed its check at the receiver (%s); attempt %d of %d",
            self.opt.receiver,
            e.name,
            msg.reason,
            n,
            self.opt.file_retries,
        )
        self._res.retries += 1
        if n < self.opt.file_retries:
            todo.append(e)
            return
        # 7.2 (seed): give the file up after file_retries attempts, but first find out
        # whether our own copy is the damaged one.
        got = file_magic_of(snap[e.key])
        if got != e.magic:
            raise BadData(
                f"{e.name} is corrupt on the sender: its bytes have magic {got:#010x}, the"
                f" manifest says {e.magic:#010x} (vrepl's vnode refuses to read it too)",
                retry=False,
            )
        self._res.failed.append(f"{e.name}: {msg.reason} ({n} attempts)")

    def _send(self, stream: ShipStream, index: int, e: P.FileEntry, path: str, offset: int) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size != e.size:
                raise ShipError(f"{e.name} changed size in the snapshot")
            if offset:
                self.progress("file_bytes", offset)

            def sent(n: int) -> None:
                self.progress("file_bytes", n)
                killpoint(KP_MID_FILE)

            stream.send_file(P.Data(index, offset, e.size - offset), fd, offset, e.size - offset, sent)
        finally:
            os.close(fd)
        self._res.sent_files += 1
        self._res.sent_bytes += e.size - offset
        killpoint(KP_FILE_SENT)

    # -- confirmations (reply thread) --------------------------------------------------------
    def _confirm_loaded(self, files: list[P.FileEntry], removed: Sequence[P.FileEntry] = ()) -> None:
        lines = [LOG_LOADED + entry_line(e) for e in files] + [LOG_REMOVED + entry_line(e) for e in removed]
        with self._log_lock:
            if self._log is not None:
                self._log.write(lines)
            self._res.loaded += len(files)
            self._res.removed += len(removed)
        if lines:
            killpoint(KP_LOADED_LOGGED)

    def _on_loaded(self, msg: P.Loaded) -> None:
        files = []
        for i in msg.indexes:
            e = self._offered.get(i)
            if e is None:
                raise PeerGone(f"loaded names offer #{i}, which was never offered")
            files.append(e)
        removed = []
        for k in msg.deleted:
            if not 0 <= k < len(self._deleted):
                raise PeerGone(f"loaded names deletion {k} of {len(self._deleted)}")
            removed.append(self._deleted[k])
        self._confirm_loaded(files, removed)
