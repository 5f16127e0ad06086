"""Recently freed pages for a benchmark step: `free_recent_pages()`.

Owns that one function, shared by bench/bench_ship.py and bench/bench_txn_bulk.py. Must not:
time anything (the caller runs it right before the step it times, outside the timing).
"""
from __future__ import annotations

import os
import time


def free_recent_pages(mib: int, where: str) -> float:
    """Write `mib` MiB into a file under `where`, fsync it, drop its pages and remove it; the
    seconds it took. The test VM's host backs guest memory on first touch and takes freed
    memory back (virtio-balloon free page reporting): a page-cache page that lands on such
    memory cost about 2 s per GiB more than one the guest freed a moment before, so
    whichever step of a comparison found recently freed pages ran up to 3 x faster (rsync
    against a ship, docs/benchmarks.md §Shipping, ninth session; a transaction's puts
    against the restore that followed the removal of their files, §Transactions, bulk):
    each timed step starts right after this instead. On tmpfs the fsync and the advice do
    nothing and the removal frees the pages. (Touching and freeing anonymous memory did not
    do it: those pages went back to the host at once.)"""
    t0 = time.monotonic()
    if mib > 0:
        path = os.path.join(where, ".free-recent-pages")
        chunk = bytes(1 << 20)
        with open(path, "wb") as fh:
            for _ in range(mib):
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        os.unlink(path)
    return time.monotonic() - t0
