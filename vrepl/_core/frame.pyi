from collections.abc import Sequence

from typing_extensions import Buffer  # collections.abc.Buffer is Python 3.12+

import numpy as np
import numpy.typing as npt

HEADER_SIZE_BYTES: int
RECORD_SIGNATURE: int
DEFAULT_MAX_PAYLOAD_BYTES: int
MAX_PAYLOAD_LIMIT_BYTES: int
STATUS_OK: int
STATUS_INCOMPLETE: int
STATUS_ZERO: int
STATUS_BAD_SIGNATURE: int
STATUS_BAD_HEADER_CRC: int
STATUS_BAD_FLAGS: int
STATUS_TOO_LARGE: int
STATUS_BAD_PAYLOAD_CRC: int
STATUS_VERSION_GAP: int
REASONS: dict[int, str | None]

class Record:
    msg_type: int
    schema_version: int
    flags: int
    version: int
    epoch: int
    payload: bytes
    def __init__(self, msg_type: int, version: int, epoch: int, payload: bytes,
                 schema_version: int = 1, flags: int = 0) -> None: ...
    def encode(self) -> bytes: ...
    def describe(self) -> str: ...

def header_invalid(data: Buffer, offset: int = 0, max_payload_len: int = ...) -> str | None: ...
def decode_record(data: Buffer, offset: int = 0, max_payload_len: int = ...) -> Record: ...
def encode_record(msg_type: int, version: int, epoch: int, payload: Buffer,
                  schema_version: int = 1) -> bytes: ...
def encode_batch(msg_type: int, first_version: int, epoch: int, payloads: Sequence[Buffer],
                 schema_version: int = 1) -> bytes: ...
def encode_packed(msg_type: int, first_version: int, epoch: int, data: Buffer,
                  lengths: npt.NDArray[np.uint32], schema_version: int = 1) -> bytes: ...
