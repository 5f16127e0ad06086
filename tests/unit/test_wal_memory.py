"""Hostile WAL files are inspected in bounded memory (chunks), never read whole."""
import os
import tracemalloc

import pytest

from vrepl import wal
from vrepl._core import record
from vrepl.errors import WalCorruptError

pytestmark = pytest.mark.timeout(60)
BIG = 256 * 1024 * 1024  # 32 read chunks, sparse on disk
BOUND = 6 * wal.READ_CHUNK_BYTES  # a few chunks in flight, whatever the file size


def _peak(fn):
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_large_garbage_file_rejected_in_bounded_memory(tmp_path):
    path = tmp_path / wal.wal_file_name(0)
    with open(path, "wb") as fh:
        fh.write(record.encode_record(1, 1, 1, b"good"))
        fh.truncate(BIG)  # a sparse 64 MiB: zeros after the first record...
        fh.seek(BIG - 10)
        fh.write(b"not zeros!")  # ...ending in non-zero bytes: corruption, not a torn tail

    def run():
        with pytest.raises(WalCorruptError) as err:
            wal.inspect(str(tmp_path))
        assert err.value.offset == len(record.encode_record(1, 1, 1, b"good"))
        assert err.value.last_good_version == 1

    assert _peak(run) < BOUND


def test_large_zero_tail_is_torn_in_bounded_memory(tmp_path):
    path = tmp_path / wal.wal_file_name(0)
    first = record.encode_batch(1, 1, 1, [b"a", b"b"])
    with open(path, "wb") as fh:
        fh.write(first)
        fh.truncate(BIG)

    def run():
        state = wal.inspect(str(tmp_path))
        assert state.torn_tail is not None
        assert state.torn_tail.offset == len(first) and state.torn_tail.last_good_version == 2

    assert _peak(run) < BOUND
    assert wal.repair(str(tmp_path)) is not None
    assert os.path.getsize(path) == len(first)
