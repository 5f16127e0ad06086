"""Scanning WAL files: what a directory holds, where its records stop and why, repair and
verification (docs/wal-format.md §torn tails).

Owns: scanning a file in bounded chunks with the Cython record codec, telling a torn tail of
the last file (a crash artefact: returned, and cut by repair()) from corruption (raised,
naming file and offset), inspect() (the shape of a directory: versions, epochs, the state of
its last file), repair() and verify().
Must not: write anything but repair()'s truncation of a torn tail, hold more than one chunk
plus one record in memory, or skip a record it cannot verify.
"""

from __future__ import annotations

import logging
import os
import struct
from typing import Iterator

import numpy as np

from vrepl._core import record as _rec
from vrepl.errors import WalCorruptError
from vrepl.wal.files import (
    DEFAULT_MAX_RECORD_BYTES,
    HEADER_SIZE,
    READ_CHUNK_BYTES,
    TornTail,
    WalFile,
    WalState,
    _read_index,
    list_wal_files,
    open_regular,
)

log = logging.getLogger("vrepl.wal")


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


def _classify_stop(
    fh,
    head: bytes,
    scan_status: int,
    reason: str | None,
    path: str,
    file_off: int,
    is_last: bool,
    max_record: int,
    last_good: int,
) -> TornTail:
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


def _scan_file(wf: WalFile, start: int, expect: int, max_record: int, verify_payload: bool = True):
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
            scan = _rec.scan(
                data, max_payload_len=max_record, verify_payload=verify_payload, expect_version=expect, contiguous=True
            )
            if scan.count:
                expect = int(scan.versions[-1]) + 1
                yield pos, data, scan
            if not scan.ok and not (scan.status == _rec.STATUS_INCOMPLETE and not at_eof):
                last_good = int(scan.versions[-1]) if scan.count else max(expect - 1, 0)
                return _classify_stop(
                    fh,
                    data[scan.end :],
                    scan.status,
                    scan.reason,
                    wf.path,
                    pos + scan.end,
                    not wf.sealed,
                    max_record,
                    last_good,
                )
            # An incomplete record whose header passed its checks is at most
            # HEADER_SIZE + max_record bytes, so the carry stays bounded.
            carry = data[scan.end :]
            pos += scan.end
            if at_eof:
                return None


def _check_records(wf: WalFile, pos: int, scan, prev_epoch: int) -> None:
    """What a WAL record must be beyond its checksums (docs/wal-format.md §Record): a
    version of at least 1, a message type of WAL data (1..15; 16..63 are replication
    messages on the wire), and an epoch never below the one before it. A record that is not
    is corruption, raised at that record (`pos` = file offset of the scan)."""
    if int(scan.versions[0]) < 1:
        raise WalCorruptError(wf.path, pos + int(scan.offsets[0]), "version 0: versions start at 1", 0)
    types = scan.msg_types
    bad = np.flatnonzero((types < 1) | (types > 15))
    if len(bad):
        i = int(bad[0])
        version = int(scan.versions[i])
        raise WalCorruptError(
            wf.path,
            pos + int(scan.offsets[i]),
            f"msg_type {int(types[i])} at version {version} is not a WAL data type (1..15)",
            version - 1,
        )
    epochs = scan.epochs
    if int(epochs[0]) < prev_epoch:
        i, before = 0, prev_epoch
    else:
        back = np.flatnonzero(epochs[1:] < epochs[:-1])
        if not len(back):
            return
        i = int(back[0]) + 1
        before = int(epochs[i - 1])
    version = int(scan.versions[i])
    raise WalCorruptError(
        wf.path,
        pos + int(scan.offsets[i]),
        f"epoch goes back: version {version} has epoch {int(epochs[i])} after epoch {before}",
        version - 1,
    )


def inspect(
    directory: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, verify_all: bool = False, through_version: int = 0
) -> WalState:
    """Read a WAL directory's shape and the state of its last file.

    Sealed files are checked by their index (or a scan if it is missing or stale); with
    verify_all every byte of every file is verified, and with through_version > 0 as well
    only the files up to the one holding that version (later ones are not read; the state
    then describes that prefix). Raises WalCorruptError for corruption; a torn tail of the
    last file is returned in WalState.torn_tail, not raised.
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
                    raise WalCorruptError(
                        wf.path, 0, f"version gap: file starts at version {first}, expected {expect}", expect - 1
                    )
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
            if verify_all:
                _check_records(wf, _pos, scan, epoch_of_last)
            if not wf.first_version:
                wf.first_version = int(scan.versions[0])
            wf.last_version = int(scan.versions[-1])
            expect = wf.last_version + 1
            epoch_of_last = int(scan.epochs[-1])
        if verify_all and through_version and wf.last_version >= through_version:
            break  # `vrepl replay --to-version N` reads nothing after N (docs/restore.md §8)
    state.last_epoch = epoch_of_last or _last_epoch_of(state)
    return state


def _last_epoch_of(state: WalState) -> int:
    """Epoch of the last record, read from the last file that holds records."""
    for wf in reversed(state.files):
        if wf.last_version:
            epoch = 0
            try:
                for _pos, _data, scan in _scan_file(wf, 0, 0, DEFAULT_MAX_RECORD_BYTES, verify_payload=False):
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
