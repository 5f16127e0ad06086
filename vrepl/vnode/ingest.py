"""The binary (Arrow IPC stream) and InfluxDB line-protocol bodies of a write: their rules,
their WAL payloads (formats 4 and 5, docs/vnode.md §2) and their decoding into Staged
batches (vrepl/_core/memcols.pyx: `arrow_to_staged`, `parse_lines`).

Owns: the Arrow schema rules (docs/client-api.md §Binary writes), the stream's limits
(messages, fields, no compressed buffers: a hostile stream is refused before pyarrow
allocates for it), the payload layouts and the timestamp unit codes. Every replica decodes
the same payload bytes with the same units (they travel in the payload), so all get the
same rows. Must not: touch files or the memtable, or raise for bad client input (a reason
is returned instead).
"""
from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

from vrepl._core import memcols as M
from vrepl._core.memcols import Staged, table_of_series  # noqa: F401  (public)
from vrepl.vnode import rows as R
from vrepl.vnode.config import VnodeConfig
from vrepl.vnode.errors import PayloadError, StreamRefused
from vrepl.vnode.rows import (
    COLUMN_NAME_RE,
    COLUMN_NAME_RULE,
    INT64_MAX,
    INT64_MIN,
    PAYLOAD_FORMAT_ARROW,
    PAYLOAD_FORMAT_LINES,
    PAYLOAD_MAGIC,
    REQUEST_ID_RE,
    TABLE_NAME_RE,
    TABLE_NAME_RULE,
)

ARROW_CONTENT_TYPE = "application/vnd.apache.arrow.stream"
# Timestamp units by name (InfluxDB's precision values, v1 and v2) -> the payload's code.
UNIT_CODES = {"ns": M.UNIT_NS, "n": M.UNIT_NS, "us": M.UNIT_US, "u": M.UNIT_US,
              "ms": M.UNIT_MS, "s": M.UNIT_S, "m": M.UNIT_M, "h": M.UNIT_H}
UNIT_NAMES = {M.UNIT_NS: "ns", M.UNIT_US: "us", M.UNIT_MS: "ms", M.UNIT_S: "s",
              M.UNIT_M: "m", M.UNIT_H: "h"}
VNODE_UNIT = {"ms": M.UNIT_MS, "us": M.UNIT_US}
ARROW_TS_UNITS = {"s": M.UNIT_S, "ms": M.UNIT_MS, "us": M.UNIT_US, "ns": M.UNIT_NS}

# Bounds of an Arrow stream, whatever the configuration (a payload read back from the WAL
# is bounded by them too): messages (schema + dictionaries + record batches), fields.
ARROW_MAX_MESSAGES = 1024
ARROW_MAX_FIELDS = 1024 + 2
TABLE_COLUMN = "_table"
TS_COLUMN = "ts"
TABLE_METADATA_KEY = b"vrepl.table"
_DEFAULT = VnodeConfig()
# Schemas already checked, by the bytes of their schema message: a client sends the same one
# again and again (the check is a few Python calls per column).
_SCHEMAS: dict[bytes, _Checked] = {}
SCHEMA_CACHE_MAX = 1024
_I64 = struct.Struct("<q")


# -- payloads ------------------------------------------------------------------------------

def _rid_bytes(request_id: str | None) -> bytes:
    rid = request_id.encode("ascii") if request_id else b""
    return bytes([len(rid)]) + rid


def encode_arrow_payload(body: bytes, request_id: str | None, vunit: int) -> bytes:
    """Format 4: "VRB" 0x04 | u8 n | n bytes of request id | u8 vnode unit | the stream."""
    return PAYLOAD_MAGIC + bytes([PAYLOAD_FORMAT_ARROW]) + _rid_bytes(request_id) \
        + bytes([vunit]) + body


def encode_lines_payload(body: bytes, request_id: str | None, unit: int, vunit: int,
                         default_ts: int) -> bytes:
    """Format 5: "VRB" 0x05 | u8 n | n bytes of request id | u8 unit | u8 vnode unit |
    i64 (little-endian) default ts | the line-protocol bytes."""
    return PAYLOAD_MAGIC + bytes([PAYLOAD_FORMAT_LINES]) + _rid_bytes(request_id) \
        + bytes([unit, vunit]) + _I64.pack(default_ts) + body


