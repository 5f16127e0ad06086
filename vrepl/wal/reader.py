"""Reading a WAL: WalReader yields whole, verified records from a version on, also from a
log a writer is appending to (docs/wal-format.md, docs/embedding.md).

Owns: seeking to a version with the per-file index, yielding blocks of whole records
(WalBlock) and decoded records, and read_records() for small logs.
Must not: write anything, or return a record it has not verified (corruption raises
WalCorruptError after every good record before it was yielded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from vrepl._core import record as _rec
from vrepl.errors import WalCorruptError
from vrepl.wal.files import DEFAULT_MAX_RECORD_BYTES, INDEX_STRIDE_RECORDS, WalFile, _read_index, list_wal_files
from vrepl.wal.scan import _scan_file


@dataclass
class WalBlock:
    """Whole, verified records read from one file: `data[scan.offsets[i]:]` is record i."""

    file: WalFile
    offset: int  # where data starts in the file
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
                    raise WalCorruptError(
                        wf.path, 0, f"version gap: file starts at version {first}, expected {expect}", expect - 1
                    )
                if count and first + count - 1 < from_version:
                    expect = first + count  # nothing wanted here: skip the file unread
                    continue
                if count and from_version > first:
                    k = min((from_version - first) // INDEX_STRIDE_RECORDS, len(sample) - 1)
                    start = int(sample[k])
                    expect = first + k * INDEX_STRIDE_RECORDS
            yield from self._iter_file(wf, start, expect, from_version)
            expect = self._next_expect

    def _iter_file(self, wf: WalFile, start: int, expect: int, from_version: int) -> Iterator[WalBlock]:
        # A torn tail of the last file is where the log ends (for a live log: a record still
        # being written), so the scanner's TornTail return value is not an error here.
        for pos, data, scan in _scan_file(wf, start, expect, self.max_record_bytes):
            expect = int(scan.versions[-1]) + 1
            keep = scan.versions >= from_version
            if keep.any():
                i0 = int(np.argmax(keep))
                b0 = int(scan.offsets[i0])
                block = data[b0 : scan.end]
                sub = _rec.scan(block, max_payload_len=self.max_record_bytes, verify_payload=False)
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
