"""The line-protocol and Arrow decoders (vrepl/_core/lineproto.pxi, arrowin.pxi through
vrepl/vnode/ingest.py) as a vnode uses them: what they accept and store, every refusal
with its line, all or nothing per request, and the WAL payload decoded into the same rows
by another replica (docs/client-api.md §Binary writes, §InfluxDB line protocol)."""
from __future__ import annotations

import math
import re

import pyarrow as pa
import pytest

from vrepl.client import arrow_stream, rows_to_arrow
from vrepl.vnode import Vnode, VnodeConfig
from vrepl.vnode import ingest as I
from vrepl.vnode.errors import ApplyError

NS, US, MS, S = I.UNIT_CODES["ns"], I.UNIT_CODES["us"], I.UNIT_CODES["ms"], I.UNIT_CODES["s"]
TABLE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,191}")


@pytest.fixture
def vn(tmp_path):
    v = Vnode(str(tmp_path / "a"), VnodeConfig())
    yield v
    v.close()


@pytest.fixture
def replica(tmp_path):
    v = Vnode(str(tmp_path / "b"), VnodeConfig())
    yield v
    v.close()


def rows_of(v: Vnode, table: str) -> list[dict]:
    return [{k: x for k, x in r.items() if k not in ("_version", "_epoch")}
            for r in v.query(table, -2**63, 2**63 - 1)]


def write_lines(v: Vnode, body: bytes, unit: int = NS, version: int = 1, max_line: int = 65536):
    reason, line, staged, payload = v.prepare_lines(body, unit, max_line)
    if reason is None:
        v.apply_prepared(version, 1, staged, len(payload))
    return reason, line, payload


# -- table names ---------------------------------------------------------------------------

def test_table_of_series_is_deterministic_order_free_and_always_a_table_name():
    assert I.table_of_series("cpu", {}) == "cpu"
    a = I.table_of_series("cpu", {"host": "a", "dc": "x"})
    assert a == I.table_of_series("cpu", [("dc", "x"), ("host", "a")])
    assert a.startswith("cpu__") and len(a) == 3 + 2 + 32
    names = {a, I.table_of_series("cpu", {"host": "b", "dc": "x"}),
             I.table_of_series("cpu", {"host": "a"}), I.table_of_series("cpu", {}),
             I.table_of_series("cpu__x", {}), I.table_of_series("cpu", {"host": "a", "dc": "x", "z": "1"}),
             I.table_of_series("cpu,host=a", {}), I.table_of_series("cp", {"u": "host"})}
    assert len(names) == 8                       # no two series share a table
    for m in ("9lives", "", "a b.c", "é" * 300, "_x", "x" * 500, "cpu__x"):
        t = I.table_of_series(m, {"k": "v"}) if m else I.table_of_series(m, {})
        assert TABLE_RE.fullmatch(t), t
        assert "__" in t


# -- line protocol: what is stored -----------------------------------------------------------

def test_fields_tags_types_and_escapes_are_stored(vn):
    body = (b'cpu,host=a\\ b,dc=x\\,y usage=0.5,n=-3i,u=7u,ok=t,no=FALSE,s="say \\"hi\\" \\\\ \\n"'
            b" 1700000000000000000\n# a comment\n\n  mem free=1e3 1700000000001000000\r\n")
    assert write_lines(vn, body)[0] is None
    cpu = I.table_of_series("cpu", {"host": "a b", "dc": "x,y"})
    assert rows_of(vn, cpu) == [{"ts": 1_700_000_000_000, "host": "a b", "dc": "x,y",
                                 "usage": 0.5, "n": -3, "u": 7, "ok": True, "no": False,
                                 "s": 'say "hi" \\ \\n'}]
    assert rows_of(vn, "mem") == [{"ts": 1_700_000_000_001, "free": 1000.0}]
    assert vn.schemas[cpu] == {"host": "str", "dc": "str", "usage": "float", "n": "int",
                               "u": "int", "ok": "bool", "no": "bool", "s": "str"}