def ingest_header_invalid(payload: bytes | memoryview) -> str | None:
    """Why a format-4/5 payload's header is malformed, or None."""
    fmt = payload[3]
    need = 5 + (payload[4] if len(payload) > 4 else 0) + (1 if fmt == PAYLOAD_FORMAT_ARROW else 10)
    if len(payload) < need:
        return f"{len(payload)} bytes, shorter than its format-{fmt} header"
    n = payload[4]
    if n:
        rid = bytes(payload[5:5 + n]).decode("ascii", "replace")
        if REQUEST_ID_RE.fullmatch(rid) is None:
            return f"request id {rid!r} does not match [A-Za-z0-9_.:-]{{1,64}}"
    at = 5 + n
    if fmt == PAYLOAD_FORMAT_LINES:
        if payload[at] >= M.UNIT_COUNT:
            return f"unknown timestamp unit code {payload[at]}"
        at += 1
    if payload[at] not in (M.UNIT_MS, M.UNIT_US):
        return f"unknown vnode precision code {payload[at]}"
    return None


def decode_ingest(payload: bytes | memoryview, schemas: dict | None
                  ) -> tuple[Staged | None, str | None]:
    """(Staged, None) of a well-formed format-4/5 payload, or (None, reason): the shape
    only (no limits), the schemas' column types enforced when given."""
    reason = ingest_header_invalid(payload)
    if reason is not None:
        return None, reason
    view = memoryview(payload)
    at = 5 + payload[4]
    if payload[3] == PAYLOAD_FORMAT_ARROW:
        return arrow_staged(view[at + 1:], None, schemas, None, payload[at])
    unit, vunit = payload[at], payload[at + 1]
    default_ts = _I64.unpack_from(payload, at + 2)[0]
    st, reason, line, _ = lines_staged(view[at + 10:], None, schemas, None, unit, vunit,
                                       default_ts, 0)
    return st, (None if st is not None else f"line {line}: {reason}")


def is_ingest_payload(payload: bytes | memoryview) -> bool:
    return len(payload) > 4 and payload[3] in (PAYLOAD_FORMAT_ARROW, PAYLOAD_FORMAT_LINES) \
        and bytes(payload[:3]) == PAYLOAD_MAGIC


def decode_staged(payload: bytes | memoryview, max_payload_bytes: int | None = None,
                  schemas: dict | None = None) -> Staged | None:
    """The Staged rows of a well-formed payload of any format that agrees with `schemas`, or
    None (then decode_checked decides, and explains). The no-op has none: None."""
    if not is_ingest_payload(payload):
        return R.decode_staged(payload, max_payload_bytes, schemas)
    if max_payload_bytes is not None and len(payload) > max_payload_bytes:
        return None
    return decode_ingest(payload, schemas)[0]


def decode_checked(payload: bytes | memoryview, version: int | None = None,
                   max_payload_bytes: int | None = None, schemas: dict | None = None
                   ) -> tuple[Any, dict[str, dict[str, str]], str | None]:
    """rows.decode_checked for every payload format: (rows, new columns, schema conflict or
    None), PayloadError when malformed. Rows of formats 4 and 5 come as a Staged batch
    (Memtable.apply takes it; staged_rows lists its rows)."""
    if not is_ingest_payload(payload):
        return R.decode_checked(payload, version, max_payload_bytes, schemas)
    if max_payload_bytes is not None and len(payload) > max_payload_bytes:
        raise PayloadError(f"{len(payload)} bytes, above max_payload_bytes {max_payload_bytes}",
                           version)
    st, reason = decode_ingest(payload, schemas)
    if st is not None:
        return st, st.added, None
    if schemas:
        plain, _ = decode_ingest(payload, None)
        if plain is not None:
            return plain, plain.added, reason
    raise PayloadError(str(reason), version)


def decode_rows(payload: bytes | memoryview, version: int | None = None,
                max_payload_bytes: int | None = None) -> list[list[Any]]:
    """rows.decode_rows for every payload format: [table, ts, {column: value}] rows."""
    rows = decode_checked(payload, version, max_payload_bytes)[0]
    return staged_rows(rows) if type(rows) is Staged else rows


def staged_rows(st: Staged) -> list[list[Any]]:
    """The rows of a Staged batch as [table, ts, {column: value}] (nulls left out), table by
    table in the order each was first seen, rows of a table in their order."""
    import numpy as np
    out: list[list[Any]] = []
    for table, log in st.tables.items():
        n = log.n
        ts = log.arrays()[0].tolist()
        idx = np.arange(n, dtype=np.int64)
        cols = [(name, col.py_values(idx, n)) for name, col in log.columns.items()]
        for k in range(n):
            out.append([table, ts[k], {name: vals[k] for name, vals in cols
                                       if vals[k] is not None}])
    return out


# -- line protocol ---------------------------------------------------------------------------

