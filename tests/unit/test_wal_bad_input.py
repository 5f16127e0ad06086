"""WAL bad input: torn and zero-filled tails, flipped bits, oversize headers, files that are
not WALs, gaps in file indexes and versions, missing directories.

Each case checks the error type, that the message names the file and the offset, and that
nothing before the fault is lost."""

from __future__ import annotations

import os
import struct
import tracemalloc

import pytest

from vrepl import wal
from vrepl._core import record as R
from vrepl._core.crc32c import crc32c
from vrepl.errors import TornTailError, VreplError, WalCorruptError, WalError

pytestmark = pytest.mark.timeout(60)

H = R.HEADER_SIZE_BYTES
MiB = 1024 * 1024
PER_FILE = 10


def payload(v: int) -> bytes:
    return b"p%06d" % v


REC = H + len(payload(1))       # 43 bytes per record


def opts(**kw):
    kw.setdefault("durability", "none")
    kw.setdefault("max_file_bytes", PER_FILE * REC)
    return wal.WalOptions(**kw)


def fill(d, n, epoch=1):
    """Versions 1..n, PER_FILE records per file (so file i holds 10*i+1 .. 10*i+10)."""
    with wal.WalWriter(str(d), opts()) as w:
        for v in range(w.last_version + 1, n + 1):
            w.append(payload(v), epoch)


def wal_path(d, i):
    return str(d / wal.wal_file_name(i))


def flip(path, offset, bit=0):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([b ^ (1 << bit)]))


def read_until_error(d, from_version=1, **kw):
    """Versions the reader yields before it raises; and the error (or None)."""
    got = []
    try:
        for rec in wal.WalReader(str(d), **kw).iter_records(from_version):
            assert rec.payload == payload(rec.version)
            got.append(rec.version)
    except WalError as exc:
        return got, exc
    return got, None


def assert_names(err, path, offset):
    assert err.path == path
    assert err.offset == offset
    msg = str(err)
    assert path in msg
    assert f"offset {offset}" in msg
    assert "\n" not in msg


def huge_header(version, epoch=1):
    body = b"VRWL" + struct.pack("<BBHQQII", 1, 1, 0, version, epoch, 0xFFFFFFFF, 0)
    return body + struct.pack("<I", crc32c(body))


# -------------------------------------------------------------------------------------------
# Torn tail of the last file


def test_truncated_last_file_is_a_repairable_torn_tail(tmp_path):
    fill(tmp_path, 25)                     # files 0, 1 (sealed), 2 holds 21..25
    last = wal_path(tmp_path, 2)
    os.truncate(last, 4 * REC + 20)        # record 25 cut in the middle
    state = wal.inspect(str(tmp_path))
    tail = state.torn_tail
    assert tail is not None
    assert tail.path == last
    assert tail.offset == 4 * REC
    assert tail.last_good_version == 24
    assert tail.reason
    assert last in tail.describe() and f"offset {4 * REC}" in tail.describe()
    assert state.last_version == 24
    # Readers stop at the torn tail: nothing before it lost.
    got, err = read_until_error(tmp_path)
    assert err is None and got == list(range(1, 25))
    # A writer refuses to open until repaired.
    with pytest.raises(TornTailError) as ei:
        wal.WalWriter(str(tmp_path), opts())
    err = ei.value
    assert isinstance(err, WalError) and isinstance(err, VreplError) and isinstance(err, OSError)
    assert_names(err, last, 4 * REC)
    assert err.last_good_version == 24
    assert "24" in str(err)
    assert os.path.getsize(last) == 4 * REC + 20   # refusing did not touch the file
    # repair_tail=True truncates and appends continue from last_good_version + 1.
    with wal.WalWriter(str(tmp_path), opts(), repair_tail=True) as w:
        assert w.last_version == 24
        assert os.path.getsize(last) == 4 * REC
        assert w.append(payload(25), 1) == 25
        assert w.append(payload(26), 1) == 26
    assert wal.verify(str(tmp_path)).last_version == 26
    assert [r.version for r in wal.read_records(str(tmp_path))] == list(range(1, 27))


