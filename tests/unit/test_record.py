"""Record codec (vrepl._core.record): encode/decode round trips, batch encoders, scan(), and
detection of every single-bit flip and every truncation."""

from __future__ import annotations

import random
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrepl._core import record as R
from vrepl._core.crc32c import crc32c
from vrepl.errors import FrameError, VreplError

pytestmark = pytest.mark.timeout(60)

H = R.HEADER_SIZE_BYTES
U64 = 2**64 - 1
MiB = 1024 * 1024


def make_header(*, msg_type=1, schema_version=1, flags=0, version=1, epoch=0,
                payload_len=0, payload_crc=0, signature=b"VRWL", fix_crc=True) -> bytes:
    """A header with arbitrary fields and (by default) a correct header checksum."""
    body = signature + struct.pack("<BBHQQII", msg_type, schema_version, flags, version, epoch,
                                   payload_len, payload_crc)
    assert len(body) == 32
    return body + struct.pack("<I", crc32c(body) if fix_crc else 0)


def payloads_strategy(max_size=64, max_count=12):
    return st.lists(st.binary(max_size=max_size), max_size=max_count)


# -------------------------------------------------------------------------------------------
# Layout


def test_constants():
    assert H == 36
    assert R.RECORD_SIGNATURE == struct.unpack("<I", b"VRWL")[0]
    assert R.STATUS_OK == 0
    statuses = [R.STATUS_OK, R.STATUS_INCOMPLETE, R.STATUS_ZERO, R.STATUS_BAD_SIGNATURE,
                R.STATUS_BAD_HEADER_CRC, R.STATUS_BAD_FLAGS, R.STATUS_TOO_LARGE,
                R.STATUS_BAD_PAYLOAD_CRC, R.STATUS_VERSION_GAP]
    assert len(set(statuses)) == len(statuses)
    assert set(R.REASONS) == set(statuses)
    assert R.REASONS[R.STATUS_OK] is None


def test_encoded_layout_is_the_documented_one():
    payload = b"hello world"
    raw = R.encode_record(7, 0x0102030405060708, 0x1112131415161718, payload, schema_version=3)
    assert len(raw) == H + len(payload)
    sig, mt, sv, flags, ver, ep, plen, pcrc, hcrc = struct.unpack_from("<4sBBHQQIII", raw)
    assert sig == b"VRWL"
    assert (mt, sv, flags) == (7, 3, 0)
    assert ver == 0x0102030405060708
    assert ep == 0x1112131415161718
    assert plen == len(payload)
    assert pcrc == crc32c(payload)
    assert hcrc == crc32c(raw[:32])
    assert raw[H:] == payload
    assert make_header(msg_type=7, schema_version=3, version=ver, epoch=ep, payload_len=plen,
                       payload_crc=pcrc) == raw[:H]


# -------------------------------------------------------------------------------------------
# Round trips


@given(msg_type=st.integers(0, 255), version=st.integers(0, U64), epoch=st.integers(0, U64),
       payload=st.binary(max_size=2000), schema_version=st.integers(0, 255))
@settings(max_examples=300, deadline=None)
def test_encode_decode_round_trip(msg_type, version, epoch, payload, schema_version):
    raw = R.encode_record(msg_type, version, epoch, payload, schema_version=schema_version)
    rec = R.decode_record(raw)
    assert isinstance(rec, R.Record)
    assert rec.msg_type == msg_type
    assert rec.version == version
    assert rec.epoch == epoch
    assert rec.payload == payload
    assert rec.schema_version == schema_version
    assert rec.flags == 0
    assert rec == R.Record(msg_type, version, epoch, payload, schema_version)
    assert rec.encode() == raw
    # Decoding at an offset inside a larger buffer.
    prefix = b"\xAA" * 13
    assert R.decode_record(prefix + raw + b"trailing", offset=len(prefix)) == rec
    assert R.header_invalid(raw) is None


def test_encode_accepts_buffer_types():
    a = R.encode_record(1, 5, 2, b"abc")
    assert R.encode_record(1, 5, 2, bytearray(b"abc")) == a
    assert R.encode_record(1, 5, 2, memoryview(b"xabc")[1:]) == a
    assert R.encode_record(1, 5, 2, np.frombuffer(b"abc", dtype=np.uint8)) == a


