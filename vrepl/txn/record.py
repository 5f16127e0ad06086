"""Payload format 9: one step of a transaction as a WAL record (docs/transactions.md §3).

Owns: encoding and decoding the record, and the shape rules of its fields (a one-line reason
for anything else). The rows of a "rows" record are carried as they are (a JSON array of
[table, ts, {column: value}]); checking them against the schemas is the vnode's business.
Must not: do I/O or know about the vnode, the node or the state machine.

    format 9: "VRB" | 0x09 | UTF-8 JSON object
      {"op": "begin", "txn": N, "label": L, "timeout_ms": T, "at_ms": A}
      {"op": "rows", "txn": N, "seq": S, "rows": [[table, ts, {column: value}], ...]}
      {"op": "files", "txn": N, "seq": S, "round": R, "files": [<format-8 file entry>, ...]}
      {"op": "precommit", "txn": N, "at_ms": A}
      {"op": "commit", "txn": N, "at_ms": A}            the publish record
      {"op": "abort", "txn": N, "reason": R, "at_ms": A}

`seq` names the batch within its transaction (the loader's choice, e.g. a Spark partition
id): a second batch with a seq already staged is ignored, so a retried or speculative put
never stages rows twice (a "files" batch shares the seq numbers). A "files" record stages
whole Parquet files: `round` names their staging directory on every replica (16 lowercase
hex digits, `ingest/staged/<round>/<k>.parquet`) and each entry is a format-8 file entry
(docs/vnode.md §9.2), checked by the vnode, carried here as it is. `txn` is the version of the transaction's begin record (so a begin record's txn is its own
version: the master knows it when it forwards); `at_ms` is the master's wall clock when it
wrote the record (labels' retention is measured on it, so every replica prunes alike).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from vrepl.errors import TxnPayloadError

MAGIC = b"VRB"
TXN_FORMAT = 9
HEADER = MAGIC + bytes([TXN_FORMAT])
OPS = ("begin", "rows", "files", "precommit", "commit", "abort")
ROUND_RE = re.compile(r"[0-9a-f]{16}")
MAX_FILES = 1000
LABEL_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
LABEL_RULE = "[A-Za-z0-9_.:-]{1,128}"
REASON_MAX = 200
INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class TxnRecord:
    op: str
    txn: int
    label: str = ""
    timeout_ms: int = 0
    at_ms: int = 0
    reason: str = ""
    rows: list[Any] = field(default_factory=list)
    seq: int = 0
    round: str = ""
    files: list[Any] = field(default_factory=list)  # "files": format-8 entries (JSON objects)

    def describe(self) -> str:
        """One stable line (logs, `vrepl wal dump`)."""
        extra = {
            "begin": f" label={self.label} timeout_ms={self.timeout_ms}",
            "rows": f" seq={self.seq} rows={len(self.rows)}",
            "files": f" seq={self.seq} round={self.round} files={len(self.files)}",
            "abort": f" reason={self.reason!r}",
        }
        return f"txn {self.txn} {self.op}{extra.get(self.op, '')}"


def is_txn_payload(payload: bytes | memoryview) -> bool:
    return bytes(payload[:4]) == HEADER


def label_invalid(label: Any) -> str | None:
    if type(label) is not str or LABEL_RE.fullmatch(label) is None:
        return f"label {str(label)[:70]!r} does not match {LABEL_RULE}"
    return None


def encode_txn_payload(rec: TxnRecord) -> bytes:
    doc: dict[str, Any] = {"op": rec.op, "txn": rec.txn}
    if rec.op == "begin":
        doc.update(label=rec.label, timeout_ms=rec.timeout_ms, at_ms=rec.at_ms)
    elif rec.op == "rows":
        doc.update(seq=rec.seq, rows=rec.rows)
    elif rec.op == "files":
        doc.update(seq=rec.seq, round=rec.round, files=rec.files)
    else:
        doc["at_ms"] = rec.at_ms
        if rec.op == "abort":
            doc["reason"] = rec.reason
    return HEADER + json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def encode_rows_payload(txn: int, seq: int, rows_json: bytes) -> bytes:
    """A "rows" record embedding a client's JSON array of rows as it was received (checked
    already), so the batch is not encoded a second time."""
    return HEADER + b'{"op":"rows","txn":%d,"seq":%d,"rows":' % (txn, seq) + rows_json + b"}"


# The head of a "rows" record as encode_rows_payload and encode_txn_payload write it (keys in
# this order, no spaces): what follows "rows": up to the closing brace is the rows array.
_ROWS_HEAD_RE = re.compile(rb'\{"op":"rows","txn":([1-9][0-9]{0,18}),"seq":(0|[1-9][0-9]{0,18}),"rows":')


def split_rows_payload(payload: bytes | memoryview) -> tuple[int, int, memoryview] | None:
    """(txn, seq, the bytes of the rows array) of a "rows" record written by this module,
    without parsing the rows, so the vnode hands them to the plain write path's compiled
    parser (vrepl/_core/memcols.pyx parse_batch, which refuses trailing data); None for
    any other record or layout (then decode_txn_payload decides). The rows bytes are not
    checked here."""
    m = _ROWS_HEAD_RE.match(payload, len(HEADER)) if is_txn_payload(payload) else None
    if m is None or payload[-1] != 0x7D:  # "}"
        return None
    txn, seq = int(m.group(1)), int(m.group(2))
    if txn > INT64_MAX or seq > INT64_MAX:
        return None
    return txn, seq, memoryview(payload)[m.end() : len(payload) - 1]


def _int(doc: dict, key: str, lo: int = 0) -> int:
    v = doc.get(key)
    if type(v) is not int or not lo <= v <= INT64_MAX:
        raise ValueError(f"{key} is not an integer >= {lo}")
    return v


def decode_txn_payload(payload: bytes | memoryview, version: int | None = None) -> TxnRecord:
    """The record in a format-9 payload; TxnPayloadError naming the version otherwise."""
    where = f"version {version}: " if version is not None else ""
    if not is_txn_payload(payload):
        raise TxnPayloadError(f"{where}not a transaction payload (format 9)")
    try:
        doc = json.loads(bytes(payload[4:]).decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("the body is not a JSON object")
        op = doc.get("op")
        if op not in OPS:
            raise ValueError(f"op {str(op)[:20]!r} is not one of {', '.join(OPS)}")
        txn = _int(doc, "txn", 1)
        if op == "begin":
            reason = label_invalid(doc.get("label"))
            if reason is not None:
                raise ValueError(reason)
            return TxnRecord(
                op, txn, label=doc["label"], timeout_ms=_int(doc, "timeout_ms", 1), at_ms=_int(doc, "at_ms")
            )
        if op == "rows":
            rows = doc.get("rows")
            if not isinstance(rows, list) or not rows:
                raise ValueError("rows is not a non-empty array")
            return TxnRecord(op, txn, rows=rows, seq=_int(doc, "seq"))
        if op == "files":
            rid, files = doc.get("round"), doc.get("files")
            if type(rid) is not str or ROUND_RE.fullmatch(rid) is None:
                raise ValueError("round is not 16 lowercase hex digits")
            if (
                not isinstance(files, list)
                or not 1 <= len(files) <= MAX_FILES
                or not all(isinstance(f, dict) for f in files)
            ):
                raise ValueError(f"files is not an array of 1..{MAX_FILES} objects")
            return TxnRecord(op, txn, seq=_int(doc, "seq"), round=rid, files=files)
        reason = doc.get("reason", "")
        if type(reason) is not str or len(reason) > REASON_MAX:
            raise ValueError(f"reason is not a string of at most {REASON_MAX} characters")
        return TxnRecord(op, txn, at_ms=_int(doc, "at_ms"), reason=reason)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise TxnPayloadError(f"{where}malformed transaction payload: {exc}") from None