def test_repair_function_truncates_and_is_idempotent(tmp_path):
    fill(tmp_path, 15)
    last = wal_path(tmp_path, 1)
    os.truncate(last, 3 * REC + 1)
    tail = wal.repair(str(tmp_path))
    assert tail is not None
    assert (tail.path, tail.offset, tail.last_good_version) == (last, 3 * REC, 13)
    assert os.path.getsize(last) == 3 * REC
    assert wal.repair(str(tmp_path)) is None
    assert wal.inspect(str(tmp_path)).torn_tail is None
    with wal.WalWriter(str(tmp_path), opts()) as w:
        assert w.append(payload(14), 1) == 14


def test_every_truncation_of_the_last_file(tmp_path):
    fill(tmp_path, 14)                     # last file (index 1) holds 11..14
    last = wal_path(tmp_path, 1)
    with open(last, "rb") as fh:
        original = fh.read()
    assert len(original) == 4 * REC
    for cut in range(len(original) + 1):
        with open(last, "wb") as fh:
            fh.write(original[:cut])
        whole = cut // REC
        state = wal.inspect(str(tmp_path))
        if cut % REC == 0:
            assert state.torn_tail is None, cut
        else:
            assert state.torn_tail is not None, cut
            assert state.torn_tail.offset == whole * REC, cut
            assert state.torn_tail.last_good_version == 10 + whole, cut
        got, err = read_until_error(tmp_path)
        assert err is None and got == list(range(1, 11 + whole)), cut
    # Cutting the last file to nothing: the log ends at the sealed file.
    with open(last, "wb") as fh:
        fh.write(b"")
    with wal.WalWriter(str(tmp_path), opts()) as w:
        assert w.last_version == 10
        assert w.append(payload(11), 1) == 11


def test_truncated_sealed_file_is_corruption_not_torn_tail(tmp_path):
    fill(tmp_path, 25)
    sealed = wal_path(tmp_path, 1)
    os.truncate(sealed, 5 * REC + 7)
    (tmp_path / wal.index_file_name(1)).unlink(missing_ok=True)
    with pytest.raises(WalCorruptError) as ei:
        wal.inspect(str(tmp_path))
    assert_names(ei.value, sealed, 5 * REC)
    assert ei.value.last_good_version == 15
    with pytest.raises(WalCorruptError):
        wal.repair(str(tmp_path))
    assert os.path.getsize(sealed) == 5 * REC + 7
    got, err = read_until_error(tmp_path)
    assert isinstance(err, WalCorruptError)
    assert_names(err, sealed, 5 * REC)
    assert got == list(range(1, 16))


@pytest.mark.parametrize("zeros", [1, 10, H, 4096])
def test_zero_filled_tail_of_last_file_is_torn(tmp_path, zeros):
    fill(tmp_path, 23)
    last = wal_path(tmp_path, 2)
    size = os.path.getsize(last)
    with open(last, "ab") as fh:
        fh.write(bytes(zeros))
    state = wal.inspect(str(tmp_path))
    assert state.torn_tail is not None
    assert (state.torn_tail.path, state.torn_tail.offset) == (last, size)
    assert state.torn_tail.last_good_version == 23
    with pytest.raises(TornTailError) as ei:
        wal.WalWriter(str(tmp_path), opts())
    assert_names(ei.value, last, size)
    got, err = read_until_error(tmp_path)
    assert err is None and got == list(range(1, 24))
    with wal.WalWriter(str(tmp_path), opts(), repair_tail=True) as w:
        assert os.path.getsize(last) == size
        assert w.append(payload(24), 1) == 24
    assert wal.verify(str(tmp_path)).last_version == 24


def test_last_record_overwritten_with_zeros_is_torn(tmp_path):
    # Pages of the last record never reached the disk: same size, zero bytes.
    fill(tmp_path, 13)
    last = wal_path(tmp_path, 1)
    with open(last, "r+b") as fh:
        fh.seek(2 * REC)
        fh.write(bytes(REC))
    tail = wal.inspect(str(tmp_path)).torn_tail
    assert tail is not None and tail.offset == 2 * REC and tail.last_good_version == 12
    assert wal.repair(str(tmp_path)).offset == 2 * REC
    with wal.WalWriter(str(tmp_path), opts()) as w:
        assert w.append(payload(13), 1) == 13


