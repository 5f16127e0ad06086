"""Rows of a write request: validation with a one-line reason, and the WAL payload codec.

Owns: the row model (table, ts, value columns), the name and type rules, the per-batch
limits, schema inference (a column's type is fixed by its first non-null value), and the
encoding of a batch into one WAL record payload (docs/vnode.md §payload). Must not: touch
files or the memtable, or raise for bad client input (it returns a reason instead).

A row is a 3-sequence `(table, ts, values)`: `table` a name, `ts` an int64 in the vnode's
precision (ms or us since the epoch), `values` a non-empty dict of column name -> int,
float, str, bool or None (null).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable, Mapping, Sequence

# The name rules and type names are vrepl/names.py's; imported here also for the callers
# that take them from this module (TYPE_NAMES: vrepl/node/shipsession.py).
from vrepl.names import (COLUMN_NAME_RE, COLUMN_NAME_RULE, RESERVED_COLUMNS, TABLE_NAME_RE,
                         TABLE_NAME_RULE, TYPE_BOOL, TYPE_FLOAT, TYPE_INT, TYPE_NAMES, TYPE_STR)
from vrepl.vnode.config import VnodeConfig
from vrepl.vnode.errors import PayloadError

INT64_MIN = -2**63
INT64_MAX = 2**63 - 1

VALUE_TYPES = {int: TYPE_INT, float: TYPE_FLOAT, str: TYPE_STR, bool: TYPE_BOOL}

# Estimated sizes: what a row costs in the memtable and the payload, close enough for limits.
ROW_OVERHEAD_BYTES = 16
VALUE_FIXED_BYTES = 8

PAYLOAD_MAGIC = b"VRB"
PAYLOAD_FORMAT = 1
PAYLOAD_HEADER = PAYLOAD_MAGIC + bytes([PAYLOAD_FORMAT])
# Format 2 carries the client's request id (docs/vnode.md §payload): "VRB" 0x02, one byte n,
# n bytes of id, then the same JSON body. The id travels with the record so that every
# replica, and a node replaying its WAL, can dedup a retried request (docs/client-api.md).
PAYLOAD_FORMAT_RID = 2
PAYLOAD_HEADER_RID = PAYLOAD_MAGIC + bytes([PAYLOAD_FORMAT_RID])
# Format 3 is a no-op: exactly "VRB" 0x03, no rows (docs/vnode.md §2). A node that becomes
# master forwards one at once: the group commits the records a master inherited from older
# epochs only together with a record of the master's own epoch (Raft's rule), so without it
# they would stay uncommitted, and unarchivable, until the next client write.
PAYLOAD_FORMAT_NOOP = 3
NOOP_PAYLOAD = PAYLOAD_MAGIC + bytes([PAYLOAD_FORMAT_NOOP])
# Format 8 names a round of ingested files, not rows (docs/vnode.md §9.2): "VRB" 0x08 + a
# JSON object; vrepl/vnode/staging.py owns its layout and decoding.
PAYLOAD_FORMAT_FILES = 8
# Formats 4 (an Arrow IPC stream) and 5 (InfluxDB line protocol) carry the client's bytes
# too, after "VRB", the format, u8 n and n bytes of request id (n may be 0) and their own
# header fields; vrepl/vnode/ingest.py owns their layout and decoding (docs/vnode.md §2).
PAYLOAD_FORMAT_ARROW = 4
PAYLOAD_FORMAT_LINES = 5
RID_FORMATS = frozenset({PAYLOAD_FORMAT_RID, PAYLOAD_FORMAT_ARROW, PAYLOAD_FORMAT_LINES})
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
REQUEST_ID_RULE = "[A-Za-z0-9_.:-]{1,64}"

Row = Sequence[Any]            # (table, ts, values)
Schemas = Mapping[str, Mapping[str, str]]   # table -> column -> type name

_DEFAULT_CONFIG = VnodeConfig()

try:
    from vrepl._core.rows import fast_check as _fast_check
except ImportError:   # not built (a source checkout without the extension): Python only
    _fast_check = None
from vrepl._core.memcols import Staged, parse_batch


def loads_json(data: bytes | bytearray | memoryview) -> Any:
    """The JSON value of UTF-8 bytes (UnicodeDecodeError, RecursionError or ValueError).

    The standard module on purpose: orjson parses these bodies ~1.7x faster but turns an
    integer beyond 64 bits into a float, which would let a bad ts or int column through as
    a float instead of refusing it (docs/perf.md).
    """
    return json.loads(str(data, "utf-8"))


def _short(x: Any, limit: int = 40) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def _value_reason(col: str, v: Any) -> tuple[str | None, str | None, int]:
    """(reason, type name or None for null, estimated bytes) of one value."""
    t = type(v)
    if t is int:
        if not INT64_MIN <= v <= INT64_MAX:
            return f"column {col!r}: int {_short(v)} is outside int64", None, 0
        return None, TYPE_INT, VALUE_FIXED_BYTES
    if t is float:
        if not math.isfinite(v):
            return f"column {col!r}: float {v!r} is not finite", None, 0
        return None, TYPE_FLOAT, VALUE_FIXED_BYTES
    if t is str:
        try:
            n = len(v.encode("utf-8"))
        except UnicodeEncodeError:
            return f"column {col!r}: string is not valid UTF-8 (lone surrogate)", None, 0
        return None, TYPE_STR, n
    if t is bool:
        return None, TYPE_BOOL, 1
    if v is None:
        return None, None, 0
    return (f"column {col!r}: value of type {t.__name__} is not int, float, str, bool"
            f" or null", None, 0)


def type_accepts(column_type: str, value_type: str) -> bool:
    """Whether a column of column_type takes a value of value_type (ints widen to float)."""
    return column_type == value_type or (column_type == TYPE_FLOAT and value_type == TYPE_INT)


def check_rows(rows: Any, cfg: VnodeConfig | None = _DEFAULT_CONFIG,
               schemas: Schemas | None = None, table_count: int | None = None
               ) -> tuple[str | None, dict[str, dict[str, str]], int]:
    """Validate a batch: (reason or None, new columns per table, estimated bytes).

    The Cython fast path (vrepl/_core/rows.pyx) decides good batches; a batch it does not
    accept goes through check_rows_py, whose reason is the answer (one source of reasons).
    """
    if _fast_check is not None:
        if cfg is None:
            ok = _fast_check(rows, schemas, False, INT64_MIN, INT64_MAX, 0, 0, 0, 0, 0, None)
        else:
            ok = _fast_check(rows, schemas, True, cfg.ts_lo, cfg.ts_hi, cfg.max_rows_per_batch,
                             cfg.max_row_bytes, cfg.max_batch_bytes, cfg.max_columns_per_table,
                             cfg.max_tables, table_count)
        if ok is not None:
            return None, ok[0], ok[1]
    return check_rows_py(rows, cfg, schemas, table_count)


def parse_staged(body: bytes | memoryview, cfg: VnodeConfig | None = _DEFAULT_CONFIG,
                 schemas: Schemas | None = None, table_count: int | None = None
                 ) -> Staged | None:
    """A JSON body of rows parsed straight into typed columns (vrepl/_core/memcols.pyx), or
    None when the fast parser is not sure: then json.loads + check_rows decide (and give the
    reason). A Staged batch is one check_rows would accept with the same new columns
    (`.added`) and estimated bytes (`.nbytes`)."""
    if cfg is None:
        return parse_batch(body, schemas, False, INT64_MIN, INT64_MAX, 0, 0, 0, 0, 0, None)
    return parse_batch(body, schemas, True, cfg.ts_lo, cfg.ts_hi, cfg.max_rows_per_batch,
                       cfg.max_row_bytes, cfg.max_batch_bytes, cfg.max_columns_per_table,
                       cfg.max_tables, table_count)


def check_rows_py(rows: Any, cfg: VnodeConfig | None = _DEFAULT_CONFIG,
                  schemas: Schemas | None = None, table_count: int | None = None
                  ) -> tuple[str | None, dict[str, dict[str, str]], int]:
    """check_rows in plain Python: the reference, and the source of every refusal reason.

    With cfg None only the shape is checked (names, types, ts within int64), as for a
    payload read back from the WAL; with a config the limits apply too. `schemas` are the
    tables' known column types; the returned additions are columns this batch would add
    (types inferred from their first non-null value), checked for consistency within the
    batch as well.
    """
    added: dict[str, dict[str, str]] = {}
    schemas = schemas or {}
    if not isinstance(rows, (list, tuple)):
        return f"rows must be a list, got {type(rows).__name__}", added, 0
    if not rows:
        return "no rows", added, 0
    if cfg is not None and len(rows) > cfg.max_rows_per_batch:
        return (f"{len(rows)} rows in one batch, above max_rows_per_batch"
                f" {cfg.max_rows_per_batch}"), added, 0
    ts_lo, ts_hi = (cfg.ts_lo, cfg.ts_hi) if cfg is not None else (INT64_MIN, INT64_MAX)
    total = 0
    new_tables = 0
    ok_tables: set[str] = set()    # names already checked in this batch: skip the regex
    ok_cols: set[str] = set()
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 3:
            return f"row {i}: not a (table, ts, values) triple: {_short(row)}", added, 0
        table, ts, values = row
        if type(table) is not str or table not in ok_tables:
            if type(table) is not str or TABLE_NAME_RE.fullmatch(table) is None:
                return (f"row {i}: table name {_short(table)} does not match"
                        f" {TABLE_NAME_RULE} (no path characters)"), added, 0
            ok_tables.add(table)
        if type(ts) is not int:
            return f"row {i}: ts {_short(ts)} is not an int", added, 0
        if not ts_lo <= ts <= ts_hi:
            return f"row {i}: ts {ts} is outside [{ts_lo}, {ts_hi}]", added, 0
        if not isinstance(values, dict):
            return f"row {i}: values must be a dict of columns, got {_short(values)}", added, 0
        if not values:
            return f"row {i}: no value columns", added, 0
        known = schemas.get(table)
        new_cols = added.get(table)
        if known is None:
            known = {}
            if new_cols is None:
                new_tables += 1
                if (cfg is not None and table_count is not None
                        and table_count + new_tables > cfg.max_tables):
                    return (f"row {i}: table {table!r} would exceed max_tables"
                            f" {cfg.max_tables}"), added, 0
                new_cols = added[table] = {}
        size = ROW_OVERHEAD_BYTES + len(table)
        for col, v in values.items():
            if col not in ok_cols:
                if type(col) is not str or COLUMN_NAME_RE.fullmatch(col) is None \
                        or col in RESERVED_COLUMNS:
                    return (f"row {i}: column name {_short(col)} does not match"
                            f" {COLUMN_NAME_RULE}"), added, 0
                ok_cols.add(col)
            reason, vtype, n = _value_reason(col, v)
            if reason is not None:
                return f"row {i}: {reason}", added, 0
            size += len(col) + n
            if vtype is None:
                continue
            ctype = known.get(col)
            if ctype is None and new_cols is not None:
                ctype = new_cols.get(col)
            if ctype is None:
                if new_cols is None:
                    new_cols = added[table] = {}
                if cfg is not None and len(known) + len(new_cols) + 1 > cfg.max_columns_per_table:
                    return (f"row {i}: table {table!r} would have more than"
                            f" max_columns_per_table {cfg.max_columns_per_table} columns"), added, 0
                new_cols[col] = vtype
            elif not type_accepts(ctype, vtype):
                return (f"row {i}: column {col!r} of table {table!r} is {ctype},"
                        f" got {vtype} (a column's type cannot change)"), added, 0
        if cfg is not None and size > cfg.max_row_bytes:
            return (f"row {i}: about {size} bytes, above max_row_bytes"
                    f" {cfg.max_row_bytes}"), added, 0
        total += size
        if cfg is not None and total > cfg.max_batch_bytes:
            return (f"batch is above max_batch_bytes {cfg.max_batch_bytes}"
                    f" (at row {i})"), added, 0
    return None, added, total


def rows_invalid(rows: Any, cfg: VnodeConfig | None = _DEFAULT_CONFIG,
                 schemas: Schemas | None = None) -> str | None:
    """Why a batch of rows is refused, or None (see check_rows)."""
    return check_rows(rows, cfg, schemas)[0]


def row_bytes(row: Row) -> int:
    """Estimated size of one (valid) row, as counted against the limits."""
    table, _, values = row
    n = ROW_OVERHEAD_BYTES + len(table)
    for col, v in values.items():
        n += len(col)
        if type(v) is str:
            n += len(v)
        elif v is not None:
            n += VALUE_FIXED_BYTES
    return n


# ---------------------------------------------------------------------------------------------
# Payload codec (docs/vnode.md §payload): "VRB" + format byte 1 + UTF-8 JSON array of
# [table, ts, {column: value}] rows. JSON is parsed and written by CPython's C code, which
# beats any per-value struct packing in Python, keeps int/float/bool/null apart, and needs
# no schema to decode. The WAL record around it carries the checksum.

def encode_rows(rows: Iterable[Row]) -> bytes:
    """The WAL payload of a (validated) batch."""
    body = json.dumps(rows if isinstance(rows, (list, tuple)) else list(rows),
                      ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return PAYLOAD_HEADER + body.encode("utf-8")


def encode_payload(body: bytes, request_id: str | None = None) -> bytes:
    """The WAL payload of a batch whose JSON body is already encoded (the client's bytes,
    checked by the caller to be UTF-8 JSON of valid rows), with an optional request id."""
    if request_id is None:
        return PAYLOAD_HEADER + body
    rid = request_id.encode("ascii")
    return PAYLOAD_HEADER_RID + bytes([len(rid)]) + rid + body


def body_offset(payload: bytes | memoryview) -> int:
    """Where the JSON body of a payload with a valid header starts."""
    if payload[3] == PAYLOAD_FORMAT_RID:
        return len(PAYLOAD_HEADER_RID) + 1 + payload[4]
    return len(PAYLOAD_HEADER)


def payload_request_id(payload: bytes | memoryview) -> str | None:
    """The request id a payload carries (formats 2, 4, 5), or None."""
    if len(payload) > 5 and payload[3] in RID_FORMATS and payload[4] \
            and bytes(payload[:3]) == PAYLOAD_MAGIC:
        return bytes(payload[5:5 + payload[4]]).decode("ascii", "replace")
    return None


def is_noop(payload: bytes | memoryview) -> bool:
    """Whether a payload is the no-op record (format 3: the 4-byte header alone)."""
    return len(payload) == len(NOOP_PAYLOAD) and bytes(payload) == NOOP_PAYLOAD


def payload_invalid_header(payload: bytes | memoryview) -> str | None:
    if len(payload) < len(PAYLOAD_HEADER):
        return f"{len(payload)} bytes, shorter than the {len(PAYLOAD_HEADER)}-byte header"
    if bytes(payload[:3]) != PAYLOAD_MAGIC:
        return f"does not start with {PAYLOAD_MAGIC!r} (not a vrepl row batch)"
    if payload[3] == PAYLOAD_FORMAT_RID:
        if len(payload) < 5 or len(payload) < 5 + payload[4]:
            return f"{len(payload)} bytes, shorter than its request id header"
        rid = bytes(payload[5:5 + payload[4]]).decode("ascii", "replace")
        if REQUEST_ID_RE.fullmatch(rid) is None:
            return f"request id {rid!r} does not match {REQUEST_ID_RULE}"
        return None
    if payload[3] == PAYLOAD_FORMAT_NOOP:
        if len(payload) != len(NOOP_PAYLOAD):
            return (f"a no-op payload (format {PAYLOAD_FORMAT_NOOP}) with"
                    f" {len(payload) - len(NOOP_PAYLOAD)} bytes after its header (it has none)")
        return None
    if payload[3] == PAYLOAD_FORMAT_FILES:
        return (f"format {PAYLOAD_FORMAT_FILES} names a round of ingested files, not rows"
                " (vrepl.vnode.staging decodes it)")
    if payload[3] in (PAYLOAD_FORMAT_ARROW, PAYLOAD_FORMAT_LINES):
        return None             # vrepl/vnode/ingest.py checks the rest of its header
    if payload[3] != PAYLOAD_FORMAT:
        return (f"unknown payload format {payload[3]} (this vnode reads {PAYLOAD_FORMAT} to"
                f" {PAYLOAD_FORMAT_LINES})")
    return None


def is_json_payload(payload: bytes | memoryview) -> bool:
    """Whether a payload (with a valid header) holds a JSON body (formats 1 and 2)."""
    return payload[3] in (PAYLOAD_FORMAT, PAYLOAD_FORMAT_RID)


def decode_staged(payload: bytes | memoryview, max_payload_bytes: int | None = None,
                  schemas: Schemas | None = None) -> Staged | None:
    """decode_checked's fast path: the Staged rows of a well-formed payload that agrees with
    `schemas`, or None (then decode_checked decides, and explains)."""
    if payload_invalid_header(payload) is not None or not is_json_payload(payload):
        return None
    if max_payload_bytes is not None and len(payload) > max_payload_bytes:
        return None
    return parse_staged(memoryview(payload)[body_offset(payload):], None, schemas)


def decode_rows(payload: bytes | memoryview, version: int | None = None,
                max_payload_bytes: int | None = None) -> list[list[Any]]:
    """Rows of a payload; PayloadError (naming the version if given) when malformed.

    Checks the shape of every row (names, value types, ts an int64, one type per column
    within the batch), not the limits or the table schemas: those belong to the vnode
    applying it.
    """
    return decode_checked(payload, version, max_payload_bytes)[0]


def decode_checked(payload: bytes | memoryview, version: int | None = None,
                   max_payload_bytes: int | None = None, schemas: Schemas | None = None
                   ) -> tuple[list[list[Any]], dict[str, dict[str, str]], str | None]:
    """(rows, new columns, schema conflict or None) of a payload, in one pass over the rows.

    Malformed payloads raise PayloadError. A batch that is well formed but whose types
    conflict with `schemas` is returned with the reason, for the caller to refuse.
    """
    reason = payload_invalid_header(payload)
    if reason is None and max_payload_bytes is not None and len(payload) > max_payload_bytes:
        reason = f"{len(payload)} bytes, above max_payload_bytes {max_payload_bytes}"
    if reason is not None:
        raise PayloadError(reason, version)
    if payload[3] == PAYLOAD_FORMAT_NOOP:
        return [], {}, None
    if not is_json_payload(payload):
        raise PayloadError(f"format {payload[3]} is not a JSON payload: decode it with"
                           " vrepl.vnode.ingest.decode_checked", version)
    try:
        start = body_offset(payload)
        rows = loads_json(memoryview(payload)[start:])
    except UnicodeDecodeError as exc:
        raise PayloadError(f"body is not UTF-8 ({exc.reason} at byte"
                           f" {exc.start + start})", version) from None
    except RecursionError:
        raise PayloadError("body nests too deeply", version) from None
    except ValueError as exc:
        raise PayloadError(f"body is not JSON ({exc})", version) from None
    reason, added, _ = check_rows(rows, None, schemas)
    if reason is not None and schemas:
        # Only on failure: is the batch malformed, or does it just conflict with schemas?
        if check_rows(rows, None)[0] is None:
            return rows, added, reason
    if reason is not None:
        raise PayloadError(reason, version)
    return rows, added, None