def test_record_equality_and_repr():
    a = R.Record(1, 2, 3, b"x")
    assert a == R.Record(1, 2, 3, b"x")
    assert a != R.Record(1, 2, 3, b"y")
    assert a != R.Record(1, 3, 3, b"x")
    assert a != R.Record(2, 2, 3, b"x")
    assert a != R.Record(1, 2, 4, b"x")
    assert hash(a) == hash(R.Record(1, 2, 3, b"x"))
    assert "v=2" in repr(a)


@given(msg_type=st.integers(0, 255), first=st.integers(0, 2**63), epoch=st.integers(0, U64),
       payloads=payloads_strategy())
@settings(max_examples=200, deadline=None)
def test_encode_batch_is_concatenated_records(msg_type, first, epoch, payloads):
    batch = R.encode_batch(msg_type, first, epoch, payloads)
    expected = b"".join(R.encode_record(msg_type, first + i, epoch, p)
                        for i, p in enumerate(payloads))
    assert batch == expected
    lengths = np.array([len(p) for p in payloads], dtype=np.uint32)
    packed = R.encode_packed(msg_type, first, epoch, b"".join(payloads), lengths)
    assert packed == batch


def test_encode_batch_large_takes_nogil_path_and_matches():
    rng = random.Random(3)
    payloads = [rng.randbytes(rng.randrange(0, 5000)) for _ in range(100)]
    batch = R.encode_batch(4, 1000, 9, payloads)
    assert len(batch) >= 65536
    assert batch == b"".join(R.encode_record(4, 1000 + i, 9, p) for i, p in enumerate(payloads))
    lengths = np.array([len(p) for p in payloads], dtype=np.uint32)
    assert R.encode_packed(4, 1000, 9, b"".join(payloads), lengths) == batch


def test_encode_batch_empty_and_packed_mismatch():
    assert R.encode_batch(1, 1, 1, []) == b""
    assert R.encode_packed(1, 1, 1, b"", np.zeros(0, dtype=np.uint32)) == b""
    with pytest.raises(ValueError):
        R.encode_packed(1, 1, 1, b"abc", np.array([1, 1], dtype=np.uint32))
    with pytest.raises(ValueError):
        R.encode_packed(1, 1, 1, b"abc", np.array([4], dtype=np.uint32))


# -------------------------------------------------------------------------------------------
# scan()


def build(payloads, first=1, epoch=5, msg_type=2):
    raw = R.encode_batch(msg_type, first, epoch, payloads)
    offsets, pos = [], 0
    for p in payloads:
        offsets.append(pos)
        pos += H + len(p)
    return raw, offsets


def test_scan_returns_numpy_arrays_with_right_values():
    payloads = [b"a", b"", b"hello" * 10, b"z" * 300]
    raw = b"".join([
        R.encode_record(1, 10, 3, payloads[0]),
        R.encode_record(200, 11, 3, payloads[1]),
        R.encode_record(7, 12, 4, payloads[2]),
        R.encode_record(255, 13, 2**64 - 1, payloads[3]),
    ])
    s = R.scan(raw)
    assert s.ok and s.status == R.STATUS_OK and s.reason is None
    assert s.count == 4
    assert s.end == len(raw)
    assert s.versions.dtype == np.uint64
    assert s.epochs.dtype == np.uint64
    assert s.lengths.dtype == np.uint32
    assert s.msg_types.dtype == np.uint8
    assert all(isinstance(a, np.ndarray) for a in (s.versions, s.epochs, s.offsets,
                                                     s.lengths, s.msg_types))
    assert s.versions.tolist() == [10, 11, 12, 13]
    assert s.epochs.tolist() == [3, 3, 4, 2**64 - 1]
    assert s.offsets.tolist() == [0, H + 1, 2 * H + 1, 3 * H + 51]
    assert s.lengths.tolist() == [1, 0, 50, 300]
    assert s.msg_types.tolist() == [1, 200, 7, 255]
    assert s.last_version == 13
    for off, p in zip(s.offsets.tolist(), payloads):
        assert R.decode_record(raw, off).payload == p


