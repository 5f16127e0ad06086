"""Writing a received file around the page cache: `SequentialWriter`.

Owns: `SequentialWriter`, which writes a file front to back from a position, in pieces of any
size, through `O_DIRECT` when the file system takes it (ext4, xfs) and through ordinary
writes when not (tmpfs on older kernels, a descriptor that refuses the flag),
`DIRECT_BLOCK_BYTES`, the alignment it keeps, and `drop_cached()`, which lets the kernel
drop a durable file's pages from the page cache.

Why (docs/vnode.md §9.3 step 3, docs/restore.md §9): a replica that receives a file it will
not read soon (a slave fetching a round's files, a restoring replica) paid most of its
system CPU to put every byte into new page-cache pages (`copy_folio_from_iter`: on this
project's VMs 0.7-2.7 CPU s per GiB, against 0.06-0.3 for the same GiB written direct), and
fsync then wrote the same pages out anyway. The writer copies each piece into one of two
page-aligned buffers (reused between files, so the copy is cheap), writes each full one at
an aligned offset on a pool thread while the other fills, and `finish()` writes the last
partial block padded with zeros and truncates the file back to its true length. A ship's
receiving master does not use it: it serves the files to the slaves at once, and writing
direct there measured slower (docs/benchmarks.md §Shipping, fifth session).

A crash between that padded write and the truncation leaves up to 4,095 zero bytes at the
end: every caller checks a received file's size and CRC-32C before it keeps it, so such a
file is refused and received again, never kept.
Must not: fsync (the caller decides when a file becomes durable), checksum, name or rename
files, or read anything but the partial block a resumed file starts in.
"""

from __future__ import annotations

import concurrent.futures
import errno
import fcntl
import logging
import mmap
import os
import threading

DIRECT_BLOCK_BYTES = 4096  # the alignment O_DIRECT needs on 512- and 4096-byte devices
BUFFER_BYTES = 4 << 20  # one aligned buffer; a direct write per this many bytes

_O_DIRECT = getattr(os, "O_DIRECT", 0)

log = logging.getLogger("vrepl.directio")
_fallback_logged = False  # the first fallback of the process is a warning, later ones debug


def _log_fallback(fd: int, why: str) -> None:
    """Say once why received files go through the page cache here (the operator's disk or
    file system), without a line per file."""
    global _fallback_logged
    try:
        where = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        where = f"descriptor {fd}"
    level = logging.DEBUG if _fallback_logged else logging.WARNING
    _fallback_logged = True
    log.log(
        level,
        "%s: %s; received files are written through the page cache (slower, same durability)",
        where,
        why,
        extra={"event": "direct_io_fallback", "path": where},
    )


# Aligned buffers kept between files (a writer takes two, `finish()` gives them back): a new
# mapping per file paid a page fault per 4 KiB of it, which cost more than the page cache it
# replaces. As many as writers ran at once are kept.
_free: list[memoryview] = []
_free_lock = threading.Lock()
# Runs each writer's full-buffer writes, one at a time per writer (it waits for its last
# before it hands over the next), so a writer's bytes land in order.
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="vrepl-directio")


def _take_buffer(size: int) -> memoryview:
    with _free_lock:
        for i, view in enumerate(_free):
            if len(view) == size:
                return _free.pop(i)
    # Private and anonymous: not shared memory (a shmem fault and a tmpfs page per 4 KiB).
    return memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))


def _give_back(view: memoryview) -> None:
    with _free_lock:
        _free.append(view)


