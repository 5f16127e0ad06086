"""Wire codec: every peer, hello and arbitrator message as one record-framed frame.

Owns: the table of frame types (msg_type of the 36-byte record header, vrepl/_core/frame.pxd)
and the binary layout of each message's payload (docs/embedding.md §Wire format). A frame is
a record: the header's msg_type says which message it is, its version/epoch fields carry the
message's natural version and epoch, and its payload the rest, packed with `struct` (little
endian). Forward and ForwardBatch bodies are a u64 prev_epoch followed by WAL records exactly
as the WAL stores them, so a slave appends them to its WAL without re-encoding
(vrepl/_core/wire.pyx builds and splits those).

Frame types (WAL data records use 1..15, so a frame is never mistaken for WAL data):

    16 HELLO  17 CHALLENGE  18 AUTH  19 WELCOME                     connection handshake
    32 STATUS 33 HEARTBEAT 34 FORWARD 35 FORWARD_BATCH 36 FORWARD_ACK
    37 SYNC_REQUEST 38 TRUNCATE_REQUEST 39 SYNC_START 40 COMMIT      peer messages
    48 ARBITRATOR_REQUEST 49 ARBITRATOR_GRANT                        replica <-> arbitrator
    80..96 on a SHIP connection: vrepl/ship/protocol.py (docs/ship.md §3.1)

Any other msg_type, a payload of the wrong size or a field out of range raises FrameError
naming the reason: the connection owner closes that connection and keeps serving.
Must not: touch sockets or hold state; decoding never trusts a length it has not checked.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from vrepl._core import frame as _rec
from vrepl._core import wire as _wire
from vrepl.errors import FrameError
from vrepl.replica.messages import (
    NO_NODE,
    ArbitratorGrant,
    ArbitratorRequest,
    Commit,
    Forward,
    ForwardAck,
    ForwardBatch,
    Heartbeat,
    PeerView,
    Role,
    Status,
    SyncRequest,
    SyncStart,
    TruncateRequest,
)

HEADER_BYTES = _rec.HEADER_SIZE_BYTES
DATA_MSG_TYPE = 1  # the WAL record type of an application record (vrepl.wal.MSG_TYPE_DATA)
PROTOCOL_VERSION = 1
NONCE_BYTES = 32
PROOF_BYTES = 32  # HMAC-SHA256
MAX_STATUS_VIEWS = 64
ARBITRATOR_NODE_ID = -2  # the node id an arbitrator answers with in its CHALLENGE


class MsgType(enum.IntEnum):
    HELLO = 16
    CHALLENGE = 17
    AUTH = 18
    WELCOME = 19
    STATUS = 32
    HEARTBEAT = 33
    FORWARD = 34
    FORWARD_BATCH = 35
    FORWARD_ACK = 36
    SYNC_REQUEST = 37
    TRUNCATE_REQUEST = 38
    SYNC_START = 39
    COMMIT = 40
    ARBITRATOR_REQUEST = 48
    ARBITRATOR_GRANT = 49


class ConnKind(enum.IntEnum):
    """What a connection is for, named in the HELLO."""

    PEER = 1  # replica <-> replica of one vgroup
    ARBITRATOR = 2  # replica -> arbitrator
    SYNC = 3  # master -> a replica that is behind: the restore flow (docs/restore.md)
    BACKUP = 4  # a restore tool (`vrepl restore`) -> any replica: pull a full copy
    FETCH = 5  # a replica -> another replica: files of an ingested round (docs/vnode.md §9.6)
    SHIP = 6  # `vrepl ship` (a sender with its own secret) -> a vgroup's master (docs/ship.md)


RESTORE_TOOL_NODE_ID = -3  # the node id a restore tool names in its HELLO


# ---------------------------------------------------------------------------------------------
# Handshake messages (docs/embedding.md §Connections and the hello)


@dataclass(frozen=True, slots=True)
class Hello:
    """Client -> server, first frame: who I am, whom I want, my nonce."""

    kind: int
    vgroup_id: int
    node: int  # the client's node id
    target_node: int  # the node id the client expects to reach (ARBITRATOR_NODE_ID for one)
    nonce: bytes
    protocol: int = PROTOCOL_VERSION

    def describe(self) -> str:
        return (
            f"hello {ConnKind(self.kind).name.lower() if self.kind in ConnKind._value2member_map_ else self.kind}"
            f" vg{self.vgroup_id} n{self.node} -> n{self.target_node} proto {self.protocol}"
        )


@dataclass(frozen=True, slots=True)
class Challenge:
    """Server -> client: my node id, my nonce, and my proof over both nonces."""

    node: int
    nonce: bytes
    proof: bytes

    def describe(self) -> str:
        return f"challenge from n{self.node}"


@dataclass(frozen=True, slots=True)
class Auth:
    """Client -> server: the client's proof over both nonces."""

    proof: bytes

    def describe(self) -> str:
        return "auth"


