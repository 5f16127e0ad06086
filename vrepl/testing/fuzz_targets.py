"""Fuzz targets: functions that take arbitrary bytes and must never crash, hang or allocate
beyond the configured limits. Shared by the atheris harness (`python -m vrepl.testing.fuzz`)
and the hypothesis fuzz tests (tests/fuzz/).

A target may raise only the errors its contract names (FrameError, WalError and friends: a
clear rejection). Anything else is a bug the fuzzer reports.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from vrepl import wal
from vrepl._core import framebuf, record
from vrepl.errors import VreplError
from vrepl.replica import messages as _messages
from vrepl.transport import codec
from vrepl.transport.handshake import (
    HANDSHAKE_MAX_FRAME_BYTES,
    ClientHandshake,
    ServerHandshake,
)
from vrepl.vnode import ingest
from vrepl.vnode.config import VnodeConfig

# The largest record any target accepts: allocations must stay below a small multiple of it.
FUZZ_MAX_RECORD_BYTES = 64 * 1024


def _split(data: bytes) -> tuple[list[int], bytes]:
    """Use the first bytes of the input as chunk sizes, the rest as the stream."""
    sizes = [b % 17 + 1 for b in data[:8]]
    return sizes, data[8:]


def target_frame_buffer(data: bytes) -> None:
    """Feed a stream in input-chosen chunks; take frames until an error or the end."""
    sizes, stream = _split(data)
    fb = framebuf.FrameBuffer(max_payload_len=FUZZ_MAX_RECORD_BYTES, initial_bytes=64)
    pos, i = 0, 0
    try:
        while pos < len(stream):
            n = sizes[i % len(sizes)] if sizes else len(stream)
            fb.feed(stream[pos:pos + n])
            pos += n
            i += 1
            while fb.next_frame() is not None:
                pass
        assert fb.buffered <= len(stream)
    except VreplError:
        pass


def target_scan(data: bytes) -> None:
    """Scan arbitrary bytes: never raises, reports a consistent end and count."""
    r = record.scan(data, max_payload_len=FUZZ_MAX_RECORD_BYTES, contiguous=True)
    assert 0 <= r.end <= len(data)
    assert r.count == len(r.versions) == len(r.offsets)
    if r.count:
        assert int(r.offsets[-1]) + 36 + int(r.lengths[-1]) == r.end
    try:
        record.decode_record(data, 0, FUZZ_MAX_RECORD_BYTES)
    except VreplError:
        pass


_VALID_PREFIX = record.encode_batch(1, 1, 1, [b"a" * 10, b"b" * 20, b"c" * 5])


def target_wal_directory(data: bytes) -> None:
    """Two WAL files built from the input (the first after a valid prefix): inspect, verify,
    read and repair must only ever reject with a WalError."""
    d = tempfile.mkdtemp(prefix="vrepl-fuzz-")
    try:
        cut = data[0] if data else 0
        body = data[1:]
        first, second = body[:cut], body[cut:]
        with open(os.path.join(d, wal.wal_file_name(0)), "wb") as fh:
            fh.write(_VALID_PREFIX + first)
        if second:
            with open(os.path.join(d, wal.wal_file_name(1)), "wb") as fh:
                fh.write(second)
        try:
            state = wal.inspect(d, FUZZ_MAX_RECORD_BYTES)
            n = sum(1 for _ in wal.WalReader(d, FUZZ_MAX_RECORD_BYTES).iter_records(1))
            assert n <= state.last_version
            if state.torn_tail is not None:
                wal.repair(d, FUZZ_MAX_RECORD_BYTES)
                assert wal.inspect(d, FUZZ_MAX_RECORD_BYTES).torn_tail is None
        except VreplError:
            pass
    finally:
        shutil.rmtree(d, ignore_errors=True)


def target_decode_messages(data: bytes) -> None:
    """Every frame in the stream decoded as a peer/arbitrator/handshake message: a decoder
    may only reject with FrameError (the connection is then closed)."""
    fb = framebuf.FrameBuffer(max_payload_len=FUZZ_MAX_RECORD_BYTES)
    fb.feed(data)
    try:
        while (rec := fb.next_frame()) is not None:
            try:
                msg = codec.decode(rec, FUZZ_MAX_RECORD_BYTES)
            except VreplError:
                continue
            # What decodes must encode back to a frame that decodes to the same message.
            assert codec.decode_bytes(codec.encode(msg), FUZZ_MAX_RECORD_BYTES) == msg
    except VreplError:
        pass


def target_handshake(data: bytes) -> None:
    """A server handshake fed the frames of an attacker's stream: it may only refuse
    (HandshakeError / FrameError), and it never accepts without the secret."""
    hs = ServerHandshake(b"fuzz-secret", 2, lambda hello: None)
    fb = framebuf.FrameBuffer(max_payload_len=HANDSHAKE_MAX_FRAME_BYTES)
    fb.feed(data)
    try:
        while (rec := fb.next_frame()) is not None:
            hs.on_message(codec.decode(rec, HANDSHAKE_MAX_FRAME_BYTES))
    except VreplError:
        pass
    assert not hs.done, "handshake completed without knowing the secret"


def _handshake_seed() -> bytes:
    client = ClientHandshake(b"wrong-secret", codec.ConnKind.PEER, 7, 1, 2, nonce=b"n" * 32)
    return client.start() + codec.encode(codec.Auth(b"p" * 32))


def _messages_seed() -> bytes:
    m = _messages
    view = m.PeerView(3, 1, 10, 1, 0)
    msgs = [m.Status(0, (view, view)), m.Heartbeat(view), m.ForwardAck(1, 10, 0),
            m.SyncRequest(1, 1, 10), m.ArbitratorRequest(7, 1, 2, 2000)]
    return b"".join(codec.encode(x) for x in msgs)


# The ingest decoders' limits under fuzzing: small, so a hostile input cannot make them work
# long; the body bound is the fuzzer's input size (-max_len).
_INGEST_CFG = VnodeConfig(max_rows_per_batch=1000, max_columns_per_table=64, max_tables=64)
_LP_SCHEMAS = {"cpu": {"usage": "float", "host": "str"}}


def target_line_protocol(data: bytes) -> None:
    """A body of line protocol, as the master (limits) and a replica (shape only) read it: a
    Staged batch, or one line naming a line of the body; nothing else (no exception)."""
    unit = data[0] % 6 if data else 0
    body = data[1:]
    st, reason, line, at = ingest.lines_staged(body, _INGEST_CFG, dict(_LP_SCHEMAS), 1, unit,
                                               ingest.VNODE_UNIT["ms"], 1_700_000_000_000, 4096)
    if st is None:
        assert isinstance(reason, str) and "\n" not in reason and 0 <= at <= len(body)
        assert line >= 1 or not body
    else:
        assert st.rows >= 1 and st.rows == sum(t.n for t in st.tables.values())
        payload = ingest.encode_lines_payload(body, None, unit, ingest.VNODE_UNIT["ms"],
                                              1_700_000_000_000)
        # every replica decodes the same rows from the payload
        again = ingest.decode_rows(payload)
        assert len(again) == st.rows


def target_arrow_stream(data: bytes) -> None:
    """An Arrow IPC stream body (a valid stream with bytes flipped, cut, appended): a Staged
    batch or one line; nothing else, no crash, no allocation beyond the input's size."""
    st, reason = ingest.arrow_staged(data, _INGEST_CFG, {}, 0, ingest.VNODE_UNIT["ms"])
    if st is None:
        assert isinstance(reason, str) and "\n" not in reason
    else:
        payload = ingest.encode_arrow_payload(data, "r1", ingest.VNODE_UNIT["ms"])
        assert len(ingest.decode_rows(payload)) == st.rows


