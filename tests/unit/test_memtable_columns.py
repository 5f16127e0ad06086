"""The columnar memtable (vrepl/_core/memcols.pyx, vrepl/vnode/memtable.py).

1. parse_batch (a JSON body parsed straight into columns) agrees with the reference path
   (json.loads + check_rows): whatever it accepts, the reference accepts with the same new
   columns, estimated bytes and rows; on generated bodies, valid and hostile.
2. The memtable answers like a dict model of "newest row per (table, ts)": range queries
   and the Arrow table a flush writes, with overwrites, out-of-order ts, nulls and columns
   that appear later.
3. Arrays handed out stay as they were while the log grows.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vrepl._core.memcols import Staged, TableLog
from vrepl.vnode import rows as R
from vrepl.vnode.config import VnodeConfig
from vrepl.vnode.files import arrow_schema
from vrepl.vnode.memtable import Memtable

# -- 1. parse_batch against the reference ------------------------------------------------------

NAMES = ["t", "cpu", "_x", "ts", "9a", "a-b", "v", "s", "f", "b", "n", "é"]
SCALARS = ["0", "-0", "1", "-17", "9223372036854775807", "-9223372036854775808",
           "9223372036854775808", "-9223372036854775809", "99999999999999999999999", "01",
           "1.5", "-2.25e3", "1e400", "-1e-400", "1E5", "0.1", "1.", ".5", "NaN", "Infinity",
           "-Infinity", "true", "false", "null", "tru", '"x"', '""', '"a b"', '"\\n"',
           '"\\u00e9"', '"é"', '"\\ud800"', '"tab\there"', "[1]", "{}", '{"a":1}']


GOOD_NAMES = ["v", "s", "f", "b", "a"]
GOOD_SCALARS = ["0", "1", "-17", "1.5", "-2.25e3", "1E5", "true", "false", '"x"', '""',
                '"a b"', "null", "9223372036854775807", "-0"]
# Well-formed values by column, so that most rows of a batch agree on types.
GOOD_BY_NAME = {"v": ["0", "1", "-17", "9223372036854775807", "-0", "null"],
                "f": ["1.5", "-2.25e3", "1E5", "0.1", "3", "null"],
                "s": ['"x"', '""', '"a b"', "null"], "b": ["true", "false", "null"],
                "a": GOOD_SCALARS}


def _mostly(draw, good, any_):
    """A token: usually a well-formed one, sometimes anything (one in twelve)."""
    return draw(st.sampled_from(any_ if draw(st.integers(0, 11)) == 0 else good))


@st.composite
def bodies(draw):
    """A JSON-ish body of rows: mostly well formed, sometimes not, built as text so that
    duplicate keys, odd spacing, escapes and bad literals all occur."""
    ws = st.sampled_from(["", "", "", " ", "\n", " \t"])
    rows = []
    for _ in range(draw(st.integers(1, 6)) if draw(st.integers(0, 20)) else 0):
        table = _mostly(draw, ["t", "u"], ["t", "u", "cpu", "bad/name", "", "t\\u0041"])
        if draw(st.integers(0, 60)) == 0:
            table_tok = draw(st.sampled_from(["1", "null", '"t" ']))
        else:
            table_tok = json.dumps(table) if "\\" not in table else f'"{table}"'
        ts = _mostly(draw, ["1", "2", "3", "-5", "0", "7"],
                     ["1.0", "9223372036854775807", "99999999999999999999", '"1"', "2e0"])
        pairs = []
        keys = draw(st.lists(st.sampled_from(GOOD_NAMES), min_size=1, max_size=4, unique=True))
        if draw(st.integers(0, 5)) == 0:     # a bad or repeated key
            keys.insert(draw(st.integers(0, len(keys))), draw(st.sampled_from(NAMES + keys)))
        if draw(st.integers(0, 20)) == 0:
            keys = []
        for k in keys:
            v = _mostly(draw, GOOD_BY_NAME.get(k, GOOD_SCALARS), SCALARS)
            pairs.append(f'{json.dumps(k, ensure_ascii=draw(st.booleans()))}{draw(ws)}:{draw(ws)}{v}')
        obj = "{" + ("," + draw(ws)).join(pairs) + "}"
        parts = [table_tok, ts, obj]
        if draw(st.integers(0, 40)) == 0:
            parts = parts[:2] if draw(st.booleans()) else parts + ["1"]
        rows.append("[" + draw(ws) + ("," + draw(ws)).join(parts) + draw(ws) + "]")
    text = draw(ws) + "[" + ",".join(rows) + "]" + draw(ws)
    if draw(st.integers(0, 60)) == 0:
        text = text[:draw(st.integers(0, len(text)))]
    return text.encode("utf-8")


SCHEMA_CHOICES = [None, {}, {"t": {"v": "float"}}, {"t": {"v": "int", "s": "str"}},
                  {"t": {"b": "bool"}, "u": {}}, {"cpu": {"f": "str"}}]


def _reference(body: bytes, cfg, schemas, table_count):
    try:
        rows = R.loads_json(body)
    except (ValueError, RecursionError):
        return None, None
    reason, added, total = R.check_rows_py(rows, cfg, schemas, table_count)
    return (None if reason is not None else (rows, added, total)), reason


def _content(tables: dict) -> list:
    """Every row of a memtable's logs, comparable across two memtables."""
    m = Memtable()
    m.tables = tables
    return sorted((t, ts, ver, ep, sorted(vals.items(), key=lambda kv: kv[0]))
                  for t, ts, ver, ep, vals in m.rows_in_order())


