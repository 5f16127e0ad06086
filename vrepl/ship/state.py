"""On-disk state of a ship sender (docs/ship.md §4): file lists, sync.log, recovery.

Owns: the sender's directory `<data>/ship/`: `uuid.txt` (the sender's identity) and one
directory per receiver with `last_local_files.txt` (what the receiver holds of this sender,
as confirmed by it), `current_local_files.txt` (the next list, while it is written),
`sync.log` (the running round: each line a file the receiver confirmed loaded or
removed), `snapshot/` (hard links of the round's new files), `state.json` and
`schema.json`; the list format and its digest; the seed's sender recovery algorithm
(`recover()`), run before every round; durable writes (temp file, fsync, rename, fsync of
the directory) for every file here.

Where this departs from the seed (docs/ship.md §5): every write is fsynced; the list is
replaced by one atomic rename (the seed deletes the old list, then renames, which a crash
in between turns into "no list"); a list carries its entry count in a trailer, so a list cut
by a crash is detected; sync.log records only what the receiver confirmed *loaded* (the
seed records a file as soon as its bytes are sent, so a crash between the transfer and the
load made it "synced" and never sent again).
Must not: talk to the receiver, or read the vnode's files (sender.py does).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid as _uuid
from dataclasses import dataclass
from typing import Iterable

from vrepl.durable import fsync_dir, write_atomic
from vrepl.ship.errors import StateError
from vrepl.ship.protocol import FileEntry

SHIP_DIR = "ship"
UUID_FILE = "uuid.txt"
LAST_LIST = "last_local_files.txt"
CURRENT_LIST = "current_local_files.txt"
SYNC_LOG = "sync.log"
SNAPSHOT_DIR = "snapshot"
STATE_FILE = "state.json"
SCHEMA_FILE = "schema.json"
SELECTION_MEMO = "unchanged.json"

LIST_HEADER = "# vrepl ship last_local_files 1"
LIST_TRAILER = "# end"
UUID_RE = re.compile(r"[0-9a-f]{32}")

# sync.log lines (docs/ship.md §4.2): the seed's markers, then one line per confirmation.
LOG_START = "sync start"
LOG_DELETED_START = "sync deleted file names start"
LOG_DELETED_END = "sync deleted file names end"
LOG_TSFILE_START = "sync tsfile start"
LOG_TSFILE_END = "sync tsfile end"
LOG_END = "sync end"
LOG_LOADED = "+ "  # + <entry>: the receiver confirmed this file loaded (in its archive)
LOG_REMOVED = "- "  # - <entry>: the receiver confirmed this file removed

Key = tuple[str, int, int, int]


# ------------------------------------------------------------------------------------------
# durable writes


def remove_durable(path: str, fsync: bool = True) -> bool:
    """Remove a file or directory tree if present (and fsync its parent); whether it was."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
    if fsync:
        fsync_dir(os.path.dirname(path) or ".")
    return True


# ------------------------------------------------------------------------------------------
# entries, lists, digests


def read_json_object(path: str) -> dict:
    """The JSON object in `path`, or {} when it is missing, unreadable or not an object:
    the sender's state files that a crash may have lost or torn, each of which has a safe
    default (docs/ship.md §4.1)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def entry_line(e: FileEntry) -> str:
    """`<table>\\t<bucket>\\t<size>\\t<magic>\\t<rows>\\t<name>`: names never hold a tab or a
    newline (vnode name rules, checked before a list is written)."""
    return f"{e.table}\t{e.bucket}\t{e.size}\t{e.magic}\t{e.rows}\t{e.name}"


def parse_entry(line: str, where: str) -> FileEntry:
    parts = line.split("\t")
    if len(parts) != 6:
        raise StateError(f"{where}: malformed entry {line[:80]!r}")
    try:
        return FileEntry(0, parts[0], int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4]), parts[5])
    except ValueError:
        raise StateError(f"{where}: malformed entry {line[:80]!r}") from None


def digest_of_keys(keys: Iterable[Key]) -> bytes:
    """SHA-256 over the sorted keys, one `table\\tbucket\\tsize\\tmagic\\n` line each: the
    sender's list and the receiver's archive agree exactly when their digests do."""
    h = hashlib.sha256()
    for table, bucket, size, magic in sorted(keys):
        h.update(f"{table}\t{bucket}\t{size}\t{magic}\n".encode())
    return h.digest()


def fingerprint(data: bytes) -> str:
    """SHA-256 (hex) of a state file's bytes: a list or a manifest is "unchanged" exactly
    when its fingerprint is."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ListSummary:
    """What a round's BEGIN, STATE and DONE say of a list: its size, key digest and round."""

    files: int
    digest: bytes
    seq: int
    round_id: int


