"""Durable file writes: the bytes are on disk, and so is the name that points at them.

Owns: `write_atomic()` (temp file, fsync, rename over the name, fsync of the directory),
`fsync_dir()` and `fsync_all()` (many fsyncs issued together). The vnode's archive and
manifest, the transactions' labels and the ship sender's and receiver's state files all
write through these. Must not: know any file format, or import anything of vrepl (a leaf:
`vrepl ship` uses it without loading the vnode).
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Sequence

FSYNC_THREADS = 8  # fsyncs issued at once (fsync_all)


def fsync_dir(path: str) -> None:
    """fsync a directory (or a file: opened read-only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_all(paths: Sequence[str]) -> None:
    """fsync every file or directory of `paths`, FSYNC_THREADS at a time: fsyncs issued
    together share the file system's journal commits, where one after the other each waits
    for its own (200 files of 1 MiB on this project's test VM, ext4: 0.13 s against
    0.7-1.0 s in a row)."""
    if len(paths) <= 1:
        for p in paths:
            fsync_dir(p)
        return
    with concurrent.futures.ThreadPoolExecutor(
        min(FSYNC_THREADS, len(paths)), thread_name_prefix="vrepl-fsync"
    ) as pool:
        for _ in pool.map(fsync_dir, paths):
            pass


def write_atomic(path: str, data: bytes | bytearray | memoryview, fsync: bool = True) -> None:
    """Write to path.tmp, fsync, rename over path, fsync the directory. `data` may be any
    object with the buffer protocol (the vnode writes a pyarrow Buffer as it is)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(os.path.dirname(path) or ".")