def test_zero_run_in_the_middle_of_the_last_file_is_corruption(tmp_path):
    fill(tmp_path, 16)                       # last file holds 11..16
    last = wal_path(tmp_path, 1)
    with open(last, "r+b") as fh:
        fh.seek(2 * REC)
        fh.write(bytes(REC))                 # record 13 zeroed, 14..16 still valid
    with pytest.raises(WalCorruptError) as ei:
        wal.inspect(str(tmp_path))
    assert_names(ei.value, last, 2 * REC)
    assert ei.value.last_good_version == 12
    with pytest.raises(WalCorruptError):
        wal.repair(str(tmp_path))
    with pytest.raises(WalCorruptError):
        wal.WalWriter(str(tmp_path), opts(), repair_tail=True)
    assert os.path.getsize(last) == 6 * REC
    got, err = read_until_error(tmp_path)
    assert isinstance(err, WalCorruptError)
    assert_names(err, last, 2 * REC)
    assert got == list(range(1, 13))


# -------------------------------------------------------------------------------------------
# Flipped bits


@pytest.mark.parametrize("where", [0, 5, 9, 20, 27, 30, 33, H, H + 3, REC - 1])
def test_flipped_bit_in_sealed_file(tmp_path, where):
    fill(tmp_path, 35)
    sealed = wal_path(tmp_path, 1)          # versions 11..20
    rec_off = 4 * REC                        # record 15
    flip(sealed, rec_off + where, bit=where % 8)
    with pytest.raises(WalCorruptError) as ei:
        wal.verify(str(tmp_path))
    err = ei.value
    assert_names(err, sealed, rec_off)
    assert err.last_good_version == 14
    assert str(err.last_good_version) in str(err)
    # Reading from a version after the fault still has to pass through it.
    got16, rerr16 = read_until_error(tmp_path, from_version=16)
    assert isinstance(rerr16, WalCorruptError)
    assert got16 == []
    # Never repaired (also when the index does not vouch for the file).
    os.unlink(str(tmp_path / wal.index_file_name(1)))
    with pytest.raises(WalCorruptError):
        wal.repair(str(tmp_path))
    with pytest.raises(WalCorruptError):
        wal.WalWriter(str(tmp_path), opts(), repair_tail=True)
    # The reader raises at the fault, after handing out every record before it.
    got, rerr = read_until_error(tmp_path)
    assert isinstance(rerr, WalCorruptError)
    assert_names(rerr, sealed, rec_off)
    assert got == list(range(1, 15))


def test_every_bit_flip_in_a_sealed_file_is_detected(tmp_path):
    fill(tmp_path, 13)                       # file 0 sealed (1..10), file 1 last (11..13)
    sealed = wal_path(tmp_path, 0)
    with open(sealed, "rb") as fh:
        original = fh.read()
    for byte in range(len(original)):
        rec_i = byte // REC
        for bit in range(8):
            buf = bytearray(original)
            buf[byte] ^= 1 << bit
            with open(sealed, "wb") as fh:
                fh.write(buf)
            with pytest.raises(WalCorruptError) as ei:
                wal.verify(str(tmp_path))
            assert ei.value.path == sealed, (byte, bit)
            assert ei.value.offset == rec_i * REC, (byte, bit)
            assert f"offset {rec_i * REC}" in str(ei.value)
    with open(sealed, "wb") as fh:
        fh.write(original)
    assert wal.verify(str(tmp_path)).last_version == 13


