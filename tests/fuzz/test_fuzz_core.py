"""Fuzzing the parsers: random and mutated bytes never crash, hang or over-allocate.

Hypothesis drives the shared targets in vrepl.testing.fuzz_targets; a short coverage-guided
atheris run per target follows when atheris is installed (it is in the test extra on x86-64).
"""
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vrepl.testing import fuzz_targets

pytestmark = pytest.mark.timeout(300)

SETTINGS = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def mutated(seed_bytes: bytes):
    """Valid input with random bit flips, insertions, deletions and truncation."""
    return st.tuples(
        st.lists(st.tuples(st.integers(0, max(len(seed_bytes) - 1, 0)), st.integers(0, 7)),
                 max_size=4),
        st.integers(0, len(seed_bytes)),
        st.binary(max_size=40),
    ).map(lambda t: _apply(seed_bytes, *t))


def _apply(seed_bytes, flips, cut, extra):
    b = bytearray(seed_bytes)
    for pos, bit in flips:
        if b:
            b[pos % len(b)] ^= 1 << bit
    return bytes(b[:cut]) + extra


inputs = st.one_of(st.binary(max_size=600),
                   *[mutated(s) for s in fuzz_targets.seeds()])


@pytest.mark.parametrize("name", sorted(fuzz_targets.TARGETS))
def test_target_accepts_its_seeds(name):
    for s in fuzz_targets.seeds():
        fuzz_targets.TARGETS[name](s)


@SETTINGS
@given(inputs)
def test_fuzz_frame_buffer(data):
    fuzz_targets.target_frame_buffer(data)


@SETTINGS
@given(inputs)
def test_fuzz_scan(data):
    fuzz_targets.target_scan(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs)
def test_fuzz_wal_directory(data):
    fuzz_targets.target_wal_directory(data)


@SETTINGS
@given(inputs)
def test_fuzz_decode_messages(data):
    fuzz_targets.target_decode_messages(data)


@SETTINGS
@given(inputs)
def test_fuzz_handshake(data):
    fuzz_targets.target_handshake(data)


@SETTINGS
@given(inputs)
def test_fuzz_line_protocol(data):
    fuzz_targets.target_line_protocol(data)


@SETTINGS
@given(inputs)
def test_fuzz_arrow_stream(data):
    fuzz_targets.target_arrow_stream(data)


def test_handshake_target_would_catch_an_accepting_server(monkeypatch):
    """If the server accepted a wrong proof, the handshake target fails."""
    import hmac

    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: True)
    from vrepl.transport import codec
    from vrepl.transport.handshake import ClientHandshake, ServerHandshake

    client = ClientHandshake(b"wrong-secret", codec.ConnKind.PEER, 7, 1, 2)
    server = ServerHandshake(b"fuzz-secret", 2, lambda h: None)
    challenge = server.on_message(codec.decode_bytes(client.start()))
    auth = client.on_message(codec.decode_bytes(challenge))
    with pytest.raises(AssertionError, match="without knowing the secret"):
        fuzz_targets.target_handshake(client.start() + auth)


def test_target_catches_a_planted_crash(monkeypatch):
    """The harness reports an unexpected exception (so a passing run means something)."""
    from vrepl._core import framebuf

    class Broken(framebuf.FrameBuffer):
        def next_frame(self):
            raise KeyError("planted")

    monkeypatch.setattr(framebuf, "FrameBuffer", Broken)
    with pytest.raises(KeyError):
        fuzz_targets.target_frame_buffer(fuzz_targets.seeds()[0])


@pytest.mark.parametrize("name", sorted(fuzz_targets.TARGETS))
def test_atheris_short_run(name, tmp_path):
    pytest.importorskip("atheris")
    runs = "3000" if name == "wal_directory" else "30000"
    corpus = tmp_path / "corpus"    # the seeds, and what libFuzzer adds (the test's own dir)
    corpus.mkdir()
    for i, seed in enumerate(fuzz_targets.seeds()):
        (corpus / f"seed{i}").write_bytes(seed)
    proc = subprocess.run([sys.executable, "-m", "vrepl.testing.fuzz", name, f"-runs={runs}",
                           "-rss_limit_mb=1024", "-timeout=10", str(corpus)],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DONE" in proc.stderr
