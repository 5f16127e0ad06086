"""Codec and checksum throughput (issue 2 targets): encode + checksum, decode + verify, CRC-32C.

Figures are per call of one batch; bench/report.py turns them into records/s and GB/s.
Batches are 1000 x 128 B (164 KB encoded) and 256 x 4 KiB (1 MB): the sizes the WAL writer and
the forward path hand to the codec. Much larger single buffers are slower per byte on this
machine because fresh memory must be faulted in, not because of the codec.
"""
import numpy as np

from vrepl._core import crc32c as crc
from vrepl._core import record as rec


def test_encode_batch_128(benchmark, payloads_128):
    benchmark.extra_info.update(records=len(payloads_128), bytes=len(payloads_128) * (128 + 36))
    benchmark(rec.encode_batch, 1, 1, 7, payloads_128)


def test_encode_packed_128(benchmark, payloads_128):
    data = b"".join(payloads_128)
    lengths = np.full(len(payloads_128), 128, dtype=np.uint32)
    benchmark.extra_info.update(records=len(payloads_128), bytes=len(payloads_128) * (128 + 36))
    benchmark(rec.encode_packed, 1, 1, 7, data, lengths)


def test_decode_verify_128(benchmark, payloads_128):
    buf = rec.encode_batch(1, 1, 7, payloads_128)
    benchmark.extra_info.update(records=len(payloads_128), bytes=len(buf))
    result = benchmark(rec.scan, buf, 0, -1, rec.DEFAULT_MAX_PAYLOAD_BYTES, True, 1)
    assert result.ok and result.count == len(payloads_128)


def test_encode_batch_4k(benchmark, payloads_4k):
    benchmark.extra_info.update(records=len(payloads_4k), bytes=len(payloads_4k) * (4096 + 36))
    benchmark(rec.encode_batch, 1, 1, 7, payloads_4k)


def test_decode_verify_4k(benchmark, payloads_4k):
    buf = rec.encode_batch(1, 1, 7, payloads_4k)
    benchmark.extra_info.update(records=len(payloads_4k), bytes=len(buf))
    result = benchmark(rec.scan, buf, 0, -1, rec.DEFAULT_MAX_PAYLOAD_BYTES, True, 1)
    assert result.ok and result.count == len(payloads_4k)


def test_crc32c_64mib_hw(benchmark, buffer_64mib):
    benchmark.extra_info.update(bytes=len(buffer_64mib), impl=crc.implementation())
    benchmark(crc.crc32c, buffer_64mib)


def test_crc32c_64mib_sw(benchmark, buffer_64mib):
    benchmark.extra_info.update(bytes=len(buffer_64mib), impl="slicing-by-8")
    benchmark(crc.crc32c_software, buffer_64mib)