def _norm(v):
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


@pytest.mark.slow  # seconds of CPU: outside the `-m "not slow"` loop
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies(), schemas=st.sampled_from(SCHEMA_CHOICES), limits=st.booleans(),
       table_count=st.sampled_from([None, 0, 5]))
def test_parse_batch_accepts_only_what_the_reference_accepts(body, schemas, limits,
                                                             table_count):
    cfg = VnodeConfig(max_tables=6, max_columns_per_table=3, max_row_bytes=60) if limits else None
    staged = R.parse_staged(body, cfg, schemas, table_count)
    ref, reason = _reference(body, cfg, schemas, table_count)
    if staged is None:
        return
    assert ref is not None, f"fast path accepted a batch the reference refuses: {reason}"
    rows, added, total = ref
    assert staged.added == added
    assert staged.nbytes == total
    assert len(staged) == len(rows)
    # The same rows: staged columns against the reference rows applied one by one.
    sch = {t: dict(c) for t, c in (schemas or {}).items()}
    for t, cols in added.items():
        sch.setdefault(t, {}).update(cols)
    want = Memtable()
    want.apply(0, 0, rows, 0.0, None, sch)
    got = {t: TableLog() for t in staged.tables}
    for t, log in staged.tables.items():
        got[t].extend(log, 0, 0)
    norm = lambda content: [(t, ts, v, e, [(c, _norm(x)) for c, x in vals])  # noqa: E731
                            for t, ts, v, e, vals in content]
    assert norm(_content(got)) == norm(_content(want.tables))


def test_parse_batch_takes_plain_batches_and_leaves_the_rest():
    cfg = VnodeConfig()
    plain = b'[["t", 1, {"v": 1, "s": "a", "f": 1.5, "b": true}], ["t",2,{"v":-3, "s": null}]]'
    st_ = R.parse_staged(plain, cfg, {}, 0)
    assert isinstance(st_, Staged) and len(st_) == 2 and st_.nbytes > 0
    assert st_.added == {"t": {"v": "int", "s": "str", "f": "float", "b": "bool"}}
    # Bodies the reference accepts but the fast path leaves to it (and must not take).
    for body in (b'[["t", 1, {"s": "caf\\u00e9"}]]', '[["t", 1, {"s": "café"}]]'.encode(),
                 b'[["t", 1, {"v": 1, "v": 2}]]', b'[["t", 1, {"n": null, "n": null}]]'):
        assert R.parse_staged(body, cfg, {}, 0) is None
        assert R.check_rows(R.loads_json(body), cfg, {}, 0)[0] is None
    # Refused by both: the fast path says None, the reference says why.
    for body in (b'[["t", 1.5, {"v": 1}]]', b'[["t", 1, {"v": NaN}]]', b'[["t", 1, {}]]',
                 b'[["a/b", 1, {"v": 1}]]', b'[["t", 1, {"ts": 1}]]', b'[]',
                 b'[["t", 99999999999999999999, {"v": 1}]]', b'[["t", 1, {"v": 1e400}]]'):
        assert R.parse_staged(body, cfg, {}, 0) is None
        assert R.check_rows(R.loads_json(body), cfg, {}, 0)[0] is not None


# -- 2. the memtable against a dict model --------------------------------------------------------

VALUES = st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.booleans(),
                   st.floats(allow_nan=False, allow_infinity=False),
                   st.text(max_size=6))
TYPE_OF = {int: "int", float: "float", str: "str", bool: "bool"}


@st.composite
def batches(draw):
    """Batches of rows for tables t/u with columns a..d, each column of one type."""
    types = {c: draw(st.sampled_from(["int", "float", "str", "bool"])) for c in "abcd"}
    gen = {"int": st.integers(-2**63, 2**63 - 1), "bool": st.booleans(),
           "float": st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                              st.integers(-2**53, 2**53)),
           "str": st.text(max_size=6)}
    out = []
    for _ in range(draw(st.integers(1, 12))):
        rows = []
        for _ in range(draw(st.integers(1, 8))):
            cols = draw(st.lists(st.sampled_from("abcd"), min_size=1, max_size=4, unique=True))
            vals = {c: draw(st.one_of(st.none(), gen[types[c]])) for c in cols}
            rows.append([draw(st.sampled_from("tu")), draw(st.integers(-5, 30)), vals])
        out.append(rows)
    return types, out


@pytest.mark.slow  # seconds of CPU: outside the `-m "not slow"` loop
@settings(max_examples=300, deadline=None)
@given(data=batches(), via_json=st.booleans(), ranges=st.lists(
    st.tuples(st.integers(-8, 35), st.integers(-8, 35)), min_size=1, max_size=4))