@dataclass(frozen=True, slots=True)
class Welcome:
    """Server -> client: authenticated; peer messages follow."""

    def describe(self) -> str:
        return "welcome"


HandshakeMessage = Hello | Challenge | Auth | Welcome
WireMessage = (
    Status
    | Heartbeat
    | Forward
    | ForwardBatch
    | ForwardAck
    | SyncRequest
    | TruncateRequest
    | SyncStart
    | Commit
    | ArbitratorRequest
    | ArbitratorGrant
    | Hello
    | Challenge
    | Auth
    | Welcome
)

# ---------------------------------------------------------------------------------------------
# Layouts

_HELLO = struct.Struct("<HBIii32s")  # protocol, kind, vgroup, node, target_node, nonce
_CHALLENGE = struct.Struct("<i32s32s")  # node, nonce, proof
_AUTH = struct.Struct("<32s")
_VIEW = struct.Struct("<BQQQi")  # role, last_epoch, last_version, promised_epoch, promised_master
_STATUS_HEAD = struct.Struct("<iH")  # sender, view count
_U64 = struct.Struct("<Q")
_U8 = struct.Struct("<B")
_ARB_REQ = struct.Struct("<IiI")  # vgroup, node, lease_ms
_ARB_GRANT = struct.Struct("<IiIB")  # vgroup, node, lease_ms, granted

_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF


def _frame(msg_type: int, version: int, epoch: int, payload: bytes = b"") -> bytes:
    return _rec.encode_record(msg_type, version, epoch, payload)


def _pack_view(v: PeerView) -> bytes:
    return _VIEW.pack(v.role, v.last_epoch, v.last_version, v.promised_epoch, v.promised_master)


def _unpack_view(buf: bytes, offset: int, what: str) -> PeerView:
    role, last_epoch, last_version, promised_epoch, promised_master = _VIEW.unpack_from(buf, offset)
    if role not in Role._value2member_map_:
        raise FrameError(f"{what}: unknown role {role}")
    if promised_master < NO_NODE:
        raise FrameError(f"{what}: promised master {promised_master} is not a node id")
    return PeerView(role, last_epoch, last_version, promised_epoch, promised_master)


# ---------------------------------------------------------------------------------------------
# Encoding


