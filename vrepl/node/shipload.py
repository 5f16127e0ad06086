"""The load half of a `vrepl ship` session on the receiver (docs/ship.md §3.3): the files a
session received and verified go into the vgroup by ingest records, the round's deletions
with its last files, and load.log names each batch once its record committed.

Owns: `SessionLoading`, a mixin of `Session` (vrepl/node/shipsession.py), whose state it
uses (the sender directory `sd`, `received`, `offers`, `deleted`, `archived`, the stream),
and the receiver's kill points around a load.
Must not: block the node's I/O thread (it reaches the vgroup through
`asyncio.run_coroutine_threadsafe`) or write into the archive or the WAL (ingest does).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import Counter

from vrepl.errors import InvariantViolation
from vrepl.killpoints import killpoint, register
from vrepl.node.ingest import IngestError, IngestFile, IngestRemove, StagingError
from vrepl.node.shipdirs import (
    DATA_DIR,
    DELETE_LINE,
    INGEST_BUSY_RETRY_S,
    INGEST_BUSY_TRIES,
    INGEST_TIMEOUT_S,
    LOAD_LINE,
    SenderDirR,
    SenderStatus,
    _link_or_copy,
    _remove_tree,
    key_text,
)
from vrepl.ship import protocol as P
from vrepl.ship.errors import (
    ERR_BAD_DATA,
    ERR_BUSY,
    ERR_DISK_FULL,
    ERR_LOAD,
    ERR_NOT_MASTER,
    ERROR_NAMES,
    Refused,
    refused,
)
from vrepl.ship.state import Key, ListSummary, SyncLog, fsync_dir
from vrepl.ship.stream import ShipStream
from vrepl.vnode.staging import MAX_ROUND_FILES

if TYPE_CHECKING:
    from vrepl.node.vgroup import VgroupHost

log = logging.getLogger("vrepl.ship")

KP_INGESTED = register(
    "ship.receiver.after_ingest", "the ingest record of a batch is committed; load.log does not name its files"
)
KP_LOAD_LOGGED = register("ship.receiver.after_load_log", "load.log names the batch; LOADED not yet sent to the sender")

# The loader takes received files once this many are waiting (or at END): fewer, larger
# records (each is a flush point that rewrites the manifest), yet loading overlaps receiving.
LOAD_MIN_FILES = 128
LOAD_MIN_BYTES = 128 << 20
LOADERS = 2  # batches loading at once (docs/ship.md §3.3)


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
    m_list_parsed: Counter
    list_memo: dict[str, tuple[str, ListSummary]]

    def claim(self, vg: "VgroupHost", uuid: str, tables: list[str]) -> str | None: ...


class SessionLoading:
    """Loading what a Session received (its methods run on the session's thread). The
    attributes are the Session's (set in its __init__)."""

    svc: SessionHost
    stream: ShipStream
    vg: "VgroupHost"
    sd: SenderDirR | None
    offers: dict[int, P.FileEntry]
    deleted: list[P.FileEntry]
    received: list[int]
    round: P.Begin | None
    log: SyncLog | None
    archived: set[Key] | None
    crc_on_write: set[Key]
    _cv: threading.Condition
    _loaders: list[threading.Thread]
    _loader_stop: bool
    _load_log_lock: threading.Lock
    _load_error: BaseException | None
    _held_back: set[tuple[str, int]]
    _for_end: list[int]

    def refuse(self, code: int, reason: str) -> Refused:
        """The refusal to raise (counted in vrepl_ship_refusals_total by its error name)."""
        self.svc.m_refusals.labels(ERROR_NAMES.get(code, "other")).inc()
        return refused(code, reason)

    # -- the loader: loading while the round is still received -------------------------------
    def _init_loader(self) -> None:
        """(session thread, in __init__) The loader's state (docs/ship.md §3.3)."""
        self._cv = threading.Condition()
        self._loaders = []
        self._loader_stop = False
        self._load_log_lock = threading.Lock()
        self._load_error = None
        self._held_back = set()
        self._for_end = []  # received offers only the END load may take (held back)

    def _received(self, index: int) -> None:
        """(session thread) Offer `index` is verified in data/ (its sync.log line written)
        or held already: it joins the next load. The loader threads start with the first."""
        if not self._loaders:
            # Files of a (table, bucket) the round deletes from wait for the last record,
            # which removes the superseded file in the same manifest commit (§3.3).
            self._held_back = {(e.table, e.bucket) for e in self.deleted}
        e = self.offers[index]
        if (e.table, e.bucket) in self._held_back:
            self._for_end.append(index)
        else:
            with self._cv:
                self.received.append(index)
                self._cv.notify()
        if not self._loaders:
            self._loaders = [
                threading.Thread(target=self._loader_run, daemon=True, name=f"vrepl-ship-load-vg{self.vg.id}-{k}")
                for k in range(LOADERS)
            ]
            for t in self._loaders:
                t.start()
        self._raise_load_error()

    def _raise_load_error(self) -> None:
        """(session thread) A load of the loader failed: the round fails with its error."""
        if self._load_error is not None:
            raise self._load_error

    def _stop_loader(self) -> None:
        """(session thread) Let the loaders finish the batches they are loading, and wait for
        them; what they did not take stays in `received`."""
        if not self._loaders:
            return
        with self._cv:
            self._loader_stop = True
            self._cv.notify_all()
        for t in self._loaders:
            t.join()
        self._loaders = []

    def _take_batch(self) -> list[int]:
        """(loader, under the condition) The received offers of the next load once there
        are enough of them (LOAD_MIN_FILES or LOAD_MIN_BYTES, at most MAX_ROUND_FILES);
        else []. They leave `received`. [] too once a loader failed."""
        if self._load_error is not None:
            return []
        take = self.received[:MAX_ROUND_FILES]
        if len(take) < LOAD_MIN_FILES and sum(self.offers[i].size for i in take) < LOAD_MIN_BYTES:
            return []
        del self.received[: len(take)]
        return take

    def _loader_run(self) -> None:
        """(a loader thread) Load batches of received files while the session receives the
        next ones, until the session stops it (END, or the round failed). LOADERS threads
        take batches in turn, so one batch's record can be committing (the replicas fetch its
        files) while the next batch is checked."""
        try:
            while True:
                with self._cv:
                    batch: list[int] = []
                    while not self._loader_stop and not batch and self._load_error is None:
                        batch = self._take_batch()
                        if not batch:
                            self._cv.wait()
                    if not batch:
                        return
                self._load_batch(batch, [])
        except BaseException as exc:  # the session raises it in its own thread
            with self._cv:
                if self._load_error is None:
                    self._load_error = exc
                self._cv.notify_all()

    def _load_received(self, final: bool = False) -> None:
        """(session thread, the loader stopped) Load what was received (and verified) and
        not loaded yet, then tell the sender. The round's deletions go with its `final`
        load (at END): in one record with the last files, so a superseded file leaves the
        archive when the file that replaces it arrives, and a cut round removes nothing
        (docs/ship.md §3.3)."""
        deletions = list(range(len(self.deleted))) if final else []
        batch, self.received = self.received + self._for_end, []
        self._for_end = []
        self._load_batch(batch, deletions)

    def _load_batch(self, indexes: list[int], deletions: list[int]) -> None:
        """Load offers `indexes` (received and verified) and apply `deletions` (positions in
        the round's DELETE list), then send LOADED. sync.log and data/ are made durable
        first: recovery must know every file a record may name."""
        if not indexes and not deletions:
            return
        if self.sd is None:
            raise InvariantViolation("self.sd is not set")
        if self.log is not None:
            self.log.sync()
        if self.svc.fsync:
            fsync_dir(self.sd.p(DATA_DIR))
        fl = self.sd.files()
        batch = [self.offers[i] for i in indexes]
        held = self.archived or set()
        fresh = [e for e in batch if e.key not in fl.entries and e.key not in held]
        loaded, removed = self.sd.load_log_keys()
        fresh = [e for e in fresh if key_text(e.key) not in loaded]
        dels = [self.deleted[i] for i in deletions if key_text(self.deleted[i].key) not in removed]
        version = epoch = 0
        if fresh or dels:
            version, epoch = self.load(fresh, dels)
        self.stream.send(P.Loaded(version, epoch, tuple(indexes), tuple(deletions)))

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
                verified = e.key in self.crc_on_write
                specs.append(IngestFile(f"{sub}/{k}.parquet", e.table, sd.origin, e.size, e.magic, verified))
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
            with self._load_log_lock:  # loaders append in turn
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
                if isinstance(exc, StagingError):  # a full disk, a failed fsync: not the file's fault
                    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                    raise self.refuse(
                        ERR_DISK_FULL if full else ERR_LOAD,
                        f"{'no space left on the receiver' if full else 'the receiver could not store the files'}:"
                        f" {exc}; nothing of the batch was loaded",
                    ) from None
                if exc.code == "bad_files":
                    raise self.refuse(ERR_BAD_DATA, f"the vgroup refused a file: {exc}") from None
                raise self.refuse(ERR_LOAD, f"load failed ({exc.code}): {exc}") from None
            except TimeoutError:
                raise self.refuse(ERR_LOAD, f"load not confirmed within {INGEST_TIMEOUT_S:g} s") from None
        raise self.refuse(ERR_BUSY, "the vgroup stayed busy with other rounds; retry later")
