from typing_extensions import Buffer  # collections.abc.Buffer is Python 3.12+

import numpy as np
import numpy.typing as npt

# The frame codec, re-exported (vrepl/_core/frame.pyx owns it).
from vrepl._core.frame import DEFAULT_MAX_PAYLOAD_BYTES as DEFAULT_MAX_PAYLOAD_BYTES
from vrepl._core.frame import HEADER_SIZE_BYTES as HEADER_SIZE_BYTES
from vrepl._core.frame import MAX_PAYLOAD_LIMIT_BYTES as MAX_PAYLOAD_LIMIT_BYTES
from vrepl._core.frame import REASONS as REASONS
from vrepl._core.frame import RECORD_SIGNATURE as RECORD_SIGNATURE
from vrepl._core.frame import STATUS_BAD_FLAGS as STATUS_BAD_FLAGS
from vrepl._core.frame import STATUS_BAD_HEADER_CRC as STATUS_BAD_HEADER_CRC
from vrepl._core.frame import STATUS_BAD_PAYLOAD_CRC as STATUS_BAD_PAYLOAD_CRC
from vrepl._core.frame import STATUS_BAD_SIGNATURE as STATUS_BAD_SIGNATURE
from vrepl._core.frame import STATUS_INCOMPLETE as STATUS_INCOMPLETE
from vrepl._core.frame import STATUS_OK as STATUS_OK
from vrepl._core.frame import STATUS_TOO_LARGE as STATUS_TOO_LARGE
from vrepl._core.frame import STATUS_VERSION_GAP as STATUS_VERSION_GAP
from vrepl._core.frame import STATUS_ZERO as STATUS_ZERO
from vrepl._core.frame import Record as Record
from vrepl._core.frame import decode_record as decode_record
from vrepl._core.frame import encode_batch as encode_batch
from vrepl._core.frame import encode_packed as encode_packed
from vrepl._core.frame import encode_record as encode_record
from vrepl._core.frame import header_invalid as header_invalid

class ScanResult:
    versions: npt.NDArray[np.uint64]
    epochs: npt.NDArray[np.uint64]
    offsets: npt.NDArray[np.uint64]
    lengths: npt.NDArray[np.uint32]
    msg_types: npt.NDArray[np.uint8]
    count: int
    end: int
    status: int
    reason: str | None
    @property
    def ok(self) -> bool: ...
    @property
    def last_version(self) -> int: ...
    def describe(self) -> str: ...

def scan(data: Buffer, start: int = 0, stop: int = -1,
         max_payload_len: int = ..., verify_payload: bool = True,
         expect_version: int = 0, contiguous: bool = False) -> ScanResult: ...