@dataclass
class FileList:
    """What the receiver holds of this sender, by key, and the round that made it so."""

    entries: dict[Key, FileEntry]
    seq: int = 0  # the last completed round (0: none yet)
    round_id: int = 0

    def digest(self) -> bytes:
        return digest_of_keys(self.entries)

    def summary(self) -> ListSummary:
        return ListSummary(len(self.entries), self.digest(), self.seq, self.round_id)

    def to_bytes(self) -> bytes:
        lines = [f"{LIST_HEADER} seq={self.seq} round={self.round_id:016x}"]
        lines += [entry_line(e) for e in sorted(self.entries.values(), key=lambda e: e.key)]
        lines.append(f"{LIST_TRAILER} {len(self.entries)}")
        return ("\n".join(lines) + "\n").encode()

    @classmethod
    def read(cls, path: str) -> "FileList":
        """A list file; StateError when it is malformed or cut short (no trailer)."""
        with open(path, "rb") as fh:
            return cls.from_bytes(fh.read(), path)

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> "FileList":
        """A list file's bytes (read by the caller, who may also fingerprint them)."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise StateError(f"{path}: not UTF-8") from None
        lines = text.split("\n")
        if not lines or not lines[0].startswith(LIST_HEADER):
            raise StateError(f"{path}: not a file list (no header)")
        head = dict(p.split("=", 1) for p in lines[0][len(LIST_HEADER) :].split() if "=" in p)
        try:
            seq, round_id = int(head.get("seq", "0")), int(head.get("round", "0"), 16)
        except ValueError:
            raise StateError(f"{path}: malformed header") from None
        if lines[-1] == "":
            lines.pop()
        if len(lines) < 2 or not lines[-1].startswith(LIST_TRAILER + " "):
            raise StateError(f"{path}: cut short (no trailer): written by a round a crash interrupted")
        body = lines[1:-1]
        try:
            count = int(lines[-1][len(LIST_TRAILER) + 1 :])
        except ValueError:
            raise StateError(f"{path}: malformed trailer") from None
        if count != len(body):
            raise StateError(f"{path}: the trailer says {count} entries, the list has {len(body)}")
        entries = {}
        for line in body:
            e = parse_entry(line, path)
            entries[e.key] = e
        return cls(entries, seq, round_id)


# ------------------------------------------------------------------------------------------
# sync.log


class SyncLog:
    """The running round's log: appended and fsynced as the receiver confirms files."""

    def __init__(self, path: str, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self._fh = open(path, "a", encoding="utf-8")

    def write(self, lines: Iterable[str], durable: bool = True) -> None:
        """Append `lines`; fsynced now unless `durable` is False (then by the next sync())."""
        text = "".join(line + "\n" for line in lines)
        if not text:
            return
        self._fh.write(text)
        self._fh.flush()
        if self.fsync and durable:
            os.fsync(self._fh.fileno())

    def sync(self) -> None:
        if self.fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    @staticmethod
    def start(path: str, seq: int, round_id: int, fsync: bool = True) -> "SyncLog":
        """A new sync.log (the previous one was folded by recover())."""
        log = SyncLog(path, fsync)
        log.write([f"{LOG_START} {seq} {round_id:016x}"])
        if fsync:
            fsync_dir(os.path.dirname(path))
        return log


def fold_log(base: FileList, log_path: str) -> tuple[FileList, int, int]:
    """The seed's step 4: `base` plus every file sync.log says was loaded, minus every file
    it says was removed; (list, loaded, removed). A torn last line (a crash mid-append) is
    ignored: it was never fsynced, so the receiver's confirmation is not lost for good, the
    next round sees the file as loaded (WANT_LOADED) and logs it again."""
    entries = dict(base.entries)
    seq, round_id = base.seq, base.round_id
    loaded = removed = 0
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    lines = text.split("\n")
    complete = lines[:-1]  # the text after the last newline is a torn line
    for line in complete:
        if line.startswith(LOG_LOADED) or line.startswith(LOG_REMOVED):
            try:
                e = parse_entry(line[2:], log_path)
            except StateError:
                continue
            if line[0] == "+":
                entries[e.key] = e
                loaded += 1
            else:
                entries.pop(e.key, None)
                removed += 1
        elif line.startswith(LOG_START + " "):
            parts = line.split()
            try:
                seq, round_id = int(parts[2]), int(parts[3], 16)
            except (IndexError, ValueError):
                pass
    return FileList(entries, seq, round_id), loaded, removed


# ------------------------------------------------------------------------------------------
# the directory of one receiver


def receiver_dir_name(receiver: str, vgroup: int) -> str:
    """`<receiver>_vg<N>`, the receiver as the operator named it (--to, e.g. `10.0.0.1:6101`)
    with every character outside [A-Za-z0-9.-] as '_' (seed: the directory of a receiver is
    named by its address): `10.0.0.1_6101_vg1`."""
    safe = re.sub(r"[^A-Za-z0-9.-]", "_", receiver)[:200] or "_"
    return f"{safe}_vg{vgroup}"


class SenderDir:
    """`<data>/ship/<receiver>/`: the state of shipping one data directory to one receiver."""

    def __init__(self, data: str, receiver: str, vgroup: int, fsync: bool = True) -> None:
        self.data = os.path.abspath(data)
        self.root = os.path.join(self.data, SHIP_DIR)
        self.path = os.path.join(self.root, receiver_dir_name(receiver, vgroup))
        self.receiver = receiver
        self.fsync = fsync

    def p(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def snapshot(self) -> str:
        return self.p(SNAPSHOT_DIR)

    def ensure(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        if not os.path.exists(self.p(LAST_LIST)) and not os.path.exists(self.p(CURRENT_LIST)):
            # Created at once (empty), so that "no last list" never means "first round" by
            # accident after a crash (seed recovery step 2).
            write_atomic(self.p(LAST_LIST), FileList({}).to_bytes(), self.fsync)

    # -- the seed's recovery (docs/ship.md §5.1) ---------------------------------------------
    def recover(self) -> list[str]:
        """Run the seed's sender recovery algorithm (步骤 1-9); returns what it did (for the
        log). Afterwards last_local_files.txt is the receiver's confirmed state, and neither
        current_local_files.txt, sync.log nor snapshot/ exists."""
        done: list[str] = []
        cur, last, log = self.p(CURRENT_LIST), self.p(LAST_LIST), self.p(SYNC_LOG)
        # 1-2: an interrupted fold. Our fold renames current over last atomically, so a
        # current list next to a last one is an unfinished write: drop it and fold again.
        if os.path.exists(cur):
            if os.path.exists(last):
                remove_durable(cur, self.fsync)
                done.append("removed an unfinished current_local_files.txt")
            else:
                # 7 (seed): the old list was deleted before the rename. Only a complete
                # list may become the last one.
                try:
                    FileList.read(cur)
                    os.replace(cur, last)
                    if self.fsync:
                        fsync_dir(self.path)
                    done.append("renamed current_local_files.txt to last_local_files.txt")
                except StateError:
                    remove_durable(cur, self.fsync)
                    write_atomic(last, FileList({}).to_bytes(), self.fsync)
                    done.append("dropped a cut current_local_files.txt")
        if not os.path.exists(last):
            write_atomic(last, FileList({}).to_bytes(), self.fsync)
        # 3-7: fold sync.log into the list.
        if os.path.exists(log):
            try:
                base = FileList.read(last)
            except StateError as exc:
                raise StateError(
                    f"{exc}; remove {self.path} to ship everything again (the"
                    " receiver keeps what it has and is reconciled by listing)"
                ) from None
            folded, loaded, removed = fold_log(base, log)
            write_atomic(cur, folded.to_bytes(), self.fsync)  # 5
            os.replace(cur, last)  # 6-7, atomically
            if self.fsync:
                fsync_dir(self.path)
            done.append(f"folded sync.log: {loaded} loaded, {removed} removed")
        # 8: the round's leftovers.
        if os.path.exists(self.snapshot):
            remove_durable(self.snapshot, self.fsync)
            done.append("removed the snapshot")
        if os.path.exists(log):
            remove_durable(log, self.fsync)
        return done

    def read_last(self) -> FileList:
        return FileList.read(self.p(LAST_LIST))

    def read_last_bytes(self) -> bytes:
        with open(self.p(LAST_LIST), "rb") as fh:
            return fh.read()

    # -- unchanged.json: what the last selection found (docs/ship.md §4.1) --------------------
    def read_memo(self) -> dict:
        """unchanged.json, or {} when it is missing or unreadable (then the round diffs the
        manifest in full, as without it)."""
        return read_json_object(self.p(SELECTION_MEMO))

    def write_memo(self, manifest_fp: str, list_fp: str, summary: ListSummary, precision: str, span_ms: int) -> None:
        """Record that the manifest with fingerprint `manifest_fp` against the list with
        `list_fp` selects nothing. Not fsynced: it is a function of the two files' bytes,
        so a lost or torn memo only costs the next round one full diff, never a wrong one."""
        doc = {
            "manifest": manifest_fp,
            "list": list_fp,
            "files": summary.files,
            "digest": summary.digest.hex(),
            "seq": summary.seq,
            "round": f"{summary.round_id:016x}",
            "precision": precision,
            "file_span_ms": span_ms,
        }
        write_atomic(self.p(SELECTION_MEMO), json.dumps(doc, sort_keys=True).encode(), fsync=False)

    def write_last(self, fl: FileList) -> None:
        """Replace the list outright (after a reconciliation by listing)."""
        write_atomic(self.p(CURRENT_LIST), fl.to_bytes(), self.fsync)
        os.replace(self.p(CURRENT_LIST), self.p(LAST_LIST))
        if self.fsync:
            fsync_dir(self.path)

    # -- schema.json (the seed's sync_schema_pos) --------------------------------------------
    def read_schema(self) -> dict[str, dict[str, str]]:
        return read_json_object(self.p(SCHEMA_FILE))

    def write_schema(self, schema: dict[str, dict[str, str]]) -> None:
        write_atomic(self.p(SCHEMA_FILE), json.dumps(schema, sort_keys=True).encode(), self.fsync)

    def reset_schema(self) -> None:
        remove_durable(self.p(SCHEMA_FILE), self.fsync)

    # -- state.json ----------------------------------------------------------------------------
    def read_state(self) -> dict:
        return read_json_object(self.p(STATE_FILE))

    def write_state(self, doc: dict) -> None:
        write_atomic(self.p(STATE_FILE), json.dumps(doc, sort_keys=True).encode(), self.fsync)


# ------------------------------------------------------------------------------------------
# the sender's UUID


def load_uuid(data: str, *, given: str | None = None, fsync: bool = True) -> tuple[str, str | None]:
    """The sender's UUID (32 lowercase hex) and a note of what was repaired, if anything.

    `<data>/ship/uuid.txt` holds it; every receiver directory keeps a copy in its
    state.json. A lost uuid.txt is restored from those copies (a sender whose UUID file
    vanished would otherwise come back as a new sender and conflict with itself); copies
    that disagree are refused (the operator decides with --uuid). With none of them a new
    UUID is made. `given` (--uuid) sets it explicitly."""
    root = os.path.join(os.path.abspath(data), SHIP_DIR)
    path = os.path.join(root, UUID_FILE)
    os.makedirs(root, exist_ok=True)
    if given is not None:
        text = given.strip().lower().replace("-", "")
        if not UUID_RE.fullmatch(text):
            raise StateError(f"--uuid {given!r} is not a UUID (32 hex digits)")
        current = _read_uuid_file(path)
        if current != text:
            write_atomic(path, (text + "\n").encode(), fsync)
            return text, f"uuid set to {text} (--uuid; it was {current or 'unset'})"
        return text, None
    current = _read_uuid_file(path)
    if current is not None:
        return current, None
    copies = set()
    for name in sorted(os.listdir(root)):
        st = os.path.join(root, name, STATE_FILE)
        try:
            with open(st, encoding="utf-8") as fh:
                u = json.load(fh).get("uuid")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(u, str) and UUID_RE.fullmatch(u):
            copies.add(u)
    if len(copies) > 1:
        raise StateError(
            f"{path} is missing and the receiver directories under {root} name"
            f" different UUIDs ({', '.join(sorted(copies))}): pass the right one with --uuid"
        )
    if copies:
        text = copies.pop()
        write_atomic(path, (text + "\n").encode(), fsync)
        return text, f"{path} was missing: restored uuid {text} from the receiver state"
    text = _uuid.uuid4().hex
    write_atomic(path, (text + "\n").encode(), fsync)
    return text, None


def _read_uuid_file(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
    except FileNotFoundError:
        return None
    if not UUID_RE.fullmatch(text):
        raise StateError(f"{path}: not a UUID ({text[:40]!r}); fix it or pass --uuid")
    return text
