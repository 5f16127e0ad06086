"""How much of a file is in the page cache, for tests of `vrepl.directio.drop_cached`.

Owns: `resident_pages()` (mincore(2) over a read-only mapping of the file, through ctypes:
the standard library has no mincore) and `page_cache_drops()` (whether the file system
under a directory lets `drop_cached` drop a file's pages: tmpfs keeps them, they are the file).
Must not: read the file's bytes (a read would bring them back into the cache).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

from vrepl.directio import drop_cached

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_pages(path: str) -> tuple[int, int]:
    """(pages of `path` in the page cache, pages in all)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path}")
        try:
            vec = ctypes.create_string_buffer(pages)
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path}")
            return sum(b & 1 for b in vec.raw), pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def page_cache_drops(directory: str) -> bool:
    """Whether a written, fsynced file under `directory` leaves the page cache through
    `drop_cached` (not on tmpfs)."""
    probe = os.path.join(directory, ".page-cache-probe")
    with open(probe, "wb") as fh:
        fh.write(b"x" * (4 * mmap.PAGESIZE))
        fh.flush()
        os.fsync(fh.fileno())
    drop_cached(probe)
    try:
        return resident_pages(probe)[0] == 0
    finally:
        os.unlink(probe)
