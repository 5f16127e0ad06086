"""What the restore flow asks of a vnode: getFileInfo and getWalInfo (seed 数据恢复流程
rules 4 and 5; the mixin VnodeRestoreInfo of Vnode, vrepl/vnode/vnode.py; docs/vnode.md §7).

Owns: the answers' types (FileInfo, WalInfo), the archived files as a restore lists them
(data files, the transactions' labels file when it names a transaction, then the manifest),
a named file's size and magic as computed from its bytes, and the WAL files of
`<data path>/wal` as getWalInfo lists them.
Must not: change any file or state (the restore flow replaces files; Vnode.notify_file_synced
reloads them), or write the WAL.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from vrepl.manifest import MANIFEST_NAME, name_invalid
from vrepl.vnode.errors import ArchiveError
from vrepl.vnode.files import LABELS_FILE_NAME, file_magic
from vrepl.wal import list_wal_files  # read only: the WAL is the sync's

WAL_DIR = "wal"


@dataclass(frozen=True)
class FileInfo:
    """getFileInfo's answer (seed 数据恢复流程 rule 4); magic 0 = no such file / no more files."""

    index: int
    name: str       # relative to the data path; "" when there is no file
    size: int
    magic: int


@dataclass(frozen=True)
class WalInfo:
    """getWalInfo's answer (seed rule 5): more 0 = the last WAL file, 1 = newer ones follow;
    name "" = no WAL file."""

    more: int
    index: int
    name: str       # relative to the data path ("wal/000000000003.wal")


class VnodeRestoreInfo:
    def get_file_info(self, index: int, name: str | None = None) -> FileInfo:
        """getFileInfo (seed 数据恢复流程 rule 4).

        Without a name (the master's call): the file at `index` (0 = oldest); after the n
        data files, index n is the transactions' labels file when it names one (written
        under the lock together with the manifest, so the two always describe the same cut:
        docs/transactions.md §4), then the manifest (index n, or n + 1 after the labels
        file), so the manifest is still swapped in last; beyond it magic 0 (no more files).
        With a name (the slave's call): this node's file of that name, size and magic
        computed from its bytes, magic 0 if it has none. An unusable name or an I/O error
        raises ArchiveError (the sync layer answers -1 and stops the restore, rule 6).
        """
        with self._lock:
            files = self._store.manifest.files
            n = len(files)
            if not name:
                if 0 <= index < n:
                    f = files[index]
                    return FileInfo(index, f.name, f.size, f.magic)
                mb = self._store.manifest_bytes
                lb = self.txns.file_bytes if mb else None
                if index == n and lb is not None:
                    return FileInfo(n, LABELS_FILE_NAME, len(lb), file_magic(lb))
                if index == n + (lb is not None) and mb:
                    return FileInfo(index, MANIFEST_NAME, len(mb), file_magic(mb))
                return FileInfo(index, "", 0, 0)
            reason = None if name == LABELS_FILE_NAME else name_invalid(name)
            if reason is not None:
                raise ArchiveError(name, reason)
            if name == LABELS_FILE_NAME:
                index = n
            elif name == MANIFEST_NAME:
                index = n + (self.txns.file_bytes is not None)
            else:
                index = next((i for i, f in enumerate(files) if f.name == name), index)
        try:
            with open(self._store.abspath(name), "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return FileInfo(index, name, 0, 0)
        except OSError as exc:
            raise ArchiveError(name, f"cannot read: {exc.strerror}") from exc
        return FileInfo(index, name, len(data), file_magic(data))

    def get_wal_info(self, index: int = 0) -> WalInfo:
        """getWalInfo (seed rule 5) over `<data path>/wal`: index 0 = the oldest file."""
        if not os.path.isdir(self.wal_dir):
            return WalInfo(0, index, "")
        files = list_wal_files(self.wal_dir)
        if not files:
            return WalInfo(0, index, "")
        wf = files[0] if index == 0 else next((f for f in files if f.index == index), None)
        if wf is None:
            return WalInfo(0, index, "")
        more = 0 if wf is files[-1] else 1
        return WalInfo(more, wf.index, f"{WAL_DIR}/{os.path.basename(wf.path)}")
