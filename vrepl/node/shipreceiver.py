"""The receiving side of `vrepl ship`, inside `vrepl node` (docs/ship.md §3, §4.3, §5.2).

Owns: `ShipService`, a node's ship acceptor (vrepl/transport/node.py hands it SHIP hellos and
their sockets): which sender ids exist and their secrets (`[[ship.senders]]` in node.toml),
one session thread per connection, one running session per sender UUID, the per-sender
directory `<vgroup path>/ship/<uuid>/` (`files.txt`, `sync.log`, `load.log`, `sync.end`,
`data/`), the seed's receiver recovery algorithm (at node start and before every round),
the owner rule (`<vgroup path>/ship/owners.json`), the type check of a round's schema, and
the load of verified files into the vgroup through ONE ingest record per batch
(`VgroupHost.ingest`, docs/vnode.md §9), status and metrics.

Where this departs from the seed (docs/ship.md §6): sync.log and load.log are fsynced; a file
is written in sync.log only once its whole-file checksum matched; a file is written in
load.log only once the ingest record naming it is committed (never "loaded" when skipped);
received files are named by their content key, never by the sender's name, so no name a
sender chooses becomes a path; the owner of a table is a sender UUID (never an address).
Must not: block the node's I/O thread (sessions run on their own threads and reach the
vgroup through `asyncio.run_coroutine_threadsafe`), write into the archive or the WAL
(ingest does), or trust a byte the sender sent before checking it.
"""
from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter

from vrepl._core import crc32c as _crc
from vrepl.errors import InvariantViolation
from vrepl.killpoints import killpoint, register
from vrepl.node.config import ShipSenderConfig
from vrepl.node.ingest import IngestError, IngestFile
from vrepl.restore.paths import name_refusal
from vrepl.ship import protocol as P
from vrepl.ship.errors import (
    ERR_BAD_DATA,
    ERR_BUSY,
    ERR_CONFIG,
    ERR_DISK_FULL,
    ERR_IN_USE,
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
    LOG_START,
    LOG_TSFILE_END,
    LOG_TSFILE_START,
    FileList,
    Key,
    SyncLog,
    entry_line,
    fsync_dir,
    parse_entry,
    remove_durable,
)
from vrepl.ship.stream import ShipStream
from vrepl.transport import codec
from vrepl.vnode.errors import ArchiveError
from vrepl.vnode.files import MANIFEST_NAME, Manifest, write_atomic
from vrepl.vnode.rows import COLUMN_NAME_RE, TABLE_NAME_RE, TYPE_NAMES, type_accepts
from vrepl.vnode.staging import MAX_ROUND_FILES

if TYPE_CHECKING:
    from vrepl.node.vgroup import VgroupHost

log = logging.getLogger("vrepl.ship")

RECEIVER_DIR = "ship"
OWNERS_FILE = "owners.json"
FILES_LIST = "files.txt"
RSYNC_LOG = "sync.log"
LOAD_LOG = "load.log"
SYNC_END = "sync.end"
DATA_DIR = "data"
PART_SUFFIX = ".part"
LOAD_LINE = "load "
DELETE_LINE = "delete "
ORIGIN_PREFIX = "ship/"
LOCAL_OWNER = "local"            # owners.json value of a table written on the receiver itself
INGEST_TIMEOUT_S = 120.0
INGEST_BUSY_RETRY_S = 0.05
INGEST_BUSY_TRIES = 400

KP_RECEIVED = register("ship.receiver.after_receive",
                       "a file's bytes are whole and verified (renamed into data/, in sync.log);"
                       " not yet handed to ingest")
KP_INGESTED = register("ship.receiver.after_ingest",
                       "the ingest record of a batch is committed; load.log does not name its files")
KP_LOAD_LOGGED = register("ship.receiver.after_load_log",
                          "load.log names the batch; LOADED not yet sent to the sender")
