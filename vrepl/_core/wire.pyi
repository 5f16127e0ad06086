from collections.abc import Sequence

from typing_extensions import Buffer  # collections.abc.Buffer is Python 3.12+

FORWARD_PREFIX_BYTES: int

def encode_forward_frame(msg_type: int, first_version: int, epoch: int, prev_epoch: int, block: Buffer) -> bytes: ...
def encode_records(first_version: int, record_epochs: Sequence[int], payloads: Sequence[Buffer], data_type: int = 1) -> bytes: ...
def decode_forward_body(
    body: Buffer, first_version: int, max_record_len: int
) -> tuple[int, tuple[int, ...], tuple[bytes, ...], bytes]: ...
