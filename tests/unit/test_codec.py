"""Wire codec (vrepl/transport/codec.py, vrepl/_core/wire.pyx): every message round-trips,
frames fed one byte at a time reassemble, and malformed frames raise FrameError naming why."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrepl._core import record as _rec
from vrepl._core import wire
from vrepl._core.framebuf import FrameBuffer
from vrepl.errors import FrameError
from vrepl.replica.messages import (
    ArbitratorGrant,
    ArbitratorRequest,
    Commit,
    Forward,
    ForwardAck,
    ForwardBatch,
    Heartbeat,
    PeerView,
    Status,
    SyncRequest,
    SyncStart,
    TruncateRequest,
)
from vrepl.transport import codec
from vrepl.transport.codec import Auth, Challenge, Hello, MsgType, Welcome

u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
epoch = st.integers(1, 2**63)
version = st.integers(1, 2**62)
node = st.integers(-1, 2**31 - 1)
views = st.builds(PeerView, st.integers(0, 4), u64, u64, u64, node)
blob = st.binary(max_size=300)
b32 = st.binary(min_size=32, max_size=32)


@st.composite
def forward_batches(draw):
    n = draw(st.integers(1, 20))
    first = draw(version)
    epochs = sorted(draw(st.lists(st.integers(1, 50), min_size=n, max_size=n)))
    frame_epoch = epochs[-1] + draw(st.integers(0, 3))
    payloads = tuple(draw(st.lists(blob, min_size=n, max_size=n)))
    return ForwardBatch(frame_epoch, first, draw(st.integers(0, epochs[0])), tuple(epochs), payloads)


@st.composite
def forwards(draw):
    rec_epoch = draw(st.integers(1, 2**40))
    return Forward(rec_epoch + draw(st.integers(0, 5)), draw(version), draw(st.integers(0, rec_epoch)), rec_epoch, draw(blob))


messages = st.one_of(
    st.builds(Status, node, st.lists(views, max_size=codec.MAX_STATUS_VIEWS).map(tuple)),
    st.builds(Heartbeat, views),
    forwards(),
    forward_batches(),
    st.builds(ForwardAck, u64, u64, st.integers(0, 2)),
    st.builds(SyncRequest, u64, u64, u64),
    st.builds(TruncateRequest, u64, u64, u64),
    st.builds(SyncStart, u64, u64, u64),
    st.builds(Commit, u64, u64),
    st.builds(ArbitratorRequest, u32, node, u64, u32),
    st.builds(ArbitratorGrant, u32, node, u64, u32, st.integers(0, 1)),
    st.builds(Hello, st.integers(0, 255), u32, node, node, b32, st.integers(0, 65535)),
    st.builds(Challenge, node, b32, b32),
    st.builds(Auth, b32),
    st.just(Welcome()),
)


@settings(max_examples=400, deadline=None)
@given(messages)
def test_every_message_round_trips(msg):
    frame = codec.encode(msg)
    assert codec.decode_bytes(frame) == msg


@settings(max_examples=60, deadline=None)
@given(st.lists(messages, min_size=1, max_size=8))
def test_frames_fed_one_byte_at_a_time_reassemble(msgs):
    stream = b"".join(codec.encode(m) for m in msgs)
    fb = FrameBuffer(1 << 20)
    got = []
    for i in range(len(stream)):
        fb.feed(stream[i : i + 1])
        while (rec := fb.next_frame()) is not None:
            got.append(codec.decode(rec))
    assert got == msgs


@settings(max_examples=100, deadline=None)
@given(forward_batches())
def test_forward_batch_body_is_the_wal_records_unchanged(batch):
    frame = codec.encode(batch)
    decoded = codec.decode_bytes(frame)
    # The block a slave appends to its WAL is exactly what a WAL scan accepts.
    scan = _rec.scan(decoded.block, expect_version=batch.first_version)
    assert scan.ok and scan.count == len(batch.payloads)
    assert [int(e) for e in scan.epochs] == list(batch.record_epochs)
    # And re-encoding with that block gives the same frame (the master's zero-copy path).
    assert codec.encode(batch, decoded.block) == frame


def test_frame_type_table_keeps_peer_types_away_from_wal_data_types():
    assert all(16 <= m.value <= 63 for m in MsgType)
    assert "35 FORWARD_BATCH" in codec.describe_frame_types()


def _frame(msg_type: int, payload: bytes, version: int = 1, epoch: int = 1) -> bytes:
    return _rec.encode_record(msg_type, version, epoch, payload)


@pytest.mark.parametrize(
    "frame, reason",
    [
        (_frame(99, b""), "unknown message type 99"),
        (_frame(5, b"data"), "unknown message type 5"),
        (_frame(MsgType.FORWARD_ACK, b""), "malformed FORWARD_ACK"),
        (_frame(MsgType.FORWARD_ACK, b"\x07"), "unknown status 7"),
        (_frame(MsgType.HEARTBEAT, b"\x00" * 10), "malformed HEARTBEAT"),
        (_frame(MsgType.HEARTBEAT, struct.pack("<BQQQi", 9, 0, 0, 0, -1)), "unknown role 9"),
        (_frame(MsgType.STATUS, struct.pack("<iH", 1, 1000)), "1000 views"),
        (_frame(MsgType.STATUS, struct.pack("<iH", 1, 2) + b"\x00" * 29), "malformed STATUS"),
        (_frame(MsgType.SYNC_REQUEST, b"\x00" * 9), "malformed SYNC_REQUEST"),
        (_frame(MsgType.COMMIT, b"\x00"), "malformed COMMIT: payload is 1 bytes, expected 0"),
        (_frame(MsgType.HELLO, b"\x00" * 3), "malformed HELLO"),
        (_frame(MsgType.WELCOME, b"x"), "malformed WELCOME"),
        (_frame(MsgType.ARBITRATOR_GRANT, struct.pack("<IiIB", 1, 1, 1, 5)), "granted is 5"),
        (_frame(MsgType.FORWARD_BATCH, b"\x00" * 4), "holds no record"),
        (_frame(MsgType.FORWARD_BATCH, b"\x00" * 8 + b"junk" * 10), "bad signature"),
        (_frame(MsgType.FORWARD_BATCH, b"\x00" * 8 + _rec.encode_record(1, 2, 1, b"x")), "has version 2, expected 1"),
        (_frame(MsgType.FORWARD_BATCH, b"\x00" * 8 + _rec.encode_record(40, 1, 1, b"x")), "not a data type"),
        (_frame(MsgType.FORWARD_BATCH, b"\x00" * 8 + _rec.encode_record(1, 1, 1, b"x") + b"zz"), "trailing bytes"),
        (_frame(MsgType.FORWARD_BATCH, b"\x00" * 8 + _rec.encode_record(1, 1, 5, b"x"), epoch=2), "above the frame epoch"),
        (
            _frame(MsgType.FORWARD_BATCH, b"\x00" * 8 + _rec.encode_record(1, 1, 3, b"x") + _rec.encode_record(1, 2, 2, b"y"), epoch=3),
            "after epoch 3",
        ),
        (_frame(MsgType.FORWARD, b"\x00" * 8 + _rec.encode_batch(1, 1, 1, [b"a", b"b"])), "a FORWARD has one"),
        (_frame(MsgType.FORWARD_BATCH, b"\x00" * 8 + _rec.encode_record(1, 1, 1, b"x"), version=0), "version 0"),
    ],
)
def test_malformed_frames_raise_frame_error_naming_the_reason(frame, reason):
    with pytest.raises(FrameError, match=reason):
        codec.decode_bytes(frame)


def test_commit_frame_layout():
    """docs/embedding.md §Wire format: type 40, header version = committed version, header
    epoch = the master's epoch, no payload."""
    frame = codec.encode(Commit(7, 1234))
    rec = _rec.decode_record(frame, 0, 1024)
    assert (rec.msg_type, rec.version, rec.epoch, rec.payload) == (40, 1234, 7, b"")
    assert len(frame) == codec.HEADER_BYTES
    assert "40 COMMIT" in codec.describe_frame_types()


def test_a_corrupt_inner_record_is_refused():
    body = bytearray(b"\x00" * 8 + _rec.encode_record(1, 1, 1, b"payload"))
    body[-1] ^= 0xFF
    with pytest.raises(FrameError, match="payload checksum"):
        wire.decode_forward_body(bytes(body), 1, 1024)


def test_a_record_above_the_record_limit_is_refused():
    body = b"\x00" * 8 + _rec.encode_record(1, 1, 1, b"x" * 100)
    with pytest.raises(FrameError, match="above the maximum"):
        wire.decode_forward_body(body, 1, 50)


def test_encode_records_with_mixed_epochs_matches_record_by_record_encoding():
    block = wire.encode_records(5, (1, 1, 2), (b"a", b"bb", b""))
    expected = b"".join(_rec.encode_record(1, v, e, p) for v, e, p in ((5, 1, b"a"), (6, 1, b"bb"), (7, 2, b"")))
    assert block == expected
