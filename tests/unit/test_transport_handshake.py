"""The hello / HMAC-SHA256 challenge-response (vrepl/transport/handshake.py): both sides
prove the cluster secret over both nonces; every failure names its reason."""

from __future__ import annotations

import asyncio

import pytest

from vrepl.transport import codec
from vrepl.transport.codec import Auth, Challenge, ConnKind, Hello, Welcome
from vrepl.transport.framed import FramedStream, client_handshake, server_handshake
from vrepl.transport.handshake import (
    HANDSHAKE_MAX_FRAME_BYTES,
    ClientHandshake,
    HandshakeError,
    ServerHandshake,
    make_proof,
)

SECRET = b"cluster-secret"


def accept_all(hello: Hello) -> str | None:
    return None


def run(client: ClientHandshake, server: ServerHandshake) -> None:
    """Pump frames between the two state machines until the client is done."""
    to_server = client.start()
    while True:
        to_client = server.on_message(codec.decode_bytes(to_server))
        out = client.on_message(codec.decode_bytes(to_client))
        if out is None:
            return
        to_server = out


def test_both_sides_complete_with_the_same_secret():
    client = ClientHandshake(SECRET, ConnKind.PEER, 7, 1, 3)
    server = ServerHandshake(SECRET, 3, accept_all)
    run(client, server)
    assert client.done and server.done
    assert server.hello == client.hello


def test_the_server_refuses_a_client_with_another_secret():
    client = ClientHandshake(b"other", ConnKind.PEER, 7, 1, 3)
    server = ServerHandshake(SECRET, 3, accept_all)
    challenge = server.on_message(codec.decode_bytes(client.start()))
    # The client sees the server's proof is wrong first...
    with pytest.raises(HandshakeError, match="server proof does not match"):
        client.on_message(codec.decode_bytes(challenge))
    # ...and a client that answers anyway is refused by the server.
    with pytest.raises(HandshakeError, match="wrong proof from n1 for vg7"):
        server.on_message(Auth(b"\0" * 32))


def test_a_proof_cannot_be_reflected_or_replayed():
    hello = Hello(ConnKind.PEER, 7, 1, 3, b"a" * 32)
    server_proof = make_proof(SECRET, "server", hello, 3, b"b" * 32)
    assert server_proof != make_proof(SECRET, "client", hello, 3, b"b" * 32)  # no reflection
    assert server_proof != make_proof(SECRET, "server", hello, 3, b"c" * 32)  # fresh nonce
    server = ServerHandshake(SECRET, 3, accept_all, nonce=b"c" * 32)
    server.on_message(hello)
    with pytest.raises(HandshakeError, match="wrong proof"):
        server.on_message(Auth(make_proof(SECRET, "client", hello, 3, b"b" * 32)))


def test_nonces_are_fresh():
    a = ClientHandshake(SECRET, ConnKind.PEER, 7, 1, 3)
    b = ClientHandshake(SECRET, ConnKind.PEER, 7, 1, 3)
    assert a.hello.nonce != b.hello.nonce and len(a.hello.nonce) == 32


def test_check_hello_reason_is_raised():
    server = ServerHandshake(SECRET, 3, lambda h: f"unknown vgroup {h.vgroup_id}")
    with pytest.raises(HandshakeError, match="unknown vgroup 9"):
        server.on_message(Hello(ConnKind.PEER, 9, 1, 3, b"a" * 32))


@pytest.mark.parametrize(
    "hello, reason",
    [
        (Hello(ConnKind.PEER, 7, 1, 3, b"a" * 32, protocol=2), "protocol 2"),
        (Hello(77, 7, 1, 3, b"a" * 32), "unknown connection kind 77"),
    ],
)
def test_bad_hellos(hello, reason):
    with pytest.raises(HandshakeError, match=reason):
        ServerHandshake(SECRET, 3, accept_all).on_message(hello)


def test_the_client_checks_it_reached_the_node_it_wanted():
    client = ClientHandshake(SECRET, ConnKind.PEER, 7, 1, 3)
    server = ServerHandshake(SECRET, 4, accept_all)  # a different node now owns that port
    challenge = server.on_message(codec.decode_bytes(client.start()))
    with pytest.raises(HandshakeError, match="server is n4, expected n3"):
        client.on_message(codec.decode_bytes(challenge))


def test_out_of_order_messages_are_refused():
    server = ServerHandshake(SECRET, 3, accept_all)
    with pytest.raises(HandshakeError, match="unexpected auth"):
        server.on_message(Auth(b"\0" * 32))
    client = ClientHandshake(SECRET, ConnKind.PEER, 7, 1, 3)
    client.start()
    with pytest.raises(HandshakeError, match="unexpected welcome"):
        client.on_message(Welcome())
    with pytest.raises(HandshakeError, match="unexpected"):
        ServerHandshake(SECRET, 3, accept_all).on_message(Challenge(1, b"a" * 32, b"b" * 32))


@pytest.mark.timeout(10)
def test_stream_helpers_run_both_sides_over_tcp():
    """The functions an arbitrator uses: server_handshake / client_handshake over asyncio."""

    async def main() -> tuple[Hello, object]:
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_client(reader, writer):
            stream = FramedStream(reader, writer, max_frame_bytes=HANDSHAKE_MAX_FRAME_BYTES)
            hello = await server_handshake(
                stream, secret=SECRET, node=codec.ARBITRATOR_NODE_ID, check_hello=accept_all, max_frame_bytes=1 << 20
            )
            msg = await stream.recv()
            got.set_result((hello, msg))
            stream.close()

        server = await asyncio.start_server(on_client, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        stream = FramedStream(reader, writer)
        await client_handshake(
            stream, secret=SECRET, kind=ConnKind.ARBITRATOR, vgroup_id=5, node=2, target_node=codec.ARBITRATOR_NODE_ID
        )
        from vrepl.replica.messages import ArbitratorRequest

        stream.send(ArbitratorRequest(5, 2, 9, 2000))
        await stream.drain()
        result = await asyncio.wait_for(got, 5)
        stream.close()
        server.close()
        await server.wait_closed()
        return result

    hello, msg = asyncio.run(main())
    assert (hello.kind, hello.vgroup_id, hello.node) == (ConnKind.ARBITRATOR, 5, 2)
    assert msg.describe() == "arbitrator_request vg5 n2 e9 lease 2000ms"


@pytest.mark.timeout(10)
def test_stream_helper_times_out_a_silent_server():
    async def main() -> None:
        async def silent(reader, writer):
            await asyncio.sleep(5)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            with pytest.raises(HandshakeError, match="no handshake answer within 0.2 s"):
                await client_handshake(
                    FramedStream(reader, writer), secret=SECRET, kind=ConnKind.PEER, vgroup_id=1, node=1,
                    target_node=2, timeout_s=0.2,
                )
        finally:
            writer.close()
            server.close()

    asyncio.run(main())
