"""CRC-32C (vrepl._core.crc32c): check value, hardware vs software vs a bitwise reference,
incremental use, and the run-time choice of implementation."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrepl._core import crc32c as C

pytestmark = pytest.mark.timeout(60)

CHECK_INPUT = b"123456789"
CHECK_VALUE = 0xE3069283
IMPLEMENTATIONS = {"sse4.2", "armv8-crc", "slicing-by-8"}


def reference_crc32c(data: bytes, value: int = 0) -> int:
    """Bitwise CRC-32C (reflected polynomial 0x82F63B78), continuing from a finished value."""
    crc = value ^ 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


@pytest.fixture
def software_forced():
    C.force_software(True)
    try:
        yield
    finally:
        C.force_software(False)


def test_reference_implementation_matches_the_published_check_value():
    assert reference_crc32c(CHECK_INPUT) == CHECK_VALUE


@pytest.mark.parametrize("fn", [C.crc32c, C.crc32c_software])
def test_check_value(fn):
    assert fn(CHECK_INPUT) == CHECK_VALUE
    assert fn(bytearray(CHECK_INPUT)) == CHECK_VALUE
    assert fn(memoryview(CHECK_INPUT)) == CHECK_VALUE


@pytest.mark.parametrize("fn", [C.crc32c, C.crc32c_software])
def test_known_vectors(fn):
    # RFC 3720 (iSCSI) B.4 test vectors.
    assert fn(b"") == 0
    assert fn(bytes(32)) == 0x8A9136AA
    assert fn(b"\xff" * 32) == 0x62A8AB43
    assert fn(bytes(range(32))) == 0x46DD794E
    assert fn(bytes(range(31, -1, -1))) == 0x113FDB5C


def test_returns_python_int_in_u32_range():
    v = C.crc32c(b"hello")
    assert isinstance(v, int)
    assert 0 <= v <= 0xFFFFFFFF
    assert v != C.crc32c(b"hellp")


def _lengths():
    around = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 63, 64, 255, 256, 257]
    for boundary in (768, 3 * 8192, 2 * 3 * 8192, 65536):
        around += [boundary + d for d in range(-9, 10)]
    return sorted(set(around + [1000, 4096, 8191, 8192, 8193, 30000, 50000, 65535, 100000]))


@pytest.mark.parametrize("offset", range(8))
def test_hardware_and_software_agree_on_random_inputs(offset):
    rng = random.Random(1000 + offset)
    blob = rng.randbytes(100_000 + 16)
    view = memoryview(blob)
    for n in _lengths():
        piece = view[offset:offset + n]
        assert len(piece) == n
        hw = C.crc32c(piece)
        sw = C.crc32c_software(piece)
        assert hw == sw, (offset, n)
        seed = rng.getrandbits(32)
        assert C.crc32c(piece, seed) == C.crc32c_software(piece, seed), (offset, n, seed)


def test_three_stream_path_matches_reference_on_one_large_buffer():
    # > 3*8192 bytes goes through the long three-way loop; cross-check against the reference.
    data = random.Random(7).randbytes(3 * 8192 + 777)
    assert C.crc32c(data) == reference_crc32c(data)
    assert C.crc32c_software(data) == reference_crc32c(data)


def test_medium_three_stream_path_matches_reference():
    rng = random.Random(8)
    for n in (767, 768, 769, 775, 776, 1536, 2000, 3 * 8192 - 1):
        data = rng.randbytes(n)
        assert C.crc32c(data) == reference_crc32c(data), n


def test_single_bit_changes_the_checksum_in_a_large_buffer():
    data = bytearray(random.Random(9).randbytes(70_000))
    base = C.crc32c(data)
    for pos in (0, 1, 8191, 8192, 16384, 24575, 24576, 40000, 69_999):
        data[pos] ^= 0x10
        assert C.crc32c(data) != base, pos
        data[pos] ^= 0x10
    assert C.crc32c(data) == base


@given(a=st.binary(max_size=300), b=st.binary(max_size=300))
@settings(max_examples=200, deadline=None)
def test_incremental(a, b):
    assert C.crc32c(b, C.crc32c(a)) == C.crc32c(a + b)
    assert C.crc32c_software(b, C.crc32c_software(a)) == C.crc32c_software(a + b)


def test_incremental_over_large_pieces():
    rng = random.Random(11)
    data = rng.randbytes(200_000)
    for cut in (0, 1, 768, 24576, 65536, 100_001, 200_000):
        assert C.crc32c(data[cut:], C.crc32c(data[:cut])) == C.crc32c(data), cut
    # Many uneven pieces.
    value, pos = 0, 0
    while pos < len(data):
        step = rng.randrange(1, 30_000)
        value = C.crc32c(data[pos:pos + step], value)
        pos += step
    assert value == C.crc32c(data)


@given(data=st.binary(max_size=600), seed=st.integers(0, 0xFFFFFFFF))
@settings(max_examples=300, deadline=None)
def test_agrees_with_bitwise_reference(data, seed):
    expected = reference_crc32c(data, seed)
    assert C.crc32c(data, seed) == expected
    assert C.crc32c_software(data, seed) == expected


def test_implementation_name():
    assert C.implementation() in IMPLEMENTATIONS


def test_force_software_switches_and_restores():
    before = C.implementation()
    rng = random.Random(12)
    samples = [rng.randbytes(n) for n in (0, 5, 100, 800, 30_000, 70_000)]
    expected = [C.crc32c(s) for s in samples]
    C.force_software(True)
    try:
        assert C.implementation() == "slicing-by-8"
        assert C.crc32c(CHECK_INPUT) == CHECK_VALUE
        assert [C.crc32c(s) for s in samples] == expected
    finally:
        C.force_software(False)
    assert C.implementation() == before
    assert [C.crc32c(s) for s in samples] == expected


def test_forced_software_agrees_with_reference(software_forced):
    rng = random.Random(13)
    for n in range(0, 200, 7):
        data = rng.randbytes(n)
        assert C.crc32c(data) == reference_crc32c(data)


def test_env_var_forces_software_in_a_fresh_process():
    code = (
        "from vrepl._core import crc32c as c; "
        "print(c.implementation()); print(c.crc32c(b'123456789'))"
    )
    env = dict(os.environ, VREPL_CRC32C="software")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    name, value = out.stdout.split()
    assert name == "slicing-by-8"
    assert int(value) == CHECK_VALUE


def test_concurrent_large_checksums_from_threads():
    # Buffers above the no-GIL threshold are checksummed from several threads at once.
    data = random.Random(14).randbytes(300_000)
    expected = reference_crc32c(data[:1000])
    full = C.crc32c_software(data)
    results = []

    def work():
        for _ in range(20):
            results.append(C.crc32c(data))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [full] * 80
    assert C.crc32c(data[:1000]) == expected


def test_rejects_non_buffer():
    with pytest.raises(TypeError):
        C.crc32c("not bytes")
    with pytest.raises(TypeError):
        C.crc32c_software(12345)
