"""Writing a received file around the page cache: `SequentialWriter`.

Owns: `SequentialWriter`, which writes a file front to back from a position, in pieces of any
size, through `O_DIRECT` when the file system takes it (ext4, xfs) and through ordinary
writes when not (tmpfs on older kernels, a descriptor that refuses the flag), and
`DIRECT_BLOCK_BYTES`, the alignment it keeps.

Why (docs/ship.md §3.3, docs/restore.md): a replica that receives a file it will not read
soon (a slave fetching a round's files, a restoring replica, a single-replica receiver) paid
most of its system CPU to put every byte into new page-cache pages (`copy_folio_from_iter`:
on this project's VMs 0.7-2.7 CPU s per GiB, against 0.06-0.3 for the same GiB written
direct), and fsync then wrote the same pages out anyway. The writer copies each piece into
one page-aligned buffer (a buffer it reuses, so the copy is cheap) and writes whole aligned
buffers at aligned offsets; `finish()` writes the last partial block padded with zeros and
truncates the file back to its true length.

A crash between that padded write and the truncation leaves up to 4,095 zero bytes at the
end: every caller checks a received file's size and CRC-32C before it keeps it, so such a
file is refused and received again, never kept.
Must not: fsync (the caller decides when a file becomes durable), checksum, name or rename
files, or read anything but the partial block a resumed file starts in.
"""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading

DIRECT_BLOCK_BYTES = 4096       # the alignment O_DIRECT needs on 512- and 4096-byte devices
BUFFER_BYTES = 4 << 20          # one aligned buffer; a direct write per this many bytes

_O_DIRECT = getattr(os, "O_DIRECT", 0)

# Aligned buffers kept between files (a writer takes one, `finish()` gives it back): a new
# mapping per file paid a page fault per 4 KiB of it, which cost more than the page cache it
# replaces. As many as writers ran at once are kept.
_free: list[memoryview] = []
_free_lock = threading.Lock()


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
    `direct` says whether O_DIRECT is in use; OSError of a write (ENOSPC) is the caller's."""

    def __init__(self, fd: int, offset: int = 0, *, direct: bool = True,
                 buffer_bytes: int = BUFFER_BYTES) -> None:
        self.fd = fd
        self.end = offset               # the file's true length so far
        self.direct = bool(direct and _O_DIRECT) and _set_direct(fd, True)
        if not self.direct:
            return
        self._buf = _take_buffer(max(DIRECT_BLOCK_BYTES, buffer_bytes - buffer_bytes % DIRECT_BLOCK_BYTES))
        head = offset % DIRECT_BLOCK_BYTES
        self._pos = offset - head       # the file offset of the buffer's first byte (aligned)
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
            self._buf[self._fill:self._fill + take] = view[i:i + take]
            self._fill += take
            i += take
            self.end += take
            if self._fill == cap:
                self._flush(cap)

    def finish(self) -> None:
        """Write what the buffer holds and leave the file exactly `end` bytes long. When a
        write fails (ENOSPC, raised), the file is cut back to the bytes known written."""
        if not self.direct:
            return
        ok = False
        try:
            fill = self._fill
            if fill:
                padded = -(-fill // DIRECT_BLOCK_BYTES) * DIRECT_BLOCK_BYTES
                self._buf[fill:padded] = bytes(padded - fill)
                self._flush(padded)
                if padded != fill:
                    os.ftruncate(self.fd, self.end)
            ok = True
        finally:
            if not ok:
                try:
                    os.ftruncate(self.fd, self._pos)
                except OSError:
                    pass
                self.end = self._pos
            if self.direct:
                self._release()
        os.lseek(self.fd, self.end, os.SEEK_SET)

    # -- inside ------------------------------------------------------------------------------------
    def _flush(self, length: int) -> None:
        """Write the buffer's first `length` bytes (a multiple of the block) at `_pos`."""
        real = min(length, self._fill)
        try:
            done = os.pwritev(self.fd, [self._buf[:length]], self._pos)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            done = 0
        if done < length:
            # Refused (EINVAL: the file system needs an alignment beyond ours) or short (a
            # full disk): the rest of this buffer, and every later byte, through ordinary
            # writes, which say why they stop.
            _set_direct(self.fd, False)
            if done < real:
                _write_at(self.fd, self._buf[done:real], self._pos + done)
            self._pos += real
            self._fill = 0
            self._fallback()
            return
        self._pos += real
        self._fill = 0

    def _read_block(self, pos: int) -> int:
        try:
            return os.preadv(self.fd, [self._buf[:DIRECT_BLOCK_BYTES]], pos)
        except OSError:
            return -1

    def _fallback(self) -> None:
        """Ordinary writes from here on (the buffer is empty or already written)."""
        self._release()
        os.lseek(self.fd, self.end, os.SEEK_SET)

    def _release(self) -> None:
        _set_direct(self.fd, False)     # the caller's later I/O on `fd` needs no alignment
        _give_back(self._buf)
        self._buf = memoryview(b"")
        self.direct = False


def _set_direct(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for `fd`; False when the file system refuses it."""
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | _O_DIRECT) if on else (flags & ~_O_DIRECT))
    except OSError:
        return False
    return True


def _write_all(fd: int, view: memoryview) -> None:
    while view:     # a short write (a full disk) is followed by ENOSPC, never ignored
        view = view[os.write(fd, view):]


def _write_at(fd: int, view: memoryview, pos: int) -> None:
    while view:
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n