def lines_staged(body: bytes | memoryview, cfg: VnodeConfig | None, schemas: dict | None,
                 table_count: int | None, unit: int, vunit: int, default_ts: int,
                 max_line_bytes: int) -> tuple[Staged | None, str | None, int, int]:
    """parse_lines with a configuration's limits (cfg None: the shape only)."""
    if cfg is None:
        return M.parse_lines(body, schemas, False, INT64_MIN, INT64_MAX, 0, 0, 0, 0, 0, None,
                             unit, vunit, default_ts, max_line_bytes)
    return M.parse_lines(body, schemas, True, cfg.ts_lo, cfg.ts_hi, cfg.max_rows_per_batch,
                         cfg.max_row_bytes, cfg.max_batch_bytes, cfg.max_columns_per_table,
                         cfg.max_tables, table_count, unit, vunit, default_ts, max_line_bytes)


# -- Arrow -----------------------------------------------------------------------------------

def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _field_code(f: pa.Field) -> tuple[int, int, int, bool]:
    """(code, width, offset width, unsigned index) of a value column, or StreamRefused."""
    t = f.type
    if pa.types.is_null(t):
        return M.ARROW_NULL, 0, 0, False
    if pa.types.is_boolean(t):
        return M.ARROW_BOOL, 0, 0, False
    if pa.types.is_integer(t):
        return (M.ARROW_INT if pa.types.is_signed_integer(t) else M.ARROW_UINT,
                t.bit_width // 8, 0, False)
    if pa.types.is_float32(t) or pa.types.is_float64(t):
        return M.ARROW_FLOAT, t.bit_width // 8, 0, False
    if _is_string(t):
        return M.ARROW_STR, 0, 8 if pa.types.is_large_string(t) else 4, False
    if pa.types.is_dictionary(t) and _is_string(t.value_type) \
            and pa.types.is_integer(t.index_type):
        return (M.ARROW_DICT, t.index_type.bit_width // 8,
                8 if pa.types.is_large_string(t.value_type) else 4,
                not pa.types.is_signed_integer(t.index_type))
    raise StreamRefused(f"column {f.name!r} has type {t}: value columns are int8-64, uint8-64,"
                   " float32/64, bool, string, large_string, dictionary of strings or null")


def _check_schema(schema: pa.Schema) -> tuple[str | None, list[tuple[str, tuple]]]:
    """(the table from the metadata or None, [(value column name, code tuple)])."""
    if len(schema) > ARROW_MAX_FIELDS:
        raise StreamRefused(f"{len(schema)} columns, above {ARROW_MAX_FIELDS}")
    names = schema.names
    if len(set(names)) != len(names):
        raise StreamRefused("a column name appears twice")
    meta = schema.metadata or {}
    table = meta.get(TABLE_METADATA_KEY)
    if TS_COLUMN not in names:
        raise StreamRefused("no 'ts' column")
    ts_type = schema.field(TS_COLUMN).type
    if not (pa.types.is_int64(ts_type) or pa.types.is_timestamp(ts_type)):
        raise StreamRefused(f"column 'ts' has type {ts_type}: int64 (in the vnode's precision) or"
                       " timestamp")
    if TABLE_COLUMN in names:
        if table is not None:
            raise StreamRefused("both a '_table' column and 'vrepl.table' metadata")
        t = schema.field(TABLE_COLUMN).type
        if not (_is_string(t) or (pa.types.is_dictionary(t) and _is_string(t.value_type)
                                  and pa.types.is_integer(t.index_type))):
            raise StreamRefused(f"column '_table' has type {t}: string or dictionary of strings")
        table_name = None
    elif table is None:
        raise StreamRefused("no table: a '_table' column or 'vrepl.table' schema metadata")
    else:
        try:
            table_name = table.decode("utf-8")
        except UnicodeDecodeError:
            raise StreamRefused("'vrepl.table' metadata is not UTF-8") from None
        if TABLE_NAME_RE.fullmatch(table_name) is None:
            raise StreamRefused(f"table name {table_name[:80]!r} does not match {TABLE_NAME_RULE}")
    values = []
    for f in schema:
        if f.name in (TS_COLUMN, TABLE_COLUMN):
            continue
        if COLUMN_NAME_RE.fullmatch(f.name) is None:
            raise StreamRefused(f"column name {f.name[:80]!r} does not match {COLUMN_NAME_RULE}")
        values.append((f.name, _field_code(f)))
    if not values:
        raise StreamRefused("no value column")
    return table_name, values


class _Checked:
    """A schema that passed _check_schema: the pyarrow Schema, the table (or None: a
    `_table` column), the ts column's unit code (-1: int64), the layout export_columns
    takes (every column in order), and whether dictionaries make the stream reader needed."""

    __slots__ = ("dicts", "layout", "schema", "table", "table_index", "ts_index", "ts_unit")

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.table, values = _check_schema(schema)
        codes = dict(values)
        ts_type = schema.field(TS_COLUMN).type
        self.ts_unit = ARROW_TS_UNITS[ts_type.unit] if pa.types.is_timestamp(ts_type) else -1
        self.layout = []
        for f in schema:
            if f.name == TS_COLUMN:
                code: tuple = (M.ARROW_INT, 8, 0, False)
            elif f.name == TABLE_COLUMN:
                code = _field_code(pa.field(TABLE_COLUMN, f.type))
            else:
                code = codes[f.name]
            self.layout.append((f.name, code))
        self.dicts = any(pa.types.is_dictionary(f.type) for f in schema)
        self.ts_index = schema.get_field_index(TS_COLUMN)
        self.table_index = schema.get_field_index(TABLE_COLUMN)


# ipc_scan's refusals of a stream that is well framed but refused by this node's rules
# (vrepl/_core/arrowin.pxi); every other reason of ipc_scan is a stream that is not one
# (truncated, malformed metadata, out of order): "not a valid Arrow IPC stream".
_SCAN_RULE_REFUSALS = ("more than ", "compressed buffers ")


def read_arrow(body: bytes | memoryview, vunit: int, max_rows: int) -> list[tuple]:
    """The batches arrow_to_staged takes, from an IPC stream; StreamRefused with the reason
    for a stream this node refuses, ValueError for one that is no valid stream."""
    reason, schema_meta, msgs = M.ipc_scan(body, ARROW_MAX_MESSAGES)
    if reason is not None or schema_meta is None or msgs is None:
        reason = reason or "no schema message"
        if reason.startswith(_SCAN_RULE_REFUSALS):
            raise StreamRefused(reason)
        raise ValueError(reason)
    buf = pa.py_buffer(body)
    checked = _SCHEMAS.get(schema_meta)
    if checked is None:
        _, start, end = msgs[0]
        checked = _Checked(pa.ipc.read_schema(buf.slice(start, end - start)))
        if len(_SCHEMAS) >= SCHEMA_CACHE_MAX:
            _SCHEMAS.clear()
        _SCHEMAS[schema_meta] = checked
    if checked.dicts:      # the stream reader keeps the dictionaries
        batches = list(pa.ipc.open_stream(buf))
    else:
        batches = [pa.ipc.read_record_batch(buf.slice(start, end - start), checked.schema)
                   for kind, start, end in msgs if kind == 3]
    unit = -1 if checked.ts_unit == vunit else checked.ts_unit
    out = []
    rows = 0
    for batch in batches:
        batch.validate(full=True)
        rows += batch.num_rows
        if rows > max_rows:
            raise StreamRefused(f"more than {max_rows} rows")
        if batch.num_rows == 0:
            continue
        cols = M.export_columns(batch, checked.layout)
        ts = cols[checked.ts_index]
        if ts.validity:
            raise StreamRefused("column 'ts' has nulls")
        if checked.table is None:
            table: Any = cols[checked.table_index]
            if table.validity:
                raise StreamRefused("column '_table' has nulls")
        else:
            table = checked.table
        values = [c for c in cols if c.name not in (TS_COLUMN, TABLE_COLUMN)]
        out.append((batch.num_rows, table, ts, unit, values))
    return out


def arrow_staged(body: bytes | memoryview, cfg: VnodeConfig | None, schemas: dict | None,
                 table_count: int | None, vunit: int) -> tuple[Staged | None, str | None]:
    """(Staged, None) of an Arrow IPC stream body, or (None, one-line reason). cfg None:
    the shape only (a payload read back from the WAL)."""
    max_rows = cfg.max_rows_per_batch if cfg is not None else M.ARROW_DECODE_MAX_ROWS
    try:
        batches = read_arrow(body, vunit, max_rows)
    except StreamRefused as exc:
        return None, f"Arrow stream refused: {exc}"
    except (pa.ArrowException, OSError, ValueError, TypeError, OverflowError, MemoryError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        return None, f"not a valid Arrow IPC stream: {first}"
    if cfg is None:
        return M.arrow_to_staged(batches, schemas, False, INT64_MIN, INT64_MAX, 0, 0, 0, 0, 0,
                                 None, vunit)
    return M.arrow_to_staged(batches, schemas, True, cfg.ts_lo, cfg.ts_hi,
                             cfg.max_rows_per_batch, cfg.max_row_bytes, cfg.max_batch_bytes,
                             cfg.max_columns_per_table, cfg.max_tables, table_count, vunit)