def test_every_bit_flip_in_the_last_file_is_detected(tmp_path):
    fill(tmp_path, 14)                       # last file (index 1) holds 11..14
    last = wal_path(tmp_path, 1)
    with open(last, "rb") as fh:
        original = fh.read()
    n_recs = len(original) // REC
    for byte in range(len(original)):
        rec_i = byte // REC
        for bit in range(8):
            buf = bytearray(original)
            buf[byte] ^= 1 << bit
            with open(last, "wb") as fh:
                fh.write(buf)
            where = (byte, bit)
            if byte < 4 and rec_i == 0:
                # Signature of the file's first record: reported as "not a vrepl WAL" at 0
                # (last_good_version there: see test_bad_signature_at_start_of_later_file).
                with pytest.raises(WalCorruptError) as ei:
                    wal.inspect(str(tmp_path))
                assert ei.value.path == last and ei.value.offset == 0, where
            elif rec_i < n_recs - 1:
                # Valid records follow the fault: corruption, never a torn tail.
                with pytest.raises(WalCorruptError) as ei:
                    wal.inspect(str(tmp_path))
                assert ei.value.path == last and ei.value.offset == rec_i * REC, where
                assert ei.value.last_good_version == 10 + rec_i, where
                with pytest.raises(WalCorruptError):
                    wal.repair(str(tmp_path))
                with open(last, "rb") as fh:
                    assert fh.read() == bytes(buf), where   # repair refused, untouched
            else:
                # The very last record: indistinguishable from a torn write; either way it
                # is reported at its offset and nothing before it is lost.
                try:
                    state = wal.inspect(str(tmp_path))
                except WalCorruptError as exc:
                    assert exc.path == last and exc.offset == rec_i * REC, where
                else:
                    assert state.torn_tail is not None, where
                    assert state.torn_tail.offset == rec_i * REC, where
                    assert state.torn_tail.last_good_version == 10 + rec_i, where


def test_bad_signature_at_start_of_later_file_reports_last_good_version(tmp_path):
    fill(tmp_path, 14)                       # file 0: 1..10, file 1 (last): 11..14
    last = wal_path(tmp_path, 1)
    flip(last, 0)
    with pytest.raises(WalCorruptError) as ei:
        wal.inspect(str(tmp_path))
    assert_names(ei.value, last, 0)
    # Versions 1..10 in file 0 are intact: the error must not say "last good version 0".
    assert ei.value.last_good_version == 10
    assert "last good version 10" in str(ei.value)


def test_flipped_bit_mid_last_file_refuses_repair(tmp_path):
    fill(tmp_path, 17)                       # last file holds 11..17
    last = wal_path(tmp_path, 1)
    flip(last, 2 * REC + H + 2)              # payload of record 13
    with pytest.raises(WalCorruptError) as ei:
        wal.inspect(str(tmp_path))
    assert_names(ei.value, last, 2 * REC)
    assert ei.value.last_good_version == 12
    assert not isinstance(ei.value, TornTailError)
    with pytest.raises(WalCorruptError):
        wal.repair(str(tmp_path))
    with pytest.raises(WalCorruptError):
        wal.WalWriter(str(tmp_path), opts())
    with pytest.raises(WalCorruptError):
        wal.WalWriter(str(tmp_path), opts(), repair_tail=True)
    assert os.path.getsize(last) == 7 * REC
    got, err = read_until_error(tmp_path)
    assert isinstance(err, WalCorruptError)
    assert_names(err, last, 2 * REC)
    assert got == list(range(1, 13))


def test_reader_error_offset_is_file_offset_after_index_seek(tmp_path):
    """The reader seeks by the index; the offset it reports must still be the file offset."""
    per_file = 3 * wal.INDEX_STRIDE_RECORDS
    with wal.WalWriter(str(tmp_path), opts(max_file_bytes=per_file * REC)) as w:
        for v in range(1, per_file + 6):
            w.append(payload(v), 1)
    sealed = wal_path(tmp_path, 0)
    bad_version = 2 * wal.INDEX_STRIDE_RECORDS + 10
    bad_off = (bad_version - 1) * REC
    flip(sealed, bad_off + H + 1)
    got, err = read_until_error(tmp_path, from_version=bad_version - 3)
    assert isinstance(err, WalCorruptError)
    assert_names(err, sealed, bad_off)
    assert got == [bad_version - 3, bad_version - 2, bad_version - 1]


# -------------------------------------------------------------------------------------------
# Oversize header