def test_scan_empty_and_range():
    s = R.scan(b"")
    assert s.ok and s.count == 0 and s.end == 0 and s.last_version == 0
    assert len(s.versions) == 0 and s.versions.dtype == np.uint64
    raw, offsets = build([b"aa", b"bbb", b"c"], first=1)
    s = R.scan(raw, start=offsets[1])
    assert s.ok and s.versions.tolist() == [2, 3]
    assert s.offsets.tolist() == offsets[1:]
    s = R.scan(raw, start=offsets[1], stop=offsets[2])
    assert s.ok and s.versions.tolist() == [2] and s.end == offsets[2]
    with pytest.raises(ValueError):
        R.scan(raw, start=len(raw) + 1)


def test_scan_many_records_grows_index():
    payloads = [bytes([i % 256]) * (i % 17) for i in range(5000)]
    raw, offsets = build(payloads, first=77)
    s = R.scan(raw, expect_version=77)
    assert s.ok and s.count == 5000
    assert s.versions.tolist() == list(range(77, 5077))
    assert s.offsets.tolist() == offsets
    assert s.lengths.tolist() == [len(p) for p in payloads]


@pytest.mark.parametrize("gap_at", [0, 1, 3])
def test_scan_expect_version_detects_gap(gap_at):
    versions = [5, 6, 7, 8]
    if gap_at == 0:
        expect = 4  # the very first record does not carry the expected version
    else:
        expect = 5
        versions = versions[:gap_at] + [v + 1 for v in versions[gap_at:]]  # skip one version
    recs = [R.encode_record(1, v, 1, b"p%d" % i) for i, v in enumerate(versions)]
    raw = b"".join(recs)
    s = R.scan(raw, expect_version=expect)
    assert s.status == R.STATUS_VERSION_GAP
    assert not s.ok
    assert s.reason == R.REASONS[R.STATUS_VERSION_GAP]
    assert s.count == gap_at
    assert s.end == sum(len(r) for r in recs[:gap_at])
    # Without expect_version the same bytes scan clean.
    assert R.scan(raw).ok


def test_scan_expect_version_accepts_contiguous():
    raw, _ = build([b"x"] * 10, first=2**64 - 20)
    assert R.scan(raw, expect_version=2**64 - 20).ok
    s = R.scan(raw, expect_version=2**64 - 19)
    assert s.status == R.STATUS_VERSION_GAP and s.count == 0 and s.end == 0


def test_scan_decreasing_or_repeated_version_is_gap():
    raw = R.encode_record(1, 3, 1, b"a") + R.encode_record(1, 3, 1, b"b")
    s = R.scan(raw, expect_version=3)
    assert s.status == R.STATUS_VERSION_GAP and s.count == 1 and s.end == H + 1


def _small_buffer():
    payloads = [b"", b"x", b"hello, world", bytes(range(40))]
    return build(payloads, first=100, epoch=3)


def test_every_single_bit_flip_is_detected():
    raw, offsets = _small_buffer()
    bounds = offsets + [len(raw)]
    for byte in range(len(raw)):
        rec_i = max(i for i, o in enumerate(offsets) if o <= byte)
        for bit in range(8):
            buf = bytearray(raw)
            buf[byte] ^= 1 << bit
            s = R.scan(bytes(buf))
            where = (byte, bit)
            assert s.status != R.STATUS_OK, where
            assert s.status in (R.STATUS_BAD_SIGNATURE, R.STATUS_BAD_HEADER_CRC,
                                R.STATUS_BAD_PAYLOAD_CRC), where
            # Nothing before the flipped record lost; nothing at or after it reported.
            assert s.count == rec_i, where
            assert s.end == bounds[rec_i], where
            assert s.versions.tolist() == list(range(100, 100 + rec_i)), where
            if byte - offsets[rec_i] < H:
                assert s.status in (R.STATUS_BAD_SIGNATURE, R.STATUS_BAD_HEADER_CRC), where
                assert R.header_invalid(bytes(buf), offsets[rec_i]) is not None, where
            else:
                assert s.status == R.STATUS_BAD_PAYLOAD_CRC, where
            # decode_record of the flipped record raises with its offset.
            with pytest.raises(FrameError) as ei:
                R.decode_record(bytes(buf), offsets[rec_i])
            assert ei.value.offset == offsets[rec_i]


