"""The receiver's on-disk state of `vrepl ship` (docs/ship.md §4.2, §5.2).

Owns: the per-sender directory `<vgroup path>/ship/<uuid>/` (`files.txt`, `sync.log`,
`load.log`, `sync.end`, `data/`: `SenderDirR`), the names received files take (their content
key, never the sender's name), the check of a sender's entry, a sender's status record, and
the seed's receiver recovery algorithm (`recover`, at node start and before every round).
Must not: open sockets, or write into the archive or the WAL (recovery loads through a
`Loader`, the session's ingest records: vrepl/node/shipsession.py).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from dataclasses import dataclass
from typing import Any, Protocol

from vrepl._core import crc32c as _crc
from vrepl.errors import InvariantViolation
from vrepl.restore.paths import name_refusal
from vrepl.ship import protocol as P
from vrepl.ship.errors import ShipError
from vrepl.ship.state import (
    LOG_LOADED,
    LOG_REMOVED,
    LOG_START,
    FileList,
    Key,
    ListSummary,
    SyncLog,
    fingerprint,
    fsync_dir,
    parse_entry,
    remove_durable,
)
from vrepl.vnode.errors import ArchiveError
from vrepl.vnode.files import MANIFEST_NAME, Manifest, write_atomic
from vrepl.vnode.rows import TABLE_NAME_RE

log = logging.getLogger("vrepl.ship")

RECEIVER_DIR = "ship"
OWNERS_FILE = "owners.json"
FILES_LIST = "files.txt"
RSYNC_LOG = "sync.log"
LOAD_LOG = "load.log"
SYNC_END = "sync.end"
ROUNDS_FILE = "rounds.json"
MAX_BEGUN = 64  # rounds begun and not completed that rounds.json remembers
DATA_DIR = "data"
PART_SUFFIX = ".part"
LOAD_LINE = "load "
DELETE_LINE = "delete "
ORIGIN_PREFIX = "ship/"
LOCAL_OWNER = "local"  # owners.json value of a table written on the receiver itself
INGEST_TIMEOUT_S = 120.0
INGEST_BUSY_RETRY_S = 0.05
INGEST_BUSY_TRIES = 400


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

    def summary(self, memo: dict[str, tuple[str, ListSummary]]) -> tuple[ListSummary, bool]:
        """(what files() would say of this sender's list, whether files.txt had to be parsed
        for it). `memo` keeps the summary of the last files.txt parsed, by the fingerprint
        of its bytes: a round that follows an unchanged files.txt (nothing new) reads it and
        parses nothing. Without a files.txt, files() (the manifest) every time."""
        path = self.p(FILES_LIST)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return self.files().summary(), True
        fp = fingerprint(data)
        known = memo.get(path)
        if known is not None and known[0] == fp:
            return known[1], False
        try:
            sm = FileList.from_bytes(data, path).summary()
        except ShipError:
            return self.files().summary(), True  # logs the rebuild
        memo[path] = (fp, sm)
        return sm, True

    def archive(self, vnode: Any = None) -> dict[Key, list[tuple[str, int, int]]]:
        """This sender's files in the vgroup's archive, as every replica holds them once the
        rounds committed so far are applied: key -> [(archive name, size, magic)]. The
        vnode's pending rounds (committed or replayed records not archived yet: their adds
        count, their removals are gone) are read before the manifest, so a round a flush
        archives in between is seen in one or the other."""
        pending = vnode.pending_ingests() if vnode is not None else []
        m = read_manifest_of(self.vgroup_path)
        out: dict[Key, list[tuple[str, int, int]]] = {}
        for f in m.files if m is not None else ():
            if getattr(f, "origin", "") == self.origin:
                out.setdefault((f.table, f.bucket, f.size, f.magic), []).append((f.name, f.size, f.magic))
        for p in pending:
            for k, e in enumerate(p.record.files):
                if e.origin == self.origin:
                    name = p.record.archive_name(p.version, k)
                    held = out.setdefault((e.table, e.bucket, e.size, e.crc32c), [])
                    if name not in (n for n, _, _ in held):
                        held.append((name, e.size, e.crc32c))
            gone = {r.name for r in p.record.removes}
            if gone:
                for key in list(out):
                    out[key] = [x for x in out[key] if x[0] not in gone]
                    if not out[key]:
                        del out[key]
        return out

    def write_files(self, fl: FileList) -> None:
        os.makedirs(self.path, exist_ok=True)
        write_atomic(self.p(FILES_LIST), fl.to_bytes(), self.fsync)

    # -- the round history (docs/ship.md §7.1: a cloned UUID) -----------------------------------
    def read_begun(self) -> list[int]:
        """Ids of the rounds begun since the last completed one (rounds.json)."""
        try:
            with open(self.p(ROUNDS_FILE), encoding="utf-8") as fh:
                doc = json.load(fh)
            return [int(x, 16) for x in doc.get("begun", [])]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning(
                "ship %s: %s unreadable (%s): the round history starts again", self.uuid, self.p(ROUNDS_FILE), exc
            )
            return []

    def note_begun(self, round_id: int) -> None:
        """Remember (durably, before STATE answers) that this sender began round `round_id`:
        its sync.log may name it from now on."""
        begun = [x for x in self.read_begun() if x != round_id][-(MAX_BEGUN - 1) :] + [round_id]
        os.makedirs(self.path, exist_ok=True)
        write_atomic(self.p(ROUNDS_FILE), json.dumps({"begun": [f"{x:016x}" for x in begun]}).encode(), self.fsync)

    def clear_begun(self) -> None:
        remove_durable(self.p(ROUNDS_FILE), self.fsync)

    def load_log_keys(self) -> tuple[set[str], set[str]]:
        loaded: set[str] = set()
        deleted: set[str] = set()
        try:
            with open(self.p(LOAD_LOG), encoding="utf-8", errors="replace") as fh:
                lines = fh.read().split("\n")[:-1]  # a torn last line was never fsynced
        except FileNotFoundError:
            return loaded, deleted
        for line in lines:
            if line.startswith(LOAD_LINE):
                loaded.add(line[len(LOAD_LINE) :])
            elif line.startswith(DELETE_LINE):
                deleted.add(line[len(DELETE_LINE) :])
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


class Loader(Protocol):
    """What recovery needs to load files: a session's ingest records."""

    def load(self, files: list[P.FileEntry]) -> tuple[int, int]: ...


