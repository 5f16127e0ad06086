"""The write-ahead log: a directory of size-rotated files of records (docs/wal-format.md).

Owns: WAL files on disk, their names, rotation, durability (fsync / group commit / none),
the per-file index that makes seeking by version cheap, tail inspection and repair, and
recycling of files whose records are all archived. Encoding and checksums are the Cython
record codec's (vrepl._core.record); this package never parses bytes itself.

Rules it enforces (from the seed, docs/design.md): versions start at 1 and go up by exactly
1 across the whole log; file indexes form one contiguous range; the last file is the one
being written. A torn or zero-filled tail of the LAST file is a crash artefact, reported
and truncated by repair(); any other fault is corruption, an error naming file and offset,
never skipped.

Modules, each importing only those before it: files.py (names, options, the file and state
types, safe listing, the per-file index), scan.py (chunked scans, torn tail or corruption,
inspect, repair, verify), writer.py (WalWriter), reader.py (WalReader, read_records). This
package's face re-exports their names: callers write `from vrepl.wal import WalWriter`.

Must not: touch anything outside its directory, hold a record in memory longer than the
caller's batch, or allocate more than the maximum record size for a single record it has not
verified.
"""

from vrepl._core import record as _rec  # vrepl/cli.py and tests read records through wal._rec
from vrepl.errors import TornTailError, VersionError, WalCorruptError, WalError
from vrepl.wal.files import (
    DEFAULT_GROUP_COMMIT_MS,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    HEADER_SIZE,
    INDEX_STRIDE_RECORDS,
    MSG_TYPE_DATA,
    READ_CHUNK_BYTES,
    WAL_NAME,
    Durability,
    TornTail,
    WalFile,
    WalOptions,
    WalState,
    _fsync_dir,  # the sync's WAL thread (vrepl/transport/storage.py)
    _read_index,  # the restore sender (vrepl/restore/sender.py)
    index_file_name,
    list_wal_files,
    open_regular,
    wal_file_name,
)
from vrepl.wal.reader import WalBlock, WalReader, read_records
from vrepl.wal.scan import inspect, repair, verify
from vrepl.wal.writer import WalWriter

__all__ = [
    "DEFAULT_GROUP_COMMIT_MS",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_RECORD_BYTES",
    "HEADER_SIZE",
    "INDEX_STRIDE_RECORDS",
    "MSG_TYPE_DATA",
    "READ_CHUNK_BYTES",
    "WAL_NAME",
    "Durability",
    "TornTail",
    "TornTailError",
    "VersionError",
    "WalBlock",
    "WalCorruptError",
    "WalError",
    "WalFile",
    "WalOptions",
    "WalReader",
    "WalState",
    "WalWriter",
    "index_file_name",
    "inspect",
    "list_wal_files",
    "open_regular",
    "read_records",
    "repair",
    "verify",
    "wal_file_name",
]
