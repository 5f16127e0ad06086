"""The reference vnode: the storage half of a time-series vnode that embeds vrepl.

Owns: rows and their validation (rows.py), the memtable (memtable.py), archived Parquet
files and the manifest (files.py), and the callback API a sync instance calls (vnode.py,
with its flush in flush.py, its queries in query.py, the restore flow's questions in
restoreinfo.py).
Must not: open sockets or write the WAL (the sync instance owns it). docs/vnode.md.
"""
from vrepl.vnode.config import VnodeConfig, config_invalid
from vrepl.vnode.errors import (ApplyError, ArchiveError, PayloadError, VnodeClosedError,
                                VnodeError)
from vrepl.vnode.files import ArchivedFile, file_magic
from vrepl.vnode.ingest import decode_rows
from vrepl.vnode.rows import check_rows, encode_rows, rows_invalid
from vrepl.vnode.vnode import FileInfo, Vnode, WalInfo

__all__ = ["ApplyError", "ArchiveError", "ArchivedFile", "FileInfo", "PayloadError", "Vnode",
           "VnodeClosedError", "VnodeConfig", "VnodeError", "WalInfo", "check_rows",
           "config_invalid", "decode_rows", "encode_rows", "file_magic", "rows_invalid"]
