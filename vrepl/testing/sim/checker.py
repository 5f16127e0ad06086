"""Safety checkers of the simulator (docs/simulation.md §Invariants).

Owns: `History`, which is told about every master election, every ok confirmation and every
WAL truncation the simulated cluster executes, and raises `SafetyViolation` the moment one
of the promises of docs/design.md breaks:

* at most one master per epoch, across all time (§2.3);
* a version confirmed ok is never changed: a second, different record confirmed ok at the
  same version means the first was lost;
* leader completeness: every master, at its election and whenever a write of an older epoch
  is confirmed while it reigns, holds every record confirmed ok in an older epoch, with the
  same (epoch, payload);
* a confirmed record is never truncated from a majority: after any truncation, at least
  `quorum` nodes still hold it durably;
* at the end, the final master's log holds every confirmed record;
* (epoch, version) names one record: two WALs never hold different payloads at the same
  (epoch, version) — the log matching that truncation and SyncStart rely on (§4.3);
* the commit index (§4.4): a version committed on any node (CommitAdvanced) names one
  record for ever; a committed record is never truncated from any node's WAL, nor asked to
  be (the core refuses such a TruncateRequest and logs it at ERROR: the run fails on that
  line), and the final master holds every one — in every quorum mode, since the app
  archives what is committed.

With quorum < majority (asynchronous replication) losing a confirmed write is the documented
price of that setting: `lossy=True` counts losses in `lost` instead of raising.
Must not: drive the simulation or look at replica internals; it sees what a client and an
omniscient observer of the WALs see.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from vrepl.replica import Record


class SafetyViolation(AssertionError):
    """A safety property of the protocol broke in a simulated run."""


class History:
    """What happened that safety depends on, checked as it is recorded."""

    def __init__(self, n_replicas: int, quorum: int, *, lossy: bool = False) -> None:
        self.n_replicas = n_replicas
        self.quorum = quorum
        self.lossy = lossy
        self.master_of_epoch: dict[int, int] = {}  # epoch -> node, every epoch ever mastered
        self.confirmed: dict[int, Record] = {}  # version -> the record confirmed ok there
        self.confirmed_count = 0  # ok confirmations (a version re-confirmed after a loss counts again)
        self.lost: dict[int, Record] = {}  # lossy mode: version -> confirmed record found lost
        self.elections = 0
        self.truncated_confirmed = 0  # confirmed records removed from some node's log (must stay 0)
        self.written: dict[tuple[int, int], tuple[int, bytes]] = {}  # (epoch, version) -> (first writer, payload)
        self.committed: dict[int, tuple[int, Record]] = {}  # version -> (first node to commit it, record)

    # ------------------------------------------------------------------ recording

    def _violate(self, what: str) -> None:
        raise SafetyViolation(what)

    def _lose(self, rec: Record, what: str) -> None:
        if not self.lossy:
            self._violate(what)
        self.lost.setdefault(rec.version, rec)

    def on_append(self, node: int, rec: Record) -> None:
        """`node` appended `rec` to its WAL."""
        key = (rec.epoch, rec.version)
        first = self.written.setdefault(key, (node, rec.payload))
        if first[1] != rec.payload:
            self._violate(f"two different records at e{rec.epoch}v{rec.version}: n{first[0]} wrote {first[1]!r},"
                          f" n{node} now appends {rec.payload!r}")

    def on_master(self, node: int, epoch: int, log: Sequence[Record]) -> None:
        """`node` became master of `epoch` holding `log` (its whole WAL, index = version - 1)."""
        self.elections += 1
        held = self.master_of_epoch.setdefault(epoch, node)
        if held != node:
            self._violate(f"two masters in epoch {epoch}: n{held} and n{node}")
        self.check_master_holds(node, epoch, log, self.confirmed.values())

    def check_master_holds(self, node: int, epoch: int, log: Sequence[Record], records: Iterable[Record]) -> None:
        for rec in records:
            if rec.epoch >= epoch:
                continue
            have = log[rec.version - 1] if rec.version <= len(log) else None
            if have != rec:
                got = have.describe() if have else "nothing"
                self._lose(rec, f"master n{node} of e{epoch} lacks confirmed {rec.describe()}"
                                f" payload {rec.payload!r} (has {got})")

    def on_confirm_ok(self, node: int, rec: Record, masters: Iterable[tuple[int, int, Sequence[Record]]]) -> None:
        """`node` confirmed `rec` ok to its client; `masters` are the current (node, epoch,
        log) of every node that is master now."""
        self.confirmed_count += 1
        old = self.confirmed.get(rec.version)
        if old is not None and old != rec:
            self._lose(old, f"confirmed {old.describe()} {old.payload!r} was replaced by"
                            f" {rec.describe()} {rec.payload!r} confirmed by n{node}")
        self.confirmed[rec.version] = rec
        for m, epoch, log in masters:
            if epoch > rec.epoch:
                self.check_master_holds(m, epoch, log, (rec,))

    def on_commit(self, node: int, log: Sequence[Record], first: int, version: int) -> None:
        """`node` raised its commit version from `first` to `version`: records first+1..version
        of its `log` are committed. Each version may only ever name one committed record."""
        committed = self.committed
        for v in range(first + 1, version + 1):
            rec = log[v - 1]
            known = committed.setdefault(v, (node, rec))
            if known[1] != rec:
                self._violate(f"n{node} commits {rec.describe()} {rec.payload!r} but n{known[0]} committed"
                              f" {known[1].describe()} {known[1].payload!r} at v{v}")

    def on_truncate(self, node: int, cut: int, durable_logs: Sequence[Sequence[Record]], dropped: Sequence[Record]) -> None:
        """`node` truncated its WAL after version `cut`, dropping `dropped`; `durable_logs`
        are every node's durable log after the truncation."""
        for rec in dropped:
            known = self.committed.get(rec.version)
            if known is not None and known[1] == rec:
                self._violate(f"n{node} truncated committed {rec.describe()} (committed by n{known[0]}) after v{cut}")
        for rec in dropped:
            if self.confirmed.get(rec.version) != rec:
                continue
            self.truncated_confirmed += 1
            holders = sum(1 for log in durable_logs if rec.version <= len(log) and log[rec.version - 1] == rec)
            if holders < self.quorum:
                self._lose(rec, f"n{node} truncated confirmed {rec.describe()} after v{cut}:"
                                f" only {holders} durable copies left, quorum {self.quorum}")

    def on_committed_cut_refused(self, node: int, text: str) -> None:
        """`node` was asked to truncate records at or below its commit version. The core
        refuses it (a peer's message never trips an invariant there), but only a bug sends
        that request (docs/design.md §4.4)."""
        self._violate(f"n{node} was asked to cut committed records: {text}")

    def check_final(self, node: int, log: Sequence[Record]) -> None:
        """The converged master's log holds every confirmed and every committed record."""
        for v, (first, rec) in self.committed.items():
            if v > len(log) or log[v - 1] != rec:
                self._violate(f"final master n{node} lacks {rec.describe()} committed by n{first}")
        for rec in self.confirmed.values():
            have = log[rec.version - 1] if rec.version <= len(log) else None
            if have != rec:
                self._lose(rec, f"final master n{node} lacks confirmed {rec.describe()} {rec.payload!r}")
