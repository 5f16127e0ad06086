"""The follower's role: its state and what only a follower does (docs/design.md §4.2, §4.3, §4.4).

Owns: `Follower`: the master it follows in its promised epoch, whether that master confirmed
its log is a prefix of its own (`sync_started`) and up to where (`matched_version`), the
sync cache of forwards ahead of the log end, the acks sent, the master's commit version, a
restore session from the master. Its handlers: forwards and batches, SyncStart and
TruncateRequest (log matching), Commit, the restore events, the app's recover; and the
refusal of a master whose message contradicts what this follower matched with it.
Must not: exist outside syncing/slave: `Replica._become_follower` creates it and every other
transition drops it (role.py); change the role but through the Replica's transitions; do I/O.
"""

from __future__ import annotations

from vrepl._core.frame import HEADER_SIZE_BYTES as RECORD_HEADER_BYTES
from vrepl.replica.actions import (
    LogLevel,
    PersistBatch,
    PersistRecords,
    ResetConnection,
    Send,
    TruncateWalAfter,
    WriteToCache,
    WriteToCacheBatch,
)
from vrepl.replica.events import AppRecover, LogRebased, RestoreBegun, RestoredRecords, RestoreEnded
from vrepl.replica.forward import SyncCache
from vrepl.replica.history import EpochHistory, history_invalid
from vrepl.replica.host import ReplicaHost
from vrepl.replica.messages import (
    AckStatus,
    Commit,
    Forward,
    ForwardAck,
    ForwardBatch,
    Record,
    Role,
    SyncRequest,
    SyncStart,
    TruncateRequest,
)
from vrepl.replica.role import RoleState

# In the reason a follower gives when a master asks it to cut records at or below its commit
# version (docs/design.md §4.4): only a bug can send that. Logged at ERROR; the simulator
# fails a run that logs it (vrepl/testing/sim/world.py).
CUTS_COMMITTED_RECORDS = "cuts committed records"