KP_SYNC_END = register("ship.receiver.after_sync_end",
                       "the round is received and loaded, sync.end written; sync.log not folded")


def key_file_name(e: P.FileEntry) -> str:
    """The name of a received file in data/: its content key, never the sender's name."""
    return f"{e.table}.b{e.bucket}.s{e.size}.m{e.magic:08x}.parquet"


def key_text(key: Key) -> str:
    return f"{key[0]}\t{key[1]}\t{key[2]}\t{key[3]}"


def entry_refusal(e: P.FileEntry) -> str | None:
    """Why a sender's entry is refused (hostile or impossible), or None."""
    why = name_refusal(e.name)
    if why is not None:
        return why
    if TABLE_NAME_RE.fullmatch(e.table) is None:
        return f"table name {e.table[:80]!r} is not a table name"
    if e.size <= 0 or e.magic <= 0 or e.magic > 0xFFFFFFFF:
        return f"{e.describe()}: impossible size or checksum"
    return None


def read_manifest_of(path: str) -> Manifest | None:
    try:
        with open(os.path.join(path, MANIFEST_NAME), "rb") as fh:
            return Manifest.from_bytes(fh.read(), path)
    except (FileNotFoundError, ArchiveError):
        return None


@dataclass
class SenderStatus:
    uuid: str
    sender_id: int = 0
    host: str = ""
    peer: str = ""
    vgroup: int = 0
    connected: bool = False
    last_round: int = 0
    last_round_at: float = 0.0
    last_round_files: int = 0
    last_round_bytes: int = 0
    files_behind: int = 0
    bytes_behind: int = 0
    files: int = 0
    last_error: str = ""
    last_error_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class SenderDirR:
    """`<vgroup path>/ship/<uuid>/` on the receiver: one sender's rounds into one vgroup."""

    def __init__(self, vgroup_path: str, uuid: str, fsync: bool = True) -> None:
        self.uuid = uuid
        self.path = os.path.join(vgroup_path, RECEIVER_DIR, uuid)
        self.vgroup_path = vgroup_path
        self.fsync = fsync
        self.origin = ORIGIN_PREFIX + uuid

    def p(self, name: str) -> str:
        return os.path.join(self.path, name)

    def ensure(self) -> None:
        os.makedirs(self.p(DATA_DIR), exist_ok=True)

    def data_file(self, e: P.FileEntry) -> str:
        return os.path.join(self.path, DATA_DIR, key_file_name(e))

    def files(self) -> FileList:
        """This sender's files the vgroup holds. files.txt, or (a new master after a
        failover, a lost directory) the vgroup's manifest entries whose origin is this
        sender."""
        try:
            return FileList.read(self.p(FILES_LIST))
        except FileNotFoundError:
            pass
        except ShipError as exc:
            log.warning("ship %s: %s: rebuilt from the manifest", self.uuid, exc)
        m = read_manifest_of(self.vgroup_path)
        entries: dict[Key, P.FileEntry] = {}
        if m is not None:
            for f in m.files:
                if getattr(f, "origin", "") == self.origin:
                    e = P.FileEntry(0, f.table, f.bucket, f.size, f.magic, f.rows, f.name)
                    entries[e.key] = e
        return FileList(entries)

    def files_in_archive(self) -> set[Key]:
        """Keys of the vgroup's archived files whose origin is this sender."""
        m = read_manifest_of(self.vgroup_path)
        if m is None:
            return set()
        return {(f.table, f.bucket, f.size, f.magic) for f in m.files
                if getattr(f, "origin", "") == self.origin}

    def write_files(self, fl: FileList) -> None:
        os.makedirs(self.path, exist_ok=True)
        write_atomic(self.p(FILES_LIST), fl.to_bytes(), self.fsync)

    def load_log_keys(self) -> tuple[set[str], set[str]]:
        loaded: set[str] = set()
        deleted: set[str] = set()
        try:
            with open(self.p(LOAD_LOG), encoding="utf-8", errors="replace") as fh:
                lines = fh.read().split("\n")[:-1]     # a torn last line was never fsynced
        except FileNotFoundError:
            return loaded, deleted
        for line in lines:
            if line.startswith(LOAD_LINE):
                loaded.add(line[len(LOAD_LINE):])
            elif line.startswith(DELETE_LINE):
                deleted.add(line[len(DELETE_LINE):])
        return loaded, deleted

    def append_load_log(self, lines: list[str]) -> None:
        log_ = SyncLog(self.p(LOAD_LOG), self.fsync)
        try:
            log_.write(lines)
        finally:
            log_.close()

    def log_entries(self) -> tuple[list[P.FileEntry], list[P.FileEntry], tuple[int, int] | None, bool]:
        """sync.log: (received files, deleted files, (seq, round) of the round, ended)."""
        received: list[P.FileEntry] = []
        deleted: list[P.FileEntry] = []
        rnd: tuple[int, int] | None = None
        with open(self.p(RSYNC_LOG), encoding="utf-8", errors="replace") as fh:
            lines = fh.read().split("\n")[:-1]
        for line in lines:
            if line.startswith(LOG_LOADED) or line.startswith(LOG_REMOVED):
                try:
                    e = parse_entry(line[2:], self.p(RSYNC_LOG))
                except ShipError:
                    continue
                (received if line[0] == "+" else deleted).append(e)
            elif line.startswith(LOG_START + " "):
                parts = line.split()
                try:
                    rnd = (int(parts[2]), int(parts[3], 16))
                except (IndexError, ValueError):
                    rnd = None
        return received, deleted, rnd, os.path.exists(self.p(SYNC_END))