def test_memtable_answers_like_a_dict_of_newest_rows(data, via_json, ranges):
    types, batches_ = data
    schemas = {"t": dict(types), "u": dict(types)}
    mem = Memtable()
    model: dict[tuple[str, int], tuple[int, dict]] = {}
    for version, rows in enumerate(batches_, start=1):
        if via_json:   # the master's and the slaves' path: the body parsed into columns
            body = json.dumps(rows, ensure_ascii=True).encode()
            staged = R.parse_staged(body, None, schemas)
            batch = staged if staged is not None else R.loads_json(body)
        else:
            batch = rows
        mem.apply(version, 7, batch, 0.0, None, schemas)
        for table, ts, vals in rows:
            model[(table, ts)] = (version, vals)
    for table in "tu":
        for start, end in ranges:
            got = mem.range(table, start, end)
            want = sorted((ts, v) for (t, ts), v in model.items() if t == table and start <= ts < end)
            assert [ts for ts, _ in got] == [ts for ts, _ in want]
            for (ts, (ver, ep, vals)), (_, (wver, wvals)) in zip(got, want):
                assert (ver, ep) == (wver, 7)
                for c in "abcd":
                    w = wvals.get(c)
                    w = float(w) if types[c] == "float" and w is not None else w
                    assert vals.get(c) == w, (table, ts, c)
        if table not in mem.tables:
            continue
        tbl = mem.to_arrow(table, arrow_schema("ms", types))
        want = sorted((ts, v) for (t, ts), v in model.items() if t == table)
        assert tbl.column("ts").cast(pa.int64()).to_pylist() == [ts for ts, _ in want]
        assert tbl.column("_version").to_pylist() == [v for _, (v, _) in want]
        for c in "abcd":
            exp = [vals.get(c) for _, (_, vals) in want]
            if types[c] == "float":
                exp = [None if x is None else float(x) for x in exp]
            assert tbl.column(c).to_pylist() == exp


def test_failed_merge_back_keeps_every_row_in_order(tmp_path):
    """A flush that fails puts imem back under the newer writes (Vnode._merge_back)."""
    from vrepl.vnode.vnode import Vnode
    schemas = {"t": {"a": "int", "s": "str"}}
    old, new = Memtable(), Memtable()
    old.apply(1, 1, [["t", 1, {"a": 1, "s": "x"}], ["t", 2, {"a": 2}]], 0.0, None, schemas)
    new.apply(2, 1, [["t", 2, {"s": "y"}], ["t", 3, {"a": 3}]], 0.0, None, schemas)
    merged = Vnode._merge_back(old, new, schemas)
    assert merged.rows == 4 and merged.max_version == 2
    assert [(ts, v, vals) for ts, (v, _, vals) in merged.range("t", 0, 10)] == [
        (1, 1, {"a": 1, "s": "x"}), (2, 2, {"a": None, "s": "y"}), (3, 2, {"a": 3, "s": None})]


# -- 3. exported arrays never change ---------------------------------------------------------------

def test_arrays_handed_out_stay_valid_while_the_log_grows():
    schemas = {"t": {"a": "int", "s": "str"}}
    mem = Memtable()
    mem.apply(1, 1, [["t", i, {"a": i, "s": "v%d" % i}] for i in range(10)], 0.0, None, schemas)
    log = mem.tables["t"]
    ts, ver, _ = log.arrays()
    vals, valid, _ = log.columns["a"].arrays(log.n)
    svals, _, soffs = log.columns["s"].arrays(log.n)
    before = (ts.copy(), vals.copy(), bytes(svals), soffs.copy())
    for v in range(2, 400):   # grow every buffer many times over
        mem.apply(v, 1, [["t", 10 * v + i, {"a": -i, "s": "w" * 50}] for i in range(10)],
                  0.0, None, schemas)
    assert np.array_equal(ts, before[0]) and np.array_equal(vals, before[1])
    assert bytes(svals) == before[2] and np.array_equal(soffs, before[3])
    assert mem.range("t", 0, 3)[2][1][2] == {"a": 2, "s": "v2"}
    assert log.n == 10 + 398 * 10 and not math.isnan(float(valid.sum()))


def test_parse_batch_rejects_non_bytes_cleanly():
    with pytest.raises(TypeError):
        R.parse_staged("not bytes", None, {})


def test_a_sealed_memtable_has_nothing_left_to_pad():
    """A flush reads imem outside the vnode lock while queries read it under the lock;
    reading pads short columns, so a flush seals imem first (Vnode.flush)."""
    schemas = {"t": {"a": "int", "s": "str"}}
    mem = Memtable()
    mem.apply(1, 1, [["t", 1, {"a": 1, "s": "x"}], ["t", 2, {"a": 2}], ["t", 3, {"a": 3}]],
              0.0, None, schemas)
    log = mem.tables["t"]
    assert log.columns["s"].n == 1 < log.n                 # "s" missing from later rows
    mem.seal()
    assert all(col.n == log.n for col in log.columns.values())
    assert [vals["s"] for _, (_, _, vals) in mem.range("t", 0, 9)] == ["x", None, None]