@pytest.mark.parametrize("unit,raw,want", [
    (NS, 1_700_000_000_123_999_999, 1_700_000_000_123), (US, 1_700_000_000_123_999, 1_700_000_000_123),
    (MS, 5, 5), (S, 5, 5000), (I.UNIT_CODES["m"], 2, 120_000), (I.UNIT_CODES["h"], 1, 3_600_000),
    (NS, -1, -1), (US, -1500, -2)])
def test_timestamps_convert_to_the_vnode_precision_rounding_down(tmp_path, unit, raw, want):
    v = Vnode(str(tmp_path / "p"), VnodeConfig(ts_min=-10**15))
    try:
        assert write_lines(v, b"t f=1 %d" % raw, unit)[0] is None
        assert [r["ts"] for r in rows_of(v, "t")] == [want]
    finally:
        v.close()


def test_a_line_without_timestamp_gets_the_masters_clock_and_replicas_agree(vn, replica):
    import time
    before = time.time_ns() // 1_000_000
    reason, _, payload = write_lines(vn, b"t f=1\n")
    assert reason is None
    assert replica.write_to_cache(1, 1, payload)
    [row] = rows_of(replica, "t")
    assert before <= row["ts"] <= time.time_ns() // 1_000_000
    assert rows_of(vn, "t") == [row]


def test_the_payload_decodes_into_the_same_rows_on_another_replica(vn, replica):
    body = b"".join(b'm%d,h=%d a=%di,b=%d.5,c="%s",d=%s %d\n'
                    % (i % 3, i % 5, i, i, b"x" * (i % 7), b"t" if i % 2 else b"f", i)
                    for i in range(300))
    reason, _, payload = write_lines(vn, body, MS)
    assert reason is None and payload[3] == 5
    assert replica.write_to_cache(1, 1, payload)
    for t in vn.schemas:
        assert rows_of(vn, t) == rows_of(replica, t)
    assert sum(len(rows_of(vn, t)) for t in vn.schemas) == 300
    assert len(I.decode_rows(payload)) == 300


# -- line protocol: refusals ----------------------------------------------------------------

@pytest.mark.parametrize("body,line,what", [
    (b"ok f=1 1\ncpu\\", 2, "bad escape"),
    (b"ok f=1 1\nbad f=1,f=2 2\n", 2, "duplicate field 'f'"),
    (b"ok f=1i 1\nok f=1.5 2\n", 2, "is int, got float"),
    (b"ok f=1 1\nok f=\"x\" 2\n", 2, "is float, got str"),
    (b"a f=1 1\nb f=1 2\nc f=", 3, "missing value"),
    (b"a f=1 1\nb f=\"abc", 2, "unterminated string"),
    (b"a f=1 1\n\nb", 3, "missing fields"),
    (b"a,t=1 t=2 1", 1, "both a tag and a field"),
    (b"a,t=1,t=2 f=1 1", 1, "duplicate tag"),
    (b"a,t= f=1 1", 1, "missing tag value"),
    (b"a f=18446744073709551615u 1", 1, "unsigned"),
    (b"a f=9223372036854775808i 1", 1, "int64"),
    (b"a f=nan 1", 1, "not a number"),
    (b"a f=1 12x", 1, "invalid timestamp"),
    (b"a f=1 1 2", 1, "after the timestamp"),
    (b"a my-field=1 1", 1, "does not match"),
    (b"a,bad-tag=1 f=1 1", 1, "tag key"),
    (b"a f=1 -1", 1, "outside"),
    (b"a f=\"\xff\" 1", 1, "not UTF-8"),
    (b"\n# only comments\n", 1, "no points"),
])
def test_a_bad_line_refuses_the_whole_request_naming_its_line(vn, body, line, what):
    reason, got_line, payload = write_lines(vn, body)
    assert reason is not None and what in reason, reason
    assert got_line == line and reason.startswith(f"line {line}: unable to parse "), reason
    assert "\n" not in reason and payload == b""
    assert vn.schemas == {} and vn.get_version() == 0          # nothing half-applied


