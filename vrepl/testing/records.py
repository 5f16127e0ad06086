"""WAL blocks as lists of records, for the ports of the simulator and the scripted network.

Owns: `history_of()` (the epoch history pairs of a list of records, as a replica's config
wants them), `decode_block()` (the encoded WAL records a driver hands its Storage port, as replica
`Record`s) and `encode_block()` (records back into WAL bytes with their scan, what a
Storage port returns when the driver reads the WAL), both through the real C codecs
(vrepl/_core/wire.pyx, record.pyx).
Must not: hold state.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

from vrepl._core import record as _rec
from vrepl._core import wire as _wire
from vrepl.replica import Record
from vrepl.replica.history import EpochHistory
from vrepl.transport.codec import encode_records

_PREV = struct.pack("<Q", 0)
MAX_RECORD_BYTES = 16 << 20


def decode_block(first_version: int, block: bytes) -> list[Record]:
    """The records of an encoded WAL block whose first record is `first_version`."""
    _, epochs, payloads, _ = _wire.decode_forward_body(_PREV + block, first_version, MAX_RECORD_BYTES)
    return [Record(e, first_version + i, p) for i, (e, p) in enumerate(zip(epochs, payloads))]


def encode_block(records: Sequence[Record]) -> tuple[bytes, Any]:
    """WAL bytes of consecutive records and their scan (versions, epochs, offsets, lengths)."""
    block = encode_records(records[0].version, tuple(r.epoch for r in records), tuple(r.payload for r in records))
    return block, _rec.scan(block, max_payload_len=MAX_RECORD_BYTES, contiguous=True)


def history_of(records: Sequence[Record]) -> tuple[tuple[int, int], ...]:
    """The (epoch, last version) pairs of consecutive records (EpochHistory.pairs())."""
    h = EpochHistory()
    for rec in records:
        h.note_append(rec.epoch, rec.version)
    return h.pairs()
