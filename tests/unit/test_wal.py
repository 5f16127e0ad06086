"""WAL writer and reader (vrepl.wal): versions, epochs, rotation, per-file index, reading from
any version, durability policies, reopen, recycle and close."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from vrepl import wal
from vrepl._core import record as R
from vrepl._core.framebuf import FrameBuffer
from vrepl.errors import VersionError, VreplError, WalError

pytestmark = pytest.mark.timeout(60)

H = R.HEADER_SIZE_BYTES


def opts(**kw) -> wal.WalOptions:
    kw.setdefault("durability", "none")
    return wal.WalOptions(**kw)


def payload(v: int) -> bytes:
    return b"p%06d" % v          # 7 bytes: every record is H + 7 = 43 bytes


REC = H + len(payload(1))


def fill(directory, n, *, per_batch=1, epoch=1, **kw):
    """A WAL with versions 1..n of payload(v)."""
    w = wal.WalWriter(str(directory), opts(**kw))
    v = w.last_version + 1
    while v <= n:
        k = min(per_batch, n - v + 1)
        w.append_batch([payload(x) for x in range(v, v + k)], epoch)
        v += k
    w.close()
    return w


def names(directory):
    return sorted(os.listdir(directory))


def versions(directory, from_version=1):
    return [r.version for r in wal.WalReader(str(directory)).iter_records(from_version)]


# -------------------------------------------------------------------------------------------
# Appending


def test_versions_start_at_1_and_go_up_by_1(tmp_path):
    with wal.WalWriter(str(tmp_path), opts()) as w:
        assert w.last_version == 0
        assert w.append(b"a", 1) == 1
        assert w.append(b"b", 1) == 2
        assert w.append_batch([b"c", b"d", b"e"], 1) == (3, 5)
        assert w.append(b"f", 1, version=6) == 6
        assert w.append_batch([b"g"], 1, first_version=7) == (7, 7)
        assert w.last_version == 7
        assert w.first_version == 1
    recs = wal.read_records(str(tmp_path))
    assert [r.version for r in recs] == list(range(1, 8))
    assert [r.payload for r in recs] == [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]
    assert all(r.epoch == 1 and r.msg_type == wal.MSG_TYPE_DATA for r in recs)


def test_msg_type_and_epoch_are_stored(tmp_path):
    with wal.WalWriter(str(tmp_path), opts()) as w:
        w.append(b"x", 3, msg_type=9)
        w.append_batch([b"y", b"z"], 4, msg_type=200)
    recs = wal.read_records(str(tmp_path))
    assert [(r.msg_type, r.epoch) for r in recs] == [(9, 3), (200, 4), (200, 4)]


@pytest.mark.parametrize("bad", [0, 1, 3, 100])
def test_first_version_that_does_not_follow_raises(tmp_path, bad):
    with wal.WalWriter(str(tmp_path), opts()) as w:
        w.append(b"a", 1)
        with pytest.raises(VersionError):
            w.append(b"b", 1, version=bad)
        with pytest.raises(VersionError):
            w.append_batch([b"b", b"c"], 1, first_version=bad)
        assert w.last_version == 1
        assert w.append(b"b", 1) == 2
    assert versions(tmp_path) == [1, 2]
    assert issubclass(VersionError, VreplError) and issubclass(VersionError, ValueError)


def test_empty_batch_and_oversize_record_rejected(tmp_path):
    with wal.WalWriter(str(tmp_path), opts(max_record_bytes=100)) as w:
        with pytest.raises(ValueError):
            w.append_batch([], 1)
        with pytest.raises(ValueError):
            w.append(b"x" * 101, 1)
        assert w.append(b"x" * 100, 1) == 1
        assert w.last_version == 1


def test_epochs_cannot_go_backwards(tmp_path):
    with wal.WalWriter(str(tmp_path), opts()) as w:
        w.append(b"a", 5)
        w.append(b"b", 5)
        with pytest.raises(VersionError):
            w.append(b"c", 4)
        with pytest.raises(VersionError):
            w.append_batch([b"c"], 0)
        assert w.last_version == 2
        w.append(b"c", 6)
        assert w.last_epoch == 6
    # Still enforced after reopening.
    with wal.WalWriter(str(tmp_path), opts()) as w:
        assert w.last_epoch == 6
        with pytest.raises(VersionError):
            w.append(b"d", 5)
        assert w.append(b"d", 6) == 4
    assert [r.epoch for r in wal.read_records(str(tmp_path))] == [5, 5, 6, 6]


def test_last_epoch_after_reopen_with_missing_index_and_empty_last_file(tmp_path):
    """The writer's last_epoch is the epoch of the newest record, however inspect found it.

    Here: file 0 (epoch 1) has lost its index, file 1 (epoch 2) has one, and the last file is
    empty (e.g. a crash right after rotation, or a torn tail repaired down to nothing)."""
    o = opts(max_file_bytes=10 * REC)
    with wal.WalWriter(str(tmp_path), o) as w:
        for v in range(1, 11):
            w.append(payload(v), 1)
        for v in range(11, 21):
            w.append(payload(v), 2)
        w.append(payload(21), 2)
    os.truncate(tmp_path / wal.wal_file_name(2), 0)
    os.unlink(tmp_path / wal.index_file_name(0))
    with wal.WalWriter(str(tmp_path), o) as w:
        assert w.last_version == 20
        assert w.last_epoch == 2
        with pytest.raises(VersionError):
            w.append(payload(21), 1)


def test_append_encoded_block(tmp_path):
    with wal.WalWriter(str(tmp_path), opts()) as w:
        w.append(b"first", 1)
        block = R.encode_batch(1, 2, 1, [b"two", b"three", b"four"])
        assert w.append_encoded(block) == (2, 4)
        assert w.last_version == 4
        # With a scan (as the frame buffer hands it out).
        fb = FrameBuffer()
        fb.feed(R.encode_batch(1, 5, 2, [b"five", b"six"]))
        blk, scan = fb.take_block()
        assert w.append_encoded(blk, scan) == (5, 6)
        assert w.last_epoch == 2
        assert w.append(b"seven", 2) == 7
    recs = wal.read_records(str(tmp_path))
    assert [r.version for r in recs] == list(range(1, 8))
    assert [r.payload for r in recs] == [b"first", b"two", b"three", b"four", b"five",
                                         b"six", b"seven"]


@pytest.mark.parametrize("first", [1, 2, 4, 1000])
def test_append_encoded_block_that_does_not_follow_raises(tmp_path, first):
    with wal.WalWriter(str(tmp_path), opts()) as w:
        w.append_batch([b"a", b"b"], 1)
        block = R.encode_batch(1, first, 1, [b"x", b"y"])
        with pytest.raises(VersionError):
            w.append_encoded(block)
        # The same block with a (lying) scan is rejected too.
        with pytest.raises(VersionError):
            w.append_encoded(block, R.scan(block))
        assert w.last_version == 2
    assert versions(tmp_path) == [1, 2]
    assert os.path.getsize(tmp_path / "000000000000.wal") == 2 * (H + 1)


def test_append_encoded_rejects_gap_inside_block_and_bad_bytes(tmp_path):
    with wal.WalWriter(str(tmp_path), opts()) as w:
        w.append(b"a", 1)
        gap = R.encode_record(1, 2, 1, b"b") + R.encode_record(1, 4, 1, b"c")
        with pytest.raises(VersionError):
            w.append_encoded(gap)
        torn = R.encode_batch(1, 2, 1, [b"b", b"c"])[:-1]
        with pytest.raises(VersionError):
            w.append_encoded(torn)
        flipped = bytearray(R.encode_batch(1, 2, 1, [b"b", b"c"]))
        flipped[-1] ^= 1
        with pytest.raises(VersionError):
            w.append_encoded(bytes(flipped))
        assert w.last_version == 1
        assert w.append(b"b", 1) == 2
    assert versions(tmp_path) == [1, 2]


def test_append_encoded_cannot_take_epoch_backwards(tmp_path):
    """Epochs never go backwards in the log, whichever append path writes them."""
    with wal.WalWriter(str(tmp_path), opts()) as w:
        w.append(b"a", 5)
        block = R.encode_batch(1, 2, 4, [b"old epoch"])
        with pytest.raises(VersionError):
            w.append_encoded(block)
        assert w.last_epoch == 5
        assert w.last_version == 1


def test_concurrent_appends_are_contiguous(tmp_path):
    w = wal.WalWriter(str(tmp_path), opts(max_file_bytes=4096))
    got = []
    lock = threading.Lock()

    def work(tid):
        for i in range(100):
            first, last = w.append_batch([b"t%d-%d" % (tid, i)] * 3, 1)
            with lock:
                got.append((first, last))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    got.sort()
    assert got == [(1 + 3 * i, 3 + 3 * i) for i in range(400)]
    assert versions(tmp_path) == list(range(1, 1201))


# -------------------------------------------------------------------------------------------
# Rotation and index files


def test_rotation_creates_contiguous_files_and_indexes(tmp_path):
    max_file = 10 * REC
    fill(tmp_path, 95, max_file_bytes=max_file)
    listing = names(tmp_path)
    wal_files = [n for n in listing if n.endswith(".wal")]
    idx_files = [n for n in listing if n.endswith(".idx")]
    assert wal_files == [wal.wal_file_name(i) for i in range(10)]
    assert wal_files[0] == "000000000000.wal" and wal_files[1] == "000000000001.wal"
    # Every sealed file (all but the last) has an index; the last has none.
    assert idx_files == [wal.index_file_name(i) for i in range(9)]
    assert not any(n.endswith(".tmp") for n in listing)
    state = wal.inspect(str(tmp_path))
    assert [f.index for f in state.files] == list(range(10))
    for i, f in enumerate(state.files):
        assert f.size <= max_file
        assert f.first_version == 10 * i + 1
        assert f.last_version == min(10 * i + 10, 95)
        assert f.sealed == (i < 9)
    assert state.first_version == 1 and state.last_version == 95
    assert state.torn_tail is None


def test_rotation_keeps_batches_whole(tmp_path):
    fill(tmp_path, 100, per_batch=7, max_file_bytes=20 * REC)
    state = wal.inspect(str(tmp_path))
    for f in state.files:
        assert f.size <= 20 * REC
        assert f.count % 7 == 0 or f is state.files[-1]
    assert versions(tmp_path) == list(range(1, 101))


def test_block_bigger_than_max_file_gets_its_own_file(tmp_path):
    with wal.WalWriter(str(tmp_path), opts(max_file_bytes=100)) as w:
        w.append(b"x", 1)
        w.append(b"y" * 500, 1)
        w.append(b"z", 1)
    state = wal.inspect(str(tmp_path))
    assert [(f.first_version, f.last_version) for f in state.files] == [(1, 1), (2, 2), (3, 3)]
    assert versions(tmp_path) == [1, 2, 3]


def _check_every_from_version(directory, n):
    reader = wal.WalReader(str(directory))
    for start in range(1, n + 2):
        got = [r.version for r in reader.iter_records(start)]
        assert got == list(range(start, n + 1)), start
    assert [r.version for r in reader.iter_records(0)] == list(range(1, n + 1))
    assert [r.version for r in reader.iter_records(n + 100)] == []


def test_iter_records_from_every_version_small_files(tmp_path):
    # Fewer records per file than the index stride.
    fill(tmp_path, 60, max_file_bytes=7 * REC)
    assert len(wal.inspect(str(tmp_path)).files) == 9
    _check_every_from_version(tmp_path, 60)
    recs = wal.read_records(str(tmp_path), 30)
    assert [r.payload for r in recs] == [payload(v) for v in range(30, 61)]


def test_iter_records_from_every_version_files_larger_than_index_stride(tmp_path):
    # More than INDEX_STRIDE_RECORDS per file, so the reader seeks inside sealed files by
    # their index, in the first file and in later ones.
    per_file = 3 * wal.INDEX_STRIDE_RECORDS + 10
    n = 3 * per_file + 50
    fill(tmp_path, n, per_batch=1, max_file_bytes=per_file * REC)
    state = wal.inspect(str(tmp_path))
    assert len(state.files) == 4
    assert state.files[1].count == per_file
    _check_every_from_version(tmp_path, n)


def test_iter_records_seek_into_second_file(tmp_path):
    """Smallest case of the one above: read from a version past the first index sample of the
    second file."""
    per_file = 2 * wal.INDEX_STRIDE_RECORDS
    fill(tmp_path, 2 * per_file + 1, max_file_bytes=per_file * REC)
    start = per_file + wal.INDEX_STRIDE_RECORDS + 1   # in file 1, after its second sample
    assert versions(tmp_path, start) == list(range(start, 2 * per_file + 2))


def test_iter_blocks_offsets_are_relative_to_block(tmp_path):
    fill(tmp_path, 50, per_batch=5, max_file_bytes=12 * REC)
    seen = []
    for blk in wal.WalReader(str(tmp_path)).iter_blocks(17):
        assert isinstance(blk.file, wal.WalFile)
        block, scan = blk.data, blk.scan
        assert scan.ok and scan.end == len(block)
        assert int(scan.offsets[0]) == 0
        # blk.offset is where the block starts in its file.
        with open(blk.file.path, "rb") as fh:
            fh.seek(blk.offset)
            assert fh.read(len(block)) == block
        for off in scan.offsets.tolist():
            rec = R.decode_record(block, off)
            assert rec.payload == payload(rec.version)
            seen.append(rec.version)
    assert seen == list(range(17, 51))


@pytest.mark.parametrize("damage", ["delete", "flip", "truncate", "garbage", "empty", "stale"])
def test_reading_with_a_missing_or_bad_index_still_works(tmp_path, damage):
    per_file = 2 * wal.INDEX_STRIDE_RECORDS + 5
    n = 2 * per_file + 20
    fill(tmp_path, n, max_file_bytes=per_file * REC)
    idx0 = tmp_path / wal.index_file_name(0)
    idx1 = tmp_path / wal.index_file_name(1)
    assert idx0.exists() and idx1.exists()
    for idx in (idx0, idx1):
        body = idx.read_bytes()
        if damage == "delete":
            idx.unlink()
        elif damage == "flip":
            b = bytearray(body)
            b[len(b) // 2] ^= 0x20
            idx.write_bytes(bytes(b))
        elif damage == "truncate":
            idx.write_bytes(body[:len(body) - 9])
        elif damage == "garbage":
            idx.write_bytes(b"not an index at all" * 5)
        elif damage == "empty":
            idx.write_bytes(b"")
    if damage == "stale":
        # Each file gets the other's index (valid checksum, wrong file index and offsets).
        b0, b1 = idx0.read_bytes(), idx1.read_bytes()
        idx0.write_bytes(b1)
        idx1.write_bytes(b0)
    state = wal.inspect(str(tmp_path))
    assert [(f.first_version, f.last_version) for f in state.files] == [
        (1, per_file), (per_file + 1, 2 * per_file), (2 * per_file + 1, n)]
    reader = wal.WalReader(str(tmp_path))
    for start in (1, 2, 64, 65, 66, 129, per_file, per_file + 1, per_file + 70, 2 * per_file,
                  2 * per_file + 1, n):
        assert [r.version for r in reader.iter_records(start)] == list(range(start, n + 1)), \
            start
    # A writer opens and continues on top of it.
    with wal.WalWriter(str(tmp_path), opts(max_file_bytes=per_file * REC)) as w:
        assert w.last_version == n
        assert w.append(payload(n + 1), 1) == n + 1
    assert wal.verify(str(tmp_path)).last_version == n + 1


def test_inspect_and_read_allocate_little(tmp_path):
    """Opening and reading a small WAL with max_record_bytes=1 MiB allocates nothing near the
    64 MiB default file size (issue: no allocation larger than the maximum record size)."""
    import tracemalloc
    fill(tmp_path, 200, max_file_bytes=20 * REC)
    mib = 1024 * 1024
    tracemalloc.start()
    try:
        wal.inspect(str(tmp_path), max_record_bytes=mib)
        inspect_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        list(wal.WalReader(str(tmp_path), max_record_bytes=mib).iter_records(150))
        read_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert inspect_peak < 16 * mib
    assert read_peak < 16 * mib


def test_index_written_for_sealed_file_matches_contents(tmp_path):
    per_file = 3 * wal.INDEX_STRIDE_RECORDS
    fill(tmp_path, per_file + 1, max_file_bytes=per_file * REC)
    import struct
    body = (tmp_path / wal.index_file_name(0)).read_bytes()
    magic, fmt, index, first, count, size, stride = struct.unpack_from("<4sIQQQQQ", body)
    assert magic == b"VRIX" and index == 0 and first == 1 and count == per_file
    assert size == per_file * REC and stride == wal.INDEX_STRIDE_RECORDS
    sample = np.frombuffer(body, dtype="<u8", offset=struct.calcsize("<4sIQQQQQ"),
                           count=(len(body) - struct.calcsize("<4sIQQQQQ") - 4) // 8)
    assert sample.tolist() == [k * stride * REC for k in range(3)]


# -------------------------------------------------------------------------------------------
# Durability


def test_durability_fsync_reports_every_append(tmp_path):
    seen = []
    with wal.WalWriter(str(tmp_path), opts(durability="fsync"), on_durable=seen.append) as w:
        for i in range(1, 6):
            v = w.append(b"x", 1)
            assert w.durable_version == v == i
        w.append_batch([b"a", b"b"], 1)
        assert w.durable_version == 7
        assert w.wait_durable(7, timeout_s=0)
    assert seen == [1, 2, 3, 4, 5, 7]


def test_durability_group_zero_is_one_sync_per_call(tmp_path):
    seen = []
    with wal.WalWriter(str(tmp_path), opts(durability="group", group_commit_ms=0),
                       on_durable=seen.append) as w:
        assert w.append_batch([b"a", b"b", b"c"], 1) == (1, 3)
        assert w.durable_version == 3
        w.append(b"d", 1)
        assert w.wait_durable(4, timeout_s=0)
    assert seen == [3, 4]


def test_durability_group_with_flusher(tmp_path):
    seen = []
    cond = threading.Event()

    def on_durable(v):
        seen.append((v, threading.current_thread().name))
        if v >= 50:
            cond.set()

    w = wal.WalWriter(str(tmp_path), opts(durability="group", group_commit_ms=5),
                      on_durable=on_durable)
    try:
        for i in range(50):
            w.append(b"x%d" % i, 1)
        assert w.wait_durable(50, timeout_s=10)
        assert w.durable_version >= 50
        assert cond.wait(10)
        vs = [v for v, _ in seen]
        assert vs == sorted(vs) and vs[-1] == 50
        assert len(set(vs)) == len(vs)
        # Called from the flusher thread, not from the appending one.
        assert all(name != threading.current_thread().name for _, name in seen)
        assert not w.wait_durable(51, timeout_s=0.05)
    finally:
        w.close()
    assert versions(tmp_path) == list(range(1, 51))


def test_durability_none(tmp_path):
    seen = []
    with wal.WalWriter(str(tmp_path), opts(durability="none"), on_durable=seen.append) as w:
        w.append(b"a", 1)
        w.append_batch([b"b", b"c"], 1)
        assert w.durable_version == 3
        assert w.wait_durable(3, timeout_s=0)
        assert not w.wait_durable(4, timeout_s=0.01)
    assert seen == [1, 3]


def test_explicit_sync(tmp_path):
    w = wal.WalWriter(str(tmp_path), opts(durability="group", group_commit_ms=0))
    w.append(b"a", 1)
    assert w.sync() == 1
    w.close()


def test_close_with_group_commit_flusher_is_prompt(tmp_path):
    """close() right after an append must not hang waiting for the flusher thread."""
    w = wal.WalWriter(str(tmp_path), opts(durability="group", group_commit_ms=50))
    w.append(b"a", 1)   # wakes the flusher, which then sleeps 50 ms to gather a group
    done = threading.Event()

    def closer():
        w.close()
        done.set()

    t0 = time.monotonic()
    threading.Thread(target=closer, daemon=True).start()
    assert done.wait(2.0), "WalWriter.close() took more than 2 s"
    assert time.monotonic() - t0 < 2.0
    assert w.durable_version == 1
    assert w._flusher is None or not w._flusher.is_alive()


def test_options_validation():
    with pytest.raises(ValueError):
        wal.WalOptions(max_file_bytes=10)
    with pytest.raises(ValueError):
        wal.WalOptions(max_record_bytes=0)
    with pytest.raises(ValueError):
        wal.WalOptions(max_record_bytes=2**32)
    with pytest.raises(ValueError):
        wal.WalOptions(group_commit_ms=-1)
    with pytest.raises(ValueError):
        wal.WalOptions(durability="sometimes")
    assert wal.WalOptions(durability="fsync").durability is wal.Durability.FSYNC


# -------------------------------------------------------------------------------------------
# Reopen, recycle, close


def test_reopen_continues_versions(tmp_path):
    fill(tmp_path, 25, max_file_bytes=10 * REC, epoch=3)
    with wal.WalWriter(str(tmp_path), opts(max_file_bytes=10 * REC)) as w:
        assert w.last_version == 25
        assert w.first_version == 1
        assert w.last_epoch == 3
        assert w.durable_version == 25
        assert w.append(payload(26), 3) == 26
        assert w.append_batch([payload(27), payload(28)], 4) == (27, 28)
        with pytest.raises(VersionError):
            w.append(b"x", 4, version=28)
    with wal.WalWriter(str(tmp_path), opts(max_file_bytes=10 * REC)) as w:
        assert w.last_version == 28 and w.last_epoch == 4
        for v in range(29, 41):
            assert w.append(payload(v), 4) == v
    state = wal.verify(str(tmp_path))
    assert state.last_version == 40 and state.torn_tail is None
    assert [f.index for f in state.files] == list(range(len(state.files)))
    _check_every_from_version(tmp_path, 40)
    assert [r.payload for r in wal.read_records(str(tmp_path))] == [payload(v)
                                                                   for v in range(1, 41)]


def test_reopen_empty_directory_and_create_false(tmp_path):
    with wal.WalWriter(str(tmp_path / "new"), opts()) as w:
        assert w.last_version == 0
    assert names(tmp_path / "new") == ["000000000000.wal"]
    with wal.WalWriter(str(tmp_path / "new"), opts()) as w:
        assert w.append(b"a", 1) == 1
    with pytest.raises(WalError):
        wal.WalWriter(str(tmp_path / "missing"), opts(), create=False)
    assert not (tmp_path / "missing").exists()


def test_recycle_removes_only_sealed_files_below_version(tmp_path):
    fill(tmp_path, 55, max_file_bytes=10 * REC)   # files: 1-10, 11-20, ..., 51-55
    w = wal.WalWriter(str(tmp_path), opts(max_file_bytes=10 * REC))
    try:
        assert w.recycle(1) == []
        assert w.recycle(10) == []              # file 0 still holds version 10
        removed = w.recycle(11)
        assert removed == [str(tmp_path / wal.wal_file_name(0))]
        assert not (tmp_path / wal.index_file_name(0)).exists()
        assert w.first_version == 11
        removed = w.recycle(35)                 # files 1 (11-20) and 2 (21-30); not 31-40
        assert removed == [str(tmp_path / wal.wal_file_name(i)) for i in (1, 2)]
        assert w.first_version == 31
        # Never the last (open) file, even when everything is below the version.
        removed = w.recycle(10**6)
        assert removed == [str(tmp_path / wal.wal_file_name(i)) for i in (3, 4)]
        assert [f.index for f in w.files] == [5]
        assert w.first_version == 51
        assert w.append(payload(56), 1) == 56
    finally:
        w.close()
    listing = names(tmp_path)
    assert listing == [wal.wal_file_name(5)]
    assert versions(tmp_path, 1) == list(range(51, 57))
    assert versions(tmp_path, 53) == list(range(53, 57))
    with wal.WalWriter(str(tmp_path), opts(max_file_bytes=10 * REC)) as w:
        assert w.first_version == 51 and w.last_version == 56
        assert w.append(payload(57), 1) == 57
    assert wal.verify(str(tmp_path)).first_version == 51


def test_recycle_oldest_first_keeps_indexes_contiguous(tmp_path):
    fill(tmp_path, 40, max_file_bytes=10 * REC)
    with wal.WalWriter(str(tmp_path), opts(max_file_bytes=10 * REC)) as w:
        w.recycle(21)
        state = wal.inspect(str(tmp_path))
        assert [f.index for f in state.files] == [2, 3]
        assert state.first_version == 21
    assert versions(tmp_path) == list(range(21, 41))


def test_close_is_idempotent_and_append_after_close_fails(tmp_path):
    w = wal.WalWriter(str(tmp_path), opts(durability="fsync"))
    w.append(b"a", 1)
    w.close()
    w.close()
    with pytest.raises(WalError):
        w.append(b"b", 1)
    with pytest.raises(WalError):
        w.append_encoded(R.encode_record(1, 2, 1, b"b"))
    assert versions(tmp_path) == [1]
    with wal.WalWriter(str(tmp_path), opts()) as w2:
        assert w2.append(b"b", 1) == 2


def test_reader_on_live_log_sees_whole_records_only(tmp_path):
    with wal.WalWriter(str(tmp_path), opts()) as w:
        w.append_batch([b"a", b"b"], 1)
        path = tmp_path / wal.wal_file_name(0)
        # A record being written: only part of it is in the file yet.
        partial = R.encode_record(1, 3, 1, b"c" * 100)[:50]
        with open(path, "ab") as fh:
            fh.write(partial)
        assert versions(tmp_path) == [1, 2]


def test_file_name_helpers():
    assert wal.wal_file_name(0) == "000000000000.wal"
    assert wal.wal_file_name(12) == "000000000012.wal"
    assert wal.index_file_name(3) == "000000000003.idx"
    assert wal.WAL_NAME.match("000000000007.wal")
    assert not wal.WAL_NAME.match("7.wal")
