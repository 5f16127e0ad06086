"""The sync instance's storage: its WAL (written from one thread) and its persisted promise.

Owns: `<data path>/wal` through a `vrepl.wal.WalWriter` whose jobs run on the process's WAL
thread (vrepl/transport/walflush.py, one for every store of the process), the promise file
`<data path>/promise` (PersistPromisedEpoch), WAL truncation after a version
(TruncateWalAfter), and what start-up needs from disk (last epoch/version, the epoch
history, the promise). docs/embedding.md §Storage.

Group commit: the event loop only queues appends; the WAL thread takes every append queued so
far, writes them with ONE write and makes them durable with ONE fdatasync (WalWriter with
durability "group" and group_commit_ms 0, i.e. one fdatasync per append call), then reports
the durable version through `on_durable` (the WalWriter's callback, called on the WAL
thread). While one fdatasync runs the next appends queue up, so the batch grows with the
load and a lone write waits for no timer. Jobs run in the order queued, so every durable
report for earlier appends comes before the report of a later truncation (the ordering the
replica needs, vrepl/replica/actions.py). In one wake-up the WAL thread runs every store
that has jobs, one after the other.
Must not: call the replica or the app; talk to sockets. Callbacks run on the WAL thread: the
owner hops back to its event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from vrepl import wal as _wal
from vrepl._core import crc32c as _crc
from vrepl.errors import InvariantViolation, VreplError, WalError
from vrepl.transport.walflush import WalFlusher

log = logging.getLogger("vrepl.storage")

_PROMISE = struct.Struct("<4sIQi")  # magic, format, epoch, master
_PROMISE_MAGIC = b"VRPM"
PROMISE_FILE = "promise"
WAL_DIR = "wal"
# run_inline declines while a group commit takes longer than this on average: on a slow disk
# the WAL thread keeps the loop free (docs/embedding.md, max_wal_inline_sync_bytes).
INLINE_MAX_COMMIT_S = 0.001
# While the group commits average at most max_wal_inline_commit_us (fast storage: a RAM disk,
# a drive with a power-safe cache), run_inline takes batches of any size up to this: the
# thread hand-off then costs more than the commit, and a vgroup with one request in flight
# pays it per request (docs/perf.md §16). Larger batches still go to the WAL thread, so one
# commit holds the loop for a bounded time.
INLINE_FAST_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class DiskState:
    """What a sync instance finds on disk at start-up."""

    last_epoch: int
    last_version: int
    epoch_history: tuple[tuple[int, int], ...]
    promised_epoch: int
    promised_master: int | None  # None: no promise file
    repaired_tail: str | None  # a torn WAL tail that start-up truncated (description)


# ---------------------------------------------------------------------------------------------
# Promise file


def read_promise(data_path: str) -> tuple[int, int] | None:
    """(epoch, master) from `<data_path>/promise`, None if absent; VreplError if corrupt."""
    path = os.path.join(data_path, PROMISE_FILE)
    try:
        with open(path, "rb") as fh:
            body = fh.read(64)
    except FileNotFoundError:
        return None
    if len(body) != _PROMISE.size + 4:
        raise VreplError(f"{path}: promise file is {len(body)} bytes, expected {_PROMISE.size + 4}")
    if struct.unpack_from("<I", body, _PROMISE.size)[0] != _crc.crc32c(body[: _PROMISE.size]):
        raise VreplError(f"{path}: promise file checksum mismatch")
    magic, fmt, epoch, master = _PROMISE.unpack_from(body)
    if magic != _PROMISE_MAGIC or fmt != 1:
        raise VreplError(f"{path}: not a vrepl promise file")
    return epoch, master


def write_promise(data_path: str, epoch: int, master: int) -> None:
    """Durably replace the promise: write a temp file, fsync, rename, fsync the directory."""
    body = _PROMISE.pack(_PROMISE_MAGIC, 1, epoch, master)
    body += struct.pack("<I", _crc.crc32c(body))
    path = os.path.join(data_path, PROMISE_FILE)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, body)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(data_path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# ---------------------------------------------------------------------------------------------
# WAL helpers


def epoch_history(wal_dir: str, max_record_bytes: int) -> tuple[tuple[int, int], ...]:
    """(epoch, first_version) pairs of a WAL, from the epochs of its records (one read)."""
    pairs: list[tuple[int, int]] = []
    last_epoch = -1
    for blk in _wal.WalReader(wal_dir, max_record_bytes).iter_blocks(1):
        epochs = blk.scan.epochs
        if not len(epochs):
            continue
        versions = blk.scan.versions
        starts = np.flatnonzero(np.diff(epochs.astype(np.int64))) + 1
        if int(epochs[0]) != last_epoch:
            pairs.append((int(epochs[0]), int(versions[0])))
        for k in starts:
            pairs.append((int(epochs[k]), int(versions[k])))
        last_epoch = int(epochs[-1])
    return tuple(pairs)


# ---------------------------------------------------------------------------------------------
# The store


class WalStore:
    """The WAL of one sync instance plus its promise file. Its jobs run on the process's
    WAL thread (vrepl/transport/walflush.py), shared by every store, one store at a time
    and each store's jobs in the order queued.

    `on_durable(version)` and `on_truncated(last_epoch, last_version)` and `on_error(exc)`
    are called on the WAL thread (or the I/O thread in `run_inline`), in job order;
    `on_group_commit(seconds)` (optional) once per group commit, with how long its write
    and fdatasync took. After a failure the store runs no more jobs.
    """

    def __init__(
        self,
        data_path: str,
        *,
        max_record_bytes: int = _wal.DEFAULT_MAX_RECORD_BYTES,
        max_file_bytes: int = _wal.DEFAULT_MAX_FILE_BYTES,
        on_durable: Callable[[int], None],
        on_truncated: Callable[[int, int], None],
        on_error: Callable[[BaseException], None],
        on_group_commit: Callable[[float], object] | None = None,
    ) -> None:
        self.data_path = data_path
        self.wal_dir = os.path.join(data_path, WAL_DIR)
        self.options = _wal.WalOptions(
            max_file_bytes=max_file_bytes,
            max_record_bytes=max_record_bytes,
            durability=_wal.Durability.GROUP,
            group_commit_ms=0,
        )
        self._on_durable = on_durable
        self._on_truncated = on_truncated
        self._on_error = on_error
        self._on_group_commit = on_group_commit
        self._writer: _wal.WalWriter | None = None
        self._jobs: deque[tuple] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._flusher: WalFlusher | None = None
        self._scheduled = False  # in the flusher's queue
        self._busy = False  # a thread is executing jobs (the WAL thread or run_inline)
        self._failed = False  # a job raised: nothing more is written
        self._queued_bytes = 0
        # True when the owner ends every batch with run_inline() or kick() (the inline sync
        # of max_wal_inline_sync_bytes): a queued job then waits for the batch's end instead
        # of waking the WAL thread at once, which would wake for nothing when the batch
        # runs inline, and take the GIL from the loop during the inline fdatasync.
        self.defer_wake = False
        # Moving average of a group commit's write + fdatasync, in seconds, measured on
        # whichever thread ran it: run_inline declines while it is above INLINE_MAX_COMMIT_S
        # (a slow disk would stall the loop, every vgroup of the process and the HTTP API
        # with it, for each commit) and takes any size up to INLINE_FAST_MAX_BYTES while it
        # is at most its fast_commit_s. It starts at 0: the first commits probe inline, and
        # a few slow ones move the store to the WAL thread (each moves it by a fifth).
        self.commit_s_ewma = 0.0
        self.fast_inline = False  # run_inline's last verdict on fast storage (its hysteresis)
        self.durable_version = 0  # written by the WAL thread
        self.appended_bytes = 0
        self.fsyncs = 0

    def open(self) -> DiskState:
        """Open (creating) the WAL, repairing a torn tail; read the promise and epoch history."""
        os.makedirs(self.wal_dir, exist_ok=True)
        repaired = None
        tail = _wal.repair(self.wal_dir, self.options.max_record_bytes)
        if tail is not None:
            repaired = tail.describe()
        self._writer = self._new_writer()
        history = epoch_history(self.wal_dir, self.options.max_record_bytes)
        promise = read_promise(self.data_path)
        state = DiskState(
            last_epoch=self._writer.last_epoch if self._writer.last_version else 0,
            last_version=self._writer.last_version,
            epoch_history=history,
            promised_epoch=promise[0] if promise else 0,
            promised_master=promise[1] if promise else None,
            repaired_tail=repaired,
        )
        self.durable_version = state.last_version
        self._flusher = WalFlusher.shared()
        return state

    def _new_writer(self) -> _wal.WalWriter:
        return _wal.WalWriter(self.wal_dir, self.options, on_durable=self._durable)

    def _durable(self, version: int) -> None:
        self.durable_version = version
        self._on_durable(version)

    # -- called from the event loop ------------------------------------------------------------

    def _queue(self, job: tuple, nbytes: int = 0) -> None:
        with self._cond:
            self._jobs.append(job)
            self._queued_bytes += nbytes
            wake = not (self.defer_wake or self._scheduled or self._busy or self._closed) and self._flusher is not None
            if wake:
                self._scheduled = True
        if wake:
            # wake implies a flusher: only close() clears it, after _closed stops new wakes
            self._flusher.schedule(self)  # type: ignore[union-attr]

    def kick(self) -> None:
        """Hand the queued jobs to the WAL thread (the end of a batch that did not run them
        inline, with defer_wake)."""
        with self._cond:
            wake = (
                bool(self._jobs) and not (self._scheduled or self._busy or self._closed) and self._flusher is not None
            )
            if wake:
                self._scheduled = True
        if wake:
            self._flusher.schedule(self)  # type: ignore[union-attr]

    def append(self, first_version: int, last_version: int, block: bytes) -> None:
        """Queue encoded records first_version..last_version for the WAL thread."""
        self._queue(("append", first_version, last_version, block), len(block))

    def truncate_after(self, version: int) -> None:
        self._queue(("truncate", version))

    def reset(self, base_version: int, base_epoch: int) -> None:
        """Queue: drop every WAL file and start an empty WAL whose next record is
        base_version + 1 (a restore installed archived files holding everything up to
        base_version, docs/restore.md §Rebase). Ordered with the appends around it."""
        self._queue(("reset", base_version, base_epoch))

    def recycle(self, before_version: int) -> None:
        """Queue: delete sealed WAL files whose records are all below before_version (the
        app archived them: docs/vnode.md §5)."""
        self._queue(("recycle", before_version))

    def first_version_or(self, default: int) -> int:
        """The first version the WAL still holds, or `default` when it holds none."""
        w = self._writer
        first = w.first_version if w is not None else 0
        return first or default

    def run_inline(self, max_bytes: int, fast_commit_s: float = 0.0) -> bool:
        """Execute the queued jobs on the calling thread (the event loop) when the WAL thread
        is not running this store and either they hold at most `max_bytes` and the store's
        group commits take at most INLINE_MAX_COMMIT_S on average (a lone small write then
        waits for no thread hand-off, only for its fdatasync), or the commits take at most
        `fast_commit_s` (> 0) on average and the jobs hold at most INLINE_FAST_MAX_BYTES
        (fast storage: every batch). Same order and callbacks as the WAL thread. True if it
        ran something."""
        ewma = self.commit_s_ewma
        # Hysteresis: in at fast_commit_s, out above twice that, so a store whose commits
        # average near the bound does not flip between the two paths every few commits.
        self.fast_inline = fast_commit_s > 0 and ewma <= fast_commit_s * (2.0 if self.fast_inline else 1.0)
        if self.fast_inline:
            limit = max(max_bytes, INLINE_FAST_MAX_BYTES)
        elif max_bytes > 0 and ewma <= INLINE_MAX_COMMIT_S:
            limit = max_bytes
        else:
            return False
        with self._cond:
            if self._busy or not self._jobs or self._queued_bytes > limit or self._closed or self._failed:
                return False
            jobs = self._take_locked()
        try:
            self.run_jobs(jobs)
        finally:
            self.jobs_done()
        return True

    def persist_promise(self, epoch: int, master: int) -> None:
        """Synchronous and durable on return: the caller writes the following Sends only
        after this (ordering contract, vrepl/replica/actions.py)."""
        write_promise(self.data_path, epoch, master)

    def close(self, timeout_s: float = 10.0) -> None:
        """Let the WAL thread finish the queued jobs (at most timeout_s), then close."""
        flusher = self._flusher
        in_flusher = flusher is not None and flusher.in_thread()
        if not in_flusher:
            self.kick()  # jobs held for a batch's end (defer_wake) are written too
        with self._cond:
            self._closed = True
            if not in_flusher:
                self._cond.wait_for(
                    lambda: self._failed or not (self._jobs or self._busy or self._scheduled), timeout_s
                )
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError:
                log.exception("wal %s: close failed", self.wal_dir)
        if flusher is not None:
            self._flusher = None
            flusher.release()

    # -- the WAL thread (walflush.WalFlusher) ----------------------------------------------------

    def _take_locked(self) -> list[tuple]:
        jobs = list(self._jobs)
        self._jobs.clear()
        self._queued_bytes = 0
        self._busy = True
        return jobs

    def take_jobs(self) -> list[tuple] | None:
        """The jobs queued so far, now owned by the calling thread until jobs_done(); None
        when there are none or another thread runs this store."""
        with self._cond:
            self._scheduled = False
            if self._busy or not self._jobs or self._failed:
                self._cond.notify_all()
                return None
            return self._take_locked()

    def run_jobs(self, jobs: list[tuple]) -> None:
        try:
            self._do(jobs)
        except BaseException as exc:  # a failing WAL must stop the instance, loudly
            log.exception("wal %s: WAL work failed", self.wal_dir)
            with self._cond:
                self._failed = True
            self._on_error(exc)

    def jobs_done(self) -> None:
        """The thread that took jobs is done: jobs queued meanwhile go to the WAL thread."""
        with self._cond:
            self._busy = False
            wake = bool(self._jobs) and not (self._scheduled or self._failed) and self._flusher is not None
            if wake:
                self._scheduled = True
            self._cond.notify_all()
        if wake:
            # wake implies a flusher: only close() clears it, after _closed stops new wakes
            self._flusher.schedule(self)  # type: ignore[union-attr]

    def _do(self, jobs: list[tuple]) -> None:
        i = 0
        while i < len(jobs):
            job = jobs[i]
            if job[0] == "append":
                blocks = []
                while i < len(jobs) and jobs[i][0] == "append":
                    blocks.append(jobs[i][3])
                    i += 1
                block = blocks[0] if len(blocks) == 1 else b"".join(blocks)
                if self._writer is None:
                    raise InvariantViolation("self._writer is not None")
                # One write and one fdatasync for everything queued (group commit).
                observe = self._on_group_commit
                began = time.perf_counter()
                self._writer.append_encoded(block)
                took_s = time.perf_counter() - began
                # One thread runs the store at a time (_busy): a plain float is enough.
                self.commit_s_ewma += (took_s - self.commit_s_ewma) * 0.2
                if observe is not None:
                    observe(took_s)
                self.appended_bytes += len(block)
                self.fsyncs += 1
                continue
            if job[0] == "truncate":
                version = job[1]
                if self._writer is None:
                    raise InvariantViolation("self._writer is not None")
                # Report durability of everything written before the cut first (the core
                # expects every WalPersisted of earlier appends before TruncateDone).
                self._writer.sync()
                last = self._writer.truncate_after(version)
                if last != version:
                    raise WalError(f"{self.wal_dir}: truncated to v{last}, asked for v{version}", self.wal_dir)
                self.durable_version = last
                self._on_truncated(self._writer.last_epoch if last else 0, last)
            elif job[0] == "reset":
                self._reset(job[1], job[2])
            elif job[0] == "recycle":
                if self._writer is None:
                    raise InvariantViolation("self._writer is not None")
                removed = self._writer.recycle(job[1])
                if removed:
                    log.info("wal %s: recycled %d files below v%d", self.wal_dir, len(removed), job[1])
            i += 1

    def _reset(self, base_version: int, base_epoch: int) -> None:
        if self._writer is None:
            raise InvariantViolation("self._writer is not None")
        self._writer.close()
        for name in os.listdir(self.wal_dir):
            if name.endswith(".wal") or name.endswith(".idx"):
                os.unlink(os.path.join(self.wal_dir, name))
        _wal._fsync_dir(self.wal_dir)
        w = self._new_writer()
        # An empty WAL continuing after base_version: the next append must be base + 1.
        w.last_version = base_version
        w.last_epoch = base_epoch
        w.durable_version = base_version
        self._writer = w
        self.durable_version = base_version
        log.warning(
            "wal %s: reset: the log continues after v%d (e%d) held by restored files",
            self.wal_dir,
            base_version,
            base_epoch,
        )


# ---------------------------------------------------------------------------------------------
# The driver's Storage port


class LoopStorage:
    """The driver's Storage port (vrepl/driver/ports.py) over its own WalStore (the keyword
    arguments are the store's): jobs are queued to the WAL thread, and every completion
    (durable, truncated, a block read back for a stream, a failure) is handed to the I/O
    thread through `post(fn)`, which calls `fn` there while the instance runs and ends the
    driver's batch after it. `target` is the driver, bound once it exists; `fail(reason)`
    stops the instance; `run_in_executor(fn, *args)` runs a blocking read off the loop.
    """

    def __init__(
        self,
        data_path: str,
        *,
        post: Callable[..., None],
        fail: Callable[[str], None],
        run_in_executor: Callable[..., asyncio.Future[Any]],
        inline_sync_max_bytes: int = 0,
        inline_commit_max_us: int = 0,
        **store_options,
    ) -> None:
        self.store = WalStore(
            data_path,
            on_durable=self.on_durable,
            on_truncated=self.on_truncated,
            on_error=self.on_error,
            **store_options,
        )
        self.post = post
        self.fail = fail
        self.run_in_executor = run_in_executor
        self.inline_sync_max_bytes = inline_sync_max_bytes
        self.inline_fast_commit_s = inline_commit_max_us / 1e6
        self.inline_on = inline_sync_max_bytes > 0 or inline_commit_max_us > 0
        self.store.defer_wake = self.inline_on
        # the Driver (wal_durable, wal_truncated, wal_block, wal_read_failed): the type stays
        # `object` (transport must not import the driver), hence the attr-defined ignores below
        self.target: object = None
        self._readers: dict[int, list] = {}  # reader -> [next version, iterator of WalBlocks]

    # WalStore callbacks (the WAL thread, or the I/O thread from run_inline)
    def on_durable(self, version: int) -> None:
        self.post(lambda: self.target.wal_durable(version))  # type: ignore[attr-defined]

    def on_truncated(self, last_epoch: int, last_version: int) -> None:
        self.post(lambda: self.target.wal_truncated(last_epoch, last_version))  # type: ignore[attr-defined]

    def on_error(self, exc: BaseException) -> None:
        self.post(lambda: self.fail(f"WAL failed: {exc}"), always=True)

    # -- the port (I/O thread) ------------------------------------------------------------------

    def append(self, first_version: int, last_version: int, block: bytes) -> None:
        self.store.append(first_version, last_version, block)

    def persist_promise(self, epoch: int, master: int) -> None:
        self.store.persist_promise(epoch, master)

    def truncate_after(self, version: int) -> None:
        self.store.truncate_after(version)

    def rebase(self, base_version: int, base_epoch: int) -> None:
        self.store.reset(base_version, base_epoch)

    def first_version(self) -> int:
        return self.store.first_version_or(0)

    def read_wal(self, reader: int, from_version: int) -> None:
        """Read the next block on the default executor (file reads never block the loop)."""
        state = self._readers.get(reader)
        if state is None or state[0] != from_version:
            blocks = _wal.WalReader(self.store.wal_dir, self.store.options.max_record_bytes).iter_blocks(from_version)
            state = self._readers[reader] = [from_version, blocks]
        fut = self.run_in_executor(next, state[1], None)
        fut.add_done_callback(lambda f: self._read_done(reader, state, f))

    def _read_done(self, reader: int, state: list, fut) -> None:
        if fut.cancelled() or self._readers.get(reader) is not state:
            return
        exc = fut.exception()
        if exc is not None:
            if not isinstance(exc, (WalError, VreplError, OSError)):
                log.error("wal %s: reading for a stream failed: %r", self.store.wal_dir, exc, exc_info=exc)
            self.post(lambda: self.target.wal_read_failed(reader, str(exc)))  # type: ignore[attr-defined]
            return
        blk = fut.result()
        if blk is None:
            self.post(lambda: self.target.wal_block(reader, None, None))  # type: ignore[attr-defined]
            return
        state[0] = int(blk.scan.versions[-1]) + 1
        self.post(lambda: self.target.wal_block(reader, blk.data, blk.scan))  # type: ignore[attr-defined]

    def close_reader(self, reader: int) -> None:
        self._readers.pop(reader, None)

    def end_batch(self) -> None:
        """Light load or fast storage: make this batch's appends durable right here, the
        frames being on their way already, so the fdatasync overlaps the followers' work
        (max_wal_inline_sync_bytes, max_wal_inline_commit_us, docs/embedding.md §Storage)."""
        if self.inline_on and not self.store.run_inline(self.inline_sync_max_bytes, self.inline_fast_commit_s):
            self.store.kick()
