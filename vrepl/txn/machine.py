"""The transaction state machine of one vgroup (docs/transactions.md §2): records in, outcomes
out.

Owns: every transaction the vgroup's log names (state, reason, label, tables, staged rows and
bytes, the versions of its records), the label table with its retention, the counters by
state and abort reason, and `flush_limit`, the rule that keeps an unfinished transaction's
records in the WAL (a flush must not archive past the begin of a transaction that is not
finished at the cut: its staged rows live only in the log and in memory until the publish).
Every replica applies the same records in the same order to its own TxnTable, so every
replica reaches the same states: the state machine is part of the replicated data.
Must not: do I/O, read a clock (time comes from the records' `at_ms`), or check rows (the
vnode does, and hands over the batches it accepted as opaque objects).

States: PREPARE (begun, taking rows), PRECOMMITTED (rows sealed, waiting for commit or
abort), VISIBLE (the commit record, the publish, is applied: its rows are in the memtable at
that record's version), ABORTED (with its reason). COMMITTED is the master's view of a
transaction whose commit record is forwarded but not yet applied (vrepl/node/txnhost.py); a
replica never holds it: commit and publish are one record here (§5 of the doc).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from vrepl.replica.invariant import invariant
from vrepl.txn.config import TxnConfig
from vrepl.txn.record import TxnRecord

PREPARE, PRECOMMITTED, COMMITTED, VISIBLE, ABORTED = ("PREPARE", "PRECOMMITTED", "COMMITTED", "VISIBLE", "ABORTED")
STATES = (PREPARE, PRECOMMITTED, COMMITTED, VISIBLE, ABORTED)
OPEN = (PREPARE, PRECOMMITTED)
LABELS_FORMAT = 1

# Outcome effects (what applying a record did).
BEGUN, STAGED, SEALED, PUBLISHED, ABORTED_NOW, IGNORED = (
    "begun",
    "staged",
    "precommitted",
    "published",
    "aborted",
    "ignored",
)


@dataclass
class Txn:
    id: int  # the version of its begin record
    label: str
    timeout_ms: int
    begin_at_ms: int
    state: str = PREPARE
    reason: str = ""
    tables: set[str] = field(default_factory=set)
    rows: int = 0
    bytes: int = 0  # staged rows' JSON bytes (held in memory by every replica)
    files: int = 0  # staged Parquet files ("files" records) and their bytes (on disk)
    file_bytes: int = 0
    batches: list[Any] = field(default_factory=list)  # staged batches (the vnode's objects)
    seqs: set[int] = field(default_factory=set)  # the batches' seq numbers
    last_version: int = 0  # its newest record applied
    finish_version: int = 0  # the commit (publish) or abort record, once applied
    finish_at_ms: int = 0

    @property
    def open(self) -> bool:
        return self.state in OPEN

    def describe(self) -> dict[str, Any]:
        """The transaction as `show` answers it (docs/client-api.md §Transactions)."""
        return {
            "txn": self.id,
            "label": self.label,
            "state": self.state,
            "reason": self.reason,
            "tables": sorted(self.tables),
            "rows": self.rows,
            "bytes": self.bytes,
            "files": self.files,
            "file_bytes": self.file_bytes,
            "begin_version": self.id,
            "begin_at_ms": self.begin_at_ms,
            "timeout_ms": self.timeout_ms,
            "visible_version": self.finish_version if self.state == VISIBLE else 0,
            "finish_version": self.finish_version,
            "finish_at_ms": self.finish_at_ms,
        }


@dataclass(frozen=True)
class Outcome:
    """What applying one record did: `effect` (BEGUN, STAGED, SEALED, PUBLISHED, ABORTED_NOW,
    IGNORED), the transaction it concerns (None: unknown id), the reason when IGNORED, and,
    for PUBLISHED, the staged batches to apply at the record's version (for ABORTED_NOW: the
    batches dropped, so the vnode removes the files they staged). `duplicate`: an
    IGNORED step that was already done (a repeated begin, batch seq, pre-commit, commit of a
    VISIBLE or abort of an ABORTED transaction): its answer is the transaction as it is."""

    effect: str
    txn: Txn | None
    reason: str = ""
    batches: tuple[Any, ...] = ()
    duplicate: bool = False


class TxnTable:
    """Every transaction of one vgroup. `apply(version, record)` in version order (records
    at or below the newest applied are ignored: replays are harmless)."""

    def __init__(self, label_retention_ms: int = TxnConfig.label_retention_ms) -> None:
        invariant(label_retention_ms > 0, "label retention is positive")
        self.label_retention_ms = label_retention_ms
        self.txns: OrderedDict[int, Txn] = OrderedDict()  # by id (= begin version)
        self.open: dict[int, Txn] = {}  # the open ones (few), by id
        # (finish version, id) of the finished ones in finish order: retention prunes from
        # the front, flush_limit looks at the back; both cost what they touch, not all.
        self.finished: deque[tuple[int, int]] = deque()
        self.labels: dict[str, int] = {}  # label -> its newest txn id
        self.applied_version = 0
        self.now_ms = 0  # newest at_ms seen
        self.counts: Counter[str] = Counter()  # transactions by state
        self.aborts: Counter[str] = Counter()  # aborts by reason kind

    # -- applying records -------------------------------------------------------------------
    def apply(
        self,
        version: int,
        rec: TxnRecord,
        batch: Any = None,
        nbytes: int = 0,
        tables: Iterable[str] = (),
        nrows: int | None = None,
    ) -> Outcome:
        """Apply the record at `version`. A "rows" record passes the vnode's checked batch,
        its bytes and its tables; a "files" record its staged files (the vnode's object),
        their bytes, tables and rows (`nrows`). Never raises for an expected condition (an unknown or
        finished transaction, a duplicate label): the record is IGNORED with the reason,
        identically on every replica."""
        if version <= self.applied_version:
            return Outcome(IGNORED, self.txns.get(rec.txn), f"v{version} is already applied")
        self.applied_version = version
        self.now_ms = max(self.now_ms, rec.at_ms)
        if rec.op == "begin":
            return self._begin(version, rec)
        t = self.txns.get(rec.txn)
        if t is None:
            return Outcome(IGNORED, None, f"no transaction {rec.txn} (never begun, or its label expired)")
        if not t.open:
            done = (rec.op, t.state) in (("commit", VISIBLE), ("abort", ABORTED))
            why = f"transaction {t.id} is {t.state}" + (f" ({t.reason})" if t.reason else "")
            return Outcome(IGNORED, t, why, duplicate=done)
        t.last_version = version
        if rec.op in ("rows", "files"):
            if t.state != PREPARE:
                return Outcome(IGNORED, t, f"transaction {t.id} is {t.state}: it takes no more rows")
            if rec.seq in t.seqs:
                return Outcome(IGNORED, t, f"batch {rec.seq} of transaction {t.id} is already staged", duplicate=True)
            t.seqs.add(rec.seq)
            t.batches.append(batch)
            if rec.op == "files":
                t.files += len(rec.files)
                t.file_bytes += nbytes
                t.rows += nrows or 0
            else:
                t.bytes += nbytes
                t.rows += len(batch) if batch is not None else 0
            t.tables.update(tables)
            return Outcome(STAGED, t)
        if rec.op == "precommit":
            if t.state == PRECOMMITTED:
                return Outcome(IGNORED, t, f"transaction {t.id} is already PRECOMMITTED", duplicate=True)
            self._move(t, PRECOMMITTED)
            return Outcome(SEALED, t)
        if rec.op == "commit":
            batches = tuple(t.batches)
            t.batches, t.seqs = [], set()
            self._finish(t, VISIBLE, version, rec.at_ms, "")
            return Outcome(PUBLISHED, t, batches=batches)
        invariant(rec.op == "abort", "record ops are checked on decode")
        batches = tuple(t.batches)  # the vnode removes the staged files they name
        t.batches, t.seqs = [], set()
        self._finish(t, ABORTED, version, rec.at_ms, rec.reason or "aborted")
        self.aborts[abort_kind(t.reason)] += 1
        return Outcome(ABORTED_NOW, t, batches=batches)

    def _begin(self, version: int, rec: TxnRecord) -> Outcome:
        if rec.txn != version:
            return Outcome(IGNORED, None, f"a begin record names txn {rec.txn}, not its own version {version}")
        prev = self.by_label(rec.label)
        if prev is not None and prev.state != ABORTED:
            return Outcome(IGNORED, prev, f"label {rec.label} is transaction {prev.id} ({prev.state})", duplicate=True)
        t = Txn(version, rec.label, rec.timeout_ms, rec.at_ms, last_version=version)
        self.txns[version] = t
        self.open[version] = t
        self.labels[rec.label] = version
        self.counts[PREPARE] += 1
        return Outcome(BEGUN, t)

    def _move(self, t: Txn, state: str) -> None:
        self.counts[t.state] -= 1
        self.counts[state] += 1
        t.state = state

    def _finish(self, t: Txn, state: str, version: int, at_ms: int, reason: str) -> None:
        self._move(t, state)
        t.reason = reason
        t.finish_version = t.last_version = version
        t.finish_at_ms = at_ms
        del self.open[t.id]
        self.finished.append((version, t.id))
        self.prune()

    def prune(self) -> list[int]:
        """Forget finished transactions older than the label retention (by the records'
        clock): a later begin with their label starts a new transaction. Returns their ids."""
        horizon = self.now_ms - self.label_retention_ms
        gone = []
        while self.finished:
            tid = self.finished[0][1]
            t = self.txns.get(tid)
            if t is not None and t.finish_at_ms >= horizon:
                break
            self.finished.popleft()
            if t is None:
                continue
            gone.append(tid)
            del self.txns[tid]
            self.counts[t.state] -= 1
            if self.labels.get(t.label) == tid:
                del self.labels[t.label]
        return gone

    # -- questions --------------------------------------------------------------------------
    def get(self, txn: int) -> Txn | None:
        return self.txns.get(txn)

    def by_label(self, label: str) -> Txn | None:
        tid = self.labels.get(label)
        return self.txns.get(tid) if tid is not None else None

    def open_txns(self) -> list[Txn]:
        return sorted(self.open.values(), key=lambda t: t.id)

    def staged_bytes(self) -> int:
        return sum(t.bytes for t in self.open.values())

    def staged_file_bytes(self) -> int:
        return sum(t.file_bytes for t in self.open.values())

    def flush_limit(self, limit: int) -> int:
        """The highest version a flush may archive, given `limit` (docs/transactions.md §4):
        never past the begin of a transaction that is not finished at the cut, since after
        a restart the WAL above the archive is all that rebuilds its staged rows."""
        cut = min([limit, *(t.id - 1 for t in self.open.values() if t.id <= limit)])
        # One pass, newest finish first (`finished` is in finish order): a transaction
        # finished above the cut and begun at or below it lowers the cut below its begin;
        # the cut only goes down, so the first one finished at or below the cut ends the
        # walk (every older one finished lower still). Chains of overlapping transactions
        # (concurrent loaders) cost their length once, not once per lowering.
        for finish_version, tid in reversed(self.finished):
            if finish_version <= cut:
                break
            if tid <= cut:
                cut = tid - 1
        return cut

    def state_counts(self) -> dict[str, int]:
        return {s: self.counts.get(s, 0) for s in STATES}

    # -- labels file (persisted by the vnode at each flush) ---------------------------------
    def labels_doc(self, through_version: int) -> dict[str, Any]:
        """The finished transactions at or below `through_version` (the flush's cut), to be
        written next to the manifest: after a restart the WAL above the cut replays the rest."""
        done = [t for t in self.txns.values() if not t.open and t.finish_version <= through_version]
        return {
            "format": LABELS_FORMAT,
            "through_version": through_version,
            "aborts": dict(self.aborts),
            "now_ms": self.now_ms,
            "txns": [{k: v for k, v in t.describe().items() if k not in ("visible_version",)} for t in done],
        }

    def load_labels(self, doc: dict[str, Any], archived_version: int) -> None:
        """Load a labels file. Entries finished above `archived_version` are dropped (the
        file was written just before a manifest commit that a crash prevented): the WAL
        replays them."""
        invariant(doc.get("format") == LABELS_FORMAT, "labels file format 1")
        self.txns.clear()
        self.open.clear()
        self.finished.clear()
        self.labels.clear()
        self.counts.clear()
        for d in sorted(doc.get("txns", []), key=lambda d: d["txn"]):
            if d["finish_version"] > archived_version or d["state"] not in (VISIBLE, ABORTED):
                continue
            t = Txn(
                d["txn"],
                d["label"],
                d["timeout_ms"],
                d["begin_at_ms"],
                state=d["state"],
                reason=d["reason"],
                tables=set(d["tables"]),
                rows=d["rows"],
                bytes=d["bytes"],
                files=d.get("files", 0),
                file_bytes=d.get("file_bytes", 0),
                last_version=d["finish_version"],
                finish_version=d["finish_version"],
                finish_at_ms=d["finish_at_ms"],
            )
            self.txns[t.id] = t
            self.labels[t.label] = t.id
            self.counts[t.state] += 1
        for t in sorted(self.txns.values(), key=lambda t: t.finish_version):
            self.finished.append((t.finish_version, t.id))
        self.aborts = Counter(doc.get("aborts", {}))
        self.now_ms = max(self.now_ms, int(doc.get("now_ms", 0)))
        self.applied_version = max(self.applied_version, archived_version)


def abort_kind(reason: str) -> str:
    """The metric label of an abort reason: its first word (timeout, client, ...)."""
    word = reason.split(":", 1)[0].split(" ", 1)[0].strip().lower()
    return word if word in ("timeout", "client", "bad_rows", "master") else "other"