class Follower(RoleState):
    """Following `master_node` in `r.promised_epoch`: log matching, acks, commits, restore."""

    __slots__ = (
        "master_node",
        "sync_started",
        "matched_version",
        "sync_target_version",
        "acked_sent_version",
        "master_commit_version",
        "restoring",
        "cache",
    )

    ROLES = (Role.SYNCING, Role.SLAVE)

    def __init__(self, r: ReplicaHost, master_node: int) -> None:
        super().__init__(r)
        self.master_node = master_node
        self.sync_started = False  # the master confirmed my log is a prefix of its own
        self.matched_version = 0  # my log matches the master's up to here
        self.sync_target_version = 0  # the master's log end when it answered SyncStart
        self.acked_sent_version = 0
        self.master_commit_version = 0  # the last Commit of the master followed now
        self.restoring = False  # a restore session from the master runs (docs/restore.md)
        self.cache = SyncCache(r.cfg.sync_cache_max_records, r.cfg.sync_cache_max_bytes)

    def _from_master(self, i: int, epoch: int) -> bool:
        return self.r.nodes[i] == self.master_node and epoch == self.r.promised_epoch

    # ------------------------------------------------------------------ log matching (§4.3)

    def send_sync_request(self, why: str) -> None:
        r = self.r
        r.counters["resyncs"] += 1
        r._log(LogLevel.INFO, f"sync request to n{self.master_node}: {why}")
        r._emit(Send(self.master_node, SyncRequest(r.promised_epoch, r.last_epoch, r.last_version)))

    def resync(self, why: str) -> None:
        self.cache.clear()
        self.sync_started = False
        self.restoring = False  # the transport aborts the session when it sees this
        self.r._become_syncing()
        self.send_sync_request(why)

    def on_sync_start(self, i: int, msg: SyncStart) -> None:
        r = self.r
        if not self._from_master(i, msg.epoch) or r.truncating_to is not None:
            super().on_sync_start(i, msg)
            return
        if msg.first_version != r.last_version + 1:
            self.resync(f"sync start at v{msg.first_version} but my log ends at v{r.last_version}")
            return
        self.sync_started = True
        self.matched_version = r.last_version
        self.sync_target_version = msg.last_version
        self.cache.drop_through(r.last_version)
        appended: list[Record] = []
        self._drain_cache(appended)
        self._persist(appended)
        if not self.left:
            self.update_role()
            self.maybe_ack()

    def on_truncate_request(self, i: int, req: TruncateRequest) -> None:
        r = self.r
        if not self._from_master(i, req.epoch) or r.truncating_to is not None:
            super().on_truncate_request(i, req)
            return
        _, own_end = r.history.end_of_epoch_at_most(req.keep_epoch, r.last_version)
        cut = min(req.keep_version, own_end)
        if cut >= r.last_version:
            self.send_sync_request("nothing to truncate")
            return
        if cut < r.commit_version:
            # docs/design.md §4.4: committed records are in every later master's log, so no
            # correct master asks for them to be cut. A peer's message is never an invariant
            # here: refused like the one below, but logged at ERROR (a bug somewhere), and the
            # simulator fails a run that logs it.
            self._refuse_master(
                f"refused {req.describe()}: it {CUTS_COMMITTED_RECORDS} v{cut + 1}..v{r.commit_version}", LogLevel.ERROR
            )
            return
        if cut < self.matched_version:
            # A peer's message, not a bug here: the master would cut records it matched with
            # this log (its restore stream sent records its own log lacks, say). Refused;
            # the follower starts over and matches from scratch (docs/design.md §4.3).
            self._refuse_master(
                f"refused {req.describe()}: it cuts v{cut + 1}..v{self.matched_version},"
                f" which matched n{r.nodes[i]}'s log"
            )
            return
        r.truncating_to = cut
        self.sync_started = False
        self.cache.clear()
        r.counters["truncations"] += 1
        r._log(LogLevel.WARNING, f"truncating e{r.last_epoch}v{r.last_version} after v{cut}")
        r._become_syncing()
        r._emit(TruncateWalAfter(cut))

    def _refuse_master(self, reason: str, level: LogLevel = LogLevel.WARNING) -> None:
        """The master sent what contradicts the log it matched with this follower: bad input
        from a peer. Logged, connection reset, unsynced: after it reconnects the follower
        sends a new SyncRequest and the logs are matched from scratch. Leaves this role."""
        r = self.r
        r._log(level, reason)
        r._emit(ResetConnection(self.master_node, reason))
        r._mark_offline(r._index[self.master_node], "refused its messages")
        r._become_unsynced(reason)

    def _record_epoch_refusal(self, fwd: Forward) -> str | None:
        """Why a forward that extends the log cannot be appended (its record epoch), or None:
        epochs never go back along a log, and no record is newer than the master's epoch."""
        r = self.r
        if r.last_epoch <= fwd.record_epoch <= r.promised_epoch:
            return None
        return (
            f"refused {fwd.describe()} from n{self.master_node}: record epoch e{fwd.record_epoch} outside"
            f" e{r.last_epoch}..e{r.promised_epoch}"
        )

    # ------------------------------------------------------------------ forwards (§4.2)

    def fast_append(self, i: int, batch: ForwardBatch) -> bool:
        """The fast path of on_forwards for a batch that extends the log as it is: the same
        checks, made once for the batch (docs/design.md §4.2)."""
        r = self.r
        epochs = batch.record_epochs
        if not (
            batch.first_version == r.last_version + 1
            and batch.prev_epoch == r.last_epoch
            and self.sync_started
            and r.truncating_to is None
            and not len(self.cache)
            and self._from_master(i, batch.epoch)
            and epochs[0] == epochs[-1]
            and r.last_epoch <= epochs[0] <= batch.epoch
            and epochs.count(epochs[0]) == len(epochs)  # one epoch (a C loop, no set)
        ):
            return False
        n = len(batch.payloads)
        r.counters["forwards_received"] += n
        block = batch.block
        # The block is the same records as WAL records (a 36-byte header each): its length
        # gives the payload bytes without a pass over the payloads.
        r.counters["forward_bytes_received"] += (
            len(block) - RECORD_HEADER_BYTES * n if block else sum(map(len, batch.payloads))
        )
        epoch = epochs[0]
        r.history.note_append(epoch, batch.first_version)
        r.last_version = batch.first_version + n - 1
        r.last_epoch = epoch
        self.matched_version = r.last_version
        r._emit(PersistBatch(batch.first_version, epochs, batch.payloads, batch.block))
        r._emit(WriteToCacheBatch(batch.first_version, epochs, batch.payloads))
        self.update_role()
        self.maybe_ack()
        return True

    def on_forwards(self, i: int, epoch: int, fwds: tuple[Forward, ...]) -> None:
        r = self.r
        if not self._from_master(i, epoch):
            super().on_forwards(i, epoch, fwds)
            return
        if r.truncating_to is not None:
            return  # resent by the stream after the truncation
        appended: list[Record] = []
        for fwd in fwds:
            if not self._take_forward(fwd, appended):
                break
        self._persist(appended)
        if not self.left:
            self.update_role()
            self.maybe_ack()

    def _take_forward(self, fwd: Forward, appended: list[Record]) -> bool:
        """Append, cache or drop one forward; False when the follower had to resync or left."""
        r = self.r
        if not self.sync_started or fwd.version > r.last_version + 1:
            refusal = self.cache.add(fwd)
            if refusal:
                self.resync(refusal)
                return False
            return True
        if fwd.version <= r.last_version:
            if fwd.version <= self.matched_version and r.history.epoch_at(fwd.version) != fwd.record_epoch:
                # A peer's message, not a bug here: the master contradicts a record it matched.
                self._refuse_master(
                    f"refused {fwd.describe()}: matched v{fwd.version} is e{r.history.epoch_at(fwd.version)}"
                )
                return False
            return True  # a duplicate from the stream
        if fwd.prev_epoch != r.last_epoch:
            self.resync(f"v{fwd.version} follows e{fwd.prev_epoch} but my last record is e{r.last_epoch}")
            return False
        refusal = self._record_epoch_refusal(fwd)
        if refusal:
            self._refuse_master(refusal)
            return False
        self._append(fwd, appended)
        self._drain_cache(appended)
        return not self.left

    def _append(self, fwd: Forward, appended: list[Record]) -> None:
        r = self.r
        record = Record(fwd.record_epoch, fwd.version, fwd.payload)
        r.history.note_append(record.epoch, record.version)
        r.last_version = record.version
        r.last_epoch = record.epoch
        self.matched_version = record.version
        if len(self.cache):
            # A copy of this forward cached before the sync started (a live forward that came
            # ahead of the stream): the log has it now, and update_role waits for an empty
            # cache (simulator finding 6).
            self.cache.pop(record.version)
        appended.append(record)

    def _drain_cache(self, appended: list[Record]) -> None:
        r = self.r
        while True:
            fwd = self.cache.pop(r.last_version + 1)
            if fwd is None:
                return
            if fwd.prev_epoch != r.last_epoch:
                self.resync(f"cached v{fwd.version} follows e{fwd.prev_epoch}, my last is e{r.last_epoch}")
                return
            refusal = self._record_epoch_refusal(fwd)
            if refusal:
                self._refuse_master(refusal)
                return
            self._append(fwd, appended)

    def _persist(self, appended: list[Record]) -> None:
        """Persist and apply what was appended, even if this follower left its role since:
        the records are in the log."""
        if not appended:
            return
        r = self.r
        r._emit(PersistRecords(tuple(appended)))
        for record in appended:
            r._emit(WriteToCache(record))

    def update_role(self) -> None:
        r = self.r
        caught_up = (
            self.sync_started
            and not self.restoring
            and r.last_version >= self.sync_target_version
            and not len(self.cache)
        )
        if caught_up:
            r._become_slave()
        else:
            r._become_syncing()

    # ------------------------------------------------------------------ acks and commits (§4.2, §4.4)

    def on_durable(self, version: int) -> None:
        self.maybe_ack()

    def on_quorum_changed(self) -> None:
        self.maybe_ack()

    def maybe_ack(self) -> None:
        """Ack cumulatively what is durable, matches the master, and (if required) applied."""
        r = self.r
        if self.master_commit_version > r.commit_version:
            self.commit()  # durable or matched may have grown
        if not self.sync_started:
            return
        point = min(r.durable_version, self.matched_version)
        if r.cfg.app_ack_required_effective:
            point = min(point, r.app_acked_version)
        if point <= self.acked_sent_version:
            return
        self.acked_sent_version = point
        r.counters["acks_sent"] += 1
        r._emit(Send(self.master_node, ForwardAck(r.promised_epoch, point, AckStatus.OK)))

    def on_commit(self, i: int, msg: Commit) -> None:
        if not self._from_master(i, msg.epoch):
            super().on_commit(i, msg)
            return
        if msg.version > self.master_commit_version:
            self.master_commit_version = msg.version
            self.commit()

    def commit(self) -> None:
        """A follower's commit version: what its master committed, as far as this node's
        own log is durable and known to match the master's (so the records are the
        committed ones, not a deposed master's records at the same versions)."""
        r = self.r
        if r.truncating_to is not None:
            return
        point = min(self.master_commit_version, r.durable_version, self.matched_version)
        if point > r.commit_version:
            r._advance_commit(point)

    def on_app_failed(self, version: int) -> None:
        self.r._emit(ResetConnection(self.master_node, f"app failed to apply v{version}"))
        self.r._become_unsynced(f"app failed to apply v{version}")

    def on_app_recover(self, ev: AppRecover) -> None:
        if self.r.truncating_to is not None:
            super().on_app_recover(ev)
            return
        self.resync("the app asked to recover")

    # ------------------------------------------------------------------ restore (docs/restore.md)

    def on_restore_begun(self, i: int, ev: RestoreBegun) -> None:
        r = self.r
        if not self._from_master(i, ev.epoch) or not self.sync_started or r.truncating_to is not None:
            super().on_restore_begun(i, ev)
            return
        self.restoring = True
        r.counters["restores_begun"] += 1
        r._become_syncing()
        r._log(LogLevel.INFO, f"restore from n{ev.node} begun at e{r.last_epoch}v{r.last_version}")

    def on_log_rebased(self, ev: LogRebased) -> None:
        r = self.r
        if not self.restoring or ev.last_version <= r.last_version:
            self._rebase_ignored(ev, self.restoring)
            return
        if not 1 <= ev.last_epoch <= r.promised_epoch:
            # The epoch comes from the master's WAL_BEGIN: a peer's value, refused, not a bug.
            r._log(LogLevel.WARNING, f"refused {ev.describe()}: epoch outside e1..e{r.promised_epoch}")
            return
        pairs = tuple(p for p in ev.epoch_history if p[1] <= ev.last_version) or ((ev.last_epoch, ev.last_version),)
        if history_invalid(pairs, ev.last_epoch, ev.last_version) is not None:
            pairs = ((ev.last_epoch, ev.last_version),)
        r.history = EpochHistory(pairs)
        r.last_epoch, r.last_version = ev.last_epoch, ev.last_version
        self.matched_version = ev.last_version
        r.durable_version = r.app_acked_version = ev.last_version
        self.cache.drop_through(ev.last_version)
        r.counters["log_rebases"] += 1
        r._status_dirty = True
        r._log(LogLevel.INFO, f"log rebased on restored files at e{ev.last_epoch}v{ev.last_version}")
        self.maybe_ack()

    def on_restored_records(self, i: int, ev: RestoredRecords) -> None:
        if not self.restoring or type(ev.batch) is not ForwardBatch:
            super().on_restored_records(i, ev)
            return
        self.r.on_forward_batch(i, ev.batch)

    def on_restore_ended(self, ev: RestoreEnded) -> None:
        if not self.restoring:
            return
        r = self.r
        self.restoring = False
        if ev.ok:
            r.counters["restores_ended_ok"] += 1
            r._log(LogLevel.INFO, f"restore from n{ev.node} done at e{r.last_epoch}v{r.last_version}")
            self.update_role()
            return
        r.counters["restores_failed"] += 1
        self.resync(f"restore failed: {ev.reason}")
