"""The ship connection's messages (docs/ship.md §2): layouts only, no I/O.

Owns: the frame types 80..96 of a ship connection (after the HELLO / CHALLENGE / AUTH /
WELCOME handshake of kind SHIP, with the sender's own secret), their payload layouts (little
endian, `struct`), the file entry every list message carries, `encode()` and `decode()`.
Every message is one vrepl record frame (docs/wal-format.md); the header's version/epoch
carry the message's natural numbers. DATA announces `size` raw bytes that follow the frame
outside any framing (sent with os.sendfile); the reader takes exactly that many next.

    sender (edge, `vrepl ship`)                  receiver (the vgroup's master)
    BEGIN   uuid, round, last round, digest ->
                                          <-  STATE   last round, digest, match
    LIST_REQUEST (when the digests differ) ->
                                          <-  LIST* entries, LIST_END count, digest
    SCHEMA* JSON, SCHEMA_END            ->
                                          <-  SCHEMA_OK (or ERROR: owner / type conflict)
    DELETE* entries                     ->
    OFFER   entries                     ->
                                          <-  WANT   per entry: send from offset / have it
    DATA    index, offset, size + raw   ->
                                          <-  RESULT per file (checksum ok or not)
                                          <-  LOADED per committed load batch
    END     counts                      ->
                                          <-  DONE    files, digest
    ERROR   code, reason               <->   (either side, then close)

Must not: touch sockets or files. Decoding checks every length before using it; names are
decoded as sent (the receiver refuses bad ones, vrepl/node/shipreceiver.py) and describe()
escapes them (vrepl/untrusted.py), since a peer chose them.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from vrepl._core import frame as _rec
from vrepl.errors import FrameError
from vrepl.untrusted import printable

HEADER_BYTES = _rec.HEADER_SIZE_BYTES
UUID_BYTES = 16
DIGEST_BYTES = 32
MAX_TABLE_BYTES = 192
MAX_NAME_BYTES = 1024
MAX_REASON_BYTES = 1024
MAX_HOST_BYTES = 255
MAX_ENTRIES_PER_FRAME = 4096
MAX_SCHEMA_CHUNK_BYTES = 1024 * 1024
MAX_LOADED_ITEMS = 65536  # offers + deletions named by one LOADED frame
# The largest payload of any message here: a list frame of entries with the longest names.
MAX_FRAME_PAYLOAD_BYTES = 8 + MAX_ENTRIES_PER_FRAME * (35 + MAX_TABLE_BYTES + MAX_NAME_BYTES)

PRECISIONS = ("ms", "us")


class ShipMsg(enum.IntEnum):
    BEGIN = 80
    STATE = 81
    SCHEMA = 82
    SCHEMA_END = 83
    SCHEMA_OK = 84
    LIST_REQUEST = 85
    LIST = 86
    LIST_END = 87
    DELETE = 88
    OFFER = 89
    WANT = 90
    DATA = 91
    RESULT = 92
    LOADED = 93
    END = 94
    DONE = 95
    ERROR = 96


FLAG_RESYNC = 1  # BEGIN: reconcile by listing even if the digests agree (--resync)

WANT_SEND = 0  # WANT: send the file from `offset` (0, or what a cut transfer left)
WANT_LOADED = 1  # the receiver's archive already holds this file of this sender
WANT_RECEIVED = 2  # received and verified earlier (a cut round): no bytes needed

RESULT_OK = 0  # RESULT: whole, checksum (CRC-32C) equals the announced magic
RESULT_BAD = 1  # the bytes do not match the announced checksum: resend from 0


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One archived file of the sender: its key (table, bucket, size, magic) identifies the
    content on both sides; `name` is the sender's relative name (shown, never a path on the
    receiver); `index` numbers offers within one connection (0 in DELETE and LIST)."""

    index: int
    table: str
    bucket: int
    size: int
    magic: int
    rows: int = 0
    name: str = ""

    @property
    def key(self) -> tuple[str, int, int, int]:
        return (self.table, self.bucket, self.size, self.magic)

    def describe(self) -> str:
        return (
            f"#{self.index} {printable(self.name or self.table)} ({printable(self.table)}"
            f" b{self.bucket}, {self.size} B, magic {self.magic:#010x})"
        )