def test_every_truncation_is_incomplete_with_whole_records_counted():
    raw, offsets = _small_buffer()
    bounds = offsets + [len(raw)]
    for cut in range(len(raw) + 1):
        s = R.scan(raw[:cut])
        whole = sum(1 for b in bounds[1:] if b <= cut)
        assert s.count == whole, cut
        assert s.end == bounds[whole], cut
        if cut in bounds:
            assert s.status == R.STATUS_OK, cut
        else:
            assert s.status == R.STATUS_INCOMPLETE, cut
            assert s.reason == R.REASONS[R.STATUS_INCOMPLETE]
        # Same through the stop argument.
        s2 = R.scan(raw, stop=cut)
        assert (s2.count, s2.end, s2.status) == (s.count, s.end, s.status), cut


def test_truncated_decode_raises_incomplete():
    raw = R.encode_record(1, 1, 1, b"payload")
    for cut in range(len(raw)):
        with pytest.raises(FrameError) as ei:
            R.decode_record(raw[:cut])
        assert ei.value.reason == R.REASONS[R.STATUS_INCOMPLETE]


@given(payloads=payloads_strategy(max_size=40, max_count=6), data=st.data())
@settings(max_examples=150, deadline=None)
def test_random_flip_or_truncation_never_loses_earlier_records(payloads, data):
    raw, offsets = build(payloads, first=1)
    if not raw:
        return
    bounds = offsets + [len(raw)]
    if data.draw(st.booleans()):
        byte = data.draw(st.integers(0, len(raw) - 1))
        bit = data.draw(st.integers(0, 7))
        buf = bytearray(raw)
        buf[byte] ^= 1 << bit
        rec_i = max(i for i, o in enumerate(offsets) if o <= byte)
        s = R.scan(bytes(buf), expect_version=1)
        assert not s.ok
        assert s.count == rec_i and s.end == bounds[rec_i]
    else:
        cut = data.draw(st.integers(0, len(raw)))
        s = R.scan(raw[:cut], expect_version=1)
        whole = sum(1 for b in bounds[1:] if b <= cut)
        assert s.count == whole
        assert s.status == (R.STATUS_OK if cut in bounds else R.STATUS_INCOMPLETE)


