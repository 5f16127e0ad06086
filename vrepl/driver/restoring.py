"""The replica's side of a restore session: what a session asks of the replica, answered
on the driver's thread (docs/restore.md).

Owns: `ReplicaRestore`, the operations a restore session (vrepl/restore/sender.py's
`Source`, vrepl/restore/receiver.py's `Sink`) needs from the replica, each a check of the
replica's state and the event it steps: on the master, where the log ends, the epoch
history up to a version, the switch to live forwards (PeerRestoreCaughtUp) and a failed
session (PeerRestoreFailed); on the follower, beginning (RestoreBegun), the rebase on
restored files (LogRebased, after the WAL reset), feeding restored records
(RestoredRecords: skipped when held, a gap refused) and the end (RestoreEnded). Production
calls them from its session threads through the I/O thread (vrepl/restore/live.py), the
simulator directly (vrepl/testing/sim/restore.py): the same checks, the same events.
Validation returns a reason (None: done); the caller raises its own error with it.
Must not: block, do I/O beyond the driver's Storage port, or keep session state: a session
owns its own.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

from vrepl._core import wire as _wire
from vrepl.driver.ports import Storage
from vrepl.errors import FrameError
from vrepl.replica import (
    ForwardBatch,
    LogRebased,
    PeerRestoreCaughtUp,
    PeerRestoreFailed,
    Replica,
    RestoreBegun,
    RestoredRecords,
    RestoreEnded,
    Role,
)

_U64 = struct.Struct("<Q")
WAIT = "wait"  # begin_refusal: the follower has not matched its log with the master yet


class RestoreHostDriver(Protocol):
    """What these operations need from their driver."""

    replica: Replica
    storage: Storage

    def step(self, event: object) -> None: ...

    def end_batch(self) -> None: ...

    def is_connected(self, node: int) -> bool: ...


class ReplicaRestore:
    """The replica-facing restore operations of one driver (see the module doc)."""

    def __init__(self, driver: RestoreHostDriver) -> None:
        self.d = driver

    def _step(self, event: object) -> None:
        self.d.step(event)
        self.d.end_batch()

    # -- the master (sender) -------------------------------------------------------------------

    def log_end(self) -> tuple[int, int]:
        """(epoch, last version) now."""
        r = self.d.replica
        return r.promised_epoch, r.last_version

    def last_version(self) -> int:
        return self.d.replica.last_version

    def stop_reason(self, node: int | None, epoch: int) -> str | None:
        """Why a session that began in `epoch` must stop, or None. `node` None: a backup for
        a tool, which any replica may serve."""
        if node is None:
            return None
        r = self.d.replica
        if r.role != Role.MASTER or (epoch and r.promised_epoch != epoch):
            return "this node is no longer master of that epoch"
        if not self.d.is_connected(node):
            return f"n{node} is not connected any more"
        return None

    def history_upto(self, version: int) -> tuple[int, tuple[tuple[int, int], ...]] | str:
        """(epoch of record `version`, the epoch history pairs up to it), or why not."""
        r = self.d.replica
        if version > r.last_version:
            return f"the receiver asks for v{version + 1}, beyond this log's end v{r.last_version}"
        pairs = tuple(p for p in r.history.pairs() if p[1] <= version)
        return r.history.epoch_at(version), pairs

    def caught_up(self, node: int) -> int:
        """The stream to `node` is near the log end: live forwards start now (SYNC_CACHE).
        Returns the log end the stream must still cover, read before the forwards queued
        meanwhile run."""
        self.d.step(PeerRestoreCaughtUp(node))
        switched_at = self.d.replica.last_version
        self.d.end_batch()
        return switched_at

    def sender_failed(self, node: int, reason: str) -> None:
        self._step(PeerRestoreFailed(node, reason))

    # -- the follower (receiver) -----------------------------------------------------------------

    def begin_refusal(self, node: int, epoch: int) -> str | None:
        """Begin a session from master `node` of `epoch`: None when begun, WAIT while the
        follower has not matched its log yet (its SyncStart has not arrived), else why not."""
        r = self.d.replica
        following = r.role in (Role.SLAVE, Role.SYNCING) and r.master == node and r.promised_epoch == epoch
        if not following:
            return f"not following n{node} in e{epoch} (role {r.role.describe()}, e{r.promised_epoch})"
        if not r.sync_started:
            return WAIT
        self._step(RestoreBegun(node, epoch))
        return None if r.restoring else "the replica refused the restore"

    def restoring_refusal(self, node: int) -> str | None:
        r = self.d.replica
        if not r.restoring or r.master != node:
            return "the replica left the restore (it resynced: sync cache overflow or a gap)"
        return None

    def wal_from(self, app_version: int) -> int:
        """The first version to ask the WAL from: the app's version may be beyond the log's
        end (the restored files, or files a crash left installed before the WAL reset)."""
        return max(self.d.replica.last_version, app_version) + 1

    def rebase_refusal(self, base: int, prev_epoch: int) -> str | None:
        """Bad data from the sender: a rebase to an epoch the replica would refuse (checked
        before the WAL is reset)."""
        r = self.d.replica
        if base > r.last_version and not 1 <= prev_epoch <= r.promised_epoch:
            return f"wal_begin at v{base + 1} with prev epoch e{prev_epoch}, outside e1..e{r.promised_epoch}"
        return None

    def rebase(self, node: int, base: int, prev_epoch: int, history: tuple[tuple[int, int], ...]) -> str | None:
        """The restored files hold every version up to `base`: when that is beyond the log,
        reset the WAL to continue after it and rebase the replica's log."""
        why = self.restoring_refusal(node)
        if why:
            return why
        r = self.d.replica
        if base > r.last_version:
            self.d.storage.rebase(base, prev_epoch)
            self._step(LogRebased(prev_epoch, base, history))
            if r.last_version != base:
                return f"the replica refused to rebase at v{base}"
        return None

    def feed(self, node: int, block: bytes, scan: Any, prev_epoch: int) -> str | None:
        """Whole records from the WAL stream (`scan` over `block`; `prev_epoch` the epoch of
        the record before the first): records the log holds are skipped (seed: 如果小, 直接扔掉),
        a gap is refused; the rest are a forward batch of the master."""
        why = self.restoring_refusal(node)
        if why:
            return why
        r = self.d.replica
        versions = scan.versions
        first, last = int(versions[0]), int(versions[-1])
        if last <= r.last_version:
            return None
        if first > r.last_version + 1:
            return f"gap: restored records start at v{first}, the log ends at v{r.last_version}"
        k = r.last_version + 1 - first
        if k:
            prev_epoch = int(scan.epochs[k - 1])
            block = block[int(scan.offsets[k]) :]
        try:
            prev, epochs, payloads, blk = _wire.decode_forward_body(
                _U64.pack(prev_epoch) + block, first + k, r.cfg.record_max_bytes
            )
        except FrameError as exc:
            return str(exc)
        self._step(RestoredRecords(node, ForwardBatch(r.promised_epoch, first + k, prev, epochs, payloads, blk)))
        if r.last_version < last:
            return f"the replica did not take restored v{first + k}..v{last} (log at v{r.last_version})"
        return None

    def end(self, node: int, last_version: int) -> int | str:
        """The WAL stream ended at `last_version`: the follower becomes a slave (when its
        sync cache is drained). Returns its log end, or why not."""
        why = self.restoring_refusal(node)
        if why:
            return why
        r = self.d.replica
        if r.last_version < last_version:
            return f"the WAL stream ended at v{last_version} but the log is at v{r.last_version}"
        self._step(RestoreEnded(node, True))
        return r.last_version

    def receiver_failed(self, node: int, reason: str) -> None:
        if self.d.replica.restoring:
            self._step(RestoreEnded(node, False, reason))
