"""How the sync instance cuts a queued run of records into batches (vrepl.sync.batch_bounds):
the same cuts as the plain per-record rule it replaced, for any lengths and limits."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vrepl.sync import batch_bounds


def reference_bounds(payloads, max_records, max_bytes):
    """The per-record loop SyncInstance._run_queue used before (kept here as the spec)."""
    out = []
    start = 0
    while start < len(payloads):
        end, size = start, 0
        while end < len(payloads) and end - start < max_records and (end == start or size + len(payloads[end]) <= max_bytes):
            size += len(payloads[end])
            end += 1
        out.append((start, end))
        start = end
    return out


@settings(max_examples=400, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=300), max_size=200),
    max_records=st.integers(min_value=1, max_value=50),
    max_bytes=st.integers(min_value=1, max_value=2000),
)
def test_batch_bounds_match_the_per_record_rule(lengths, max_records, max_bytes):
    payloads = [b"x" * n for n in lengths]
    got = batch_bounds(payloads, max_records, max_bytes)
    assert got == reference_bounds(payloads, max_records, max_bytes)
    # And the cuts cover the run in order, each within the limits (or one oversized record).
    assert [i for s, e in got for i in range(s, e)] == list(range(len(payloads)))
    for s, e in got:
        assert 1 <= e - s <= max_records
        assert e - s == 1 or sum(lengths[s:e]) <= max_bytes


def test_batch_bounds_examples():
    assert batch_bounds([], 10, 100) == []
    assert batch_bounds([b"a"] * 10, 4, 100) == [(0, 4), (4, 8), (8, 10)]
    assert batch_bounds([b"a" * 60, b"b" * 60, b"c" * 30], 10, 100) == [(0, 1), (1, 3)]
    assert batch_bounds([b"a" * 500, b"b"], 10, 100) == [(0, 1), (1, 2)]  # an oversized record goes alone
    assert batch_bounds((b"", b"", b""), 2, 1) == [(0, 2), (2, 3)]