@pytest.mark.parametrize("which", ["sealed", "last"])
def test_header_claiming_4gib_payload(tmp_path, which):
    fill(tmp_path, 15)
    if which == "sealed":
        path, off = wal_path(tmp_path, 0), 6 * REC          # replaces record 7
        with open(path, "r+b") as fh:
            fh.seek(off)
            fh.write(huge_header(7))
        (tmp_path / wal.index_file_name(0)).unlink()
        last_good = 6
    else:
        path, off = wal_path(tmp_path, 1), 5 * REC          # after record 15
        with open(path, "ab") as fh:
            fh.write(huge_header(16) + b"x" * 100)
        last_good = 15
    tracemalloc.start()
    try:
        with pytest.raises(WalError) as e1:
            wal.inspect(str(tmp_path), max_record_bytes=MiB)
        with pytest.raises(WalError) as e2:
            wal.verify(str(tmp_path), max_record_bytes=MiB)
        got, e3 = read_until_error(tmp_path, max_record_bytes=MiB)
        with pytest.raises(WalError) as e4:
            wal.WalWriter(str(tmp_path), opts(max_record_bytes=MiB))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Far below what the 4 GiB claim would take (fixed-size read buffers are allowed for;
    # see test_wal.py::test_inspect_and_read_allocate_little for those).
    assert peak < 100 * MiB
    for err in (e1.value, e2.value, e3, e4.value):
        assert isinstance(err, WalCorruptError)
        assert_names(err, path, off)
        assert err.last_good_version == last_good
    assert got == list(range(1, last_good + 1))
    # An oversize header is not a torn tail: repair refuses.
    with pytest.raises(WalCorruptError):
        wal.repair(str(tmp_path), max_record_bytes=MiB)


def test_4gib_header_with_default_max_record(tmp_path):
    fill(tmp_path, 5)
    path = wal_path(tmp_path, 0)
    with open(path, "ab") as fh:
        fh.write(huge_header(6))
    tracemalloc.start()
    try:
        with pytest.raises(WalError) as ei:
            wal.WalWriter(str(tmp_path), opts())
        got, err = read_until_error(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100 * MiB
    assert_names(ei.value, path, 5 * REC)
    assert isinstance(err, WalCorruptError)
    assert_names(err, path, 5 * REC)
    assert got == [1, 2, 3, 4, 5]


# -------------------------------------------------------------------------------------------
# Not a WAL, gaps, missing directory


TEXT = b"This is a plain text file, certainly not a write-ahead log.\n" * 3


@pytest.mark.parametrize("text", [TEXT, b"hello\n"], ids=["long", "short"])
def test_file_that_is_not_a_wal(tmp_path, text):
    path = tmp_path / "000000000000.wal"
    path.write_bytes(text)
    for call in (lambda: wal.inspect(str(tmp_path)), lambda: wal.verify(str(tmp_path)),
                 lambda: wal.repair(str(tmp_path)),
                 lambda: wal.WalWriter(str(tmp_path), opts()),
                 lambda: wal.WalWriter(str(tmp_path), opts(), repair_tail=True),
                 lambda: wal.read_records(str(tmp_path))):
        with pytest.raises(WalCorruptError) as ei:
            call()
        assert "not a vrepl WAL" in str(ei.value)
        assert_names(ei.value, str(path), 0)
    assert path.read_bytes() == text       # never "repaired" away


def test_not_a_wal_as_a_sealed_file(tmp_path):
    fill(tmp_path, 15)
    first = tmp_path / "000000000000.wal"
    first.write_bytes(TEXT)
    (tmp_path / wal.index_file_name(0)).unlink()
    with pytest.raises(WalCorruptError) as ei:
        wal.verify(str(tmp_path))
    assert "not a vrepl WAL" in str(ei.value)
    assert_names(ei.value, str(first), 0)
    got, err = read_until_error(tmp_path)
    assert got == [] and isinstance(err, WalCorruptError)


def test_gap_in_file_indexes(tmp_path):
    fill(tmp_path, 35)                       # files 0..3
    os.unlink(wal_path(tmp_path, 1))
    os.unlink(str(tmp_path / wal.index_file_name(1)))
    calls = [lambda: wal.inspect(str(tmp_path)), lambda: wal.verify(str(tmp_path)),
             lambda: wal.repair(str(tmp_path)), lambda: wal.list_wal_files(str(tmp_path)),
             lambda: wal.WalWriter(str(tmp_path), opts()),
             lambda: wal.read_records(str(tmp_path))]
    for call in calls:
        with pytest.raises(WalCorruptError) as ei:
            call()
        msg = str(ei.value)
        assert "gap" in msg
        assert wal.wal_file_name(0) in msg and wal.wal_file_name(2) in msg
        assert_names(ei.value, wal_path(tmp_path, 2), 0)
    # Nothing was changed by the attempts.
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".wal")) == [
        wal.wal_file_name(i) for i in (0, 2, 3)]


