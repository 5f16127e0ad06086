"""The connection handshake: hello naming vgroup and nodes, HMAC-SHA256 challenge-response.

Owns: the two sides of the handshake as small state machines (`ClientHandshake`,
`ServerHandshake`: frames in, frames out, no I/O) and the proofs; vrepl/transport/framed.py
runs them over asyncio streams. docs/embedding.md §Connections and the hello describes the
exchange:

    client -> HELLO(kind, vgroup, client node, target node, nonce_c)
    server -> CHALLENGE(server node, nonce_s, proof_s)     after checking vgroup and nodes
    client -> AUTH(proof_c)                                after checking proof_s
    server -> WELCOME                                      after checking proof_c

proof_s = HMAC-SHA256(secret, "vrepl-hello-v1 server" | HELLO payload | server node | nonce_s)
proof_c = HMAC-SHA256(secret, "vrepl-hello-v1 client" | HELLO payload | server node | nonce_s)

Both sides prove they know the cluster secret over both fresh nonces (os.urandom), so a
recorded exchange cannot be replayed and one side's proof cannot be reflected as the
other's; proofs are compared in constant time (hmac.compare_digest). Any failure raises
HandshakeError with the reason, which the caller logs before closing the connection.
Must not: log or close anything itself, or read a clock (the caller enforces the timeout);
import asyncio or the frame buffer (the blocking sync clients, `vrepl ship` and restore, use
these state machines over their own sockets and need neither).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from typing import Callable

from vrepl.errors import HandshakeError, InvariantViolation
from vrepl.transport import codec
from vrepl.transport.codec import Auth, Challenge, ConnKind, Hello, Welcome

HANDSHAKE_MAX_FRAME_BYTES = 256  # the largest handshake frame payload a server accepts
_LABEL = b"vrepl-hello-v1 "


def make_proof(secret: bytes, side: str, hello: Hello, server_node: int, server_nonce: bytes) -> bytes:
    """HMAC-SHA256 proof of `side` ("server" or "client") over the hello and both nonces."""
    msg = _LABEL + side.encode() + b"|" + codec.hello_payload(hello) + struct.pack("<i", server_node) + server_nonce
    return hmac.new(secret, msg, hashlib.sha256).digest()


def new_nonce() -> bytes:
    return os.urandom(codec.NONCE_BYTES)


class ClientHandshake:
    """The connecting side. `start()` gives the HELLO frame; feed each received handshake
    message to `on_message()`, send what it returns; `done` once WELCOME arrived."""

    def __init__(
        self,
        secret: bytes,
        kind: int,
        vgroup_id: int,
        node: int,
        target_node: int,
        nonce: bytes | None = None,
        any_server: bool = False,
        secret_name: str = "the cluster secret",
    ) -> None:
        self.secret = secret
        # What the secret is, for the refusal: a sender's own secret is not the cluster's.
        self.secret_name = secret_name
        self.hello = Hello(int(kind), vgroup_id, node, target_node, nonce or new_nonce())
        self.done = False
        # A restore tool knows the address but not the node id: it accepts the node that
        # answers (the proof still binds that node id and both nonces to the secret).
        self.any_server = any_server
        self.server_node: int | None = None
        self._state = "start"

    def start(self) -> bytes:
        self._state = "wait_challenge"
        return codec.encode(self.hello)

    def on_message(self, msg: object) -> bytes | None:
        if self._state == "wait_challenge" and type(msg) is Challenge:
            if msg.node != self.hello.target_node and not self.any_server:
                raise HandshakeError(f"server is n{msg.node}, expected n{self.hello.target_node}")
            expected = make_proof(self.secret, "server", self.hello, msg.node, msg.nonce)
            if not hmac.compare_digest(expected, msg.proof):
                raise HandshakeError(f"server proof does not match {self.secret_name}")
            self._state = "wait_welcome"
            self.server_node = msg.node
            return codec.encode(Auth(make_proof(self.secret, "client", self.hello, msg.node, msg.nonce)))
        if self._state == "wait_welcome" and type(msg) is Welcome:
            self._state = "done"
            self.done = True
            return None
        raise HandshakeError(f"unexpected {_describe(msg)} while in handshake state {self._state}")


class ServerHandshake:
    """The accepting side. `check_hello(hello)` returns why a hello is refused (unknown
    vgroup, unknown node, wrong kind...) or None; `node` is this server's node id.
    `secret_for(hello)`, if given, picks the secret of an accepted hello (a ship sender has
    its own, docs/ship.md §1); else `secret` is everyone's."""

    def __init__(
        self,
        secret: bytes,
        node: int,
        check_hello: Callable[[Hello], str | None],
        nonce: bytes | None = None,
        secret_for: Callable[[Hello], bytes] | None = None,
    ) -> None:
        self.secret = secret
        self.secret_for = secret_for
        self.node = node
        self.check_hello = check_hello
        self.nonce = nonce or new_nonce()
        self.hello: Hello | None = None
        self.done = False
        self._state = "wait_hello"

    def on_message(self, msg: object) -> bytes | None:
        if self._state == "wait_hello" and type(msg) is Hello:
            if msg.protocol != codec.PROTOCOL_VERSION:
                raise HandshakeError(f"hello with protocol {msg.protocol}, this node speaks {codec.PROTOCOL_VERSION}")
            if msg.kind not in ConnKind._value2member_map_:
                raise HandshakeError(f"hello with unknown connection kind {msg.kind}")
            reason = self.check_hello(msg)
            if reason:
                raise HandshakeError(reason, "hello_refused")
            if self.secret_for is not None:
                self.secret = self.secret_for(msg)
            self.hello = msg
            self._state = "wait_auth"
            proof = make_proof(self.secret, "server", msg, self.node, self.nonce)
            return codec.encode(Challenge(self.node, self.nonce, proof))
        if self._state == "wait_auth" and type(msg) is Auth:
            if self.hello is None:
                raise InvariantViolation("self.hello is not None")
            expected = make_proof(self.secret, "client", self.hello, self.node, self.nonce)
            if not hmac.compare_digest(expected, msg.proof):
                raise HandshakeError(
                    f"wrong proof from n{self.hello.node} for vg{self.hello.vgroup_id} (cluster secret differs)",
                    "wrong_secret",
                )
            self._state = "done"
            self.done = True
            return codec.encode(Welcome())
        raise HandshakeError(f"unexpected {_describe(msg)} while in handshake state {self._state}")


def _describe(msg: object) -> str:
    describe = getattr(msg, "describe", None)
    return describe() if describe else type(msg).__name__