class ShipService:
    """A node's ship receiver (see the module doc). Thread-safe; its sessions are threads."""

    def __init__(self, senders: dict[int, ShipSenderConfig], vgroups: "dict[int, VgroupHost]",
                 registry: CollectorRegistry | None = None, fsync: bool = True) -> None:
        self.senders = senders
        self.vgroups = vgroups
        self.fsync = fsync
        self._lock = threading.Lock()
        self._active: dict[str, "Session"] = {}            # uuid -> running session
        self._owner_lock = threading.Lock()
        self.status_of: dict[str, SenderStatus] = {}
        self._stopping = False
        self._threads: set[threading.Thread] = set()
        reg = registry if registry is not None else CollectorRegistry()
        self.m_rounds = Counter("vrepl_ship_rounds", "Ship rounds received, by outcome",
                                ["vgroup", "outcome"], registry=reg)
        self.m_bytes = Counter("vrepl_ship_received_bytes", "File bytes received from ship senders",
                               ["vgroup"], registry=reg)
        self.m_files = Counter("vrepl_ship_loaded_files", "Files loaded from ship senders",
                               ["vgroup"], registry=reg)
        self.m_retries = Counter("vrepl_ship_bad_files", "Received files that failed their"
                                 " checksum (the sender sends them again)", ["vgroup"], registry=reg)
        self.m_refusals = Counter("vrepl_ship_refusals", "Ship sessions refused, by reason",
                                  ["reason"], registry=reg)

    # -- the transport's acceptor interface (I/O thread) -------------------------------------
    def hello_refusal(self, hello: codec.Hello) -> str | None:
        cfg = self.senders.get(hello.node)
        if cfg is None:
            self.m_refusals.labels("unknown_sender").inc()
            return f"ship hello from unknown sender id {hello.node} (not in [[ship.senders]])"
        if hello.vgroup_id not in self.vgroups:
            self.m_refusals.labels("unknown_vgroup").inc()
            return f"ship hello from sender {hello.node} for vg{hello.vgroup_id}, which this node does not host"
        if cfg.vgroups and hello.vgroup_id not in cfg.vgroups:
            self.m_refusals.labels("vgroup_not_allowed").inc()
            return f"sender {hello.node} may not ship into vg{hello.vgroup_id} (ship.senders vgroups)"
        if self._stopping:
            return "the node is stopping"
        return None

    def secret_for(self, hello: codec.Hello) -> bytes:
        cfg = self.senders.get(hello.node)
        # An unknown sender was refused by hello_refusal; a random secret never matches.
        return cfg.secret if cfg is not None else os.urandom(32)

    def on_connection(self, sock: socket.socket, hello: codec.Hello) -> None:
        if self._stopping:
            sock.close()
            return
        t = threading.Thread(target=self._run_session, args=(sock, hello),
                             name=f"vrepl-ship-s{hello.node}", daemon=True)
        with self._lock:
            self._threads.add(t)
        t.start()

    def _run_session(self, sock: socket.socket, hello: codec.Hello) -> None:
        try:
            Session(self, ShipStream(sock, io_timeout_s=120.0), hello).run()
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    # -- life ----------------------------------------------------------------------------------
    def recover_all(self) -> None:
        """The seed's receiver recovery at node start: each sender directory of each vgroup.
        What needs the vgroup (loading) waits for that sender's next round."""
        for vg in self.vgroups.values():
            root = os.path.join(vg.path, RECEIVER_DIR)
            if not os.path.isdir(root):
                continue
            for name in sorted(os.listdir(root)):
                if len(name) == 32 and os.path.isdir(os.path.join(root, name)):
                    sd = SenderDirR(vg.path, name, self.fsync)
                    try:
                        done = recover(sd, None)
                    except ShipError as exc:
                        log.warning("ship %s vg%d: recovery waits for the next round: %s", name, vg.id, exc)
                        continue
                    if done:
                        log.info("ship %s vg%d: recovered: %s", name, vg.id, "; ".join(done))
                    st = self.status_of.setdefault(name, SenderStatus(name))
                    st.vgroup = vg.id
                    st.files = len(sd.files().entries)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping = True
        with self._lock:
            sessions = list(self._active.values())
            threads = list(self._threads)
        for s in sessions:
            s.stream.close()
        deadline = time.monotonic() + timeout_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def status(self) -> list[dict[str, Any]]:
        with self._lock:
            return [s.to_json() for s in sorted(self.status_of.values(), key=lambda s: s.uuid)]

    # -- owners (docs/ship.md §7) ----------------------------------------------------------------
    def owners_path(self, vg: "VgroupHost") -> str:
        return os.path.join(vg.path, RECEIVER_DIR, OWNERS_FILE)

    def read_owners(self, vg: "VgroupHost") -> dict[str, str]:
        try:
            with open(self.owners_path(vg), encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            doc = {}
        return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}

    def owners(self, vg: "VgroupHost") -> dict[str, str]:
        """table -> owner (a sender UUID or "local"): owners.json, completed by the archive
        (an ingested file names its origin; a flushed one was written here)."""
        own = self.read_owners(vg)
        m = read_manifest_of(vg.path)
        if m is not None:
            for f in m.files:
                if f.table in own:
                    continue
                origin = getattr(f, "origin", "")
                if origin.startswith(ORIGIN_PREFIX):
                    own[f.table] = origin[len(ORIGIN_PREFIX):]
                elif not getattr(f, "ingest_version", 0):
                    own[f.table] = LOCAL_OWNER
        return own

    def set_owner(self, vg: "VgroupHost", table: str, owner: str | None) -> dict[str, str]:
        """The operator's release (owner None) or transfer of a table; the new owners."""
        if TABLE_NAME_RE.fullmatch(table) is None:
            raise ValueError(f"{table[:80]!r} is not a table name")
        if owner is not None and not (owner == LOCAL_OWNER or (len(owner) == 32 and all(
                c in "0123456789abcdef" for c in owner))):
            raise ValueError(f"owner {owner[:40]!r} is not a sender UUID (32 hex digits) or 'local'")
        with self._owner_lock:
            own = self.read_owners(vg)
            # An explicit release is remembered as "" so the archive's origin does not
            # claim the table again; the next sender to ship it becomes its owner.
            own[table] = owner if owner is not None else ""
            os.makedirs(os.path.dirname(self.owners_path(vg)), exist_ok=True)
            write_atomic(self.owners_path(vg), json.dumps(own, sort_keys=True).encode(), self.fsync)
        return own

    def claim(self, vg: "VgroupHost", uuid: str, tables: list[str]) -> str | None:
        """First come, first served: claim `tables` for `uuid`, or say which one another
        source owns (nothing is claimed then)."""
        with self._owner_lock:
            own = self.owners(vg)
            for t in tables:
                o = own.get(t)
                if o and o != uuid:
                    who = "rows written on the receiver itself" if o == LOCAL_OWNER else f"sender {o}"
                    return (f"table {t} belongs to {who} (a table has one source); an operator may"
                            f" release it: vrepl ship-owner --node HOST:PORT --vgroup {vg.id} {t} --release")
            explicit = self.read_owners(vg)
            changed = False
            for t in tables:
                if explicit.get(t) != uuid:
                    explicit[t] = uuid
                    changed = True
            if changed:
                os.makedirs(os.path.dirname(self.owners_path(vg)), exist_ok=True)
                write_atomic(self.owners_path(vg), json.dumps(explicit, sort_keys=True).encode(), self.fsync)
        return None