def encode(msg: WireMessage, block: bytes | None = None) -> bytes:
    """The frame for `msg`. For a ForwardBatch whose records were already encoded as WAL
    records (the WAL block of the same batch), pass them as `block` to skip re-encoding."""
    if type(msg) is ForwardBatch:
        if block is None:
            block = msg.block or encode_records(msg.first_version, msg.record_epochs, msg.payloads)
        return _wire.encode_forward_frame(MsgType.FORWARD_BATCH, msg.first_version, msg.epoch, msg.prev_epoch, block)
    if type(msg) is Forward:
        rec = _rec.encode_record(DATA_MSG_TYPE, msg.version, msg.record_epoch, msg.payload)
        return _wire.encode_forward_frame(MsgType.FORWARD, msg.version, msg.epoch, msg.prev_epoch, rec)
    if type(msg) is ForwardAck:
        return _frame(MsgType.FORWARD_ACK, msg.acked_version, msg.epoch, _U8.pack(msg.status))
    if type(msg) is Heartbeat:
        return _frame(MsgType.HEARTBEAT, 0, 0, _pack_view(msg.view))
    if type(msg) is Status:
        if len(msg.views) > MAX_STATUS_VIEWS:
            raise ValueError(f"status with {len(msg.views)} views (max {MAX_STATUS_VIEWS})")
        payload = _STATUS_HEAD.pack(msg.sender, len(msg.views)) + b"".join(_pack_view(v) for v in msg.views)
        return _frame(MsgType.STATUS, 0, 0, payload)
    if type(msg) is SyncRequest:
        return _frame(MsgType.SYNC_REQUEST, msg.last_version, msg.epoch, _U64.pack(msg.last_epoch))
    if type(msg) is TruncateRequest:
        return _frame(MsgType.TRUNCATE_REQUEST, msg.keep_version, msg.epoch, _U64.pack(msg.keep_epoch))
    if type(msg) is SyncStart:
        return _frame(MsgType.SYNC_START, msg.first_version, msg.epoch, _U64.pack(msg.last_version))
    if type(msg) is Commit:
        return _frame(MsgType.COMMIT, msg.version, msg.epoch)
    if type(msg) is ArbitratorRequest:
        return _frame(MsgType.ARBITRATOR_REQUEST, 0, msg.epoch, _ARB_REQ.pack(msg.vgroup_id, msg.node, msg.lease_ms))
    if type(msg) is ArbitratorGrant:
        payload = _ARB_GRANT.pack(msg.vgroup_id, msg.node, msg.lease_ms, 1 if msg.granted else 0)
        return _frame(MsgType.ARBITRATOR_GRANT, 0, msg.epoch, payload)
    if type(msg) is Hello:
        payload = _HELLO.pack(msg.protocol, msg.kind, msg.vgroup_id, msg.node, msg.target_node, msg.nonce)
        return _frame(MsgType.HELLO, 0, 0, payload)
    if type(msg) is Challenge:
        return _frame(MsgType.CHALLENGE, 0, 0, _CHALLENGE.pack(msg.node, msg.nonce, msg.proof))
    if type(msg) is Auth:
        return _frame(MsgType.AUTH, 0, 0, _AUTH.pack(msg.proof))
    if type(msg) is Welcome:
        return _frame(MsgType.WELCOME, 0, 0)
    raise TypeError(f"no wire encoding for {type(msg).__name__}")


def encode_records(first_version: int, epochs: tuple[int, ...], payloads: tuple[bytes, ...]) -> bytes:
    """Records first_version.. with these epochs as WAL records (the WAL's and a forward
    frame's body format): one C call when the epochs are all equal."""
    if epochs and epochs[0] == epochs[-1] and epochs.count(epochs[0]) == len(epochs):
        return _rec.encode_batch(DATA_MSG_TYPE, first_version, epochs[0], payloads)
    return _wire.encode_records(first_version, epochs, payloads, DATA_MSG_TYPE)


def hello_payload(msg: Hello) -> bytes:
    """The HELLO payload bytes, which both proofs cover (vrepl/transport/handshake.py)."""
    return _HELLO.pack(msg.protocol, msg.kind, msg.vgroup_id, msg.node, msg.target_node, msg.nonce)


# ---------------------------------------------------------------------------------------------
# Decoding


def _expect_len(payload: bytes, size: int, name: str) -> None:
    if len(payload) != size:
        raise FrameError(f"malformed {name}: payload is {len(payload)} bytes, expected {size}")


