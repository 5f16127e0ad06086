"""Transactions in the vnode (docs/transactions.md §3-§4): applying format-9 records and
keeping the labels file.

Owns: `VnodeTxns`, the vnode's TxnTable (vrepl/txn/machine.py) together with what the vnode
must do around it: check a "rows" record against the schemas (the columns it adds join
them, as a write's do), hand the published batches back to be applied to the memtable at
the publish record's version, and persist the finished transactions (labels) in
`<path>/data/txn_labels.json` at each flush, so a label is answered after the WAL below the
archive is recycled. Every method is called with the vnode's lock held.
Files ("files" records, docs/transactions.md §4.1): each record is a round of staged files
(`ingest/staged/<round>/<k>.parquet`, fetched by the node like a format-8 round's, acked
only once staged: `rounds`); the publish turns the transaction's rounds and its inline rows
into one `TxnRound` pending at the publish version, which a flush archives in one manifest
commit (files and rows together: never half of it); an abort removes the staged files.
Must not: touch the memtable, the manifest or the WAL itself (the vnode does), or decide
anything by a clock.
"""
from __future__ import annotations

import json
import os
import shutil
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

from vrepl.txn.config import TxnConfig
from vrepl.txn.machine import ABORTED_NOW, PREPARE, PUBLISHED, STAGED, Outcome, TxnTable
from vrepl.txn.record import TxnPayloadError, TxnRecord, decode_txn_payload, split_rows_payload
from vrepl.vnode import rows as R
from vrepl.vnode import staging as S
from vrepl.vnode.errors import ApplyError, ArchiveError, PayloadError
from vrepl.vnode.files import LABELS_FILE_NAME, write_atomic
from vrepl.vnode.flush import PendingIngest
from vrepl.vnode.ingest import Staged, staged_rows

DEFAULT_LABEL_RETENTION_MS = TxnConfig.label_retention_ms


@dataclass(frozen=True)
class TxnRound(S.IngestRecord):
    """A published transaction's files and inline rows, pending at its publish version like
    a format-8 round (a flush point). File k is file `parts[k][1]` of the files record at
    version `parts[k][2]` (round `parts[k][0]`): it stays staged where that record put it
    and is archived under that record's version and index (unique, and what a replica that
    fetches it for that record asks for); its rows rank by the publish version
    (`ingest_version`). `held_rows`: the inline rows, at the publish version, written by the
    same flush step so that a reader sees all of the transaction or none of it."""

    parts: tuple[tuple[str, int, int], ...] = ()
    held_rows: tuple[Any, ...] = ()

    def staged_name(self, k: int) -> str:
        rid, j, _ = self.parts[k]
        return S.staged_name(rid, j)

    def archive_name(self, version: int, k: int) -> str:
        _, j, v = self.parts[k]
        f = self.files[k]
        return S.archive_name(f.table, f.bucket, v, j)

    @property
    def staged_rounds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(rid for rid, _, _ in self.parts))


def round_columns(schemas: Mapping[str, Mapping[str, str]], rec: S.IngestRecord, version: int
                  ) -> dict[str, dict[str, str]]:
    """The columns a round of files adds to the schemas; ApplyError naming the version when
    a file's column type conflicts with a table's."""
    added: dict[str, dict[str, str]] = {}
    for table, cols in rec.columns().items():
        known = schemas.get(table, {})
        for col, typ in cols.items():
            have = known.get(col) or added.get(table, {}).get(col)
            if have is None:
                added.setdefault(table, {})[col] = typ
            elif not R.type_accepts(have, typ):
                raise ApplyError(f"version {version}: cannot apply: column {col!r} of"
                                 f" table {table!r} is {have}, the round's file has {typ}"
                                 f" (a column's type cannot change)")
    return added


def files_record(rec: TxnRecord, version: int) -> S.IngestRecord:
    """The round of files a "files" record names (its entries checked as format 8's)."""
    doc = {"round": rec.round, "kind": "txn", "meta": {"txn": rec.txn, "seq": rec.seq},
           "files": rec.files}
    return S.decode_ingest_payload(S.PAYLOAD_HEADER_FILES + json.dumps(doc).encode(), version)


