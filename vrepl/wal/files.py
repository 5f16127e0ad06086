"""WAL files on disk: names, options, what a directory holds, and the per-file index
(docs/wal-format.md).

Owns: the file names (`000000000007.wal`, `.idx`), the limits and durability options, the
types describing files and a directory's state (WalFile, TornTail, WalState), listing a
directory's WAL files safely (regular files only, contiguous indexes), opening one for
reading without following a symlink or blocking on a FIFO, fsync of the directory, and the
per-file index of sampled record offsets (written when a file is sealed, checked before use).
Must not: parse or check records (vrepl.wal.scan does, through the Cython codec), write a WAL
file, or touch anything outside the directory it is given.
"""

from __future__ import annotations

import enum
import errno
import os
import re
import stat
import struct
from dataclasses import dataclass, field

import numpy as np

from vrepl._core import crc32c as _crc
from vrepl._core import record as _rec
from vrepl.durable import fsync_dir as _fsync_dir  # noqa: F401 (writer.py and vrepl.wal use it)
from vrepl.errors import WalCorruptError, WalError

HEADER_SIZE = _rec.HEADER_SIZE_BYTES
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_RECORD_BYTES = _rec.DEFAULT_MAX_PAYLOAD_BYTES
DEFAULT_GROUP_COMMIT_MS = 2
INDEX_STRIDE_RECORDS = 64  # one index entry every this many records
READ_CHUNK_BYTES = 8 * 1024 * 1024  # how much of a file a reader holds at once
MSG_TYPE_DATA = 1  # the default message type of an application record

WAL_NAME = re.compile(r"^(\d{12})\.wal$")
_IDX_MAGIC = b"VRIX"
_IDX_HEADER = struct.Struct("<4sIQQQQQ")  # magic, format, file index, first ver, count, size, stride


def wal_file_name(index: int) -> str:
    return f"{index:012d}.wal"


def index_file_name(index: int) -> str:
    return f"{index:012d}.idx"


class Durability(str, enum.Enum):
    """When an append is on stable storage (docs/wal-format.md §durability)."""

    FSYNC = "fsync"  # each append call returns only after fdatasync
    GROUP = "group"  # appends return after write(); one fdatasync covers many (per N ms or per batch)
    NONE = "none"  # the OS decides; fsync only when a file is sealed or closed


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
    first_version: int = 0  # 0 when the file holds no record
    last_version: int = 0
    sealed: bool = True  # every file but the last is sealed

    @property
    def count(self) -> int:
        return self.last_version - self.first_version + 1 if self.first_version else 0


@dataclass
class TornTail:
    path: str
    offset: int  # where the good data ends; repair truncates here
    last_good_version: int
    reason: str

    def describe(self) -> str:
        return (
            f"{self.path}: torn tail at offset {self.offset}: {self.reason}"
            f" (last good version {self.last_good_version})"
        )


@dataclass
class WalState:
    """What inspect() found in a WAL directory."""

    directory: str
    files: list[WalFile] = field(default_factory=list)
    torn_tail: TornTail | None = None
    last_epoch: int = 0  # epoch of the record with last_version (0 if the log is empty)

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
    head = _IDX_HEADER.pack(_IDX_MAGIC, 1, wf.index, wf.first_version, wf.count, wf.size, INDEX_STRIDE_RECORDS)
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
    if magic != _IDX_MAGIC or fmt != 1 or index != wf.index or size != wf.size or stride != INDEX_STRIDE_RECORDS:
        return None
    sample = np.frombuffer(body, dtype="<u8", offset=_IDX_HEADER.size, count=(len(body) - _IDX_HEADER.size - 4) // 8)
    if len(sample) != (count + stride - 1) // stride:
        return None
    return first, count, sample


# ---------------------------------------------------------------------------------------------
# Inspection: list the files, check contiguity, classify the end of the last file.


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
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
            raise WalCorruptError(
                cur.path, 0, f"file index gap: {wal_file_name(prev.index)} is followed by {wal_file_name(cur.index)}"
            )
    if files:
        files[-1].sealed = False
    return files