def test_line_and_batch_limits(tmp_path):
    v = Vnode(str(tmp_path / "l"), VnodeConfig(max_rows_per_batch=2, max_columns_per_table=2))
    try:
        assert "max_line_bytes 10" in write_lines(v, b"a f=1 1\na f=12345678 2", max_line=10)[0]
        assert "max_rows_per_batch" in write_lines(v, b"a f=1 1\na f=1 2\na f=1 3")[0]
        assert "max_columns_per_table" in write_lines(v, b"a f=1,g=1,h=1 1")[0]
    finally:
        v.close()


def test_a_replica_refuses_a_payload_that_conflicts_with_its_schema(vn, replica):
    reason, _, payload = write_lines(vn, b"t f=1i 1")
    assert reason is None
    replica.apply_local(1, 1, [["t", 0, {"f": "text"}]])
    with pytest.raises(ApplyError, match="is str, got int"):
        replica.write_to_cache(2, 1, payload)


# -- Arrow -----------------------------------------------------------------------------------

def write_arrow(v: Vnode, data, version: int = 1):
    body = data if isinstance(data, bytes) else arrow_stream(data)
    reason, staged, payload = v.prepare_arrow(body)
    if reason is None:
        v.apply_prepared(version, 1, staged, len(payload))
    return reason, payload


def test_arrow_types_map_to_the_vnode_types(vn, replica):
    b = pa.record_batch({
        "ts": pa.array([1, 2, 3], pa.timestamp("us")),
        "_table": pa.array(["x", "y", "x"]).dictionary_encode(),
        "i8": pa.array([-1, None, 3], pa.int8()), "u32": pa.array([1, 2, 3], pa.uint32()),
        "f32": pa.array([0.5, 1.5, None], pa.float32()), "b": pa.array([True, None, False]),
        "s": pa.array(["é", "", None], pa.large_string()),
        "d": pa.array(["p", "q", "p"]).dictionary_encode(), "n": pa.array([None] * 3, pa.null())})
    reason, payload = write_arrow(vn, b)
    assert reason is None and payload[3] == 4
    assert rows_of(vn, "x") == [{"ts": 0, "i8": -1, "u32": 1, "f32": 0.5, "b": True, "s": "é",
                                 "d": "p"},
                                {"ts": 0, "i8": 3, "u32": 3, "f32": None, "b": False, "s": None,
                                 "d": "p"}][1:]     # ts 1 and 3 us are both 0 ms: the later wins
    # (a column only ever null in a table has no type there, and is not a column of it)
    assert rows_of(vn, "y") == [{"ts": 0, "u32": 2, "f32": 1.5, "s": "", "d": "q"}]
    assert vn.schemas["x"] == {"i8": "int", "u32": "int", "f32": "float", "b": "bool",
                               "s": "str", "d": "str"}
    assert replica.write_to_cache(1, 1, payload)
    assert rows_of(replica, "x") == rows_of(vn, "x") and rows_of(replica, "y") == rows_of(vn, "y")


