"""A fault-injection hook of the staging area, for tests (docs/vnode.md §9.5).

Owns: `VREPL_FAULT_STAGE_FSYNC=ERRNO[@N]` (read once, at the first staging of the process)
and `fsync_staged()`, the fsync of a batch of staged files that vrepl/vnode/staging.py's
`stage_files` calls: the N-th call in the process fails with that errno, once, as a file
system that runs out of space or fails at fsync would; every other call is `fsync_all`.
Must not: do anything observable while the variable is unset (a flag test), or be armed by
anything but the environment of the process.
"""
from __future__ import annotations

import errno
import os
import threading

from vrepl.killpoints import split_hit
from vrepl.vnode.files import fsync_all

# ERRNO is a name (ENOSPC, EDQUOT, EIO). No file system available to the tests fails fsync
# by itself (a full tmpfs fails the write before it), hence the hook.
FAULT_ENV = "VREPL_FAULT_STAGE_FSYNC"
_fault: list[int] = []          # [errno, hit number, hits so far] once read and armed
_fault_read = False
_fault_lock = threading.Lock()


def parse_fault(text: str) -> tuple[int, int] | None:
    """`ERRNO[@N]` (FAULT_ENV) -> (errno number, N), None for an empty text; ValueError
    naming what is wrong."""
    text = text.strip()
    if not text:
        return None
    name, n = split_hit(text, f"{FAULT_ENV}={text!r}")
    num = getattr(errno, name, None)
    if not name.startswith("E") or type(num) is not int:
        raise ValueError(f"{FAULT_ENV}={text!r}: {name!r} is not an errno name (ENOSPC, EIO, ...)")
    return num, n


def fsync_staged(paths: list[str]) -> None:
    """fsync the files of a staging batch together (fsync_all), or fail as FAULT_ENV says."""
    global _fault_read
    fail = 0
    with _fault_lock:
        if not _fault_read:
            _fault_read = True
            spec = parse_fault(os.environ.get(FAULT_ENV, ""))
            if spec is not None:
                _fault[:] = [spec[0], spec[1], 0]
        if _fault:
            _fault[2] += 1
            if _fault[2] == _fault[1]:
                fail = _fault[0]
    if fail:
        raise OSError(fail, os.strerror(fail), paths[0])
    fsync_all(paths)
