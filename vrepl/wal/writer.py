"""Writing a WAL: WalWriter appends, rotates, makes records durable, truncates and recycles
(docs/wal-format.md §durability).

Owns: the one writer of a WAL directory: appending records with the next versions (encoded
here or forwarded already encoded, verified), rotation (seal: fsync, index; then a new
file), durability by policy (fsync per append, group commit by a flusher thread, none),
truncation after a version (a deposed master's suffix) and recycling of sealed files whose
records are all archived.
Must not: leave a partial record in a file after a failed write, cut below the first
version still in the log, call `on_durable` under its lock, or read records for a caller
(vrepl.wal.reader does).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Sequence

import numpy as np

from vrepl._core import record as _rec
from vrepl.errors import TornTailError, VersionError, WalError
from vrepl.wal.files import (
    MSG_TYPE_DATA,
    Durability,
    WalFile,
    WalOptions,
    WalState,
    _fsync_dir,
    _write_index,
    index_file_name,
    wal_file_name,
)
from vrepl.wal.scan import _last_epoch_of, _scan_file, inspect, repair

log = logging.getLogger("vrepl.wal")


class WalWriter:
    """Appends records with versions last_version+1, +2, ... to a WAL directory.

    Thread-safe: append calls are serialised by a lock. With Durability.GROUP and
    group_commit_ms > 0 a flusher thread fsyncs; `on_durable(version)` is then called from
    that thread, otherwise from the appending thread. `durable_version` is the highest version
    known to be on stable storage.
    """

    def __init__(
        self,
        directory: str,
        options: WalOptions | None = None,
        *,
        repair_tail: bool = False,
        create: bool = True,
        on_durable: Callable[[int], None] | None = None,
    ):
        self.directory = directory
        self.options = options or WalOptions()
        self._on_durable = on_durable
        if create:
            os.makedirs(directory, exist_ok=True)
        state = inspect(directory, self.options.max_record_bytes)
        if state.torn_tail is not None:
            if not repair_tail:
                t = state.torn_tail
                raise TornTailError(t.path, t.offset, t.last_good_version, t.reason)
            repair(directory, self.options.max_record_bytes)
            state = inspect(directory, self.options.max_record_bytes)
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._durable_cond = threading.Condition()  # its own lock: waiters never block appends
        self.last_version = state.last_version
        self.last_epoch = state.last_epoch
        self.first_version = state.first_version
        self.durable_version = self.last_version
        self._files = state.files
        self._closed = False
        self._generation = 0
        if not self._files:
            self._files.append(self._create_file(0))
        cur = self._files[-1]
        self._fd = os.open(cur.path, os.O_WRONLY | os.O_APPEND)
        self._offsets_current = self._scan_offsets(cur)
        self._flusher: threading.Thread | None = None
        self._dirty = threading.Event()
        if self.options.durability is Durability.GROUP and self.options.group_commit_ms > 0:
            self._flusher = threading.Thread(target=self._flush_loop, name="vrepl-wal-flush", daemon=True)
            self._flusher.start()

    # -- file management --------------------------------------------------------------------
    def _create_file(self, index: int) -> WalFile:
        path = os.path.join(self.directory, wal_file_name(index))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        _fsync_dir(self.directory)
        return WalFile(index, path, 0, sealed=False)

    def _scan_offsets(self, wf: WalFile) -> list[np.ndarray]:
        """Byte offsets of the records of the current file (for its index when sealed)."""
        return [
            scan.offsets + np.uint64(pos)
            for pos, _data, scan in _scan_file(wf, 0, 0, self.options.max_record_bytes, verify_payload=False)
        ]

    def _rotate(self) -> None:
        """Seal the current file (fsync, index) and start the next one. Lock held."""
        cur = self._files[-1]
        with self._sync_lock:
            os.fdatasync(self._fd)
            os.close(self._fd)
            self._generation += 1
        cur.sealed = True
        offsets = np.concatenate(self._offsets_current) if self._offsets_current else np.empty(0, dtype=np.uint64)
        _write_index(self.directory, cur, offsets)
        # durable_version advances in _after_write: callbacks never run under the lock.
        nxt = self._create_file(cur.index + 1)
        self._files.append(nxt)
        self._fd = os.open(nxt.path, os.O_WRONLY | os.O_APPEND)
        self._offsets_current = []

    # -- appending ----------------------------------------------------------------------------
    def append(self, payload: bytes, epoch: int, *, version: int | None = None, msg_type: int = MSG_TYPE_DATA) -> int:
        """Append one record; returns its version (last_version + 1)."""
        return self.append_batch([payload], epoch, first_version=version, msg_type=msg_type)[1]

    def append_batch(
        self, payloads: Sequence[bytes], epoch: int, *, first_version: int | None = None, msg_type: int = MSG_TYPE_DATA
    ) -> tuple[int, int]:
        """Append records in one write; returns (first_version, last_version)."""
        if not payloads:
            raise ValueError("append_batch: no payloads")
        for i, p in enumerate(payloads):
            if len(p) > self.options.max_record_bytes:
                raise ValueError(
                    f"record {i} is {len(p)} bytes, above max_record_bytes {self.options.max_record_bytes}"
                )
        with self._lock:
            first = self.last_version + 1
            if epoch < self.last_epoch:
                raise VersionError(f"append: epoch {epoch} is older than the WAL's last epoch {self.last_epoch}")
            if first_version is not None and first_version != first:
                raise VersionError(
                    f"append: version {first_version} does not follow the WAL's last version {self.last_version}"
                )
            block = _rec.encode_batch(msg_type, first, epoch, payloads)
            self._write_block_locked(block, None, first, first + len(payloads) - 1, epoch)
            last = self.last_version
        self._after_write(last)
        return first, last

    def append_encoded(self, block: bytes, scan=None) -> tuple[int, int]:
        """Append already-encoded records (a forwarded block), verified and version-checked.

        The block must hold whole records whose versions continue the log exactly.
        """
        with self._lock:
            expect = self.last_version + 1
            if scan is None or scan.count == 0 or int(scan.versions[0]) != expect:
                scan = _rec.scan(block, max_payload_len=self.options.max_record_bytes, expect_version=expect)
            if not scan.ok or scan.end != len(block):
                raise VersionError(
                    f"append_encoded: block rejected at offset {scan.end}:"
                    f" {scan.reason} (WAL last version {self.last_version})"
                )
            if scan.count == 0:
                return expect, self.last_version
            if int(scan.versions[-1]) - int(scan.versions[0]) + 1 != scan.count:
                raise VersionError("append_encoded: versions in the block are not contiguous")
            epochs = scan.epochs
            if int(epochs[0]) < self.last_epoch or (scan.count > 1 and bool((epochs[1:] < epochs[:-1]).any())):
                raise VersionError(
                    f"append_encoded: epochs go backwards (WAL last epoch {self.last_epoch}, block {int(epochs[0])}..)"
                )
            self._write_block_locked(block, scan.offsets, expect, int(scan.versions[-1]), int(scan.epochs[-1]))
            last = self.last_version
        self._after_write(last)
        return expect, last

    def _write_block_locked(self, block: bytes, offsets, first: int, last: int, epoch: int) -> None:
        if self._closed:
            raise WalError(f"{self.directory}: WAL writer is closed", self.directory)
        cur = self._files[-1]
        if cur.size and cur.size + len(block) > self.options.max_file_bytes:
            self._rotate()
            cur = self._files[-1]
        if offsets is None:
            offsets = _rec.scan(block, verify_payload=False).offsets
        view = memoryview(block)
        written = 0
        try:
            while written < len(block):
                written += os.write(self._fd, view[written:])
        except OSError as exc:
            # Leave the file as it was: a partial record would be a torn tail mid-log.
            os.ftruncate(self._fd, cur.size)
            raise WalError(
                f"{cur.path}: write failed at offset {cur.size}: {exc.strerror}", cur.path, cur.size
            ) from exc
        self._offsets_current.append(offsets + np.uint64(cur.size))
        cur.size += len(block)
        if not cur.first_version:
            cur.first_version = first
        if not self.first_version:
            self.first_version = first
        cur.last_version = last
        self.last_version = last
        self.last_epoch = epoch

    def _after_write(self, last: int) -> None:
        d = self.options.durability
        if d is Durability.FSYNC or (d is Durability.GROUP and self.options.group_commit_ms == 0):
            self.sync()
        elif d is Durability.GROUP:
            self._dirty.set()
        else:
            self._set_durable(last)  # durability "none": durable as far as the policy cares

    # -- durability ---------------------------------------------------------------------------
    def sync(self) -> int:
        """Make everything written so far durable; returns the durable version."""
        with self._lock:
            fd, gen, target = self._fd, self._generation, self.last_version
        with self._sync_lock:
            if gen == self._generation and not self._closed:
                os.fdatasync(fd)
        self._set_durable(target)
        return target

    def _set_durable(self, version: int) -> None:
        notify = False
        with self._durable_cond:
            if version > self.durable_version:
                self.durable_version = version
                notify = True
                self._durable_cond.notify_all()
        if notify and self._on_durable is not None:
            self._on_durable(version)

    def wait_durable(self, version: int, timeout_s: float | None = None) -> bool:
        with self._durable_cond:
            return self._durable_cond.wait_for(lambda: self.durable_version >= version, timeout_s)

    def _flush_loop(self) -> None:
        period_s = self.options.group_commit_ms / 1000.0
        while not self._closed:
            # The timeout only guards against a lost wake-up; close() also sets _dirty.
            if not self._dirty.wait(0.5):
                continue
            if self._closed:
                return
            # Let more appends join this group; then one fdatasync covers all of them.
            time.sleep(period_s)
            self._dirty.clear()
            try:
                self.sync()
            except OSError:
                log.exception("wal %s: group fsync failed", self.directory)
                return

    # -- maintenance --------------------------------------------------------------------------
    @property
    def files(self) -> list[WalFile]:
        with self._lock:
            return [WalFile(f.index, f.path, f.size, f.first_version, f.last_version, f.sealed) for f in self._files]

    def truncate_after(self, version: int) -> int:
        """Discard every record with a version above `version` (a deposed master's suffix
        the new master does not have, docs/design.md). Durable before it returns; returns the
        new last version. Refuses to cut below the first version still in the log."""
        with self._lock:
            if version >= self.last_version:
                return self.last_version
            if version < self.first_version - 1:
                raise VersionError(
                    f"truncate_after({version}): the log starts at {self.first_version}; records before it are recycled"
                )
            with self._sync_lock:
                os.close(self._fd)
                self._generation += 1
            # Later files first, so a crash midway leaves a log that is still contiguous.
            while len(self._files) > 1 and (
                self._files[-1].first_version == 0 or self._files[-1].first_version > version
            ):
                gone = self._files.pop()
                os.unlink(gone.path)
            cur = self._files[-1]
            try:
                # The file is the last one again: it is written to, so it has no index.
                os.unlink(os.path.join(self.directory, index_file_name(cur.index)))
            except FileNotFoundError:
                pass
            cur.sealed = False
            offsets, versions, epochs = [], [], []
            for pos, _data, scan in _scan_file(cur, 0, 0, self.options.max_record_bytes, verify_payload=False):
                offsets.append(scan.offsets + np.uint64(pos))
                versions.append(scan.versions)
                epochs.append(scan.epochs)
            all_offsets = np.concatenate(offsets) if offsets else np.empty(0, np.uint64)
            all_versions = np.concatenate(versions) if versions else np.empty(0, np.uint64)
            all_epochs = np.concatenate(epochs) if epochs else np.empty(0, np.uint64)
            n = int((all_versions <= version).sum())
            cut = int(all_offsets[n]) if n < len(all_offsets) else cur.size
            with open(cur.path, "r+b") as fh:
                fh.truncate(cut)
                os.fsync(fh.fileno())
            _fsync_dir(self.directory)
            cur.size = cut
            cur.last_version = int(all_versions[n - 1]) if n else 0
            if not n:
                cur.first_version = 0
            self._offsets_current = [all_offsets[:n]] if n else []
            self.last_version = version
            self.last_epoch = int(all_epochs[n - 1]) if n else _last_epoch_of(WalState(self.directory, self._files))
            self._fd = os.open(cur.path, os.O_WRONLY | os.O_APPEND)
            with self._durable_cond:
                self.durable_version = min(self.durable_version, version)
            log.warning("wal %s: truncated after version %d", self.directory, version)
            return version

    def recycle(self, before_version: int) -> list[str]:
        """Delete sealed files whose records all have versions < before_version (oldest
        first, so indexes stay contiguous). Returns the removed paths."""
        removed = []
        with self._lock:
            while len(self._files) > 1:
                f = self._files[0]
                if not f.sealed or (f.last_version and f.last_version >= before_version):
                    break
                os.unlink(f.path)
                try:
                    os.unlink(os.path.join(self.directory, index_file_name(f.index)))
                except FileNotFoundError:
                    pass
                removed.append(f.path)
                self._files.pop(0)
            self.first_version = next((f.first_version for f in self._files if f.first_version), 0)
        if removed:
            _fsync_dir(self.directory)
        return removed

    def close(self) -> None:
        """fsync and close; the last file stays the last (not sealed)."""
        with self._lock:
            if self._closed:
                return
            with self._sync_lock:
                os.fdatasync(self._fd)
                os.close(self._fd)
                self._closed = True
                self._generation += 1
            last = self.last_version
        self._dirty.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        self._set_durable(last)

    def __enter__(self) -> "WalWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
