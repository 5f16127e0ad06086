"""A restore into a directory, without a running replica (`vrepl restore`).

Owns: `DirSink`, the receiver's sink for a copy of a replica's data path: the own files are
the ones the local manifest names (the reference vnode's layout, `data/manifest.json`);
the WAL phase writes a new WAL in `<dir>/.vrepl-restore/wal.new` starting after the
restored archived version, swapped in for `<dir>/wal` at the end (stage, then swap).
Must not: touch anything the local manifest or the sender did not name.
"""
from __future__ import annotations

import errno
import json
import os
import shutil

from vrepl import wal as _wal
from vrepl.errors import InvariantViolation, VersionError
from vrepl.restore import protocol as P
from vrepl.restore.errors import BadData, DiskFull, RestoreError
from vrepl.restore.paths import STAGING_DIR, confined
from vrepl.restore.receiver import file_crc_magic

MANIFEST_NAME = "data/manifest.json"  # the reference vnode's (vrepl/vnode/files.py)
LABELS_FILE_NAME = "data/txn_labels.json"  # its transactions' labels file (same module)


def read_manifest(data_path: str) -> dict | None:
    try:
        with open(os.path.join(data_path, MANIFEST_NAME), "rb") as fh:
            doc = json.loads(fh.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RestoreError(f"{data_path}/{MANIFEST_NAME} is unreadable: {exc}", restart=False) from None
    if not isinstance(doc, dict):
        raise RestoreError(f"{data_path}/{MANIFEST_NAME} is not a manifest", restart=False)
    return doc


class DirSink:
    def __init__(self, data_path: str, *, max_record_bytes: int = _wal.DEFAULT_MAX_RECORD_BYTES,
                 max_wal_file_bytes: int = _wal.DEFAULT_MAX_FILE_BYTES) -> None:
        self.data_path = os.path.abspath(data_path)
        self.max_record_bytes = max_record_bytes
        self.max_wal_file_bytes = max_wal_file_bytes
        self.writer: _wal.WalWriter | None = None
        self.new_wal = os.path.join(self.data_path, STAGING_DIR, "wal.new")
        self.begin: P.SyncBegin | None = None

    def on_begin(self, begin: P.SyncBegin) -> None:
        self.begin = begin

    def own_file(self, index: int, name: str) -> tuple[int, int] | None:
        path = confined(self.data_path, name)
        try:
            size = os.lstat(path).st_size
        except FileNotFoundError:
            return None
        return size, file_crc_magic(path)

    def own_files(self) -> list[str]:
        doc = read_manifest(self.data_path)
        if doc is None:
            return []
        names = [str(f["name"]) for f in doc.get("files", []) if isinstance(f, dict) and "name" in f]
        if os.path.lexists(os.path.join(self.data_path, *LABELS_FILE_NAME.split("/"))):
            names.append(LABELS_FILE_NAME)
        return names + [MANIFEST_NAME]

    def files_synced(self) -> None:
        pass

    def wal_from_version(self) -> int:
        doc = read_manifest(self.data_path)
        return int(doc.get("archived_version", 0)) + 1 if doc else 1

    def on_wal_begin(self, msg: P.WalBegin) -> None:
        shutil.rmtree(self.new_wal, ignore_errors=True)
        os.makedirs(self.new_wal)
        w = _wal.WalWriter(self.new_wal, _wal.WalOptions(max_file_bytes=self.max_wal_file_bytes,
                                                          max_record_bytes=self.max_record_bytes,
                                                          durability=_wal.Durability.NONE))
        w.last_version = msg.first_version - 1  # the restored files hold everything before it
        w.last_epoch = msg.prev_epoch
        w.durable_version = w.last_version
        self.writer = w

    def feed(self, block: bytes, scan) -> None:
        w = self.writer
        if w is None:
            raise InvariantViolation("WAL data is fed before on_wal_begin()")
        first, last = int(scan.versions[0]), int(scan.versions[-1])
        if last <= w.last_version:
            return
        if first > w.last_version + 1:
            raise BadData(f"gap: WAL records start at v{first}, the copy ends at v{w.last_version}")
        k = w.last_version + 1 - first
        if k:
            block = block[int(scan.offsets[k]):]
            scan = None
        try:
            w.append_encoded(block, scan)
        except VersionError as exc:  # epochs going backwards, versions out of order: the sender's data
            raise BadData(f"bad WAL data from the sender: {exc}") from None
        except OSError as exc:
            if getattr(exc.__cause__, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"no space left on device writing the WAL under {self.data_path}: the previous"
                               " data is intact") from None
            raise

    def on_wal_end(self, last_version: int) -> int:
        w = self.writer
        if w is None:
            raise InvariantViolation("the WAL ends before on_wal_begin()")
        if w.last_version < last_version:
            raise BadData(f"the WAL stream ended at v{last_version} but the copy is at v{w.last_version}")
        w.close()  # fsyncs
        self.writer = None
        wal_dir = os.path.join(self.data_path, "wal")
        old = os.path.join(self.data_path, STAGING_DIR, "wal.old")
        shutil.rmtree(old, ignore_errors=True)
        if os.path.lexists(wal_dir):
            os.replace(wal_dir, old)
        os.replace(self.new_wal, wal_dir)
        fd = os.open(self.data_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        shutil.rmtree(os.path.join(self.data_path, STAGING_DIR), ignore_errors=True)
        return w.last_version