class VnodeTxns:
    def __init__(self, path: str, label_retention_ms: int = DEFAULT_LABEL_RETENTION_MS,
                 fsync: bool = True) -> None:
        self.file = os.path.join(path, *LABELS_FILE_NAME.split("/"))
        self.fsync = fsync
        self.table = TxnTable(label_retention_ms)
        # The labels file's bytes as last loaded or saved, so getFileInfo lists it without
        # reading the disk (written under the vnode's lock with the manifest). None: no file,
        # or one without a transaction, which a restore does not send (a vnode that never
        # ran a transaction keeps the manifest at index n, docs/vnode.md §4).
        self.file_bytes: bytes | None = None
        # "files" records of transactions, by version: staged here or not (the node fetches
        # what is missing and acks nothing at or above the first unstaged one). Dropped at
        # the publish (once staged) or the abort.
        self.rounds: OrderedDict[int, PendingIngest] = OrderedDict()

    def load(self, archived_version: int) -> None:
        """A fresh table holding the labels file's transactions finished at or below the
        archive (the WAL above it replays the rest)."""
        self.table = TxnTable(self.table.label_retention_ms)
        self.file_bytes = None
        self.rounds = OrderedDict()
        try:
            with open(self.file, "rb") as fh:
                data = fh.read()
            doc = json.loads(data.decode("utf-8"))
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
        self.file_bytes = data if doc.get("txns") else None

    def save(self, through_version: int) -> None:
        """Write the finished transactions at or below `through_version` (before the
        manifest commit that archives up to it; docs/transactions.md §4)."""
        doc = self.table.labels_doc(through_version)
        raw = json.dumps(doc, separators=(",", ":")).encode()
        os.makedirs(os.path.dirname(self.file), exist_ok=True)
        write_atomic(self.file, raw, self.fsync)
        self.file_bytes = raw if doc["txns"] else None

    def apply(self, version: int, epoch: int, payload: bytes,
              schemas: dict[str, dict[str, str]], path: str
              ) -> tuple[Outcome, dict[str, dict[str, str]], list[Any], PendingIngest | None]:
        """Apply a format-9 record: (outcome, columns it adds to the schemas, the published
        batches to apply to the memtable at `version`, in staging order (each a Staged
        batch or a list of rows), the TxnRound pending at `version` when a published
        transaction staged files (its rows are then held in it, not returned)). A "rows" or
        "files" record that conflicts with the schemas is an ApplyError naming the version
        (the master checked it: a conflict here means diverged replicas)."""
        batch: Any = None   # what the record stages: Staged, a list of rows or PendingIngest
        fast = self._parse_rows(payload, schemas)
        if fast is not None:
            rec, batch = fast
        else:
            try:
                rec = decode_txn_payload(payload, version)
            except TxnPayloadError as exc:     # the vnode's kind of error: the node handles it
                raise PayloadError(str(exc).split("malformed transaction payload: ")[-1],
                                   version) from None
        added: dict[str, dict[str, str]] = {}
        nbytes, nrows = 0, None
        tables: set[str] = set()
        t = self.table.get(rec.txn) if rec.op in ("rows", "files") else None
        if batch is not None:
            added, nbytes, tables = batch.added, batch.nbytes or len(payload), set(batch.tables)
        elif t is not None and t.state == PREPARE and rec.seq not in t.seqs:
            if rec.op == "rows":
                reason, added, nbytes = R.check_rows(rec.rows, None, schemas)
                if reason is not None:
                    raise ApplyError(f"version {version}: cannot stage rows of transaction"
                                     f" {rec.txn}: {reason}")
                batch = rec.rows
                nbytes = nbytes or len(payload)
                tables = {row[0] for row in rec.rows}
            else:
                irec = files_record(rec, version)
                added = round_columns(schemas, irec, version)
                batch = PendingIngest(version, epoch, irec, not S.missing_staged(path, irec))
                nbytes = sum(f.size for f in irec.files)
                tables, nrows = {f.table for f in irec.files}, irec.rows
        out = self.table.apply(version, rec, batch, nbytes, tables, nrows)
        if out.effect == STAGED and isinstance(batch, PendingIngest):
            self.rounds[version] = batch
        if out.effect == ABORTED_NOW:
            self._drop_files(out.batches, path)
        if out.effect != PUBLISHED:
            return out, added, [], None
        batches = [b for b in out.batches if not isinstance(b, PendingIngest)]
        files = [b for b in out.batches if isinstance(b, PendingIngest)]
        if not files:
            return out, added, batches, None
        rows = [row for b in batches for row in (staged_rows(b) if type(b) is Staged else b)]
        parts = tuple((p.record.round, j, p.version) for p in files
                      for j in range(len(p.record.files)))
        entries = tuple(f for p in files for f in p.record.files)
        pub = TxnRound(files[0].record.round, "txn", {"txn": rec.txn}, entries, (),
                       parts, tuple(rows))
        for p in files:         # staged ones are done; a missing one's fetch goes on
            if not S.missing_staged(path, p.record):
                self.rounds.pop(p.version, None)
        return out, added, [], PendingIngest(version, epoch, pub, not S.missing_staged(path, pub))

    def _parse_rows(self, payload: bytes, schemas: dict[str, dict[str, str]]
                    ) -> tuple[TxnRecord, Staged] | None:
        """The fast path of a "rows" record that stages: its rows parsed straight into
        columns by the plain write path's parser (a Staged batch: no Python object per row
        or value, held so until the publish), with the schemas' types enforced. None when
        the record is not that (another op or layout, a batch that would be ignored, rows
        the parser is not sure of or that conflict): then decode_txn_payload and check_rows
        decide, and give the reason."""
        parts = split_rows_payload(payload)
        if parts is None:
            return None
        txn, seq, body = parts
        t = self.table.get(txn)
        if t is None or t.state != PREPARE or seq in t.seqs:
            return None
        staged = R.parse_staged(body, None, schemas)
        if staged is None:
            return None
        return TxnRecord("rows", txn, seq=seq), staged

    def _drop_files(self, batches: tuple[Any, ...], path: str) -> None:
        """An aborted transaction's staged files go (its rounds' directories)."""
        for b in batches:
            if isinstance(b, PendingIngest):
                self.rounds.pop(b.version, None)
                shutil.rmtree(S.staged_round_path(path, b.record.round), ignore_errors=True)

    def refresh(self, version: int, path: str) -> bool | None:
        """Whether the files record at `version` is staged now (None: not one of ours). One
        of a finished transaction that is staged now is dropped."""
        p = self.rounds.get(version)
        if p is None:
            return None
        p.staged = not S.missing_staged(path, p.record)
        t = self.table.get(int(p.record.meta["txn"]))
        if p.staged and (t is None or not t.open):
            del self.rounds[version]
        return p.staged

    def staged_rounds(self) -> set[str]:
        """The staging directories the open transactions' files records name."""
        return {p.record.round for p in self.rounds.values()}

    def flush_limit(self, limit: int) -> int:
        return self.table.flush_limit(limit)

    def status(self) -> dict[str, Any]:
        t = self.table
        return {"states": t.state_counts(), "aborts": dict(t.aborts),
                "staged_bytes": t.staged_bytes(), "open": len(t.open_txns()),
                "staged_file_bytes": t.staged_file_bytes(),
                "labels": len(t.labels)}