@dataclass(frozen=True, slots=True)
class Begin:
    seq: int  # the sender's round number with this receiver (1, 2, ...)
    uuid: bytes  # 16 bytes: the sender's identity (docs/ship.md §4)
    round_id: int  # random u64 naming this round
    last_round_id: int  # the sender's last completed round with this receiver, 0 none
    flags: int
    precision: str  # the sender's vnode precision, "ms" or "us"
    file_span_ms: int
    last_files: int  # entries in the sender's last_local_files
    last_digest: bytes  # their digest (docs/ship.md §3)
    deleted: int  # this round: files deleted on the sender since
    new: int  # ... and new files, and their bytes (hints for progress)
    new_bytes: int
    host: str = ""  # the sender's host name (shown in status; informational)

    def describe(self) -> str:
        return (
            f"begin round {self.seq} ({self.round_id:016x}) uuid {self.uuid.hex()}"
            f" last {self.last_round_id:016x} {self.deleted} deleted {self.new} new"
            f" ({self.new_bytes} B)"
        )


@dataclass(frozen=True, slots=True)
class State:
    last_seq: int  # the receiver's last completed round of this sender (0 none)
    last_round_id: int
    match: bool  # its digest of this sender's files equals the sender's
    files: int
    digest: bytes

    def describe(self) -> str:
        return (
            f"state last round {self.last_seq} ({self.last_round_id:016x}) {self.files} files"
            f" {'match' if self.match else 'differ'}"
        )


@dataclass(frozen=True, slots=True)
class Schema:
    chunk: bytes  # UTF-8 JSON {"tables": {table: {column: type}}}, one part

    def describe(self) -> str:
        return f"schema {len(self.chunk)} B"


@dataclass(frozen=True, slots=True)
class SchemaEnd:
    tables: int

    def describe(self) -> str:
        return f"schema_end {self.tables} tables"


@dataclass(frozen=True, slots=True)
class SchemaOk:
    def describe(self) -> str:
        return "schema_ok"


@dataclass(frozen=True, slots=True)
class ListRequest:
    def describe(self) -> str:
        return "list_request"


@dataclass(frozen=True, slots=True)
class ListPart:
    entries: tuple[FileEntry, ...]

    def describe(self) -> str:
        return f"list {len(self.entries)} entries"


@dataclass(frozen=True, slots=True)
class ListEnd:
    count: int
    digest: bytes

    def describe(self) -> str:
        return f"list_end {self.count} entries"


@dataclass(frozen=True, slots=True)
class Delete:
    entries: tuple[FileEntry, ...]

    def describe(self) -> str:
        return f"delete {len(self.entries)} entries"


@dataclass(frozen=True, slots=True)
class Offer:
    entries: tuple[FileEntry, ...]

    def describe(self) -> str:
        return f"offer {len(self.entries)} entries"


@dataclass(frozen=True, slots=True)
class Want:
    items: tuple[tuple[int, int, int], ...]  # (index, WANT_*, offset)

    def describe(self) -> str:
        send = sum(1 for _, s, _ in self.items if s == WANT_SEND)
        return f"want {len(self.items)} entries, {send} to send"


@dataclass(frozen=True, slots=True)
class Data:
    index: int
    offset: int
    size: int  # raw bytes that follow this frame: file bytes offset..offset+size

    def describe(self) -> str:
        return f"data #{self.index} @{self.offset} {self.size} B"


@dataclass(frozen=True, slots=True)
class Result:
    index: int
    status: int  # RESULT_*
    reason: str = ""

    def describe(self) -> str:
        return f"result #{self.index} {'ok' if self.status == RESULT_OK else 'bad: ' + printable(self.reason)}"


@dataclass(frozen=True, slots=True)
class Loaded:
    version: int  # the ingest record's version on the receiving vgroup
    epoch: int
    indexes: tuple[int, ...]  # offers now in the receiver's archive
    deleted: tuple[int, ...]  # positions in this round's DELETE list now removed

    def describe(self) -> str:
        return f"loaded v{self.version} e{self.epoch} {len(self.indexes)} files {len(self.deleted)} deletions"


