"""The round's file selection of `vrepl ship` (docs/ship.md §5.1): the vnode's manifest read
as the sender's file entries, the seed's deleted and new lists by diffing it against the
last-shipped list, and a file's magic (CRC-32C) recomputed from its bytes.

Owns: reading and checking the manifest for shipping (a name the receiver would refuse is
refused here first), the diff, and the magic.
Must not: write anything, open a connection, or scan a directory (the manifest names the
files).
"""

from __future__ import annotations

import os

from vrepl._core import crc32c as _crc
from vrepl.restore.paths import name_refusal
from vrepl.ship import protocol as P
from vrepl.ship.errors import StateError, UnsafeName
from vrepl.ship.state import Key
from vrepl.vnode.errors import ArchiveError
from vrepl.vnode.files import MANIFEST_NAME, Manifest
from vrepl.vnode.rows import TABLE_NAME_RE

CRC_CHUNK_BYTES = 16 * 1024 * 1024


def read_manifest(data: str) -> Manifest:
    path = os.path.join(data, MANIFEST_NAME)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise StateError(
            f"{data}: no {MANIFEST_NAME}: not a vnode data directory (give the"
            " directory that holds data/ and wal/, e.g. <data_dir>/vg1)"
        ) from None
    except OSError as exc:
        raise StateError(f"{path}: {exc.strerror}") from None
    try:
        return Manifest.from_bytes(raw, path)
    except ArchiveError as exc:
        raise StateError(str(exc)) from None


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
