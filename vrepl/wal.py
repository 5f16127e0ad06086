"""The write-ahead log: a directory of size-rotated files of records (docs/wal-format.md).

Owns: WAL files on disk, their names, rotation, durability (fsync / group commit / none),
the per-file index that makes seeking by version cheap, tail inspection and repair, and
recycling of files whose records are all archived. Encoding and checksums are the Cython
record codec's (vrepl._core.record); this module never parses bytes itself.

Rules it enforces (from the seed, docs/design.md): versions start at 1 and go up by exactly
1 across the whole log; file indexes form one contiguous range; the last file is the one
being written. A torn or zero-filled tail of the LAST file is a crash artefact, reported
and truncated by repair(); any other fault is corruption, an error naming file and offset,
never skipped.

Must not: touch anything outside its directory, hold a record in memory longer than the
caller's batch, or allocate more than the maximum record size for a single record it has not
verified.
"""
from __future__ import annotations

import enum
import errno
import logging
import os
import re
import stat
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from vrepl._core import crc32c as _crc
from vrepl._core import record as _rec
from vrepl.errors import TornTailError, VersionError, WalCorruptError, WalError

log = logging.getLogger("vrepl.wal")

HEADER_SIZE = _rec.HEADER_SIZE_BYTES
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_RECORD_BYTES = _rec.DEFAULT_MAX_PAYLOAD_BYTES
DEFAULT_GROUP_COMMIT_MS = 2
INDEX_STRIDE_RECORDS = 64          # one index entry every this many records
READ_CHUNK_BYTES = 8 * 1024 * 1024  # how much of a file a reader holds at once
MSG_TYPE_DATA = 1                   # the default message type of an application record

WAL_NAME = re.compile(r"^(\d{12})\.wal$")
_IDX_MAGIC = b"VRIX"
_IDX_HEADER = struct.Struct("<4sIQQQQQ")  # magic, format, file index, first ver, count, size, stride


def wal_file_name(index: int) -> str:
    return f"{index:012d}.wal"


def index_file_name(index: int) -> str:
    return f"{index:012d}.idx"


class Durability(str, enum.Enum):
    """When an append is on stable storage (docs/wal-format.md §durability)."""

    FSYNC = "fsync"   # each append call returns only after fdatasync
    GROUP = "group"   # appends return after write(); one fdatasync covers many (per N ms or per batch)
    NONE = "none"     # the OS decides; fsync only when a file is sealed or closed


@dataclass(frozen=True)
class WalOptions:
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    durability: Durability = Durability.GROUP
    # group commit: 0 = one fdatasync at the end of every append call (one per batch);
    # N > 0 = a flusher thread makes everything written durable at most N ms later.
    group_commit_ms: int = DEFAULT_GROUP_COMMIT_MS

    def __post_init__(self) -> None:
        object.__setattr__(self, "durability", Durability(self.durability))
        if self.max_file_bytes < HEADER_SIZE:
            raise ValueError(f"max_file_bytes {self.max_file_bytes} is below one header")
        if not 0 < self.max_record_bytes <= 0xFFFFFFFF:
            raise ValueError(f"max_record_bytes {self.max_record_bytes} not in 1..2^32-1")
        if self.group_commit_ms < 0:
            raise ValueError("group_commit_ms must be >= 0")


@dataclass
class WalFile:
    """One WAL file as found on disk."""

    index: int
    path: str
    size: int
    first_version: int = 0   # 0 when the file holds no record
    last_version: int = 0
    sealed: bool = True      # every file but the last is sealed

    @property
    def count(self) -> int:
        return self.last_version - self.first_version + 1 if self.first_version else 0


@dataclass
class TornTail:
    path: str
    offset: int            # where the good data ends; repair truncates here
    last_good_version: int
    reason: str

    def describe(self) -> str:
        return (f"{self.path}: torn tail at offset {self.offset}: {self.reason}"
                f" (last good version {self.last_good_version})")


