"""The sync connection's messages (docs/restore.md §Protocol): layouts only, no I/O.

Owns: the frame types 64..79 of a sync connection (after the usual HELLO / CHALLENGE / AUTH /
WELCOME handshake of kind SYNC or BACKUP), their payload layouts (little endian, `struct`),
`encode()` and `decode()`. Every message is one vrepl record frame (docs/wal-format.md): the
header's version/epoch carry the message's natural version and epoch. FILE_DATA and
WAL_DATA frames announce `size` raw bytes that follow the frame outside any framing (they
are sent with os.sendfile); the reader takes exactly that many bytes next.

    sender (the node that has the data)          receiver (the node restoring)
    SYNC_BEGIN  flags, totals        ->
    FILE_INFO   index, size, magic, name ->
                                     <-  FILE_ACK index, need (0 same, 1 send)
    FILE_DATA   index, size + raw bytes ->                      (only when need = 1)
    ... until get_file_info says magic 0 ...
    FILES_END   count                ->
                                     <-  WAL_REQUEST from_version
    WAL_BEGIN   first version, prev epoch, epoch history ->
    WAL_DATA    size + raw WAL records ->                     (any number)
    WAL_END     last version sent    ->
                                     <-  DONE last version applied
    ERROR       reason               <-> (either side, then close)

Must not: touch sockets or files; decoding checks every length before using it. Names and
reasons are decoded as sent (the receiver refuses bad names, vrepl/restore/paths.py);
describe() escapes them (vrepl/untrusted.py), since a peer chose them.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from vrepl._core import frame as _rec
from vrepl.errors import FrameError
from vrepl.untrusted import printable

HEADER_BYTES = _rec.HEADER_SIZE_BYTES
MAX_NAME_BYTES = 1024
MAX_REASON_BYTES = 1024
MAX_HISTORY_PAIRS = 4096
MAX_FRAME_PAYLOAD_BYTES = 8 + 16 * MAX_HISTORY_PAIRS + 64  # the largest payload of any message here
# ERROR's code (its header version field; senders before it was added send 0): 1 says the
# source's files changed during the restore, so the receiver knows a retry can help and the
# tool exits 7 (not 4) when its retries run out (docs/restore.md §2, §8).
ERROR_OTHER = 0
ERROR_SOURCE_CHANGED = 1


class SyncMsg(enum.IntEnum):
    SYNC_BEGIN = 64
    FILE_INFO = 65
    FILE_DATA = 66
    FILES_END = 67
    WAL_BEGIN = 68
    WAL_DATA = 69
    WAL_END = 70
    ERROR = 71
    FILE_ACK = 72
    WAL_REQUEST = 73
    DONE = 74
    FETCH_REQUEST = 75  # a FETCH connection (docs/vnode.md §9.6): one file of a round, please


FLAG_FILES = 1  # SYNC_BEGIN: a files phase comes first
FLAG_LIVE = 2  # SYNC_BEGIN: the receiver is a replica following the sender (SYNC_CACHE at the end)


@dataclass(frozen=True, slots=True)
class SyncBegin:
    epoch: int  # the sender's promised epoch (0 for a backup from a non-master)
    last_version: int  # the sender's log end when the session began
    flags: int
    files: int  # archived files the sender has now (a hint for progress)
    file_bytes: int
    wal_bytes: int  # WAL bytes from the receiver's version on (a hint), 0 if unknown

    def describe(self) -> str:
        return (f"sync_begin e{self.epoch} v{self.last_version} flags {self.flags}"
                f" {self.files} files {self.file_bytes}B wal {self.wal_bytes}B")


@dataclass(frozen=True, slots=True)
class FileInfo:
    index: int
    size: int
    magic: int
    name: str

    def describe(self) -> str:
        return f"file_info #{self.index} {printable(self.name)} {self.size}B magic {self.magic:#010x}"


@dataclass(frozen=True, slots=True)
class FileData:
    index: int
    size: int  # raw bytes that follow this frame

    def describe(self) -> str:
        return f"file_data #{self.index} {self.size}B"


@dataclass(frozen=True, slots=True)
class FilesEnd:
    count: int

    def describe(self) -> str:
        return f"files_end {self.count} files"


@dataclass(frozen=True, slots=True)
class WalBegin:
    first_version: int  # the first record the WAL_DATA that follows may start with
    prev_epoch: int  # epoch of record first_version - 1 (0 if none)
    history: tuple[tuple[int, int], ...]  # the sender's (epoch, first_version) pairs up to first_version - 1

    def describe(self) -> str:
        return f"wal_begin v{self.first_version} prev e{self.prev_epoch} history {len(self.history)} pairs"


@dataclass(frozen=True, slots=True)
class WalData:
    size: int  # raw bytes of whole WAL records that follow this frame

    def describe(self) -> str:
        return f"wal_data {self.size}B"


@dataclass(frozen=True, slots=True)
class WalEnd:
    last_version: int

    def describe(self) -> str:
        return f"wal_end v{self.last_version}"


@dataclass(frozen=True, slots=True)
class Error:
    reason: str
    code: int = ERROR_OTHER

    def describe(self) -> str:
        return f"error {printable(self.reason)}"


@dataclass(frozen=True, slots=True)
class FileAck:
    index: int
    need: int  # 0: the receiver has it (same name, size, magic); 1: send it

    def describe(self) -> str:
        return f"file_ack #{self.index} {'send' if self.need else 'same'}"


@dataclass(frozen=True, slots=True)
class WalRequest:
    from_version: int

    def describe(self) -> str:
        return f"wal_request from v{self.from_version}"


@dataclass(frozen=True, slots=True)
class Done:
    last_version: int

    def describe(self) -> str:
        return f"done v{self.last_version}"


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """File `index` of the round `round_id` named by the record at `version` (docs/vnode.md
    §9.6): the server answers FILE_INFO (magic 0: it has no such file), then FILE_DATA."""

    version: int
    index: int
    size: int
    magic: int
    bucket: int
    round_id: str
    table: str

    def describe(self) -> str:
        return (f"fetch_request v{self.version} round {printable(self.round_id)} #{self.index}"
                f" {printable(self.table)} {self.size}B")


SyncMessage = (SyncBegin | FileInfo | FileData | FilesEnd | WalBegin | WalData | WalEnd | Error
               | FileAck | WalRequest | Done | FetchRequest)

_BEGIN = struct.Struct("<BIQQ")  # flags, files, file_bytes, wal_bytes
_FILE_INFO = struct.Struct("<QIH")  # size, magic, name length
_U64 = struct.Struct("<Q")
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_PAIR = struct.Struct("<QQ")
_FETCH = struct.Struct("<IQIqBB")  # index, size, magic, bucket, round length, table length


def _frame(t: int, version: int = 0, epoch: int = 0, payload: bytes = b"") -> bytes:
    return _rec.encode_record(t, version, epoch, payload)


def encode(msg: SyncMessage) -> bytes:
    t = type(msg)
    if t is FileInfo:
        name = msg.name.encode()
        if len(name) > MAX_NAME_BYTES:
            raise ValueError(f"file name of {len(name)} bytes (max {MAX_NAME_BYTES})")
        return _frame(SyncMsg.FILE_INFO, msg.index, 0, _FILE_INFO.pack(msg.size, msg.magic, len(name)) + name)
    if t is FileAck:
        return _frame(SyncMsg.FILE_ACK, msg.index, 0, _U8.pack(msg.need))
    if t is FileData:
        return _frame(SyncMsg.FILE_DATA, msg.index, 0, _U64.pack(msg.size))
    if t is WalData:
        return _frame(SyncMsg.WAL_DATA, 0, 0, _U64.pack(msg.size))
    if t is SyncBegin:
        return _frame(SyncMsg.SYNC_BEGIN, msg.last_version, msg.epoch,
                      _BEGIN.pack(msg.flags, msg.files, msg.file_bytes, msg.wal_bytes))
    if t is FilesEnd:
        return _frame(SyncMsg.FILES_END, msg.count)
    if t is WalBegin:
        if len(msg.history) > MAX_HISTORY_PAIRS:
            raise ValueError(f"epoch history of {len(msg.history)} pairs (max {MAX_HISTORY_PAIRS})")
        body = _U16.pack(len(msg.history)) + b"".join(_PAIR.pack(e, v) for e, v in msg.history)
        return _frame(SyncMsg.WAL_BEGIN, msg.first_version, msg.prev_epoch, body)
    if t is WalEnd:
        return _frame(SyncMsg.WAL_END, msg.last_version)
    if t is Error:
        return _frame(SyncMsg.ERROR, msg.code, 0, msg.reason.encode()[:MAX_REASON_BYTES])
    if t is WalRequest:
        return _frame(SyncMsg.WAL_REQUEST, msg.from_version)
    if t is Done:
        return _frame(SyncMsg.DONE, msg.last_version)
    if t is FetchRequest:
        rid, table = msg.round_id.encode(), msg.table.encode()
        if len(rid) > 255 or len(table) > 255:
            raise ValueError("round id or table name above 255 bytes")
        return _frame(SyncMsg.FETCH_REQUEST, msg.version, 0,
                      _FETCH.pack(msg.index, msg.size, msg.magic, msg.bucket, len(rid), len(table))
                      + rid + table)
    raise TypeError(f"no sync encoding for {t.__name__}")


def _expect(p: bytes, n: int, name: str) -> None:
    if len(p) != n:
        raise FrameError(f"malformed {name}: payload is {len(p)} bytes, expected {n}")


def decode(rec: _rec.Record) -> SyncMessage:
    """The message a verified frame carries; FrameError if the type or layout is wrong."""
    t, p, v, e = rec.msg_type, rec.payload, rec.version, rec.epoch
    if t == SyncMsg.FILE_INFO:
        if len(p) < _FILE_INFO.size:
            raise FrameError(f"malformed FILE_INFO: payload is {len(p)} bytes")
        size, magic, n = _FILE_INFO.unpack_from(p)
        _expect(p, _FILE_INFO.size + n, "FILE_INFO")
        try:
            name = p[_FILE_INFO.size:].decode()
        except UnicodeDecodeError:
            raise FrameError("malformed FILE_INFO: the name is not UTF-8") from None
        return FileInfo(v, size, magic, name)
    if t == SyncMsg.FILE_ACK:
        _expect(p, 1, "FILE_ACK")
        if p[0] > 1:
            raise FrameError(f"malformed FILE_ACK: need {p[0]}")
        return FileAck(v, p[0])
    if t == SyncMsg.FILE_DATA:
        _expect(p, 8, "FILE_DATA")
        return FileData(v, _U64.unpack(p)[0])
    if t == SyncMsg.WAL_DATA:
        _expect(p, 8, "WAL_DATA")
        return WalData(_U64.unpack(p)[0])
    if t == SyncMsg.SYNC_BEGIN:
        _expect(p, _BEGIN.size, "SYNC_BEGIN")
        flags, files, fbytes, wbytes = _BEGIN.unpack(p)
        return SyncBegin(e, v, flags, files, fbytes, wbytes)
    if t == SyncMsg.FILES_END:
        _expect(p, 0, "FILES_END")
        return FilesEnd(v)
    if t == SyncMsg.WAL_BEGIN:
        if len(p) < 2:
            raise FrameError("malformed WAL_BEGIN: no history count")
        n = _U16.unpack_from(p)[0]
        if n > MAX_HISTORY_PAIRS:
            raise FrameError(f"malformed WAL_BEGIN: {n} history pairs (max {MAX_HISTORY_PAIRS})")
        _expect(p, 2 + n * _PAIR.size, "WAL_BEGIN")
        history = tuple(_PAIR.unpack_from(p, 2 + k * _PAIR.size) for k in range(n))
        return WalBegin(v, e, history)
    if t == SyncMsg.WAL_END:
        _expect(p, 0, "WAL_END")
        return WalEnd(v)
    if t == SyncMsg.ERROR:
        return Error(p[:MAX_REASON_BYTES].decode("utf-8", "replace"), v)
    if t == SyncMsg.WAL_REQUEST:
        _expect(p, 0, "WAL_REQUEST")
        return WalRequest(v)
    if t == SyncMsg.DONE:
        _expect(p, 0, "DONE")
        return Done(v)
    if t == SyncMsg.FETCH_REQUEST:
        if len(p) < _FETCH.size:
            raise FrameError(f"malformed FETCH_REQUEST: payload is {len(p)} bytes")
        index, size, magic, bucket, nr, nt = _FETCH.unpack_from(p)
        _expect(p, _FETCH.size + nr + nt, "FETCH_REQUEST")
        try:
            rid = p[_FETCH.size:_FETCH.size + nr].decode()
            table = p[_FETCH.size + nr:].decode()
        except UnicodeDecodeError:
            raise FrameError("malformed FETCH_REQUEST: a name is not UTF-8") from None
        return FetchRequest(v, index, size, magic, bucket, rid, table)
    raise FrameError(f"unknown sync message type {t}")