class SequentialWriter:
    """Writes `fd` front to back from `offset` (the file must end there: the caller
    truncated it). `write(piece)` any number of times, then `finish()` (also after an error:
    it writes what the buffer holds, so a cut transfer keeps every byte it received).
    `direct` says whether O_DIRECT is in use; OSError of a write (ENOSPC) is the caller's,
    raised by the `write` or `finish` after it (a full buffer is written on a pool thread
    while the next one fills: a direct write waits for the disk). `finish()` must run before
    `fd` is closed: a write may still be in flight until then."""

    def __init__(self, fd: int, offset: int = 0, *, direct: bool = True, buffer_bytes: int = BUFFER_BYTES) -> None:
        self.fd = fd
        self.end = offset  # the file's true length so far
        self.direct = bool(direct and _O_DIRECT) and _set_direct(fd, True)
        if direct and _O_DIRECT and not self.direct:
            _log_fallback(fd, "the file system refuses O_DIRECT")
        self._pending: concurrent.futures.Future | None = None
        self._failed = False
        self._pending_pos = 0  # where the write in flight starts
        if not self.direct:
            return
        size = max(DIRECT_BLOCK_BYTES, buffer_bytes - buffer_bytes % DIRECT_BLOCK_BYTES)
        self._buf = _take_buffer(size)
        self._spare = _take_buffer(size)
        head = offset % DIRECT_BLOCK_BYTES
        self._pos = offset - head  # the file offset of the buffer's first byte (aligned)
        self._fill = 0
        if head:
            # A resumed file ends inside a block: that block's bytes start the buffer and
            # are written again, whole, with the bytes that follow them.
            got = self._read_block(self._pos)
            if got != head:
                self._fallback()
                return
            self._fill = head

    def write(self, piece: bytes | bytearray | memoryview) -> None:
        view = memoryview(piece).cast("B")
        i, n = 0, len(view)
        while i < n:
            if not self.direct:
                _write_all(self.fd, view[i:])
                self.end += n - i
                return
            cap = len(self._buf)
            take = min(n - i, cap - self._fill)
            self._buf[self._fill : self._fill + take] = view[i : i + take]
            self._fill += take
            i += take
            self.end += take
            if self._fill == cap:
                self._flush(cap, wait=False)

    def finish(self) -> None:
        """Write what the buffer holds and leave the file exactly `end` bytes long. When a
        write fails (ENOSPC, raised), the file is cut back to the bytes known written."""
        if not self.direct:
            return
        ok = False
        try:
            if self._failed:  # raised already, by the write that failed
                return
            fill = self._fill
            padded = -(-fill // DIRECT_BLOCK_BYTES) * DIRECT_BLOCK_BYTES
            self._buf[fill:padded] = bytes(padded - fill)
            self._flush(padded, wait=True)
            if padded != fill:
                os.ftruncate(self.fd, self.end)
            ok = True
        finally:
            if not ok:
                self._abandon()
                try:
                    os.ftruncate(self.fd, self._pos)
                except OSError:
                    pass
                self.end = self._pos
            if self.direct:
                self._release()
        os.lseek(self.fd, self.end, os.SEEK_SET)

    # -- inside ------------------------------------------------------------------------------------
    def _flush(self, length: int, wait: bool) -> None:
        """Write the buffer's first `length` bytes (a multiple of the block) at `_pos`: on
        the pool once the write before it is done, or here when `wait`."""
        real = min(length, self._fill)
        if self._wait():  # the write before fell back to ordinary writes
            _write_at(self.fd, self._buf[:real], self._pos)
            self._pos += real
            self._fill = 0
            self._fallback()
            return
        if length:
            if wait:
                if self._write_job(self._buf, length, real, self._pos):
                    self._fallback()
            else:
                self._pending_pos = self._pos
                self._pending = _pool.submit(self._write_job, self._buf, length, real, self._pos)
                self._buf, self._spare = self._spare, self._buf
        self._pos += real
        self._fill = 0

    def _write_job(self, buf: memoryview, length: int, real: int, pos: int) -> bool:
        """Write buf[:length] at `pos`; True when it fell back to an ordinary write."""
        try:
            done = os.pwritev(self.fd, [buf[:length]], pos)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            done = 0
        if done >= length:
            return False
        # Refused (EINVAL: the file system needs an alignment beyond ours) or short (a full
        # disk): the rest of this buffer, and every later byte, through ordinary writes,
        # which say why they stop.
        _set_direct(self.fd, False)
        _log_fallback(self.fd, "an O_DIRECT write was refused" if done == 0 else "an O_DIRECT write was short")
        if done < real:
            _write_at(self.fd, buf[done:real], pos + done)
        return True

    def _wait(self) -> bool:
        """The write in flight is done (True if it fell back to ordinary writes); its error
        is raised here, and finish() then cuts the file back to where that write started."""
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        try:
            return bool(pending.result())
        except BaseException:
            self._pos, self._fill = self._pending_pos, 0
            self._failed = True
            raise

    def _abandon(self) -> None:
        """After an error: let a write still in flight end before the file is cut back."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except BaseException:
                self._pos = min(self._pos, self._pending_pos)

    def _read_block(self, pos: int) -> int:
        try:
            return os.preadv(self.fd, [self._buf[:DIRECT_BLOCK_BYTES]], pos)
        except OSError:
            return -1

    def _fallback(self) -> None:
        """Ordinary writes from here on (the buffers are empty or already written)."""
        self._release()
        os.lseek(self.fd, self.end, os.SEEK_SET)

    def _release(self) -> None:
        _set_direct(self.fd, False)  # the caller's later I/O on `fd` needs no alignment
        for view in (self._buf, self._spare):
            if len(view):
                _give_back(view)
        self._buf = self._spare = memoryview(b"")
        self.direct = False


def drop_cached(path: str) -> None:
    """Let the kernel drop the page-cache pages of the file at `path` (POSIX_FADV_DONTNEED;
    only clean pages go, so the caller fsynced it first). Advice only: a file that is gone
    or a file system without it is left as it is.

    Why (docs/vnode.md §9.3 step 5): an ingested file's master wrote every byte through the
    page cache (it serves them to the slaves) and reads it again only for queries. Kept, a
    ship of GiBs pushes the node's hot pages out, and each new page costs more than a
    reused one: on this project's VMs, whose memory the host backs on first touch and takes
    back when freed, 2,000 files of 1 MiB written and fsynced took 5.8 s (4.3 system CPU s)
    kept and 2.5 s (1.2) dropped after each fsync, the same pages reused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def _set_direct(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for `fd`; False when the file system refuses it."""
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | _O_DIRECT) if on else (flags & ~_O_DIRECT))
    except OSError:
        return False
    return True


def _write_all(fd: int, view: memoryview) -> None:
    while view:  # a short write (a full disk) is followed by ENOSPC, never ignored
        view = view[os.write(fd, view) :]


def _write_at(fd: int, view: memoryview, pos: int) -> None:
    while view:
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n
