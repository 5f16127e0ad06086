"""Frame buffer (vrepl._core.framebuf): reassembly of records from arbitrary chunkings, the
recv_into path, take_block, and FrameError for bytes that can never be a frame."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrepl._core import record as R
from vrepl._core.crc32c import crc32c
from vrepl._core.framebuf import FrameBuffer
from vrepl.errors import FrameError, VreplError

pytestmark = pytest.mark.timeout(60)

H = R.HEADER_SIZE_BYTES


def make_header(*, version=1, epoch=0, payload_len=0, payload_crc=0, flags=0) -> bytes:
    body = b"VRWL" + struct.pack("<BBHQQII", 1, 1, flags, version, epoch, payload_len,
                                 payload_crc)
    return body + struct.pack("<I", crc32c(body))


def sample_records(n=20, seed=0, max_len=300):
    rng = random.Random(seed)
    recs = [R.Record(rng.randrange(256), 1 + i, rng.randrange(5), rng.randbytes(rng.randrange(max_len)))
            for i in range(n)]
    raws = [R.encode_record(r.msg_type, r.version, r.epoch, r.payload) for r in recs]
    return recs, raws


def test_one_byte_at_a_time_returns_exactly_the_records():
    recs, raws = sample_records(15, seed=1)
    stream = b"".join(raws)
    fb = FrameBuffer(initial_bytes=40)
    out = []
    boundaries = set()
    pos = 0
    for raw in raws:
        pos += len(raw)
        boundaries.add(pos)
    for i in range(len(stream)):
        fb.feed(stream[i:i + 1])
        fed = i + 1
        frame = fb.next_frame()
        if fed in boundaries:
            assert frame is not None, fed
            out.append(frame)
            assert fb.next_frame() is None
        else:
            assert frame is None, fed
            assert not fb.has_frame()
        assert fb.consumed_bytes == max([b for b in boundaries if b <= fed], default=0)
    assert out == recs
    assert fb.buffered == 0
    assert fb.consumed_bytes == len(stream)


def test_one_byte_at_a_time_raw_frames():
    _, raws = sample_records(6, seed=2)
    fb = FrameBuffer()
    got = []
    for b in b"".join(raws):
        fb.feed(bytes([b]))
        raw = fb.next_raw()
        if raw is not None:
            got.append(raw)
    assert got == raws


@given(seed=st.integers(0, 2**32 - 1), cuts=st.lists(st.integers(0, 4000), max_size=30),
       initial=st.sampled_from([36, 64, 1000, 65536]))
@settings(max_examples=150, deadline=None)
def test_random_chunkings_give_the_original_records(seed, cuts, initial):
    recs, raws = sample_records(12, seed=seed, max_len=400)
    stream = b"".join(raws)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    fb = FrameBuffer(initial_bytes=initial)
    out = []
    for a, b in zip(points, points[1:]):
        fb.feed(stream[a:b])
        out.extend(fb.take_frames())
    assert out == recs
    assert fb.buffered == 0
    assert fb.consumed_bytes == len(stream)


def test_take_frames_max_frames():
    recs, raws = sample_records(5, seed=3)
    fb = FrameBuffer()
    fb.feed(b"".join(raws))
    assert fb.take_frames(2) == recs[:2]
    assert fb.take_frames(0) == []
    assert fb.take_frames() == recs[2:]
    assert fb.take_frames() == []


def test_take_block_is_concatenated_raw_frames_with_relative_offsets():
    recs, raws = sample_records(10, seed=4)
    stream = b"".join(raws)
    fb = FrameBuffer(initial_bytes=64)
    # Consume two frames first so the block does not start at storage offset 0.
    fb.feed(stream[:len(raws[0]) + len(raws[1]) + 5])
    assert fb.next_frame() == recs[0]
    assert fb.next_frame() == recs[1]
    partial_end = sum(len(r) for r in raws[:7]) + 10   # cut inside record 7
    fb.feed(stream[len(raws[0]) + len(raws[1]) + 5:partial_end])
    block, scan = fb.take_block()
    assert block == b"".join(raws[2:7])
    assert scan.ok
    assert scan.count == 5
    assert scan.end == len(block)
    assert scan.versions.tolist() == [r.version for r in recs[2:7]]
    expected_offsets = np.cumsum([0] + [len(r) for r in raws[2:6]]).tolist()
    assert scan.offsets.tolist() == expected_offsets
    for off, rec in zip(scan.offsets.tolist(), recs[2:7]):
        assert R.decode_record(block, off) == rec
    assert fb.take_block() is None  # only a partial frame is left
    fb.feed(stream[partial_end:])
    block, scan = fb.take_block()
    assert block == b"".join(raws[7:])
    assert scan.offsets[0] == 0
    assert fb.consumed_bytes == len(stream)
    assert fb.take_block() is None


def test_take_block_hands_out_good_frames_before_raising():
    recs, raws = sample_records(3, seed=5)
    fb = FrameBuffer()
    fb.feed(b"".join(raws) + b"GARBAGE!" * 10)
    block, scan = fb.take_block()
    assert block == b"".join(raws)
    with pytest.raises(FrameError) as ei:
        fb.take_block()
    assert ei.value.offset == len(block)


def test_writable_wrote_path_across_growth():
    recs, raws = sample_records(30, seed=6, max_len=3000)
    stream = b"".join(raws)
    fb = FrameBuffer(initial_bytes=64)
    rng = random.Random(7)
    pos = 0
    out = []
    while pos < len(stream):
        want = rng.randrange(1, 9000)
        view = fb.writable(want)
        assert isinstance(view, memoryview)
        assert len(view) >= want
        n = min(want, len(stream) - pos)
        view[:n] = stream[pos:pos + n]   # what sock.recv_into(view) would do
        del view
        fb.wrote(n)
        pos += n
        out.extend(fb.take_frames())
    assert out == recs


def test_writable_view_kept_alive_across_growth():
    # The recv_into contract: writable(), fill, wrote(); an old view being still referenced
    # must not break the buffer when it grows.
    recs, raws = sample_records(4, seed=8, max_len=2000)
    stream = b"".join(raws)
    fb = FrameBuffer(initial_bytes=40)
    views = []
    pos = 0
    while pos < len(stream):
        v = fb.writable(50)
        views.append(v)  # keep every view alive
        n = min(50, len(stream) - pos)
        v[:n] = stream[pos:pos + n]
        fb.wrote(n)
        pos += n
    assert fb.take_frames() == recs


def test_wrote_beyond_space_raises():
    fb = FrameBuffer(initial_bytes=64)
    v = fb.writable(10)
    with pytest.raises(ValueError):
        fb.wrote(len(v) + 1)
    with pytest.raises(ValueError):
        fb.wrote(-1)


def test_corrupt_header_raises_frame_error_with_offset():
    recs, raws = sample_records(3, seed=9)
    bad = bytearray(raws[2])
    bad[12] ^= 0x01   # inside the version field: header checksum mismatch
    fb = FrameBuffer()
    fb.feed(raws[0] + raws[1] + bytes(bad))
    assert fb.next_frame() == recs[0]
    assert fb.next_frame() == recs[1]
    with pytest.raises(FrameError) as ei:
        fb.next_frame()
    err = ei.value
    assert isinstance(err, VreplError) and isinstance(err, ValueError)
    assert err.offset == len(raws[0]) + len(raws[1])
    assert err.reason == R.REASONS[R.STATUS_BAD_HEADER_CRC]
    assert f"offset {err.offset}" in str(err)
    with pytest.raises(FrameError):
        fb.has_frame()


def test_corrupt_header_detected_as_soon_as_header_complete():
    _, raws = sample_records(1, seed=10, max_len=10)
    bad = bytearray(raws[0])
    bad[20] ^= 0x80
    fb = FrameBuffer()
    fb.feed(bytes(bad[:H - 1]))
    assert fb.next_frame() is None
    fb.feed(bytes(bad[H - 1:H]))
    with pytest.raises(FrameError):
        fb.next_frame()


def test_oversize_frame_rejected_before_payload_arrives():
    fb = FrameBuffer(max_payload_len=1024)
    good = R.encode_record(1, 1, 1, b"x" * 1024)
    fb.feed(good)
    assert fb.next_frame().payload == b"x" * 1024
    fb.feed(make_header(version=2, payload_len=1025))  # header only, no payload yet
    with pytest.raises(FrameError) as ei:
        fb.next_frame()
    assert ei.value.reason == R.REASONS[R.STATUS_TOO_LARGE]
    assert ei.value.offset == len(good)


def test_4gib_header_rejected_without_waiting():
    fb = FrameBuffer(max_payload_len=1 << 20)
    fb.feed(make_header(payload_len=0xFFFFFFFF))
    with pytest.raises(FrameError) as ei:
        fb.take_block()
    assert ei.value.reason == R.REASONS[R.STATUS_TOO_LARGE]
    assert ei.value.offset == 0


def test_bad_payload_crc_raises():
    recs, raws = sample_records(2, seed=11, max_len=50)
    bad = bytearray(raws[1])
    bad[-1] ^= 0x40
    assert len(raws[1]) > H   # a payload to corrupt
    fb = FrameBuffer()
    fb.feed(raws[0] + bytes(bad[:-1]))
    assert fb.next_frame() == recs[0]
    assert fb.next_frame() is None   # payload not complete yet: no error
    fb.feed(bytes(bad[-1:]))
    with pytest.raises(FrameError) as ei:
        fb.next_frame()
    assert ei.value.reason == R.REASONS[R.STATUS_BAD_PAYLOAD_CRC]
    assert ei.value.offset == len(raws[0])


def test_bad_payload_crc_nonempty():
    raw = bytearray(R.encode_record(1, 1, 1, b"some payload"))
    raw[H + 3] ^= 1
    fb = FrameBuffer()
    fb.feed(bytes(raw))
    with pytest.raises(FrameError) as ei:
        fb.next_raw()
    assert ei.value.reason == R.REASONS[R.STATUS_BAD_PAYLOAD_CRC]
    assert ei.value.offset == 0


def test_garbage_raises_only_once_a_header_worth_arrived():
    fb = FrameBuffer()
    garbage = b"GET / HTTP/1.1\r\nHost: example\r\n\r\n" + b"x" * 10
    fb.feed(garbage[:H - 1])
    assert fb.next_frame() is None
    fb.feed(garbage[H - 1:])
    with pytest.raises(FrameError) as ei:
        fb.next_frame()
    assert ei.value.reason == R.REASONS[R.STATUS_BAD_SIGNATURE]
    assert ei.value.offset == 0


def test_unknown_flags_rejected():
    fb = FrameBuffer()
    fb.feed(make_header(flags=4))
    with pytest.raises(FrameError) as ei:
        fb.next_frame()
    assert ei.value.reason == R.REASONS[R.STATUS_BAD_FLAGS]


def test_every_bit_flip_in_a_stream_raises_at_the_right_offset():
    recs, raws = sample_records(3, seed=12, max_len=20)
    stream = b"".join(raws)
    starts = np.cumsum([0] + [len(r) for r in raws]).tolist()
    for byte in range(len(stream)):
        rec_i = max(i for i in range(len(raws)) if starts[i] <= byte)
        for bit in (0, 3, 7):
            buf = bytearray(stream)
            buf[byte] ^= 1 << bit
            fb = FrameBuffer()
            fb.feed(bytes(buf))
            got = []
            with pytest.raises(FrameError) as ei:
                while True:
                    rec = fb.next_frame()
                    assert rec is not None, (byte, bit)
                    got.append(rec)
            assert got == recs[:rec_i], (byte, bit)
            assert ei.value.offset == starts[rec_i], (byte, bit)
            assert fb.consumed_bytes == starts[rec_i]


def test_consumed_bytes_and_buffered_counts():
    _, raws = sample_records(4, seed=13)
    fb = FrameBuffer()
    assert fb.consumed_bytes == 0 and fb.buffered == 0
    fb.feed(raws[0] + raws[1][:5])
    assert fb.buffered == len(raws[0]) + 5
    fb.next_raw()
    assert fb.consumed_bytes == len(raws[0])
    assert fb.buffered == 5
    fb.feed(raws[1][5:] + raws[2] + raws[3])
    fb.take_frames()
    assert fb.consumed_bytes == sum(map(len, raws))
    assert fb.buffered == 0


def test_empty_feed_and_zero_length_payloads():
    fb = FrameBuffer()
    fb.feed(b"")
    assert fb.next_frame() is None
    raws = [R.encode_record(0, v, 0, b"") for v in range(1, 50)]
    for r in raws:
        fb.feed(r)
    frames = fb.take_frames()
    assert [f.version for f in frames] == list(range(1, 50))
    assert all(f.payload == b"" for f in frames)


def test_large_frame_grows_buffer():
    payload = random.Random(14).randbytes(300_000)
    raw = R.encode_record(3, 9, 2, payload)
    fb = FrameBuffer(initial_bytes=36)
    for i in range(0, len(raw), 7777):
        assert fb.next_frame() is None
        fb.feed(raw[i:i + 7777])
    rec = fb.next_frame()
    assert rec.payload == payload and rec.version == 9
