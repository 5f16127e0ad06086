"""The round's file selection of `vrepl ship` (docs/ship.md §5.1): the vnode's manifest read
as the sender's file entries, the seed's deleted and new lists by diffing it against the
last-shipped list, and a file's magic (CRC-32C) recomputed from its bytes.

Owns: reading and checking the manifest for shipping (a name the receiver would refuse is
refused here first), the diff, `Selection` (the manifest and the list as read at a round's
start, parsed and diffed only when unchanged.json does not already say they select
nothing: a round with nothing new reads two files and parses neither), and the magic.
Must not: write anything, open a connection, or scan a directory (the manifest names the
files).
"""

from __future__ import annotations

import os

from vrepl._core import crc32c as _crc
from vrepl.errors import ArchiveError
from vrepl.manifest import DATA_DIR, MANIFEST_NAME, Manifest
from vrepl.names import TABLE_NAME_RE
from vrepl.restore.paths import name_refusal
from vrepl.ship import protocol as P
from vrepl.ship.errors import StateError, UnsafeName
from vrepl.ship.state import CURRENT_LIST, LAST_LIST, SYNC_LOG, FileList, Key, ListSummary, SenderDir, fingerprint

CRC_CHUNK_BYTES = 16 * 1024 * 1024
WAL_DIR = "wal"  # a vnode directory's WAL (vrepl/vnode/restoreinfo.py; not imported: no vnode here)


def vnode_dir_refusal(data: str) -> str | None:
    """Why `data` is no vnode directory, or None when it is one: it holds data/manifest.json,
    or data/ and wal/ (a vnode that has archived nothing yet)."""
    if os.path.isfile(os.path.join(data, MANIFEST_NAME)):
        return None
    if os.path.isdir(os.path.join(data, DATA_DIR)) and os.path.isdir(os.path.join(data, WAL_DIR)):
        return None
    return (
        f"{data}: not a vnode directory (neither {MANIFEST_NAME} nor {DATA_DIR}/ and {WAL_DIR}/):"
        " give the directory that holds data/ and wal/, e.g. <data_dir>/vg1"
    )


def nothing_archived_yet(sdir: SenderDir, data: str) -> ListSummary | None:
    """The last list's summary when the vnode has archived nothing yet (no manifest) and
    nothing was shipped from it to this receiver (no list naming a file, no round under
    way): the round has nothing to do and needs no connection. None otherwise, including a
    manifest gone after files were shipped (the round then says it is missing)."""
    if os.path.exists(os.path.join(data, MANIFEST_NAME)):
        return None
    if any(os.path.exists(sdir.p(name)) for name in (SYNC_LOG, CURRENT_LIST)):
        return None
    try:
        last = FileList.read(sdir.p(LAST_LIST))
    except FileNotFoundError:
        return FileList({}).summary()
    except (StateError, OSError):
        return None
    return last.summary() if not last.entries else None


def read_manifest_bytes(data: str) -> bytes:
    path = os.path.join(data, MANIFEST_NAME)
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise StateError(
            f"{data}: no {MANIFEST_NAME}: not a vnode data directory (give the"
            " directory that holds data/ and wal/, e.g. <data_dir>/vg1)"
        ) from None
    except OSError as exc:
        raise StateError(f"{path}: {exc.strerror}") from None


def parse_manifest(raw: bytes, data: str) -> Manifest:
    try:
        return Manifest.from_bytes(raw, os.path.join(data, MANIFEST_NAME))
    except ArchiveError as exc:
        raise StateError(str(exc)) from None


class Selection:
    """The round's selection: the manifest and last_local_files.txt, each read once at the
    round's start (the round works from these bytes even if a flush replaces the manifest
    meanwhile). `unchanged`: unchanged.json names both files' fingerprints, so they select
    nothing (it was written after a diff of exactly these bytes found nothing to ship, and
    the check of the manifest's names passed); then nothing is parsed unless the receiver's
    state differs and the list must be reconciled (`manifest`, `now`, `last` parse on first
    use)."""

    def __init__(self, sdir: SenderDir, data: str) -> None:
        self.data = data
        self.manifest_bytes = read_manifest_bytes(data)
        self.list_bytes = sdir.read_last_bytes()
        self.manifest_fp = fingerprint(self.manifest_bytes)
        self.list_fp = fingerprint(self.list_bytes)
        self._list_path = sdir.p(LAST_LIST)
        self._manifest: Manifest | None = None
        self._now: dict[Key, P.FileEntry] | None = None
        self._last: FileList | None = None
        self._memo: ListSummary | None = None
        self.precision, self.file_span_ms = "", 0
        memo = sdir.read_memo()
        if memo.get("manifest") == self.manifest_fp and memo.get("list") == self.list_fp:
            try:
                self._memo = ListSummary(
                    int(memo["files"]), bytes.fromhex(memo["digest"]), int(memo["seq"]), int(memo["round"], 16)
                )
                self.precision, self.file_span_ms = str(memo["precision"]), int(memo["file_span_ms"])
            except (KeyError, ValueError, TypeError):
                self._memo = None
        if self._memo is None:
            self.precision, self.file_span_ms = self.manifest.precision, self.manifest.file_span_ms

    @property
    def unchanged(self) -> bool:
        return self._memo is not None

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            self._manifest = parse_manifest(self.manifest_bytes, self.data)
        return self._manifest

    @property
    def now(self) -> dict[Key, P.FileEntry]:
        if self._now is None:
            self._now = manifest_entries(self.manifest)
        return self._now

    @property
    def last(self) -> FileList:
        if self._last is None:
            self._last = FileList.from_bytes(self.list_bytes, self._list_path)
        return self._last

    def last_summary(self) -> ListSummary:
        return self._memo if self._memo is not None else self.last.summary()

    def diff(self) -> tuple[list[P.FileEntry], list[P.FileEntry]]:
        """(deleted, new) of the manifest against the list as read at the round's start."""
        return ([], []) if self._memo is not None else diff(self.last.entries, self.now)


def manifest_entries(m: Manifest) -> dict[Key, P.FileEntry]:
    """The manifest's files as entries by key. A name the receiver would refuse is refused
    here first (it came from this disk, but a damaged or crafted manifest is possible)."""
    out: dict[Key, P.FileEntry] = {}
    for f in m.files:
        why = name_refusal(f.name)
        if why is not None or TABLE_NAME_RE.fullmatch(f.table) is None:
            raise UnsafeName(f"the manifest names a file the receiver would refuse: {why or f'table {f.table!r}'}")
        e = P.FileEntry(0, f.table, f.bucket, f.size, f.magic, f.rows, f.name)
        out[e.key] = e
    return out


def diff(last: dict[Key, P.FileEntry], now: dict[Key, P.FileEntry]) -> tuple[list[P.FileEntry], list[P.FileEntry]]:
    """(deleted, new): the seed's two lists, by content key, in a stable order."""
    deleted = sorted((e for k, e in last.items() if k not in now), key=lambda e: e.key)
    new = sorted((e for k, e in now.items() if k not in last), key=lambda e: (e.bucket, e.table, e.key))
    return deleted, new


def file_magic_of(path: str) -> int:
    """CRC-32C of a file (1 if 0): the vnode's magic, recomputed from its bytes."""
    crc = 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            chunk = fh.read(CRC_CHUNK_BYTES)
            if not chunk:
                break
            crc = _crc.crc32c(chunk, crc)
    return crc or 1