def decode(rec: _rec.Record, max_record_bytes: int = _rec.DEFAULT_MAX_PAYLOAD_BYTES) -> WireMessage:
    """The message carried by a frame (a verified Record from FrameBuffer); FrameError if the
    type is unknown or the payload does not fit its layout."""
    t = rec.msg_type
    p = rec.payload
    if t == MsgType.FORWARD_BATCH or t == MsgType.FORWARD:
        prev_epoch, epochs, payloads, block = _wire.decode_forward_body(p, rec.version, max_record_bytes)
        if epochs[-1] > rec.epoch:
            raise FrameError(f"malformed forward: record epoch {epochs[-1]} above the frame epoch {rec.epoch}")
        if t == MsgType.FORWARD:
            if len(payloads) != 1:
                raise FrameError(f"malformed FORWARD: {len(payloads)} records (a FORWARD has one)")
            return Forward(rec.epoch, rec.version, prev_epoch, epochs[0], payloads[0])
        return ForwardBatch(rec.epoch, rec.version, prev_epoch, epochs, payloads, block)
    if t == MsgType.FORWARD_ACK:
        _expect_len(p, 1, "FORWARD_ACK")
        status = p[0]
        if status > 2:
            raise FrameError(f"malformed FORWARD_ACK: unknown status {status}")
        return ForwardAck(rec.epoch, rec.version, status)
    if t == MsgType.HEARTBEAT:
        _expect_len(p, _VIEW.size, "HEARTBEAT")
        return Heartbeat(_unpack_view(p, 0, "HEARTBEAT"))
    if t == MsgType.STATUS:
        if len(p) < _STATUS_HEAD.size:
            raise FrameError(f"malformed STATUS: payload is {len(p)} bytes")
        sender, count = _STATUS_HEAD.unpack_from(p)
        if count > MAX_STATUS_VIEWS:
            raise FrameError(f"malformed STATUS: {count} views (max {MAX_STATUS_VIEWS})")
        _expect_len(p, _STATUS_HEAD.size + count * _VIEW.size, "STATUS")
        views = tuple(_unpack_view(p, _STATUS_HEAD.size + k * _VIEW.size, "STATUS") for k in range(count))
        return Status(sender, views)
    if t == MsgType.SYNC_REQUEST:
        _expect_len(p, 8, "SYNC_REQUEST")
        return SyncRequest(rec.epoch, _U64.unpack(p)[0], rec.version)
    if t == MsgType.TRUNCATE_REQUEST:
        _expect_len(p, 8, "TRUNCATE_REQUEST")
        return TruncateRequest(rec.epoch, _U64.unpack(p)[0], rec.version)
    if t == MsgType.SYNC_START:
        _expect_len(p, 8, "SYNC_START")
        return SyncStart(rec.epoch, rec.version, _U64.unpack(p)[0])
    if t == MsgType.COMMIT:
        _expect_len(p, 0, "COMMIT")
        return Commit(rec.epoch, rec.version)
    if t == MsgType.ARBITRATOR_REQUEST:
        _expect_len(p, _ARB_REQ.size, "ARBITRATOR_REQUEST")
        vgroup, node, lease_ms = _ARB_REQ.unpack(p)
        return ArbitratorRequest(vgroup, node, rec.epoch, lease_ms)
    if t == MsgType.ARBITRATOR_GRANT:
        _expect_len(p, _ARB_GRANT.size, "ARBITRATOR_GRANT")
        vgroup, node, lease_ms, granted = _ARB_GRANT.unpack(p)
        if granted > 1:
            raise FrameError(f"malformed ARBITRATOR_GRANT: granted is {granted}")
        return ArbitratorGrant(vgroup, node, rec.epoch, lease_ms, granted)
    if t == MsgType.HELLO:
        _expect_len(p, _HELLO.size, "HELLO")
        protocol, kind, vgroup, node, target, nonce = _HELLO.unpack(p)
        return Hello(kind, vgroup, node, target, nonce, protocol)
    if t == MsgType.CHALLENGE:
        _expect_len(p, _CHALLENGE.size, "CHALLENGE")
        node, nonce, proof = _CHALLENGE.unpack(p)
        return Challenge(node, nonce, proof)
    if t == MsgType.AUTH:
        _expect_len(p, _AUTH.size, "AUTH")
        return Auth(_AUTH.unpack(p)[0])
    if t == MsgType.WELCOME:
        _expect_len(p, 0, "WELCOME")
        return Welcome()
    raise FrameError(f"unknown message type {t}")


def decode_bytes(frame: bytes, max_record_bytes: int = _rec.DEFAULT_MAX_PAYLOAD_BYTES) -> WireMessage:
    """Decode one whole frame given as bytes (tests, tools); FrameError if it is not one."""
    rec = _rec.decode_record(frame, 0, max_record_bytes + 64)
    if len(frame) != HEADER_BYTES + len(rec.payload):
        raise FrameError(f"{len(frame) - HEADER_BYTES - len(rec.payload)} bytes after the frame")
    return decode(rec, max_record_bytes)


def describe_frame_types() -> str:
    """The frame-type table as text (docs, `vrepl` tools)."""
    return "\n".join(f"{m.value:3d} {m.name}" for m in MsgType)