@dataclass(frozen=True, slots=True)
class End:
    offered: int
    deleted: int

    def describe(self) -> str:
        return f"end {self.offered} offered {self.deleted} deleted"


@dataclass(frozen=True, slots=True)
class Done:
    seq: int
    files: int
    digest: bytes

    def describe(self) -> str:
        return f"done round {self.seq} {self.files} files"


@dataclass(frozen=True, slots=True)
class Error:
    code: int
    reason: str

    def describe(self) -> str:
        return f"error {self.code} {printable(self.reason)}"


ShipMessage = (
    Begin
    | State
    | Schema
    | SchemaEnd
    | SchemaOk
    | ListRequest
    | ListPart
    | ListEnd
    | Delete
    | Offer
    | Want
    | Data
    | Result
    | Loaded
    | End
    | Done
    | Error
)

_ENTRY = struct.Struct("<IqQIQBH")  # index, bucket, size, magic, rows, table len, name len
_BEGIN = struct.Struct("<16sQQBBQI32sIIQH")
_STATE = struct.Struct("<QBI32s")
_WANT = struct.Struct("<IBQ")
_DATA = struct.Struct("<QQ")
_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U32x2 = struct.Struct("<II")
_LIST_END = struct.Struct("<32s")
_DONE = struct.Struct("<I32s")
_U64_MAX = (1 << 64) - 1


def _frame(t: int, version: int = 0, epoch: int = 0, payload: bytes = b"") -> bytes:
    return _rec.encode_record(t, version, epoch, payload)


def _pack_entry(e: FileEntry) -> bytes:
    table = e.table.encode()
    name = e.name.encode()
    if len(table) > MAX_TABLE_BYTES:
        raise ValueError(f"table name of {len(table)} bytes (max {MAX_TABLE_BYTES})")
    if len(name) > MAX_NAME_BYTES:
        raise ValueError(f"file name of {len(name)} bytes (max {MAX_NAME_BYTES})")
    return _ENTRY.pack(e.index, e.bucket, e.size, e.magic, e.rows, len(table), len(name)) + table + name


def _pack_entries(entries: tuple[FileEntry, ...]) -> bytes:
    if len(entries) > MAX_ENTRIES_PER_FRAME:
        raise ValueError(f"{len(entries)} entries in one frame (max {MAX_ENTRIES_PER_FRAME})")
    return _U32.pack(len(entries)) + b"".join(_pack_entry(e) for e in entries)


def _unpack_entries(p: bytes, what: str) -> tuple[FileEntry, ...]:
    if len(p) < 4:
        raise FrameError(f"malformed {what}: no entry count")
    n = _U32.unpack_from(p)[0]
    if n > MAX_ENTRIES_PER_FRAME:
        raise FrameError(f"malformed {what}: {n} entries (max {MAX_ENTRIES_PER_FRAME})")
    out = []
    off = 4
    for _ in range(n):
        if len(p) - off < _ENTRY.size:
            raise FrameError(f"malformed {what}: entry cut short")
        index, bucket, size, magic, rows, tlen, nlen = _ENTRY.unpack_from(p, off)
        off += _ENTRY.size
        if tlen > MAX_TABLE_BYTES or nlen > MAX_NAME_BYTES or len(p) - off < tlen + nlen:
            raise FrameError(f"malformed {what}: bad name lengths")
        try:
            table = p[off : off + tlen].decode()
            name = p[off + tlen : off + tlen + nlen].decode()
        except UnicodeDecodeError:
            raise FrameError(f"malformed {what}: a name is not UTF-8") from None
        off += tlen + nlen
        out.append(FileEntry(index, table, bucket, size, magic, rows, name))
    if off != len(p):
        raise FrameError(f"malformed {what}: {len(p) - off} bytes after the entries")
    return tuple(out)