def recover(sd: SenderDirR, loader: "Session | None", keep_parts: bool = True) -> list[str]:
    """The seed's receiver recovery (接收端恢复模块, docs/ship.md §5.2): replay sync.log
    against load.log — each deletion and each received file not yet in load.log is applied
    (a file through `loader`, an ingest record; without one, StateError-like ShipError: the
    round stays until the next session) — then fold the log into files.txt and remove
    sync.log, load.log, sync.end (in that order) and the data/ leftovers."""
    done: list[str] = []
    if not os.path.exists(sd.p(RSYNC_LOG)):
        for name in (LOAD_LOG, SYNC_END):
            if remove_durable(sd.p(name), sd.fsync):
                done.append(f"removed a stray {name}")
        _clean_data(sd, keep_parts)
        return done
    received, deleted, rnd, ended = sd.log_entries()
    loaded, removed = sd.load_log_keys()
    fl = sd.files()
    todo_del = [e for e in deleted if key_text(e.key) not in removed]
    if todo_del:
        sd.append_load_log([DELETE_LINE + key_text(e.key) for e in todo_del])
        removed |= {key_text(e.key) for e in todo_del}
    todo = [e for e in received if key_text(e.key) not in loaded]
    # A file whose ingest record committed before a crash (load.log not yet written) is in
    # the archive with this sender as its origin: recorded, not loaded twice.
    in_archive = (sd.files_in_archive() | set(fl.entries)) if todo else set()
    already = [e for e in todo if e.key in in_archive]
    if already:
        sd.append_load_log([LOAD_LINE + key_text(e.key) for e in already])
        loaded |= {key_text(e.key) for e in already}
        todo = [e for e in todo if e.key not in in_archive]
    if todo:
        missing = [e for e in todo if not os.path.exists(sd.data_file(e))]
        if missing:
            # Never recorded as loaded: the sender's next round offers it again.
            done.append(f"{len(missing)} received files are gone from data/: shipped again")
            todo = [e for e in todo if os.path.exists(sd.data_file(e))]
        damaged = [e for e in todo if _crc_of(sd.data_file(e)) != e.magic]
        if damaged:
            # Received before a crash whose bytes never all reached the disk: sent again.
            for e in damaged:
                os.unlink(sd.data_file(e))
            done.append(f"{len(damaged)} received files were damaged by a crash: shipped again")
            todo = [e for e in todo if e not in damaged]
        if todo and loader is None:
            raise ShipError(f"{len(todo)} received files of round {rnd[0] if rnd else '?'} are not loaded yet")
        if todo:
            if loader is None:
                raise InvariantViolation("loader is not set")
            loader.load(todo)
            loaded |= {key_text(e.key) for e in todo}
            done.append(f"loaded {len(todo)} received files")
    for e in received:
        if key_text(e.key) in loaded:
            fl.entries[e.key] = e
    for e in deleted:
        if key_text(e.key) in removed:
            fl.entries.pop(e.key, None)
    if rnd is not None and ended:
        fl.seq, fl.round_id = rnd
    sd.write_files(fl)
    for name in (RSYNC_LOG, LOAD_LOG, SYNC_END):     # the seed's order: 3, 4, 5
        remove_durable(sd.p(name), sd.fsync)
    _clean_data(sd, keep_parts)
    done.append(f"folded sync.log ({len(received)} received, {len(deleted)} deleted)")
    return done


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link (same file system: no copy), else a copy (data/ on another mount)."""
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copyfile(src, dst)


def _crc_of(path: str) -> int:
    """CRC-32C of a file's bytes, 1 if that is 0 (the vnode's magic)."""
    crc = 0
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(16 << 20):
            crc = _crc.crc32c(chunk, crc)
    return crc or 1


def _clean_data(sd: SenderDirR, keep_parts: bool) -> None:
    """Remove what data/ holds once no round needs it: whole files (loaded, or of a round
    that was folded: the sender offers them again), and with `keep_parts` False the parts
    of cut transfers (kept between rounds so that a cut file resumes from its offset)."""
    d = sd.p(DATA_DIR)
    if not os.path.isdir(d):
        return
    removed = 0
    for name in os.listdir(d):
        if not (keep_parts and name.endswith(PART_SUFFIX)):
            os.unlink(os.path.join(d, name))
            removed += 1
    if removed and sd.fsync:
        fsync_dir(d)


class Session:
    """One sender's connection (a thread): the receiver's half of docs/ship.md §3."""

    def __init__(self, svc: ShipService, stream: ShipStream, hello: codec.Hello) -> None:
        self.svc = svc
        self.stream = stream
        self.hello = hello
        self.vg = svc.vgroups[hello.vgroup_id]
        self.sd: SenderDirR | None = None
        self.status: SenderStatus | None = None
        self.offers: dict[int, P.FileEntry] = {}
        self.deleted: list[P.FileEntry] = []
        self.received: list[int] = []           # verified offers, not loaded yet
        self.round: P.Begin | None = None
        self.log: SyncLog | None = None
        self.bytes_in = 0

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
                    raise self.refuse(ERR_IN_USE, f"sender {uuid} is shipping from {other.stream.peer}"
                                      " already (a second process, or a cloned UUID)")
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
        except Exception as exc:             # a bug here must not take the node down
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
            raise self.refuse(ERR_NOT_MASTER, f"vg{vg.id} on n{vg.node_id} is {vg.role}, not the master"
                              f" (master: n{vg.master})")
        cfg = vg.node_cfg.vnode
        if (b.precision, b.file_span_ms) != (cfg.precision, cfg.file_span_ms):
            raise self.refuse(ERR_CONFIG, f"the sender's vnode has precision {b.precision} and file_span_ms"
                              f" {b.file_span_ms}, vg{vg.id} here {cfg.precision} and {cfg.file_span_ms}")
        self.round = b
        uuid = b.uuid.hex()
        sd = self.sd = SenderDirR(vg.path, uuid, self.svc.fsync)
        sd.ensure()
        # The seed's refusal: the previous round must be loaded first. Its recovery runs now
        # (loading what it can); if that fails the round is refused and the sender retries.
        try:
            done = recover(sd, self)
        except (IngestError, ShipError) as exc:
            raise self.refuse(ERR_BUSY, f"the previous round of sender {uuid} is not loaded yet ({exc});"
                              " retry later") from None
        if done:
            log.info("ship %s vg%d: recovered before the round: %s", uuid, vg.id, "; ".join(done))
        fl = sd.files()
        if self.status is None:
            raise InvariantViolation("self.status is not set")
        self.status.files = len(fl.entries)
        digest = fl.digest()
        match = digest == b.last_digest and len(fl.entries) == b.last_files
        self.stream.send(P.State(fl.seq, fl.round_id, match, len(fl.entries), digest))
        msg = self.stream.recv()
        if type(msg) is P.ListRequest:
            self._send_list(fl)
            msg = self.stream.recv()
        if type(msg) is P.End:          # nothing new: no sync.log at all
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
                self._offer(msg)            # type: ignore[arg-type]
            elif t is P.Data:
                self._data(msg)             # type: ignore[arg-type]
            elif t is P.End:
                break
            else:
                raise self.refuse(ERR_PROTOCOL, f"unexpected {msg.describe()}")
            msg = self.stream.recv()
        end: P.End = msg                    # type: ignore[assignment]
        if end.offered != len(self.offers) or end.deleted != len(self.deleted):
            raise self.refuse(ERR_PROTOCOL, f"end counts {end.offered}/{end.deleted}, received"
                              f" {len(self.offers)} offers, {len(self.deleted)} deletions")
        self._load_received()
        self.log.write([LOG_TSFILE_END, LOG_END])
        self.log.close()
        self.log = None
        write_atomic(sd.p(SYNC_END), b"", self.svc.fsync)
        killpoint(KP_SYNC_END)
        if self.deleted:
            self.stream.send(P.Loaded(0, 0, (), tuple(range(len(self.deleted)))))
        recover(sd, self, keep_parts=False)
        fl = sd.files()
        self.stream.send(P.Done(b.seq, len(fl.entries), fl.digest()))
        st = self.status
        st.last_round, st.last_round_at, st.files = b.seq, time.time(), len(fl.entries)
        st.last_round_files, st.last_round_bytes = len(self.offers), self.bytes_in
        st.files_behind = st.bytes_behind = 0
        st.last_error = ""
        log.info("ship %s vg%d: round %d: %d offered, %d deleted, %d B received; %d files held",
                 uuid, vg.id, b.seq, len(self.offers), len(self.deleted), self.bytes_in, len(fl.entries))

    def _send_list(self, fl: FileList) -> None:
        entries = sorted(fl.entries.values(), key=lambda e: e.key)
        for k in range(0, len(entries), P.MAX_ENTRIES_PER_FRAME):
            self.stream.send(P.ListPart(tuple(entries[k:k + P.MAX_ENTRIES_PER_FRAME])))
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
                    raise self.refuse(ERR_TYPE, f"type conflict: {table}.{col} is {typ} on the sender,"
                                      f" {have} on the receiver; nothing of this round was staged")
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
        items = []
        for e in msg.entries:
            why = entry_refusal(e)
            if why:
                raise self.refuse(ERR_UNSAFE_NAME, why)
            if e.index in self.offers:
                raise self.refuse(ERR_PROTOCOL, f"offer #{e.index} twice")
            self.offers[e.index] = e
            path = self.sd.data_file(e)
            if e.key in fl.entries:
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
            raise self.refuse(ERR_BAD_DATA, f"data for {e.describe()} claims bytes {msg.offset}..{msg.offset + msg.size},"
                              f" the file is {e.size} B")
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
            while pos < msg.offset:                      # the checksum of what a cut left
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
                while rest:         # a short write (a full disk) is followed by ENOSPC, never ignored
                    rest = rest[os.write(fd, rest):]
                counter.inc(len(view))      # as it arrives: a cut transfer counts what came
                self.bytes_in += len(view)

            self.stream.recv_raw(msg.size, sink)
            if self.status is not None:
                self.status.bytes_behind = max(0, self.status.bytes_behind - msg.size)
            if (state[0] or 1) != e.magic:
                os.close(fd)
                fd = -1
                os.unlink(part)
                self.svc.m_retries.labels(str(self.vg.id)).inc()
                self.stream.send(P.Result(msg.index, P.RESULT_BAD,
                                          f"checksum {state[0] or 1:#010x}, announced {e.magic:#010x}"))
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
    def _load_received(self) -> None:
        """Load what was received (and verified) so far, then tell the sender."""
        if not self.received:
            return
        if self.sd is None:
            raise InvariantViolation("self.sd is not set")
        if self.log is not None:
            self.log.sync()
        if self.svc.fsync:
            fsync_dir(self.sd.p(DATA_DIR))
        fl = self.sd.files()
        batch = [self.offers[i] for i in self.received]
        fresh = [e for e in batch if e.key not in fl.entries]
        loaded, _ = self.sd.load_log_keys()
        fresh = [e for e in fresh if key_text(e.key) not in loaded]
        version = epoch = 0
        if fresh:
            version, epoch = self.load(fresh)
        indexes = tuple(self.received)
        self.received = []
        self.stream.send(P.Loaded(version, epoch, indexes, ()))

    def load(self, files: list[P.FileEntry]) -> tuple[int, int]:
        """Ingest `files` (each in data/) by ingest records of at most MAX_ROUND_FILES files,
        writing load.log after each commits; (version, epoch) of the last record."""
        if self.sd is None:
            raise InvariantViolation("self.sd is not set")
        sd, vg = self.sd, self.vg
        version = epoch = 0
        for k in range(0, len(files), MAX_ROUND_FILES):
            batch = files[k:k + MAX_ROUND_FILES]
            sub = f"ship-{sd.uuid}-{os.urandom(6).hex()}"
            incoming = os.path.join(vg.staging_dir(), sub)
            os.makedirs(incoming, exist_ok=True)
            specs = []
            for n, e in enumerate(batch):
                _link_or_copy(sd.data_file(e), os.path.join(incoming, f"{n}.parquet"))
                specs.append(IngestFile(f"{sub}/{n}.parquet", e.table, sd.origin, e.size, e.magic))
            meta = {"sender": sd.uuid, "round": self.round.round_id if self.round else 0,
                    "seq": self.round.seq if self.round else 0}
            t0 = time.monotonic()
            try:
                res = self._ingest(specs, meta)
            finally:
                _remove_tree(incoming)
            log.info("ship %s vg%d: %d files loaded by record v%d in %.3f s", sd.uuid, vg.id, len(batch),
                     res.version, time.monotonic() - t0)
            killpoint(KP_INGESTED)
            sd.append_load_log([LOAD_LINE + key_text(e.key) for e in batch])
            killpoint(KP_LOAD_LOGGED)
            for e in batch:
                try:
                    os.unlink(sd.data_file(e))
                except FileNotFoundError:
                    pass
            self.svc.m_files.labels(str(vg.id)).inc(len(batch))
            version, epoch = res.version, res.epoch
        return version, epoch

    def _ingest(self, specs: list[IngestFile], meta: dict[str, Any]) -> Any:
        vg = self.vg
        loop = vg.loop
        if loop is None:
            raise self.refuse(ERR_NOT_MASTER, f"vg{vg.id} is not running")
        for _ in range(INGEST_BUSY_TRIES):
            fut = asyncio.run_coroutine_threadsafe(vg.ingest(specs, "ship", meta), loop)
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


def _remove_tree(path: str) -> None:
    for root, dirs, files in os.walk(path, topdown=False):
        for f in files:
            os.unlink(os.path.join(root, f))
        for d in dirs:
            os.rmdir(os.path.join(root, d))
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass

