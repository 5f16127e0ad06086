"""Transactions in the vnode (docs/transactions.md §3-§4): applying format-9 records and
keeping the labels file.

Owns: `VnodeTxns`, the vnode's TxnTable (vrepl/txn/machine.py) together with what the vnode
must do around it: check a "rows" record against the schemas (the columns it adds join
them, as a write's do), hand the published batches back to be applied to the memtable at
the publish record's version, and persist the finished transactions (labels) in
`<path>/data/txn_labels.json` at each flush, so a label is answered after the WAL below the
archive is recycled. Every method is called with the vnode's lock held.
Must not: touch the memtable, the manifest or the WAL itself (the vnode does), or decide
anything by a clock.
"""
from __future__ import annotations

import json
import os
from typing import Any

from vrepl.txn.config import TxnConfig
from vrepl.txn.machine import PREPARE, PUBLISHED, Outcome, TxnTable
from vrepl.txn.record import TxnPayloadError, decode_txn_payload
from vrepl.vnode import rows as R
from vrepl.vnode.errors import ApplyError, ArchiveError, PayloadError
from vrepl.vnode.files import write_atomic

LABELS_NAME = "txn_labels.json"
DEFAULT_LABEL_RETENTION_MS = TxnConfig.label_retention_ms


class VnodeTxns:
    def __init__(self, path: str, label_retention_ms: int = DEFAULT_LABEL_RETENTION_MS,
                 fsync: bool = True) -> None:
        self.file = os.path.join(path, "data", LABELS_NAME)
        self.fsync = fsync
        self.table = TxnTable(label_retention_ms)

    def load(self, archived_version: int) -> None:
        """A fresh table holding the labels file's transactions finished at or below the
        archive (the WAL above it replays the rest)."""
        self.table = TxnTable(self.table.label_retention_ms)
        try:
            with open(self.file, "rb") as fh:
                doc = json.loads(fh.read().decode("utf-8"))
        except FileNotFoundError:
            self.table.applied_version = archived_version
            return
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ArchiveError(self.file, f"unreadable transaction labels: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != 1:
            raise ArchiveError(self.file, "not a transaction labels file of format 1")
        try:
            self.table.load_labels(doc, archived_version)
        except (KeyError, TypeError, ValueError) as exc:
            raise ArchiveError(self.file, f"malformed transaction labels: {exc!r}") from exc

    def save(self, through_version: int) -> None:
        """Write the finished transactions at or below `through_version` (before the
        manifest commit that archives up to it; docs/transactions.md §4)."""
        data = json.dumps(self.table.labels_doc(through_version), separators=(",", ":"))
        os.makedirs(os.path.dirname(self.file), exist_ok=True)
        write_atomic(self.file, data.encode(), self.fsync)

    def apply(self, version: int, payload: bytes, schemas: dict[str, dict[str, str]]
              ) -> tuple[Outcome, dict[str, dict[str, str]], list[Any], int]:
        """Apply a format-9 record: (outcome, columns it adds to the schemas, rows to apply
        to the memtable at `version` (the published batches, concatenated), their bytes).
        A "rows" record whose rows conflict with the schemas is an ApplyError naming the
        version (the master checked them: a conflict here means diverged replicas)."""
        try:
            rec = decode_txn_payload(payload, version)
        except TxnPayloadError as exc:     # the vnode's kind of error: the node handles it
            raise PayloadError(str(exc).split("malformed transaction payload: ")[-1],
                               version) from None
        added: dict[str, dict[str, str]] = {}
        batch, nbytes, tables = None, 0, ()
        if rec.op == "rows":
            t = self.table.get(rec.txn)
            if t is not None and t.state == PREPARE:
                reason, added, nbytes = R.check_rows(rec.rows, None, schemas)
                if reason is not None:
                    raise ApplyError(f"version {version}: cannot stage rows of transaction"
                                     f" {rec.txn}: {reason}")
                batch = rec.rows
                nbytes = nbytes or len(payload)
                tables = {row[0] for row in rec.rows}
        out = self.table.apply(version, rec, batch, nbytes, tables)
        if out.effect != PUBLISHED:
            return out, added, [], 0
        rows = [row for b in out.batches for row in b]
        return out, added, rows, out.txn.bytes if out.txn is not None else 0

    def flush_limit(self, limit: int) -> int:
        return self.table.flush_limit(limit)

    def status(self) -> dict[str, Any]:
        t = self.table
        return {"states": t.state_counts(), "aborts": dict(t.aborts),
                "staged_bytes": t.staged_bytes(), "open": len(t.open_txns()),
                "labels": len(t.labels)}