def encode(msg: ShipMessage) -> bytes:
    if isinstance(msg, Data):
        return _frame(ShipMsg.DATA, msg.index, 0, _DATA.pack(msg.offset, msg.size))
    if isinstance(msg, Want):
        if len(msg.items) > MAX_ENTRIES_PER_FRAME:
            raise ValueError(f"{len(msg.items)} items in one WANT (max {MAX_ENTRIES_PER_FRAME})")
        return _frame(
            ShipMsg.WANT, 0, 0, _U32.pack(len(msg.items)) + b"".join(_WANT.pack(i, s, o) for i, s, o in msg.items)
        )
    if isinstance(msg, Result):
        return _frame(ShipMsg.RESULT, msg.index, 0, _U8.pack(msg.status) + msg.reason.encode()[:MAX_REASON_BYTES])
    if isinstance(msg, Offer):
        return _frame(ShipMsg.OFFER, 0, 0, _pack_entries(msg.entries))
    if isinstance(msg, Delete):
        return _frame(ShipMsg.DELETE, 0, 0, _pack_entries(msg.entries))
    if isinstance(msg, ListPart):
        return _frame(ShipMsg.LIST, 0, 0, _pack_entries(msg.entries))
    if isinstance(msg, Loaded):
        if len(msg.indexes) + len(msg.deleted) > MAX_LOADED_ITEMS:
            raise ValueError(f"{len(msg.indexes) + len(msg.deleted)} items in one LOADED (max {MAX_LOADED_ITEMS})")
        body = (
            _U32x2.pack(len(msg.indexes), len(msg.deleted))
            + b"".join(_U32.pack(i) for i in msg.indexes)
            + b"".join(_U32.pack(i) for i in msg.deleted)
        )
        return _frame(ShipMsg.LOADED, msg.version, msg.epoch, body)
    if isinstance(msg, Begin):
        if len(msg.uuid) != UUID_BYTES or len(msg.last_digest) != DIGEST_BYTES:
            raise ValueError("uuid must be 16 bytes and the digest 32")
        host = msg.host.encode()[:MAX_HOST_BYTES]
        return _frame(
            ShipMsg.BEGIN,
            msg.seq,
            0,
            _BEGIN.pack(
                msg.uuid,
                msg.round_id,
                msg.last_round_id,
                msg.flags,
                PRECISIONS.index(msg.precision),
                msg.file_span_ms,
                msg.last_files,
                msg.last_digest,
                msg.deleted,
                msg.new,
                msg.new_bytes,
                len(host),
            )
            + host,
        )
    if isinstance(msg, State):
        return _frame(
            ShipMsg.STATE, msg.last_seq, 0, _STATE.pack(msg.last_round_id, 1 if msg.match else 0, msg.files, msg.digest)
        )
    if isinstance(msg, Schema):
        if len(msg.chunk) > MAX_SCHEMA_CHUNK_BYTES:
            raise ValueError(f"schema chunk of {len(msg.chunk)} bytes (max {MAX_SCHEMA_CHUNK_BYTES})")
        return _frame(ShipMsg.SCHEMA, 0, 0, msg.chunk)
    if isinstance(msg, SchemaEnd):
        return _frame(ShipMsg.SCHEMA_END, msg.tables)
    if isinstance(msg, SchemaOk):
        return _frame(ShipMsg.SCHEMA_OK)
    if isinstance(msg, ListRequest):
        return _frame(ShipMsg.LIST_REQUEST)
    if isinstance(msg, ListEnd):
        return _frame(ShipMsg.LIST_END, msg.count, 0, _LIST_END.pack(msg.digest))
    if isinstance(msg, End):
        return _frame(ShipMsg.END, msg.offered, 0, _U32.pack(msg.deleted))
    if isinstance(msg, Done):
        return _frame(ShipMsg.DONE, msg.seq, 0, _DONE.pack(msg.files, msg.digest))
    if isinstance(msg, Error):
        return _frame(ShipMsg.ERROR, 0, 0, _U8.pack(msg.code) + msg.reason.encode()[:MAX_REASON_BYTES])
    raise TypeError(f"no ship encoding for {type(msg).__name__}")


def _expect(p: bytes, n: int, name: str) -> None:
    if len(p) != n:
        raise FrameError(f"malformed {name}: payload is {len(p)} bytes, expected {n}")


