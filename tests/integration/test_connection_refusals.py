"""Bad connections against a running 3-process cluster: each is closed with a logged reason
and the node keeps serving (issue 3 §Tests: unknown vgroup, wrong secret, oversize frame,
garbage bytes, unknown message type). The test is the client, with a raw socket."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from vrepl._core import record as _rec
from vrepl._core.framebuf import FrameBuffer
from vrepl.transport import codec
from vrepl.transport.codec import ConnKind
from vrepl.transport.handshake import ClientHandshake, HandshakeError

pytestmark = pytest.mark.timeout(60)

SECRET = "test-secret"
LIMITS = {"max_record_bytes": 65536, "max_batch_bytes": 65536, "stream_chunk_bytes": 65536}


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(5)
    return s


def closed_by_server(s: socket.socket, timeout_s: float = 5.0) -> bool:
    """True once the server closed the connection (EOF or reset), reading what it sent."""
    deadline = time.monotonic() + timeout_s
    s.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if not s.recv(65536):
                return True
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


def recv_message(s: socket.socket, fb: FrameBuffer):
    while True:
        rec = fb.next_frame()
        if rec is not None:
            return codec.decode(rec)
        data = s.recv(65536)
        if not data:
            raise EOFError("closed")
        fb.feed(data)


def handshake(s: socket.socket, *, secret: bytes, vgroup: int, node: int, target: int) -> None:
    hs = ClientHandshake(secret, ConnKind.PEER, vgroup, node, target)
    fb = FrameBuffer(1 << 20)
    s.sendall(hs.start())
    while not hs.done:
        out = hs.on_message(recv_message(s, fb))
        if out:
            s.sendall(out)


def log_has(c, node: int, text: str, timeout_s: float = 5.0) -> bool:
    return bool(c.wait_for(f"n{node} logs {text!r}", lambda: text in c.nodes[node].log_text(), timeout_s))


def still_serving(c, m: int, count: int = 50) -> None:
    before = time.monotonic()
    c.send(m, f"forward {count} 64")
    c.wait_for(
        "confirms after the bad connection",
        lambda: any(e["status"] == "ok" for e in c.confirms(m, before)),
        10,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from vrepl.testing.cluster import ProcessCluster

    c = ProcessCluster(str(tmp_path_factory.mktemp("refusals")), 3, secret=SECRET, lifetime_s=90, **LIMITS)
    try:
        c.start()
        c.wait_master(slaves=2, timeout_s=15)
        yield c
    finally:
        c.close()


def test_unknown_vgroup_is_refused(cluster):
    c = cluster
    with connect(c.nodes[3].port) as s:
        s.sendall(codec.encode(codec.Hello(ConnKind.PEER, 99, 1, 3, b"n" * 32)))
        assert closed_by_server(s)
    assert log_has(c, 3, "unknown vgroup 99")
    still_serving(c, c.wait_master(slaves=2))


def test_unknown_node_is_refused(cluster):
    c = cluster
    with connect(c.nodes[3].port) as s:
        s.sendall(codec.encode(codec.Hello(ConnKind.PEER, 7, 42, 3, b"n" * 32)))
        assert closed_by_server(s)
    assert log_has(c, 3, "unknown node n42")


def test_wrong_secret_is_refused(cluster):
    c = cluster
    with connect(c.nodes[3].port) as s:
        # The client checks the server's proof first and gives up...
        with pytest.raises(HandshakeError, match="server proof does not match"):
            handshake(s, secret=b"not-the-secret", vgroup=7, node=1, target=3)
    # ...so answer anyway, to see the server refuse the client's proof:
    hs = ClientHandshake(b"not-the-secret", ConnKind.PEER, 7, 1, 3)
    with connect(c.nodes[3].port) as s:
        s.sendall(hs.start())
        fb = FrameBuffer(1 << 20)
        challenge = recv_message(s, fb)
        assert isinstance(challenge, codec.Challenge)
        s.sendall(codec.encode(codec.Auth(b"\0" * 32)))
        assert closed_by_server(s)
    assert log_has(c, 3, "wrong proof from n1 for vg7")
    still_serving(c, c.wait_master(slaves=2))


def test_oversize_frame_before_the_hello_is_refused(cluster):
    c = cluster
    with connect(c.nodes[2].port) as s:
        # A valid header claiming a 1 MiB payload; the handshake limit is 256 bytes.
        s.sendall(_header(codec.MsgType.HELLO, 1 << 20))
        assert closed_by_server(s)
    assert log_has(c, 2, "payload length above the maximum")


def test_garbage_bytes_are_refused(cluster):
    c = cluster
    with connect(c.nodes[2].port) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\xff" * 64)
        assert closed_by_server(s)
    assert log_has(c, 2, "bad signature")
    still_serving(c, c.wait_master(slaves=2))


def test_after_the_handshake_oversize_and_unknown_types_close_the_connection(cluster):
    c = cluster
    # Authenticate as n1 towards n3 (n1 has the lower address, so it is the one that connects).
    with connect(c.nodes[3].port) as s:
        handshake(s, secret=SECRET.encode(), vgroup=7, node=1, target=3)
        s.sendall(_header(codec.MsgType.FORWARD_BATCH, 1 << 20))  # above the 128 KiB frame limit
        assert closed_by_server(s)
    assert log_has(c, 3, "payload length above the maximum")
    with connect(c.nodes[3].port) as s:
        handshake(s, secret=SECRET.encode(), vgroup=7, node=1, target=3)
        s.sendall(_rec.encode_record(99, 0, 0, b"hello"))
        assert closed_by_server(s)
    assert log_has(c, 3, "unknown message type 99")
    with connect(c.nodes[3].port) as s:
        handshake(s, secret=SECRET.encode(), vgroup=7, node=1, target=3)
        s.sendall(_rec.encode_record(codec.MsgType.FORWARD_ACK, 1, 1, b"\x00\x00"))
        assert closed_by_server(s)
    assert log_has(c, 3, "malformed FORWARD_ACK")
    # The real n1 reconnects within its reconnect interval; the group keeps confirming.
    m = c.wait_master(slaves=2, timeout_s=10)
    still_serving(c, m)


def test_the_higher_address_may_not_open_the_connection(cluster):
    c = cluster
    with connect(c.nodes[1].port) as s:
        s.sendall(codec.encode(codec.Hello(ConnKind.PEER, 7, 3, 1, b"n" * 32)))
        assert closed_by_server(s)
    assert log_has(c, 1, "has the higher address")


def _header(msg_type: int, payload_len: int) -> bytes:
    """A valid 36-byte header (checksummed) announcing payload_len bytes that never come."""
    from vrepl._core.crc32c import crc32c

    head = struct.pack("<IBBHQQII", _rec.RECORD_SIGNATURE, msg_type, 1, 0, 0, 0, payload_len, 0)
    return head + struct.pack("<I", crc32c(head))
