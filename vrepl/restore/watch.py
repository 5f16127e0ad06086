"""Watching files during a restore: inotify (inotify_simple), polling where it is missing.

Owns: `Watcher`, which answers two questions of the sender (seed 数据恢复流程: "从同步文件启动起,
sync模块会通过inotify监控所有处理过的file以及wal"):
* `changed()`: did any file registered with `add_file()` change since it was registered
  (modified, rewritten, renamed over, deleted)? A flush or an import on the source rewrote
  it, so what was sent is stale: the session restarts.
* `wait(timeout_s)`: block until something happens in a directory registered with
  `add_dir()` (the WAL directory: the last WAL grew, was closed, a new WAL file appeared)
  or the timeout passes. The last-WAL tailer sleeps here instead of spinning.
Polling fallback (no inotify, or `poll=True`): files are compared by (inode, size, mtime)
every `poll_interval_s`; `wait()` sleeps at most `poll_interval_s`.
Must not: read file contents or decide what a change means.
"""
from __future__ import annotations

import logging
import os
import time

from vrepl.errors import InvariantViolation

log = logging.getLogger("vrepl.restore")

try:  # Linux only; absent elsewhere
    import inotify_simple as _ino
except ImportError:  # pragma: no cover - exercised with poll=True instead
    _ino = None

DEFAULT_POLL_INTERVAL_S = 0.05


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class Watcher:
    """inotify watches on processed files and on the WAL directory (see the module doc)."""

    def __init__(self, *, poll: bool = False, poll_interval_s: float = DEFAULT_POLL_INTERVAL_S) -> None:
        self.poll_interval_s = poll_interval_s
        self._ino = None
        if not poll and _ino is not None:
            try:
                self._ino = _ino.INotify()
            except OSError as exc:  # e.g. fs.inotify.max_user_instances reached
                log.warning("inotify unavailable (%s): polling every %g s", exc, poll_interval_s)
        self.polling = self._ino is None
        self._files: dict[int, str] = {}  # wd -> path (inotify)
        self._stamps: dict[str, tuple[int, int, int] | None] = {}  # path -> stamp (polling)
        self._dirs: dict[int, str] = {}
        self._change: str | None = None
        self._dir_event = False
        self._last_poll = 0.0

    # -- registering ------------------------------------------------------------------------

    def add_file(self, path: str) -> None:
        """Watch a file already processed; any later change makes changed() say so."""
        if self._ino is not None:
            f = _ino.flags
            try:
                wd = self._ino.add_watch(path, f.MODIFY | f.ATTRIB | f.CLOSE_WRITE | f.DELETE_SELF | f.MOVE_SELF)
            except OSError as exc:
                self._change = self._change or f"{path} cannot be watched ({exc.strerror or exc}): it changed"
                return
            self._files[wd] = path
        else:
            self._stamps[path] = _stamp(path)

    def forget_files(self) -> None:
        """Stop watching the processed files (the receiver committed them)."""
        if self._ino is not None:
            for wd in list(self._files):
                try:
                    self._ino.rm_watch(wd)
                except OSError:
                    pass
        self._files.clear()
        self._stamps.clear()
        self._change = None

    def add_dir(self, path: str) -> None:
        """Watch a directory for files growing, closing, appearing, going."""
        if self._ino is not None:
            f = _ino.flags
            wd = self._ino.add_watch(path, f.MODIFY | f.CLOSE_WRITE | f.CREATE | f.MOVED_TO | f.DELETE)
            self._dirs[wd] = path

    # -- asking -----------------------------------------------------------------------------

    def _drain(self, timeout_ms: int) -> None:
        if self._ino is None:
            raise InvariantViolation("inotify is read before it is set up")
        for ev in self._ino.read(timeout=timeout_ms):
            if ev.wd in self._dirs:
                self._dir_event = True
                continue
            path = self._files.get(ev.wd)
            if path is None or self._change is not None:
                continue
            if ev.mask & _ino.flags.IGNORED:
                continue
            names = ", ".join(str(fl.name).lower() for fl in _ino.flags.from_mask(ev.mask))
            self._change = f"{path} changed on the source during the restore ({names})"

    def changed(self) -> str | None:
        """Why a watched file is stale, or None."""
        if self._ino is not None:
            self._drain(0)
            return self._change
        now = time.monotonic()
        if self._change is None and now - self._last_poll >= self.poll_interval_s:
            self._last_poll = now
            for path, stamp in self._stamps.items():
                if _stamp(path) != stamp:
                    self._change = f"{path} changed on the source during the restore (polled)"
                    break
        return self._change

    def wait(self, timeout_s: float) -> bool:
        """Block until a watched directory saw an event (True) or the timeout passed."""
        if self._ino is None:
            time.sleep(min(timeout_s, self.poll_interval_s))
            return False
        if not self._dir_event:
            self._drain(max(int(timeout_s * 1000), 0))
        seen, self._dir_event = self._dir_event, False
        return seen

    def close(self) -> None:
        if self._ino is not None:
            try:
                self._ino.close()
            except OSError:
                pass
            self._ino = None