def decode(rec: _rec.Record) -> ShipMessage:
    """The message a verified frame carries; FrameError if the type or layout is wrong."""
    t, p, v, e = rec.msg_type, rec.payload, rec.version, rec.epoch
    if t == ShipMsg.DATA:
        _expect(p, _DATA.size, "DATA")
        offset, size = _DATA.unpack(p)
        return Data(v, offset, size)
    if t == ShipMsg.WANT:
        if len(p) < 4:
            raise FrameError("malformed WANT: no count")
        n = _U32.unpack_from(p)[0]
        if n > MAX_ENTRIES_PER_FRAME:
            raise FrameError(f"malformed WANT: {n} items (max {MAX_ENTRIES_PER_FRAME})")
        _expect(p, 4 + n * _WANT.size, "WANT")
        items = tuple(_WANT.unpack_from(p, 4 + k * _WANT.size) for k in range(n))
        if any(s > WANT_RECEIVED for _, s, _ in items):
            raise FrameError("malformed WANT: unknown status")
        return Want(items)
    if t == ShipMsg.RESULT:
        if len(p) < 1 or p[0] > RESULT_BAD:
            raise FrameError("malformed RESULT")
        return Result(v, p[0], p[1 : 1 + MAX_REASON_BYTES].decode("utf-8", "replace"))
    if t == ShipMsg.OFFER:
        return Offer(_unpack_entries(p, "OFFER"))
    if t == ShipMsg.DELETE:
        return Delete(_unpack_entries(p, "DELETE"))
    if t == ShipMsg.LIST:
        return ListPart(_unpack_entries(p, "LIST"))
    if t == ShipMsg.LOADED:
        if len(p) < _U32x2.size:
            raise FrameError("malformed LOADED: no counts")
        n, m = _U32x2.unpack_from(p)
        if n + m > MAX_LOADED_ITEMS:
            raise FrameError(f"malformed LOADED: {n} + {m} items (max {MAX_LOADED_ITEMS})")
        _expect(p, _U32x2.size + 4 * (n + m), "LOADED")
        vals = struct.unpack_from(f"<{n + m}I", p, _U32x2.size)
        return Loaded(v, e, tuple(vals[:n]), tuple(vals[n:]))
    if t == ShipMsg.BEGIN:
        if len(p) < _BEGIN.size:
            raise FrameError(f"malformed BEGIN: payload is {len(p)} bytes")
        (uuid, round_id, last, flags, prec, span, last_files, digest, deleted, new, new_bytes, hlen) = (
            _BEGIN.unpack_from(p)
        )
        _expect(p, _BEGIN.size + hlen, "BEGIN")
        if prec >= len(PRECISIONS):
            raise FrameError(f"malformed BEGIN: precision code {prec}")
        return Begin(
            v,
            uuid,
            round_id,
            last,
            flags,
            PRECISIONS[prec],
            span,
            last_files,
            digest,
            deleted,
            new,
            new_bytes,
            p[_BEGIN.size :].decode("utf-8", "replace"),
        )
    if t == ShipMsg.STATE:
        _expect(p, _STATE.size, "STATE")
        last, match, files, digest = _STATE.unpack(p)
        return State(v, last, bool(match), files, digest)
    if t == ShipMsg.SCHEMA:
        if len(p) > MAX_SCHEMA_CHUNK_BYTES:
            raise FrameError(f"malformed SCHEMA: {len(p)} bytes")
        return Schema(bytes(p))
    if t == ShipMsg.SCHEMA_END:
        _expect(p, 0, "SCHEMA_END")
        return SchemaEnd(v)
    if t == ShipMsg.SCHEMA_OK:
        _expect(p, 0, "SCHEMA_OK")
        return SchemaOk()
    if t == ShipMsg.LIST_REQUEST:
        _expect(p, 0, "LIST_REQUEST")
        return ListRequest()
    if t == ShipMsg.LIST_END:
        _expect(p, _LIST_END.size, "LIST_END")
        return ListEnd(v, _LIST_END.unpack(p)[0])
    if t == ShipMsg.END:
        _expect(p, 4, "END")
        return End(v, _U32.unpack(p)[0])
    if t == ShipMsg.DONE:
        _expect(p, _DONE.size, "DONE")
        files, digest = _DONE.unpack(p)
        return Done(v, files, digest)
    if t == ShipMsg.ERROR:
        if len(p) < 1:
            raise FrameError("malformed ERROR: no code")
        return Error(p[0], p[1 : 1 + MAX_REASON_BYTES].decode("utf-8", "replace"))
    raise FrameError(f"unknown ship message type {t}")
