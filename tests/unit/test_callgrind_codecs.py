"""bench/callgrind_codecs.py: the codec round trip it profiles really round-trips, and its
report names functions readably. (Its figures live in docs/perf.md §12, not here.)"""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import callgrind_codecs as cg  # noqa: E402


def test_round_trip_runs_and_checks_every_record():
    cg.round_trips(3, 10, 50)
    cg.round_trips(1, 1, 0)


def test_round_trip_notices_a_short_scan(monkeypatch):
    from vrepl._core import record as rec
    real = rec.scan
    monkeypatch.setattr(rec, "scan", lambda b, **kw: real(b[:-1], **kw))
    with pytest.raises(SystemExit, match="scan found"):
        cg.round_trips(1, 5, 20)


@pytest.mark.parametrize("raw, short", [
    ("/x/vrepl/_core/record.c:__pyx_f_5vrepl_5_core_6record_write_record",
     "record.c: write_record"),
    ("/x/vrepl/_core/record.c:__pyx_f_5vrepl_5_core_6record_parse_header.part.0",
     "record.c: parse_header.part.0"),
    ("/x/vrepl/_core/wire.c:__pyx_pw_5vrepl_5_core_4wire_3encode_records",
     "wire.c: 3encode_records"),
    ("./string/memmove-vec-unaligned-erms.S:__memcpy_avx_unaligned_erms",
     "memmove-vec-unaligned-erms.S: __memcpy_avx_unaligned_erms"),
])
def test_short_names(raw, short):
    assert cg.short(raw) == short


def test_time_mode_prints_a_per_record_figure():
    out = subprocess.run([sys.executable, str(REPO / "bench/callgrind_codecs.py"), "--time",
                          "--records", "5", "--size", "10"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "per round trip of 5 records of 10 B" in out and "ns per record" in out


def test_bad_arguments_are_refused():
    proc = subprocess.run([sys.executable, str(REPO / "bench/callgrind_codecs.py"),
                           "--records", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--records must be" in proc.stderr


@pytest.mark.slow  # seconds of CPU: outside the `-m "not slow"` loop
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_callgrind_profile_attributes_instructions_to_the_codecs():
    # The program total also moves with other threads (numpy's OpenBLAS pool spins under
    # callgrind), so only the codecs' own functions, which do the same work every
    # iteration, are asserted on.
    per_fn = cg.callgrind_profile(20, 10, 100)
    crc = sum(v for k, v in per_fn.items() if "crc32c" in k)
    write_record = sum(v for k, v in per_fn.items() if k.endswith("frame_write_record"))
    assert crc > 0 and write_record > 0
