"""vrepl.restore: bringing a replica that is behind up to date (seed 数据恢复流程, docs/restore.md).

Owns: the sync connection's protocol (protocol.py) and blocking stream (stream.py), the side
that has the data (sender.py: archived files with os.sendfile, sealed WAL files, the last
WAL tailed with inotify), the side that is behind (receiver.py: compare, stage, verify,
swap; records handed to a sink), file name confinement (paths.py), watching (watch.py), the
per-node concurrency limit (limiter.py), sessions inside a sync instance (live.py), the
`vrepl restore` / `vrepl replay` commands (cli.py), and the restore settings (config.py).
Must not: be imported by vrepl.replica (the core stays free of I/O); every decision that
changes the replica is an event stepped on the I/O thread. Must not import the receiver,
the sender or the command here: every module of the package runs this file first, and a
sync client (`vrepl ship` frames with protocol.py over stream.py) would load the vnode and
the WAL with them (issue 16).
"""
from vrepl.restore.config import RestoreConfig, restore_config_invalid
from vrepl.restore.errors import BadData, DiskFull, FilesChanged, PeerError, RestoreError, UnsafeName
from vrepl.restore.paths import confined, name_refusal

__all__ = ["RestoreConfig", "restore_config_invalid", "RestoreError", "FilesChanged", "UnsafeName", "DiskFull",
           "BadData", "PeerError", "confined", "name_refusal"]
