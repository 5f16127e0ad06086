"""Reference vnode rows (vrepl/vnode/rows.py, docs/vnode.md §rows, §payload): every bad input
gets a one-line reason and writes nothing; the payload codec round-trips and refuses
malformed payloads with a PayloadError."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrepl.errors import ConfigError, VreplError
from vrepl.vnode import (PayloadError, Vnode, VnodeConfig, check_rows, config_invalid,
                         decode_rows, encode_rows, rows_invalid)
from vrepl.vnode.rows import PAYLOAD_HEADER

pytestmark = pytest.mark.timeout(60)

GOOD = [("t1", 1000, {"x": 1, "y": 2.5, "s": "a", "b": True, "n": None})]


def test_good_batch_is_accepted():
    assert rows_invalid(GOOD) is None
    reason, added, size = check_rows(GOOD)
    assert reason is None
    # The all-null column "n" fixes no type.
    assert added == {"t1": {"x": "int", "y": "float", "s": "str", "b": "bool"}}
    assert size > 0


BAD = [
    # (rows, words the reason must contain)
    ("not a list", "rows must be a list"),
    ([], "no rows"),
    ([("t1", 1)], "not a (table, ts, values) triple"),
    (["t1"], "not a (table, ts, values) triple"),
    ([("a/b", 1, {"x": 1})], "table name 'a/b'"),
    ([("..", 1, {"x": 1})], "table name '..'"),
    ([("../etc", 1, {"x": 1})], "table name '../etc'"),
    ([("a\\b", 1, {"x": 1})], "table name"),
    ([("", 1, {"x": 1})], "table name ''"),
    ([("1abc", 1, {"x": 1})], "table name '1abc'"),
    ([("a.b", 1, {"x": 1})], "table name 'a.b'"),
    ([("t" * 193, 1, {"x": 1})], "table name"),
    ([(7, 1, {"x": 1})], "table name 7"),
    ([("t1", "1", {"x": 1})], "ts '1' is not an int"),
    ([("t1", 1.5, {"x": 1})], "ts 1.5 is not an int"),
    ([("t1", True, {"x": 1})], "ts True is not an int"),
    ([("t1", None, {"x": 1})], "ts None is not an int"),
    ([("t1", -1, {"x": 1})], "ts -1 is outside"),
    ([("t1", 2**63, {"x": 1})], "is outside"),
    ([("t1", 1, {})], "no value columns"),
    ([("t1", 1, [1, 2])], "values must be a dict"),
    ([("t1", 1, None)], "values must be a dict"),
    ([("t1", 1, {"ts": 1})], "column name 'ts'"),
    ([("t1", 1, {"_version": 1})], "column name '_version'"),
    ([("t1", 1, {"a-b": 1})], "column name 'a-b'"),
    ([("t1", 1, {"": 1})], "column name ''"),
    ([("t1", 1, {"c/d": 1})], "column name 'c/d'"),
    ([("t1", 1, {1: 1})], "column name 1"),
    ([("t1", 1, {"x": [1]})], "value of type list"),
    ([("t1", 1, {"x": {"a": 1}})], "value of type dict"),
    ([("t1", 1, {"x": b"ab"})], "value of type bytes"),
    ([("t1", 1, {"x": float("nan")})], "not finite"),
    ([("t1", 1, {"x": float("inf")})], "not finite"),
    ([("t1", 1, {"x": 2**63})], "outside int64"),
    ([("t1", 1, {"x": "\ud800"})], "not valid UTF-8"),
    # A column's type is fixed within a batch too.
    ([("t1", 1, {"x": 1}), ("t1", 2, {"x": "s"})], "is int, got str"),
    ([("t1", 1, {"x": 1.5}), ("t1", 2, {"x": True})], "is float, got bool"),
    ([("t1", 1, {"x": 1}), ("t1", 2, {"x": 1.5})], "is int, got float"),
    # The reason names the row.
    ([("t1", 1, {"x": 1}), ("t/2", 2, {"x": 1})], "row 1: table name"),
]


@pytest.mark.parametrize("rows,words", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_has_a_one_line_reason(rows, words):
    reason = rows_invalid(rows)
    assert reason is not None and words in reason, reason
    assert "\n" not in reason


@pytest.mark.parametrize("rows,words", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_writes_nothing(tmp_path, rows, words):
    v = Vnode(str(tmp_path))
    # A valid row before the bad one must not leak its table or columns into the schemas.
    batch = ([("tfirst", 5, {"z": 1})] + list(rows)) if isinstance(rows, list) and rows \
        else rows
    reason, payload = v.prepare_write(batch)
    assert reason is not None and words.split(":")[-1].strip() in reason
    assert payload == b""
    assert v.schemas == {}
    assert v.get_version() == 0
    assert v.query("tfirst", 0, 10**6) == []
    assert v.flush() == []


def test_type_change_against_the_schema(tmp_path):
    v = Vnode(str(tmp_path))
    assert v.prepare_write([("t1", 1, {"x": 1, "f": 1.5})])[0] is None
    reason, _ = v.prepare_write([("t1", 2, {"x": "one"})])
    assert reason == ("row 0: column 'x' of table 't1' is int, got str"
                      " (a column's type cannot change)")
    reason, _ = v.prepare_write([("t1", 2, {"x": 2.5})])
    assert "is int, got float" in reason
    # An int widens into a float column; null fits any column.
    assert v.prepare_write([("t1", 2, {"f": 2, "x": None})])[0] is None
    # The reservation holds for a batch validated before the first is applied.
    assert v.schemas == {"t1": {"x": "int", "f": "float"}}


LIMITS = VnodeConfig(max_rows_per_batch=3, max_row_bytes=100, max_batch_bytes=250,
                     max_payload_bytes=200, max_columns_per_table=2, max_tables=2)


@pytest.mark.parametrize("rows,words", [
    ([("t", i, {"x": i}) for i in range(4)], "4 rows in one batch, above max_rows_per_batch 3"),
    ([("t", 1, {"x": "a" * 100})], "above max_row_bytes 100"),
    ([("t", i, {"x": "a" * 70}) for i in range(3)], "above max_batch_bytes 250"),
    ([("t", 1, {"a": 1, "b": 2, "c": 3})], "max_columns_per_table 2"),
    ([("t1", 1, {"a": 1}), ("t2", 1, {"a": 1}), ("t3", 1, {"a": 1})], "max_tables 2"),
    ([("t", 1, {"x": "é" * 40}), ("t", 2, {"x": "\x01" * 30})], "above max_payload_bytes 200"),
])
def test_limits(tmp_path, rows, words):
    v = Vnode(str(tmp_path), LIMITS)
    reason, payload = v.prepare_write(rows)
    assert reason is not None and words in reason, reason
    assert payload == b"" and v.schemas == {}


def test_ts_range_follows_the_precision():
    ms, us = VnodeConfig(), VnodeConfig(precision="us")
    assert us.ts_hi == ms.ts_hi * 1000
    assert rows_invalid([("t", ms.ts_hi, {"x": 1})], ms) is None
    assert "outside" in rows_invalid([("t", ms.ts_hi + 1, {"x": 1})], ms)
    assert rows_invalid([("t", ms.ts_hi + 1, {"x": 1})], us) is None
    custom = VnodeConfig(ts_min=-10, ts_max=10)
    assert rows_invalid([("t", -10, {"x": 1})], custom) is None
    assert "outside [-10, 10]" in rows_invalid([("t", 11, {"x": 1})], custom)


@pytest.mark.parametrize("kwargs,words", [
    ({"precision": "ns"}, "precision 'ns'"),
    ({"max_rows_per_batch": 0}, "max_rows_per_batch must be a positive integer"),
    ({"file_span_ms": -1}, "file_span_ms"),
    ({"ts_min": 5, "ts_max": 4}, "ts_min 5 is above ts_max 4"),
    ({"max_row_bytes": 10, "max_batch_bytes": 5}, "max_row_bytes 10 is above"),
])
def test_config_invalid(tmp_path, kwargs, words):
    cfg = VnodeConfig(**kwargs)
    assert words in config_invalid(cfg)
    with pytest.raises(ConfigError, match="vnode config"):
        Vnode(str(tmp_path), cfg)


# -- payload codec ----------------------------------------------------------------------------

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
TAIL = LETTERS + "0123456789_"
names = st.builds(lambda a, b: a + b, st.sampled_from(LETTERS),
                  st.text(TAIL, max_size=10)).filter(lambda s: s != "ts")
values = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
row_st = st.tuples(st.builds(lambda a, b: a + b, st.sampled_from(LETTERS + "_"),
                             st.text(TAIL, max_size=10)),
                   st.integers(-2**63, 2**63 - 1),
                   st.dictionaries(names, values, min_size=1, max_size=5))
# Each row its own table, so random value types never conflict within a table.
batch_st = st.lists(row_st, min_size=1, max_size=20).map(
    lambda rows: [(f"{t}_{i}", ts, vals) for i, (t, ts, vals) in enumerate(rows)])


def typed(rows):
    """Rows with every value tagged by its type (1 == 1.0 == True in Python)."""
    return [(t, ts, {k: (type(v).__name__, v) for k, v in vals.items()})
            for t, ts, vals in rows]


@settings(max_examples=200, deadline=None)
@given(batch_st)
def test_payload_round_trip(rows):
    payload = encode_rows(rows)
    assert payload.startswith(PAYLOAD_HEADER)
    back = decode_rows(payload)
    assert typed(back) == typed(rows)
    for (_, _, a), (_, _, b) in zip(back, rows):
        for k in a:  # -0.0 stays -0.0
            if type(a[k]) is float:
                assert math.copysign(1, a[k]) == math.copysign(1, b[k])


def body(obj) -> bytes:
    return PAYLOAD_HEADER + json.dumps(obj).encode()


MALFORMED = [
    (b"", "shorter than the 4-byte header"),
    (b"VRB", "shorter than the 4-byte header"),
    (b"XYZ\x01[]", "not a vrepl row batch"),
    (b"VRB\x09[]", "unknown payload format 9"),
    (b"VRB\x04[]", "shorter than its format-4 header"),
    (b"VRB\x03[]", "a no-op payload (format 3) with 2 bytes after its header"),
    (b"VRB\x02\x05ab", "shorter than its request id header"),
    (b"VRB\x02\x02a/[]", "does not match"),
    (PAYLOAD_HEADER + b"\xff\xfe", "not UTF-8"),
    (PAYLOAD_HEADER + b'[["t",1,{"x":1}]', "not JSON"),
    (PAYLOAD_HEADER + b"[" * 200_000, "body"),
    (PAYLOAD_HEADER + b'[["t",1,{"x":NaN}]]', "not finite"),
    (body({"t": 1}), "rows must be a list"),
    (body([]), "no rows"),
    (body([["t", 1]]), "not a (table, ts, values) triple"),
    (body([["../t", 1, {"x": 1}]]), "table name '../t'"),
    (body([["t", 1.5, {"x": 1}]]), "ts 1.5 is not an int"),
    (body([["t", 2**64, {"x": 1}]]), "outside"),
    (body([["t", 1, {"x": [1]}]]), "value of type list"),
    (body([["t", 1, {"x": 1}], ["t", 2, {"x": "s"}]]), "is int, got str"),
]


@pytest.mark.parametrize("payload,words", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_malformed_payload_is_a_clear_error(payload, words):
    with pytest.raises(PayloadError) as exc:
        decode_rows(payload, version=42)
    msg = str(exc.value)
    assert msg.startswith("version 42: malformed row payload: "), msg
    assert words in msg, msg
    assert isinstance(exc.value, (ValueError, VreplError))


def test_payload_size_limit():
    p = encode_rows(GOOD)
    with pytest.raises(PayloadError, match="above max_payload_bytes 10"):
        decode_rows(p, max_payload_bytes=10)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_decode_or_raise_payload_error(junk):
    for payload in (junk, PAYLOAD_HEADER + junk):
        try:
            rows = decode_rows(payload)
        except PayloadError:
            continue
        assert rows_invalid(rows, None) is None


def test_every_truncation_of_a_payload_is_refused():
    p = encode_rows([("t1", 1, {"x": 1, "s": "héllo"}), ("t2", 2, {"y": None})])
    for n in range(len(p)):
        with pytest.raises(PayloadError):
            decode_rows(p[:n])