def recover(sd: SenderDirR, loader: Loader | None, keep_parts: bool = True, vnode: Any = None) -> list[str]:
    """The seed's receiver recovery (接收端恢复模块, docs/ship.md §5.2): replay sync.log
    against load.log — each received file not yet in load.log is loaded (through `loader`,
    an ingest record; without one, ShipError: the round stays until the next session); a
    deletion not in load.log is logged if its file is gone from the archive (its record
    committed before a crash), else left for the sender to send again (a session applies
    deletions only in the round's last record, docs/ship.md §3.3) — then fold the log into
    files.txt and remove sync.log, load.log, sync.end (in that order) and the data/
    leftovers. `vnode`: the vgroup's, for the rounds not archived yet (SenderDirR.archive)."""
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
    todo = [e for e in received if key_text(e.key) not in loaded]
    arch = sd.archive(vnode) if (todo or todo_del) else {}
    # A deletion whose record committed before a crash (load.log not yet written) finds its
    # file gone: recorded, not applied twice. The others wait for the sender's next round.
    gone = [e for e in todo_del if e.key not in arch]
    if gone:
        sd.append_load_log([DELETE_LINE + key_text(e.key) for e in gone])
        removed |= {key_text(e.key) for e in gone}
    # A file whose ingest record committed before a crash (load.log not yet written) is in
    # the archive with this sender as its origin: recorded, not loaded twice.
    in_archive = (set(arch) | set(fl.entries)) if todo else set()
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
    if rnd is not None and ended:
        sd.clear_begun()  # the completed round is files.txt's now (a crash before: a superset)
    for name in (RSYNC_LOG, LOAD_LOG, SYNC_END):  # the seed's order: 3, 4, 5
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