@dataclass
class WalState:
    """What inspect() found in a WAL directory."""

    directory: str
    files: list[WalFile] = field(default_factory=list)
    torn_tail: TornTail | None = None
    last_epoch: int = 0      # epoch of the record with last_version (0 if the log is empty)

    @property
    def first_version(self) -> int:
        return next((f.first_version for f in self.files if f.first_version), 0)

    @property
    def last_version(self) -> int:
        return next((f.last_version for f in reversed(self.files) if f.last_version), 0)


# ---------------------------------------------------------------------------------------------
# Per-file index: sampled offsets so a reader can seek to a version without scanning the file.

def _write_index(directory: str, wf: WalFile, offsets: np.ndarray) -> None:
    sample = np.ascontiguousarray(offsets[::INDEX_STRIDE_RECORDS], dtype="<u8")
    head = _IDX_HEADER.pack(_IDX_MAGIC, 1, wf.index, wf.first_version, wf.count, wf.size,
                            INDEX_STRIDE_RECORDS)
    body = head + sample.tobytes()
    body += struct.pack("<I", _crc.crc32c(body))
    tmp = os.path.join(directory, index_file_name(wf.index) + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(body)
        fh.flush()
        os.fdatasync(fh.fileno())
    os.replace(tmp, os.path.join(directory, index_file_name(wf.index)))


def _read_index(directory: str, wf: WalFile) -> tuple[int, int, np.ndarray] | None:
    """(first_version, count, sampled offsets) if the index is present and matches the file."""
    path = os.path.join(directory, index_file_name(wf.index))
    # An honest index holds at most one u64 per INDEX_STRIDE_RECORDS records of the file;
    # anything longer is not read (no allocation driven by a damaged file).
    limit = _IDX_HEADER.size + 4 + 8 * (wf.size // (HEADER_SIZE * INDEX_STRIDE_RECORDS) + 1)
    try:
        with open(open_regular(path), "rb") as fh:  # a FIFO or symlink index: ignored
            if os.fstat(fh.fileno()).st_size > limit:
                return None
            body = fh.read(limit)
    except OSError:
        return None
    if len(body) < _IDX_HEADER.size + 4:
        return None
    if struct.unpack_from("<I", body, len(body) - 4)[0] != _crc.crc32c(body[:-4]):
        return None
    magic, fmt, index, first, count, size, stride = _IDX_HEADER.unpack_from(body)
    if magic != _IDX_MAGIC or fmt != 1 or index != wf.index or size != wf.size \
            or stride != INDEX_STRIDE_RECORDS:
        return None
    sample = np.frombuffer(body, dtype="<u8", offset=_IDX_HEADER.size,
                           count=(len(body) - _IDX_HEADER.size - 4) // 8)
    if len(sample) != (count + stride - 1) // stride:
        return None
    return first, count, sample


# ---------------------------------------------------------------------------------------------
# Inspection: list the files, check contiguity, classify the end of the last file.

def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


def open_regular(path: str) -> int:
    """A read-only descriptor of `path` if it is a regular file; WalError otherwise. Opened
    with O_NONBLOCK | O_NOFOLLOW, so a FIFO or a symlink put there since it was listed can
    never block or redirect the read, and checked with fstat before anything is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise WalError(f"{path}: not a regular file (a symlink); refused", path) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise WalError(f"{path}: not a regular file ({_file_kind(mode)}); refused", path)
    os.set_blocking(fd, True)
    return fd


def list_wal_files(directory: str) -> list[WalFile]:
    """The WAL files of a directory in index order; WalError if indexes are not contiguous
    or a name of a WAL file is not a regular file (a FIFO, a symlink, a device: refused,
    never opened)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        raise WalError(f"{directory}: no such WAL directory", directory) from None
    except NotADirectoryError:
        raise WalError(f"{directory}: not a directory", directory) from None
    files = []
    for name in names:
        m = WAL_NAME.match(name)
        if m:
            path = os.path.join(directory, name)
            # lstat, never open: opening a FIFO for reading blocks until a writer comes.
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                raise WalError(f"{path}: not a regular file ({_file_kind(st.st_mode)}); refused", path)
            files.append(WalFile(int(m.group(1)), path, st.st_size))
    files.sort(key=lambda f: f.index)
    for prev, cur in zip(files, files[1:]):
        if cur.index != prev.index + 1:
            raise WalCorruptError(cur.path, 0, f"file index gap: {wal_file_name(prev.index)}"
                                  f" is followed by {wal_file_name(cur.index)}")
    if files:
        files[-1].sealed = False
    return files


def _windows(fh, head: bytes, overlap: int) -> Iterator[tuple[bytes, int]]:
    """(window, bytes of the window already seen) over `head` then the rest of fh, in
    READ_CHUNK_BYTES pieces that overlap by `overlap` bytes, so a pattern shorter than the
    overlap is never split. Bounded memory whatever the file size."""
    window, seen = head, 0
    while True:
        yield window, seen
        chunk = fh.read(READ_CHUNK_BYTES)
        if not chunk:
            return
        keep = window[-overlap:] if overlap else b""
        window, seen = keep + chunk, len(keep)


def _tail_is_zero(fh, head: bytes) -> bool:
    return all(w.count(0) == len(w) for w, _ in _windows(fh, head, 0))


def _valid_header_follows(fh, head: bytes, max_record: int) -> bool:
    """Whether a valid record header starts anywhere in head[1:] or the rest of the file."""
    sig = struct.pack("<I", _rec.RECORD_SIGNATURE)
    first = True
    for window, seen in _windows(fh, head, HEADER_SIZE - 1):
        pos = window.find(sig, 1 if first else max(seen - HEADER_SIZE + 1, 0))
        first = False
        while pos >= 0:
            if _rec.header_invalid(window, pos, max_record) is None:
                return True
            pos = window.find(sig, pos + 1)
    return False


def _classify_stop(fh, head: bytes, scan_status: int, reason: str | None, path: str,
                   file_off: int, is_last: bool, max_record: int, last_good: int) -> TornTail:
    """Why the records of a file stop at file_off: a torn tail of the last file (returned)
    or corruption (raised). `head` holds the file's bytes from file_off on as far as they were
    read; the rest is read from fh in bounded chunks."""
    if scan_status == _rec.STATUS_BAD_SIGNATURE and file_off == 0:
        raise WalCorruptError(path, 0, "not a vrepl WAL file (no record signature)", last_good)
    torn = False
    if scan_status == _rec.STATUS_INCOMPLETE:
        torn = True
    elif scan_status == _rec.STATUS_ZERO:
        torn = _tail_is_zero(fh, head)  # zero-filled to the end: preallocation or lost pages
        if not torn:
            reason = "zero bytes followed by non-zero data"
    elif scan_status in (_rec.STATUS_BAD_HEADER_CRC, _rec.STATUS_BAD_PAYLOAD_CRC):
        # A write cut short leaves garbage only at the very end; a valid header after the
        # bad record means data that was once good has changed: corruption.
        torn = not _valid_header_follows(fh, head, max_record)
    elif scan_status == _rec.STATUS_VERSION_GAP:
        got = struct.unpack_from("<Q", head, 8)[0]
        reason = f"version gap: found version {got}, expected {last_good + 1}"
    reason = reason or f"records stop (scan status {scan_status})"
    if torn and is_last:
        return TornTail(path, file_off, last_good, reason)
    if torn:
        reason = f"{reason} in a sealed file (only the last file may have a torn tail)"
    raise WalCorruptError(path, file_off, reason, last_good)


def _scan_file(wf: WalFile, start: int, expect: int, max_record: int,
               verify_payload: bool = True):
    """Scan a WAL file from byte `start` in bounded chunks.

    Yields (file offset of data, data, scan) for every chunk that holds whole, valid records,
    each record's version following the previous one (`expect` = the version the first must
    carry, 0 = any). Returns (StopIteration.value) a TornTail if the last file ends torn, or
    None; raises WalCorruptError for anything else. Memory: one chunk plus one record.
    """
    pos = start
    carry = b""
    with open(open_regular(wf.path), "rb") as fh:
        fh.seek(start)
        while True:
            chunk = fh.read(READ_CHUNK_BYTES)
            at_eof = not chunk
            if at_eof and not carry:
                return None
            data = carry + chunk if carry else chunk
            scan = _rec.scan(data, max_payload_len=max_record, verify_payload=verify_payload,
                             expect_version=expect, contiguous=True)
            if scan.count:
                expect = int(scan.versions[-1]) + 1
                yield pos, data, scan
            if not scan.ok and not (scan.status == _rec.STATUS_INCOMPLETE and not at_eof):
                last_good = int(scan.versions[-1]) if scan.count else max(expect - 1, 0)
                return _classify_stop(fh, data[scan.end:], scan.status, scan.reason, wf.path,
                                      pos + scan.end, not wf.sealed, max_record, last_good)
            # An incomplete record whose header passed its checks is at most
            # HEADER_SIZE + max_record bytes, so the carry stays bounded.
            carry = data[scan.end:]
            pos += scan.end
            if at_eof:
                return None


def inspect(directory: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
            verify_all: bool = False) -> WalState:
    """Read a WAL directory's shape and the state of its last file.

    Sealed files are checked by their index (or a scan if it is missing or stale); with
    verify_all every byte of every file is verified. Raises WalCorruptError for corruption;
    a torn tail of the last file is returned in WalState.torn_tail, not raised.
    """
    state = WalState(directory, list_wal_files(directory))
    expect = 0  # next version expected; 0 = whatever the first record carries
    epoch_of_last = 0
    for wf in state.files:
        idx = None if (verify_all or not wf.sealed) else _read_index(directory, wf)
        if idx is not None:
            first, count, _ = idx
            if count:
                if expect and first != expect:
                    raise WalCorruptError(wf.path, 0, f"version gap: file starts at version"
                                          f" {first}, expected {expect}", expect - 1)
                wf.first_version, wf.last_version = first, first + count - 1
                expect = first + count
                epoch_of_last = 0  # unknown until read (below)
            continue
        chunks = _scan_file(wf, 0, expect, max_record_bytes)
        while True:
            try:
                _pos, _data, scan = next(chunks)
            except StopIteration as stop:
                if stop.value is not None:
                    state.torn_tail = stop.value
                break
            if not wf.first_version:
                wf.first_version = int(scan.versions[0])
            wf.last_version = int(scan.versions[-1])
            expect = wf.last_version + 1
            epoch_of_last = int(scan.epochs[-1])
    state.last_epoch = epoch_of_last or _last_epoch_of(state)
    return state


def _last_epoch_of(state: WalState) -> int:
    """Epoch of the last record, read from the last file that holds records."""
    for wf in reversed(state.files):
        if wf.last_version:
            epoch = 0
            try:
                for _pos, _data, scan in _scan_file(wf, 0, 0, DEFAULT_MAX_RECORD_BYTES,
                                                    verify_payload=False):
                    epoch = int(scan.epochs[-1])
            except WalCorruptError:
                pass
            if epoch:
                return epoch
    return 0


def repair(directory: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> TornTail | None:
    """Truncate a torn tail of the last file; returns what was cut (None if the log was clean).

    Corruption that is not a torn tail is raised, never repaired: it needs an operator.
    """
    state = inspect(directory, max_record_bytes)
    tail = state.torn_tail
    if tail is None:
        return None
    with open(tail.path, "r+b") as fh:
        fh.truncate(tail.offset)
        fh.flush()
        os.fsync(fh.fileno())
    log.warning("wal repair: %s", tail.describe())
    return tail


def verify(directory: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> WalState:
    """Verify every byte of every file (checksums, versions, index contiguity)."""
    return inspect(directory, max_record_bytes, verify_all=True)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# Writer

class WalWriter:
    """Appends records with versions last_version+1, +2, ... to a WAL directory.

    Thread-safe: append calls are serialised by a lock. With Durability.GROUP and
    group_commit_ms > 0 a flusher thread fsyncs; `on_durable(version)` is then called from
    that thread, otherwise from the appending thread. `durable_version` is the highest version
    known to be on stable storage.
    """

    def __init__(self, directory: str, options: WalOptions | None = None, *,
                 repair_tail: bool = False, create: bool = True,
                 on_durable: Callable[[int], None] | None = None):
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
            self._flusher = threading.Thread(target=self._flush_loop, name="vrepl-wal-flush",
                                             daemon=True)
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
        return [scan.offsets + np.uint64(pos) for pos, _data, scan in
                _scan_file(wf, 0, 0, self.options.max_record_bytes, verify_payload=False)]

    def _rotate(self) -> None:
        """Seal the current file (fsync, index) and start the next one. Lock held."""
        cur = self._files[-1]
        with self._sync_lock:
            os.fdatasync(self._fd)
            os.close(self._fd)
            self._generation += 1
        cur.sealed = True
        offsets = (np.concatenate(self._offsets_current) if self._offsets_current
                   else np.empty(0, dtype=np.uint64))
        _write_index(self.directory, cur, offsets)
        # durable_version advances in _after_write: callbacks never run under the lock.
        nxt = self._create_file(cur.index + 1)
        self._files.append(nxt)
        self._fd = os.open(nxt.path, os.O_WRONLY | os.O_APPEND)
        self._offsets_current = []

    # -- appending ----------------------------------------------------------------------------
    def append(self, payload: bytes, epoch: int, *, version: int | None = None,
               msg_type: int = MSG_TYPE_DATA) -> int:
        """Append one record; returns its version (last_version + 1)."""
        return self.append_batch([payload], epoch, first_version=version, msg_type=msg_type)[1]

    def append_batch(self, payloads: Sequence[bytes], epoch: int, *,
                     first_version: int | None = None,
                     msg_type: int = MSG_TYPE_DATA) -> tuple[int, int]:
        """Append records in one write; returns (first_version, last_version)."""
        if not payloads:
            raise ValueError("append_batch: no payloads")
        for i, p in enumerate(payloads):
            if len(p) > self.options.max_record_bytes:
                raise ValueError(f"record {i} is {len(p)} bytes, above max_record_bytes"
                                 f" {self.options.max_record_bytes}")
        with self._lock:
            first = self.last_version + 1
            if epoch < self.last_epoch:
                raise VersionError(f"append: epoch {epoch} is older than the WAL's last"
                                   f" epoch {self.last_epoch}")
            if first_version is not None and first_version != first:
                raise VersionError(f"append: version {first_version} does not follow"
                                   f" the WAL's last version {self.last_version}")
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
                scan = _rec.scan(block, max_payload_len=self.options.max_record_bytes,
                                 expect_version=expect)
            if not scan.ok or scan.end != len(block):
                raise VersionError(f"append_encoded: block rejected at offset {scan.end}:"
                                   f" {scan.reason} (WAL last version {self.last_version})")
            if scan.count == 0:
                return expect, self.last_version
            if int(scan.versions[-1]) - int(scan.versions[0]) + 1 != scan.count:
                raise VersionError("append_encoded: versions in the block are not contiguous")
            epochs = scan.epochs
            if int(epochs[0]) < self.last_epoch or (scan.count > 1 and
                                                   bool((epochs[1:] < epochs[:-1]).any())):
                raise VersionError(f"append_encoded: epochs go backwards (WAL last epoch"
                                   f" {self.last_epoch}, block {int(epochs[0])}..)")
            self._write_block_locked(block, scan.offsets, expect, int(scan.versions[-1]),
                                     int(scan.epochs[-1]))
            last = self.last_version
        self._after_write(last)
        return expect, last

    def _write_block_locked(self, block: bytes, offsets, first: int, last: int,
                            epoch: int) -> None:
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
            raise WalError(f"{cur.path}: write failed at offset {cur.size}: {exc.strerror}",
                           cur.path, cur.size) from exc
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
            return self._durable_cond.wait_for(lambda: self.durable_version >= version,
                                               timeout_s)

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
            return [WalFile(f.index, f.path, f.size, f.first_version, f.last_version, f.sealed)
                    for f in self._files]

    def truncate_after(self, version: int) -> int:
        """Discard every record with a version above `version` (a deposed master's suffix
        the new master does not have, docs/design.md). Durable before it returns; returns the
        new last version. Refuses to cut below the first version still in the log."""
        with self._lock:
            if version >= self.last_version:
                return self.last_version
            if version < self.first_version - 1:
                raise VersionError(f"truncate_after({version}): the log starts at"
                                   f" {self.first_version}; records before it are recycled")
            with self._sync_lock:
                os.close(self._fd)
                self._generation += 1
            # Later files first, so a crash midway leaves a log that is still contiguous.
            while len(self._files) > 1 and (self._files[-1].first_version == 0
                                            or self._files[-1].first_version > version):
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
            for pos, _data, scan in _scan_file(cur, 0, 0, self.options.max_record_bytes,
                                               verify_payload=False):
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
            self.last_epoch = int(all_epochs[n - 1]) if n else _last_epoch_of(
                WalState(self.directory, self._files))
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
            self.first_version = next((f.first_version for f in self._files
                                       if f.first_version), 0)
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


# ---------------------------------------------------------------------------------------------
# Reader

@dataclass
class WalBlock:
    """Whole, verified records read from one file: `data[scan.offsets[i]:]` is record i."""

    file: WalFile
    offset: int      # where data starts in the file
    data: bytes
    scan: _rec.ScanResult  # offsets relative to data

class WalReader:
    """Reads a WAL directory from a given version, verifying every record it returns.

    Works on a WAL that a writer is appending to: a partial record at the very end of the last
    file is treated as not yet written. Corruption raises WalCorruptError (file, offset) after
    every good record before it has been yielded.
    """

    def __init__(self, directory: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES):
        self.directory = directory
        self.max_record_bytes = max_record_bytes

    def iter_blocks(self, from_version: int = 1) -> Iterator[WalBlock]:
        """Yield WalBlocks with whole records of versions >= from_version, in order."""
        expect = 0  # the version the next record must carry; 0 = not known yet
        for wf in list_wal_files(self.directory):
            if not wf.size:
                continue
            start = 0
            idx = _read_index(self.directory, wf) if wf.sealed else None
            if idx is not None:
                first, count, sample = idx
                if count and expect and first != expect:
                    raise WalCorruptError(wf.path, 0, f"version gap: file starts at version"
                                          f" {first}, expected {expect}", expect - 1)
                if count and first + count - 1 < from_version:
                    expect = first + count  # nothing wanted here: skip the file unread
                    continue
                if count and from_version > first:
                    k = min((from_version - first) // INDEX_STRIDE_RECORDS, len(sample) - 1)
                    start = int(sample[k])
                    expect = first + k * INDEX_STRIDE_RECORDS
            yield from self._iter_file(wf, start, expect, from_version)
            expect = self._next_expect

    def _iter_file(self, wf: WalFile, start: int, expect: int,
                   from_version: int) -> Iterator[WalBlock]:
        # A torn tail of the last file is where the log ends (for a live log: a record still
        # being written), so the scanner's TornTail return value is not an error here.
        for pos, data, scan in _scan_file(wf, start, expect, self.max_record_bytes):
            expect = int(scan.versions[-1]) + 1
            keep = scan.versions >= from_version
            if keep.any():
                i0 = int(np.argmax(keep))
                b0 = int(scan.offsets[i0])
                block = data[b0:scan.end]
                sub = _rec.scan(block, max_payload_len=self.max_record_bytes,
                                verify_payload=False)
                yield WalBlock(wf, pos + b0, block, sub)
        self._next_expect = expect

    def iter_records(self, from_version: int = 1) -> Iterator[_rec.Record]:
        """Yield every record with version >= from_version, in order."""
        for blk in self.iter_blocks(from_version):
            for off in blk.scan.offsets:
                yield _rec.decode_record(blk.data, int(off), self.max_record_bytes)


def read_records(directory: str, from_version: int = 1) -> list[_rec.Record]:
    """Convenience: all records from a version, as a list (small logs, tests)."""
    return list(WalReader(directory).iter_records(from_version))
