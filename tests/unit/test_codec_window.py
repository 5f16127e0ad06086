"""The C pending-forward window (vrepl/_core/window.pyx) behaves exactly like its plain
Python model (vrepl/replica/forward.py PendingWindowModel) on random operation sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrepl._core.window import PendingWindow, WindowInvariantError
from vrepl.replica.forward import PendingWindowModel

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 20), st.integers(0, 3)),
        st.tuples(st.just("ack"), st.integers(0, 3), st.integers(0, 120)),
        st.tuples(st.just("expire"), st.integers(0, 3)),
        st.tuples(st.just("clear")),
        st.tuples(st.just("quorum"), st.integers(0, 3)),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 3), ops)
def test_the_c_window_matches_the_model(needed, script):
    c = PendingWindow(0, needed, 100, 4)
    m = PendingWindowModel(0, needed, 100)
    next_v, tick = 1, 0
    for op in script:
        if op[0] == "add":
            n = op[1]
            tick += op[2]
            assert c.full(n) == m.full(n)
            if not c.full(n):
                c.add_range(next_v, next_v + n - 1, tick + 5)
                m.add_range(next_v, next_v + n - 1, tick + 5)
                next_v += n
        elif op[0] == "ack":
            assert c.ack(op[1], op[2]) == m.ack(op[1], op[2])
        elif op[0] == "expire":
            tick += op[1]
            first, last = c.first_version(), c.last_version()
            if first is not None:
                assert c.minority_first(first, last) == m.minority_first(first, last)
            assert c.expire(tick) == m.expire(tick)
        elif op[0] == "clear":
            assert c.clear() == m.clear()
        else:
            assert c.set_slave_acks_needed(op[1]) == m.set_slave_acks_needed(op[1])
        assert len(c) == len(m)
        assert c.first_version() == m.first_version()
        for v in (1, next_v // 2 + 1, next_v):
            assert c.slaves_acked(v) == m.slaves_acked(v)


def test_contract_violations_raise():
    w = PendingWindow(0, 1, 10, 3)
    w.add_range(1, 5, 10)
    with pytest.raises(WindowInvariantError, match="version order"):
        w.add_range(7, 8, 10)
    with pytest.raises(WindowInvariantError, match="full"):
        w.add_range(6, 20, 10)
    with pytest.raises(WindowInvariantError, match="deadlines"):
        w.add_range(6, 6, 9)


def test_a_batch_is_one_span():
    w = PendingWindow(0, 1, 1_000_000, 3)
    for k in range(100):
        w.add_range(k * 1000 + 1, (k + 1) * 1000, 7)  # the same tick: spans merge
    assert w.describe() == "window 100000 pending [v1..v100000@t7]"
    assert w.ack(0, 100000) is None
    assert w.ack(2, 60000) == (1, 60000)