def _arrow_seeds() -> list[bytes]:
    import pyarrow as pa

    from vrepl.client import arrow_stream
    one = pa.record_batch({"ts": pa.array([1, 2, 3], pa.int64()),
                           "v": pa.array([1.5, None, 2.5]), "s": pa.array(["a", "bc", None]),
                           "b": pa.array([True, False, None]), "i": pa.array([1, 2, 3], pa.int8())},
                          metadata={"vrepl.table": "t"})
    many = pa.record_batch({"ts": pa.array([1, 2], pa.timestamp("ns")),
                            "_table": pa.array(["a", "b"]).dictionary_encode(),
                            "d": pa.array(["x", "x"]).dictionary_encode(),
                            "u": pa.array([1, 2], pa.uint64()),
                            "n": pa.array([None, None], pa.null())})
    return [arrow_stream(one), arrow_stream(many)]


def _lp_seeds() -> list[bytes]:
    return [(b"\x00cpu,host=a usage=0.5,n=3i,ok=t,s=\"h\\\"i\" 1700000000000000000\n"
             b"cpu,host=a usage=1 1700000000001000000\nmem free=3u\n# c\n\n"),
            b"\x02m\\ x,t\\,k=v\\=w f=1e3,g=-2i,h=\"\" 1700000000000\r\n"]


TARGETS = {
    "frame_buffer": target_frame_buffer,
    "scan": target_scan,
    "wal_directory": target_wal_directory,
    "decode_messages": target_decode_messages,
    "handshake": target_handshake,
    "line_protocol": target_line_protocol,
    "arrow_stream": target_arrow_stream,
}


def seeds() -> list[bytes]:
    """Valid inputs the mutators start from."""
    return [
        bytes([5, 3, 16, 1, 2, 9, 4, 7]) + _VALID_PREFIX,
        _VALID_PREFIX,
        bytes([40]) + _VALID_PREFIX + record.encode_record(1, 4, 2, b"d" * 30),
        _messages_seed(),
        _handshake_seed(),
        *_lp_seeds(),
        *_arrow_seeds(),
    ]
