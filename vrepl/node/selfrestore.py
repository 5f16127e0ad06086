"""A vgroup that needs a restore pulls a complete copy of itself from its master
(docs/operations.md §A vgroup that needs a restore; issue 13 Deliver 2).

Owns: the staging directory `<vgroup path>/.vrepl-self-restore/` (`copy/`: the pulled copy,
`old/`: what it replaced, `READY`: the copy is complete and accepted), the check that finds
a vgroup directory whose WAL ends below its archived version, finding the source (the last
master known, else the master the peers' `/v1/status` name), the pull itself (the BACKUP
path of `vrepl restore`: `vrepl.restore.cli.restore_once`), the acceptance check (the copy's
log end is at least this node's own), and the swap of `data/` and `wal/` into place. The
`promise` file (durable election state) is never touched. The swap is crash-safe: the
READY marker is written (fsynced) before the first rename, and `roll_forward()`, run before
the vnode opens, finishes an interrupted swap.
Must not: open the vnode or the sync instance (the VgroupHost stops and reopens them), or
decide when to retry (the VgroupHost does, with backoff).
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from typing import Callable

from vrepl import wal as _wal
from vrepl.client import Client, ClientError
from vrepl.endpoint import parse_endpoint
from vrepl.errors import SelfRestoreError
from vrepl.restore.cli import restore_once
from vrepl.restore.dirsink import DirSink, read_manifest
from vrepl.restore.paths import STAGING_DIR as LIVE_RESTORE_DIR

STAGING = ".vrepl-self-restore"
READY = "READY"
SWAPPED = ("data", "wal")       # what a copy replaces; "promise" stays


def staging_path(path: str) -> str:
    return os.path.join(path, STAGING)


def copy_path(path: str) -> str:
    return os.path.join(path, STAGING, "copy")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def wal_end(path: str, max_record_bytes: int = _wal.DEFAULT_MAX_RECORD_BYTES
            ) -> tuple[int, int]:
    """(last epoch, last version) of the WAL in a vgroup directory; (0, 0) if it has none."""
    wal_dir = os.path.join(path, "wal")
    if not os.path.isdir(wal_dir):
        return 0, 0
    st = _wal.inspect(wal_dir, max_record_bytes)
    return st.last_epoch, st.last_version


def archived_version(path: str) -> int:
    doc = read_manifest(path)
    return int(doc.get("archived_version", 0)) if doc else 0


def wal_below_archive(path: str, max_record_bytes: int = _wal.DEFAULT_MAX_RECORD_BYTES
                      ) -> str | None:
    """Why a vgroup directory cannot be used as it is (its WAL holds records but ends below
    the archived version: archived files hold versions the log no longer has), or None.
    An empty WAL (all recycled, or a fresh restore) says nothing."""
    _, last = wal_end(path, max_record_bytes)
    archived = archived_version(path)
    if 0 < last < archived:
        return (f"the WAL ends at v{last}, below the archived version v{archived}: archived"
                f" files hold versions the log no longer has")
    return None


def find_master(client_nodes: list[str], vgroup: int, timeout_s: float = 2.0, *,
                token: str | None = None, tls: bool = False) -> int | None:
    """The node id that the peers (their HTTP /v1/status) say is the vgroup's master, or None
    when none answers or names one (`token`, `tls`: as this node's own API: the cluster's)."""
    hint = None
    for ep in client_nodes:
        c = Client([ep], request_timeout_s=timeout_s, token=token, tls=tls)
        try:
            doc = c.status(ep)
        except (ClientError, OSError):
            continue
        finally:
            c.close()
        for vg in doc.get("vgroups", []):
            if vg.get("vgroup") != vgroup or vg.get("state", "serving") != "serving":
                continue
            if vg.get("role") == "master":
                return int(doc["node"])
            if hint is None and vg.get("master") is not None:
                hint = int(vg["master"])
    return hint


class _CopySink(DirSink):
    """DirSink that also keeps the epoch of the record just below the WAL it receives (the
    copy's log end when that WAL turns out empty: everything was archived)."""

    prev_epoch = 0

    def on_wal_begin(self, msg) -> None:
        self.prev_epoch = msg.prev_epoch
        super().on_wal_begin(msg)


@dataclass
class Copy:
    epoch: int                  # the copy's log end
    version: int
    files: int
    file_bytes: int
    wal_records: int


def pull(path: str, replication: str, *, vgroup: int, secret: bytes, timeout_s: float,
         max_record_bytes: int = _wal.DEFAULT_MAX_RECORD_BYTES) -> Copy:
    """Pull a complete copy of the vgroup (archived files, then the WAL after the archived
    version) from the replica at `replication` (host:port) into the staging directory.
    A copy left by an interrupted pull is resumed (identical files are not sent again).
    Raises the restore's errors (RestoreError and its kinds, OSError)."""
    dest = copy_path(path)
    os.makedirs(dest, exist_ok=True)
    host, port = parse_endpoint(replication)
    sink = _CopySink(dest, max_record_bytes=max_record_bytes)
    receiver = restore_once(host, port, vgroup=vgroup, data=dest, secret=secret,
                            timeout_s=timeout_s, sink=sink)
    epoch, version = wal_end(dest, max_record_bytes)
    if version == 0:
        epoch, version = sink.prev_epoch, archived_version(dest)
    st = receiver.stats
    return Copy(epoch, version, st.files_checked, st.file_bytes_received,
                st.wal_records_received)


def swap(path: str) -> str:
    """Put the accepted copy in place of `data/` and `wal/` (crash-safe: READY first)."""
    dest = copy_path(path)
    for name in SWAPPED:        # a copy without archived files still replaces them
        os.makedirs(os.path.join(dest, name), exist_ok=True)
    marker = os.path.join(staging_path(path), READY)
    with open(marker, "w") as fh:
        fh.write("the copy in copy/ is complete and accepted: roll it forward\n")
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(staging_path(path))
    return roll_forward(path) or "nothing to swap"


def roll_forward(path: str, fsync: bool = True) -> str | None:
    """Finish a swap (READY present): move each of data/, wal/ still in copy/ into place (the
    current one to old/ first), drop the live restore's staging (it belongs to the replaced
    data), then the whole staging directory. Without READY an incomplete copy is left for
    the next pull to resume. Returns what was done, or None."""
    stage = staging_path(path)
    if not os.path.exists(os.path.join(stage, READY)):
        return None
    old = os.path.join(stage, "old")
    moved = []
    for name in SWAPPED:
        src = os.path.join(stage, "copy", name)
        if not os.path.lexists(src):
            continue                # moved before a crash
        dst = os.path.join(path, name)
        if os.path.lexists(dst):
            os.makedirs(old, exist_ok=True)
            shutil.rmtree(os.path.join(old, name), ignore_errors=True)
            os.replace(dst, os.path.join(old, name))
        os.replace(src, dst)
        moved.append(name)
        if fsync:
            _fsync_dir(path)
    shutil.rmtree(os.path.join(path, LIVE_RESTORE_DIR), ignore_errors=True)
    shutil.rmtree(stage, ignore_errors=True)
    if fsync:
        _fsync_dir(path)
    return f"swapped in the restored copy ({', '.join(moved) or 'already in place'})"


def ms_since(t0: float, clock: Callable[[], float] = time.monotonic) -> int:
    return int((clock() - t0) * 1000)
