"""Transactions in the validation job's WAL replay (docs/validation.md, docs/transactions.md
§4): a format-9 record stages its rows, and only the publish (commit) record puts them in the
replayed rows, at its version, as a vnode's recovery does.

Owns: `TxnReplay`, one per replayed replica, and `published_keys`: the (table, ts) keys every
transaction published, from the staged batches its WAL still holds (the per-transaction
check, vrepl/spark/txncheck.py). Must not: read files (the caller hands it the records) or
decide anything the vnode would not.
"""
from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

from vrepl.spark.model import Finding, ReplicaSpec
from vrepl.txn.machine import PREPARE, PUBLISHED, VISIBLE, TxnTable
from vrepl.txn.record import TxnPayloadError, decode_txn_payload, is_txn_payload
from vrepl.vnode.rows import check_rows


class TxnReplay:
    def __init__(self, spec: ReplicaSpec) -> None:
        self.spec = spec
        self.table = TxnTable()

    def load(self, archived_version: int, findings: list[Finding]) -> None:
        """The replica's labels file (docs/transactions.md §4), if any: the transactions
        finished in its archive."""
        path = os.path.join(self.spec.path, "data", "txn_labels.json")
        try:
            with open(path, "rb") as fh:
                self.table.load_labels(json.loads(fh.read()), archived_version)
        except FileNotFoundError:
            self.table.applied_version = archived_version
        except (OSError, ValueError, KeyError, TypeError) as exc:
            findings.append(Finding("files", "txn_labels_unreadable", f"{path}: {exc}",
                                    self.spec.vgroup, self.spec.replica, "data/txn_labels.json"))

    def outcomes(self) -> dict[int, tuple[str, str, int, int]]:
        """Every finished transaction: id -> (label, state, visible version, rows)."""
        return {t.id: (t.label, t.state, t.finish_version if t.state == VISIBLE else 0, t.rows)
                for t in self.table.txns.values() if not t.open}

    def apply(self, version: int, epoch: int, payload: bytes,
              schemas: dict[str, dict[str, str]], findings: list[Finding],
              rows: dict[tuple[str, int], tuple[int, int, dict[str, Any]]]) -> None:
        """Apply one transaction record to the replay: the publish writes its rows."""
        spec = self.spec
        try:
            rec = decode_txn_payload(payload, version)
        except TxnPayloadError as exc:
            findings.append(Finding("versions", "wal_bad_payload", str(exc), spec.vgroup,
                                    spec.replica, None, {"version": version}))
            return
        batch = None
        if rec.op == "rows":
            t = self.table.get(rec.txn)
            if t is not None and t.state == PREPARE:
                reason, added, _ = check_rows(rec.rows, None, schemas)
                if reason is not None:
                    findings.append(Finding("schemas", "wal_type_conflict",
                                            f"version {version}: {reason} (the transaction's"
                                            " batch is not staged)", spec.vgroup, spec.replica,
                                            None, {"version": version}))
                    return
                for table, cols in added.items():
                    schemas.setdefault(table, {}).update(cols)
                batch = rec.rows
        out = self.table.apply(version, rec, batch, 0, ())
        if out.effect == PUBLISHED:
            for b in out.batches:
                if b is None:       # a "files" batch: its rows are in files, not replayed here
                    continue
                for table, ts, values in b:
                    rows[(table, ts)] = (version, epoch, values)


class PublishedTxn(NamedTuple):
    """A transaction published in the WAL: its label, publish version, staged rows and
    the distinct (table, ts) keys of its staged batches."""
    label: str
    version: int
    rows: int
    keys: frozenset[tuple[str, int]]


def published_keys(records: list[tuple[int, int, int, bytes]]) -> dict[int, PublishedTxn]:
    """Every transaction whose begin, batches and publish are all in `records` (a WAL's
    records in log order, transaction records below the archive included), run through
    the same state machine the vnode uses (so a batch it ignores, a duplicate seq or one
    after the pre-commit, is not counted). A transaction begun before the WAL's first
    record is not here: its batches are gone with the recycled WAL."""
    table = TxnTable(1 << 62)        # keep every finished transaction
    out: dict[int, PublishedTxn] = {}
    for version, _epoch, _msg_type, payload in records:
        if version <= table.applied_version:
            continue
        if not is_txn_payload(payload):
            table.applied_version = version
            continue
        try:
            rec = decode_txn_payload(payload, version)
        except TxnPayloadError:       # reported by the replay (wal_bad_payload)
            table.applied_version = version
            continue
        keys = [(row[0], row[1]) for row in rec.rows] if rec.op == "rows" else None
        res = table.apply(version, rec, keys, 0, ())
        if res.effect == PUBLISHED and res.txn is not None:
            t = res.txn
            out[t.id] = PublishedTxn(t.label, version, t.rows,
                                     frozenset(k for b in res.batches for k in b))
    return out
