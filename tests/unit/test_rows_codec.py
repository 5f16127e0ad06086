"""The Cython row validator (vrepl/_core/rows.pyx) agrees with the Python reference
(vrepl/vnode/rows.py check_rows_py): it accepts exactly the batches the reference accepts,
with the same new columns and estimated bytes, and leaves every refusal (and so its reason)
to the reference."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrepl.vnode import rows as R
from vrepl.vnode.config import VnodeConfig

fast = pytest.importorskip("vrepl._core.rows").fast_check

CFG = VnodeConfig()


def _fast(rows, cfg, schemas=None, table_count=None):
    if cfg is None:
        return fast(rows, schemas, False, R.INT64_MIN, R.INT64_MAX, 0, 0, 0, 0, 0, None)
    return fast(rows, schemas, True, cfg.ts_lo, cfg.ts_hi, cfg.max_rows_per_batch,
                cfg.max_row_bytes, cfg.max_batch_bytes, cfg.max_columns_per_table,
                cfg.max_tables, table_count)


def _agree(rows, cfg=CFG, schemas=None, table_count=None, defers=False):
    """defers: a good batch of a shape JSON never produces (tuples), which the fast path
    leaves to the reference."""
    ref = R.check_rows_py(rows, cfg, schemas, table_count)
    got = _fast(rows, cfg, schemas, table_count)
    if defers:
        assert got is None
    elif ref[0] is None:
        assert got is not None, f"fast path refused a good batch: {rows!r}"
        assert got == (ref[1], ref[2])
    else:
        assert got is None, f"fast path accepted a bad batch ({ref[0]}): {rows!r}"
    # And the public entry point gives the reference's answer, reason included.
    assert R.check_rows(rows, cfg, schemas, table_count) == ref


names = st.sampled_from(["t", "t1", "_t", "T_x", "1t", "a/b", "", "ts", "v", "s", "x" * 70,
                         "y" * 200, "é"])
values = st.one_of(
    st.integers(min_value=-2**64, max_value=2**64), st.floats(allow_nan=True),
    st.text(max_size=20), st.booleans(), st.none(), st.just([1]), st.just({"a": 1}),
    st.sampled_from(["\ud800", "x" * 300]))
row = st.one_of(
    st.tuples(names, st.one_of(st.integers(min_value=-2**64, max_value=2**64), st.floats(),
                               st.text(max_size=3), st.booleans()),
              st.one_of(st.dictionaries(names, values, max_size=4), st.lists(values, max_size=2)))
    .map(list),
    st.lists(st.integers(), max_size=4), st.integers(), st.none())
schemas = st.one_of(st.none(), st.dictionaries(
    names, st.dictionaries(names, st.sampled_from(["int", "float", "str", "bool"]), max_size=3),
    max_size=3))


@pytest.mark.slow  # seconds: outside the `-m "not slow"` loop
@settings(max_examples=600, deadline=None)
@given(st.lists(row, max_size=6), schemas, st.sampled_from([None, 0, 3]))
def test_agrees_with_reference_on_generated_batches(rows, schemas, table_count):
    _agree(rows, CFG, schemas, table_count)
    _agree(rows, None, schemas)


def test_good_json_batch_and_limits():
    rows = json.loads('[["t",1,{"v":1,"f":1.5,"s":"abc","b":true,"n":null}],'
                      ' ["t",2,{"v":2,"f":2,"s":"é"}], ["u",3,{"x":1}]]')
    _agree(rows)
    _agree(rows, CFG, {"t": {"v": "int", "f": "float"}}, 1)
    _agree(rows, CFG, {"t": {"f": "int"}}, 1)           # int column gets a float: refused
    _agree(rows, CFG, {"t": {"v": "str"}}, 1)
    small = VnodeConfig(max_rows_per_batch=2)
    _agree(rows, small)
    _agree(rows, VnodeConfig(max_tables=1), None, 0)
    _agree(rows, VnodeConfig(max_columns_per_table=2))
    _agree(rows, VnodeConfig(max_row_bytes=40))
    _agree(rows, VnodeConfig(max_batch_bytes=100))
    _agree([["t", 2**63, {"v": 1}]])
    _agree([["t", 2**63 - 1, {"v": 1}]], None)
    _agree([["t", 1, {"v": 2**63}]])
    _agree([["t", 1, {"v": float("inf")}]])
    _agree([["t", 1, {"v": "\ud800"}]])
    _agree([("t", 1, {"v": 1})], defers=True)    # a tuple: the reference accepts it
    _agree([["t", True, {"v": 1}]])
    _agree([["t", 1, {"ts": 1}]])
    _agree([["t", 1, {}]])
    _agree([])
    _agree("[]")


def test_schema_conflict_reason_comes_from_the_reference():
    reason, _, _ = R.check_rows([["t", 1, {"v": "x"}]], CFG, {"t": {"v": "int"}}, 1)
    assert reason == "row 0: column 'v' of table 't' is int, got str (a column's type cannot change)"