def test_indexes_need_not_start_at_zero(tmp_path):
    fill(tmp_path, 35)
    os.unlink(wal_path(tmp_path, 0))
    os.unlink(str(tmp_path / wal.index_file_name(0)))
    assert wal.verify(str(tmp_path)).first_version == 11
    assert [r.version for r in wal.read_records(str(tmp_path))] == list(range(11, 36))


def _write_raw_wal(d, blocks):
    d.mkdir(exist_ok=True)
    for i, block in enumerate(blocks):
        (d / wal.wal_file_name(i)).write_bytes(block)


def test_version_gap_between_files(tmp_path):
    _write_raw_wal(tmp_path, [
        R.encode_batch(1, 1, 1, [payload(v) for v in (1, 2, 3)]),
        R.encode_batch(1, 5, 1, [payload(v) for v in (5, 6, 7)]),
    ])
    second = wal_path(tmp_path, 1)
    for call in (lambda: wal.inspect(str(tmp_path)), lambda: wal.verify(str(tmp_path)),
                 lambda: wal.repair(str(tmp_path)),
                 lambda: wal.WalWriter(str(tmp_path), opts())):
        with pytest.raises(WalCorruptError) as ei:
            call()
        assert "version gap" in str(ei.value)
        assert_names(ei.value, second, 0)
        assert ei.value.last_good_version == 3
    got, err = read_until_error(tmp_path)
    assert got == [1, 2, 3]
    assert isinstance(err, WalCorruptError) and "version gap" in str(err)
    assert_names(err, second, 0)


def test_version_gap_inside_a_file(tmp_path):
    block = (R.encode_batch(1, 1, 1, [payload(v) for v in (1, 2, 3)])
             + R.encode_batch(1, 5, 1, [payload(v) for v in (5, 6)]))
    _write_raw_wal(tmp_path, [block])
    path = wal_path(tmp_path, 0)
    with pytest.raises(WalCorruptError) as ei:
        wal.inspect(str(tmp_path))
    assert "version gap" in str(ei.value)
    assert_names(ei.value, path, 3 * REC)
    got, err = read_until_error(tmp_path)
    assert got == [1, 2, 3]
    assert isinstance(err, WalCorruptError) and "version gap" in str(err)
    assert_names(err, path, 3 * REC)


def test_repeated_version_across_files(tmp_path):
    _write_raw_wal(tmp_path, [
        R.encode_batch(1, 1, 1, [payload(v) for v in (1, 2, 3)]),
        R.encode_batch(1, 3, 1, [payload(v) for v in (3, 4)]),
    ])
    with pytest.raises(WalCorruptError) as ei:
        wal.verify(str(tmp_path))
    assert "version gap" in str(ei.value)
    assert_names(ei.value, wal_path(tmp_path, 1), 0)


def test_missing_directory(tmp_path):
    missing = str(tmp_path / "nope")
    for call in (lambda: wal.inspect(missing), lambda: wal.verify(missing),
                 lambda: wal.repair(missing), lambda: wal.read_records(missing),
                 lambda: wal.list_wal_files(missing),
                 lambda: wal.WalWriter(missing, opts(), create=False)):
        with pytest.raises(WalError) as ei:
            call()
        assert not isinstance(ei.value, WalCorruptError)
        assert missing in str(ei.value)
    assert not os.path.exists(missing)


def test_path_is_a_file_not_a_directory(tmp_path):
    f = tmp_path / "afile"
    f.write_bytes(b"x")
    with pytest.raises(WalError) as ei:
        wal.inspect(str(f))
    assert str(f) in str(ei.value)