def test_header_claiming_4gib_payload_is_too_large_without_allocation():
    good = R.encode_record(1, 1, 1, b"first")
    huge = make_header(version=2, payload_len=0xFFFFFFFF, payload_crc=0)
    buf = good + huge + b"\x00" * 64
    # Only the length is "wrong": with no limit the header itself is valid.
    assert R.header_invalid(huge, max_payload_len=0xFFFFFFFF) is None
    tracemalloc.start()
    try:
        s = R.scan(buf, max_payload_len=MiB)
        reason = R.header_invalid(buf, len(good), max_payload_len=MiB)
        with pytest.raises(FrameError) as ei:
            R.decode_record(buf, len(good), max_payload_len=MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s.status == R.STATUS_TOO_LARGE
    assert s.count == 1 and s.end == len(good)
    assert reason == R.REASONS[R.STATUS_TOO_LARGE]
    assert ei.value.offset == len(good)
    assert peak < 4 * MiB


def test_4gib_header_with_no_limit_is_incomplete_without_allocation():
    good = R.encode_record(1, 1, 1, b"first")
    buf = good + make_header(version=2, payload_len=0xFFFFFFFF) + b"x" * 1000
    tracemalloc.start()
    try:
        s = R.scan(buf, max_payload_len=0xFFFFFFFF)
        with pytest.raises(FrameError) as ei:
            R.decode_record(buf, len(good), max_payload_len=0xFFFFFFFF)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s.status == R.STATUS_INCOMPLETE and s.count == 1 and s.end == len(good)
    assert ei.value.reason == R.REASONS[R.STATUS_INCOMPLETE]
    assert peak < 4 * MiB


def test_default_max_payload_rejects_4gib_header():
    huge = make_header(version=1, payload_len=0xFFFFFFFF)
    assert R.header_invalid(huge) == R.REASONS[R.STATUS_TOO_LARGE]
    s = R.scan(huge)
    assert s.status == R.STATUS_TOO_LARGE and s.count == 0 and s.end == 0


def test_max_payload_boundary():
    raw = R.encode_record(1, 1, 1, b"x" * 100)
    assert R.scan(raw, max_payload_len=100).ok
    assert R.scan(raw, max_payload_len=99).status == R.STATUS_TOO_LARGE
    assert R.decode_record(raw, max_payload_len=100).payload == b"x" * 100
    with pytest.raises(FrameError):
        R.decode_record(raw, max_payload_len=99)


def test_header_invalid_reasons():
    good = R.encode_record(1, 1, 1, b"abc")
    assert R.header_invalid(good) is None
    assert R.header_invalid(good[:H]) is None  # header only: the header itself is fine
    assert R.header_invalid(good[:H - 1]) == R.REASONS[R.STATUS_INCOMPLETE]
    assert R.header_invalid(good, offset=1) == R.REASONS[R.STATUS_BAD_SIGNATURE]
    assert R.header_invalid(bytes(H)) == R.REASONS[R.STATUS_ZERO]
    assert R.header_invalid(b"NOPE" + good[4:H]) == R.REASONS[R.STATUS_BAD_SIGNATURE]
    bad_crc = bytearray(good)
    bad_crc[10] ^= 1
    assert R.header_invalid(bytes(bad_crc)) == R.REASONS[R.STATUS_BAD_HEADER_CRC]
    assert R.header_invalid(make_header(flags=1)) == R.REASONS[R.STATUS_BAD_FLAGS]
    assert R.header_invalid(make_header(payload_len=10), max_payload_len=9) == \
        R.REASONS[R.STATUS_TOO_LARGE]
    assert R.header_invalid(make_header(fix_crc=False)) == R.REASONS[R.STATUS_BAD_HEADER_CRC]
    assert R.header_invalid(good, offset=-1) is not None
    # Payload checksum is not the header's business.
    bad_payload = bytearray(good)
    bad_payload[-1] ^= 1
    assert R.header_invalid(bytes(bad_payload)) is None


def test_zero_filled_bytes_give_status_zero():
    for n in (1, 10, H - 1, H, H + 1, 4096):
        s = R.scan(bytes(n))
        assert s.status == R.STATUS_ZERO, n
        assert s.count == 0 and s.end == 0
    good = R.encode_record(1, 1, 1, b"data")
    s = R.scan(good + bytes(4096))
    assert s.status == R.STATUS_ZERO and s.count == 1 and s.end == len(good)
    s = R.scan(good + bytes(5))
    assert s.status == R.STATUS_ZERO and s.count == 1 and s.end == len(good)


@pytest.mark.parametrize("flags", [1, 2, 0x8000, 0xFFFF])
def test_unknown_flags_rejected(flags):
    payload = b"abc"
    head = make_header(flags=flags, payload_len=len(payload), payload_crc=crc32c(payload))
    good = R.encode_record(1, 1, 1, b"")
    s = R.scan(good + head + payload)
    assert s.status == R.STATUS_BAD_FLAGS
    assert s.count == 1 and s.end == len(good)
    with pytest.raises(FrameError) as ei:
        R.decode_record(head + payload)
    assert ei.value.reason == R.REASONS[R.STATUS_BAD_FLAGS]


def test_bad_payload_crc_detected_and_skippable_when_not_verifying():
    raw = bytearray(R.encode_record(1, 1, 1, b"payload!"))
    raw[-3] ^= 0xFF
    s = R.scan(bytes(raw))
    assert s.status == R.STATUS_BAD_PAYLOAD_CRC and s.count == 0
    s = R.scan(bytes(raw), verify_payload=False)
    assert s.ok and s.count == 1


def test_frame_error_type():
    with pytest.raises(FrameError) as ei:
        R.decode_record(b"garbage" * 10)
    err = ei.value
    assert isinstance(err, VreplError) and isinstance(err, ValueError)
    assert err.offset == 0
    assert "offset 0" in str(err)
    assert err.reason == R.REASONS[R.STATUS_BAD_SIGNATURE]


def test_scan_result_describe():
    raw, _ = build([b"a", b"b"])
    s = R.scan(raw + b"VR")
    assert "2 records" in s.describe()
    assert str(len(raw)) in s.describe()
    assert s.status == R.STATUS_INCOMPLETE


def test_large_scan_releases_gil_path_is_correct():
    rng = random.Random(5)
    payloads = [rng.randbytes(1000) for _ in range(200)]
    raw, offsets = build(payloads, first=1)
    assert len(raw) > 65536
    s = R.scan(raw, expect_version=1)
    assert s.ok and s.count == 200 and s.offsets.tolist() == offsets
    buf = bytearray(raw)
    buf[offsets[150] + H + 500] ^= 4
    s = R.scan(bytes(buf), expect_version=1)
    assert s.status == R.STATUS_BAD_PAYLOAD_CRC and s.count == 150 and s.end == offsets[150]
