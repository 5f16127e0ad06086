"""One process per data directory: an advisory lock held for the process's life.

Owns: `lock_dir(path, holder)`, which takes an exclusive `fcntl.flock` on `<path>/vrepl.lock`
without waiting and writes "<pid> <holder>" into it, and `DirInUseError`, the one-line
refusal naming the pid that holds the directory. The lock lasts until `DirLock.release()`
or the process ends (the kernel drops a dead process's flock, so a SIGKILLed node leaves no
stale lock; the file itself stays, harmlessly, and is reused).

Who locks (docs/operations.md §One process per data directory): the entry points, before
they read anything: `vrepl node` its data root and every vgroup directory it opens,
`vrepl restore` and `vrepl replay` their `--data` directory. Never the code below them
(restore receiver, vnode, WAL): a flock belongs to the open file, so a second lock of the
same directory in the same process is refused like another process's, and a node's own
in-process restore of one of its vgroups must run under the lock the node already holds.
Must not: wait for a lock, or delete the lock file (a file deleted and created again would
let two processes each hold "the" lock).
"""
from __future__ import annotations

import fcntl
import os
import time

from vrepl.errors import DirInUseError

LOCK_NAME = "vrepl.lock"
# The holder writes its pid right after taking the lock; a refusal that reads the file in
# between sees it empty and looks again for this long before saying "pid unknown".
_PID_WAIT_S = 0.2


class DirLock:
    """A held lock; `release()` (or the end of the process) gives it up."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)      # closing the file drops the flock
            self._fd = None

    def __enter__(self) -> "DirLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    deadline = time.monotonic() + _PID_WAIT_S
    while True:
        text = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
        if text or time.monotonic() >= deadline:
            return text.splitlines()[0] if text else ""
        time.sleep(0.01)


def lock_dir(path: str, holder: str) -> DirLock:
    """Lock directory `path` (created if missing) for this process; `holder` says who
    ("vrepl node 1"). Raises DirInUseError when another process holds it, OSError when
    the lock file cannot be created."""
    path = os.path.abspath(path)
    os.makedirs(path, exist_ok=True)
    lock_path = os.path.join(path, LOCK_NAME)
    # No O_TRUNC: the file is emptied only once the lock is ours (the holder's pid stays
    # readable for the refusal).
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = _read_holder(fd)
        os.close(fd)
        raise DirInUseError(path, text) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {holder}\n".encode(), 0)
    return DirLock(path, fd)