def _stream(cols: dict, metadata=None, compression=None) -> bytes:
    b = pa.record_batch(cols, metadata=metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, b.schema,
                           options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_batch(b)
    return sink.getvalue().to_pybytes()


def _file(cols: dict, metadata=None) -> bytes:
    """The Arrow IPC *file* format of one batch (not a stream)."""
    b = pa.record_batch(cols, metadata=metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, b.schema) as w:
        w.write_batch(b)
    return sink.getvalue().to_pybytes()


T = {"vrepl.table": "t"}


@pytest.mark.parametrize("body,what", [
    (_stream({"ts": pa.array([1]), "v": pa.array([1])}), "no table"),
    (_stream({"v": pa.array([1])}, T), "no 'ts' column"),
    (_stream({"ts": pa.array([1.5]), "v": pa.array([1])}, T), "column 'ts' has type double"),
    (_stream({"ts": pa.array([1]), "v": pa.array([[1]])}, T), "has type list"),
    (_stream({"ts": pa.array([1]), "_v": pa.array([1])}, T), "does not match"),
    (_stream({"ts": pa.array([1])}, T), "no value column"),
    (_stream({"ts": pa.array([1]), "v": pa.array([1])}, {"vrepl.table": "a/b"}), "does not match"),
    (_stream({"ts": pa.array([1]), "_table": pa.array(["t"]), "v": pa.array([1])}, T), "both"),
    (_stream({"ts": pa.array([None, 1], pa.int64()), "v": pa.array([1, 2])}, T), "'ts' has nulls"),
    (_stream({"ts": pa.array([1]), "v": pa.array([math.nan])}, T), "not finite"),
    (_stream({"ts": pa.array([1]), "v": pa.array([2**64 - 1], pa.uint64())}, T), "uint64"),
    (_stream({"ts": pa.array([1]), "v": pa.array([1])}, T, "zstd"),
     "Arrow stream refused: compressed"),
    # Truncated or malformed: "not a valid Arrow IPC stream" (docs/client-api.md §Binary
    # writes), the file format too.
    (_stream({"ts": pa.array([1]), "v": pa.array([1])}, T)[:-9],
     "not a valid Arrow IPC stream: message body"),
    (_stream({"ts": pa.array([1]), "v": pa.array([1])}, T)[:-1] + b"\x01",
     "not a valid Arrow IPC stream: message metadata"),
    (b"", "not a valid Arrow IPC stream: no schema message"),
    (b"\xff" * 64, "not a valid Arrow IPC stream"),
    (_file({"ts": pa.array([1]), "v": pa.array([1])}, T), "not a valid Arrow IPC stream"),
])
def test_arrow_refusals_are_one_line_and_write_nothing(vn, body, what):
    reason, payload = write_arrow(vn, body)
    assert reason is not None and what in reason, reason
    assert "\n" not in reason and payload == b"" and vn.schemas == {}


def test_hostile_arrow_shapes_are_refused_before_they_are_read(vn):
    """Counts the sender chooses are bounded: messages, columns, and a batch whose declared
    row count its buffers do not hold (refused by validation, nothing allocated for it)."""
    b = pa.record_batch({"ts": pa.array([1], pa.int64()), "v": pa.array([1])}, metadata=T)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, b.schema) as w:
        for _ in range(I.ARROW_MAX_MESSAGES + 1):
            w.write_batch(b)
    assert "more than 1024 messages" in write_arrow(vn, sink.getvalue().to_pybytes())[0]
    wide = {"ts": pa.array([1], pa.int64()), **{f"c{i}": pa.array([i]) for i in range(1030)}}
    assert "above 1026" in write_arrow(vn, _stream(wide, T))[0]
    body = bytearray(_stream({"ts": pa.array([7], pa.int64()), "v": pa.array([9])}, T))
    one = (1).to_bytes(8, "little")                   # the batch's row counts: 1 row
    at = body.find(one, body.rfind(b"\xff\xff\xff\xff", 0, len(body) - 8))  # in the batch
    while at >= 0:
        body[at:at + 8] = (2**40).to_bytes(8, "little")
        at = body.find(one, at)
    reason = write_arrow(vn, bytes(body))[0]
    assert reason is not None and "\n" not in reason, reason
    assert vn.schemas == {} and vn.get_version() == 0


def test_arrow_row_limit_counts_every_batch(tmp_path):
    v = Vnode(str(tmp_path / "r"), VnodeConfig(max_rows_per_batch=3))
    try:
        b = pa.record_batch({"ts": pa.array([1, 2], pa.int64()), "v": pa.array([1, 2])},
                            metadata=T)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, b.schema) as w:
            w.write_batch(b)
            w.write_batch(b)
        assert "more than 3 rows" in write_arrow(v, sink.getvalue().to_pybytes())[0]
    finally:
        v.close()


def test_rows_to_arrow_maps_rows_one_to_one_or_leaves_them_to_json():
    body = rows_to_arrow([["a", 1, {"v": 1, "s": "x"}], ["b", 2, {"v": None, "f": 1.5}]])
    t = pa.ipc.open_stream(body).read_all()
    assert t.column_names == ["ts", "_table", "v", "s", "f"]
    assert t.column("v").to_pylist() == [1, None] and t.column("f").type == pa.float64()
    for rows in ([["a", 1, {"v": 1}], ["a", 2, {"v": 1.5}]], [["a", 1.5, {"v": 1}]],
                 [["a", 1, {}]], [["a", 1, {"v": [1]}]], [["a", 1, {"v": 2**70}]], []):
        assert rows_to_arrow(rows) is None, rows
