"""One vgroup hosted by a node: a reference Vnode embedding one SyncInstance.

Owns: the vgroup's state and life (open with crash recovery, start, stop), the sync
instance's callbacks (the no-op a new master forwards at once, the slave's `write_to_cache`:
apply, then `ack_forward`; the master's outcomes in `_confirm`: apply to the memtable once
the record's outcome is known, answer the client; WAL truncation: rebuild the memtable), the
flush trigger (in a background thread, so the I/O thread never waits for Parquet) with the
group's commit index as its limit, and the vgroup's status. docs/operations.md §The write
path explains the ordering. Two mixins hold the rest, on this state:
vrepl/node/vgroup_client.py (the client API: writes, retried writes, queries, ingest over
HTTP) and vrepl/node/vgroup_restore.py (the `needs_restore` state and the self-restore
thread, vrepl/node/selfrestore.py).

Threads: everything here except `open()`/`stop()` and the self-restore thread runs on the
process's I/O thread (the sync instance's asyncio loop, shared with the HTTP server), so
role, versions and pending writes need no lock. Flushes run on `flush_executor`; queries on
the default executor; a self-restore on its own thread (it stops and starts the sync
instance, which must not be done from the I/O thread).
Must not: write the WAL (the sync instance owns it) or block the I/O thread on disk.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from typing import Any

from vrepl.node import selfrestore
from vrepl.node.config import NodeConfig, VgroupSpec
from vrepl.node.ingest import Rounds
from vrepl.node.txnhost import Txns
from vrepl.node.vgroup_client import KIND_ARROW, KIND_JSON, KIND_LINES, VgroupClientApi, _Pending
from vrepl.node.vgroup_restore import (NEEDS_RESTORE, SELF_RESTORE_RETRY_MAX_MS, SERVING,
                                       VgroupSelfRestore)
from vrepl.replica import AckStatus, ConfirmStatus, invariant
from vrepl.restore.receiver import recover_interrupted_swap
from vrepl.sync import FlowControlError, NotRunningError, SyncCallbacks, SyncInstance, SyncObservers
from vrepl.vnode import Vnode
from vrepl.vnode.errors import VnodeError
from vrepl.vnode.rows import NOOP_PAYLOAD
from vrepl.vnode.staging import is_ingest_payload

# Names other modules import from here (vrepl/node/server.py: the write kinds).
__all__ = ["KIND_ARROW", "KIND_JSON", "KIND_LINES", "NEEDS_RESTORE", "SELF_RESTORE_RETRY_MAX_MS",
           "SERVING", "VgroupHost"]

log = logging.getLogger("vrepl.node")

# Statuses after which the record IS in this node's WAL (docs/embedding.md: NOT_MASTER means
# "version not consumed"; FAILED during stop() may be a record never appended, see _confirm).
_IN_LOG = (ConfirmStatus.OK, ConfirmStatus.TIMED_OUT, ConfirmStatus.FAILED)
TXN_ROWS_PREFIX = b'VRB\x09{"op":"rows"'   # a transaction's rows record: no files to stage

STOP_JOIN_S = 10.0                  # how long stop() waits for a self-restore to give up


class VgroupHost(VgroupClientApi, VgroupSelfRestore):
    def __init__(self, node_cfg: NodeConfig, spec: VgroupSpec,
                 flush_executor: concurrent.futures.Executor,
                 observers: SyncObservers | None = None) -> None:
        self.node_cfg = node_cfg
        self.spec = spec
        self.id = spec.id
        self.node_id = node_cfg.node_id
        self.path = node_cfg.vgroup_path(spec.id)
        self.flush_executor = flush_executor
        self.observers = observers       # the node's metrics histograms (vrepl/node/metrics.py)
        self.vnode: Vnode | None = None
        self.sync: SyncInstance | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.role = "unsynced"
        self.epoch = 0
        self.master: int | None = None
        self.next_version = 0
        self.confirmed_through = 0       # highest version confirmed OK while master
        # version -> a forwarded write whose outcome is not known yet.
        self.pending: dict[int, _Pending] = {}
        self.pending_rids: dict[str, int] = {}
        self.stopping = False
        self.flushing = False
        self.flushes = 0
        self.flush_errors = 0
        self.recovered_records = 0
        self.role_changes: list[tuple[float, str, int]] = []
        self.counters = dict.fromkeys(("writes_ok", "writes_bad", "writes_not_master",
                                       "writes_unknown", "writes_overloaded",
                                       "writes_duplicate", "rows_written", "apply_errors",
                                       "writes_needs_restore", "self_restores",
                                       "self_restore_failures"), 0)
        # The no-op record a new master forwards (docs/vnode.md §2), until its outcome.
        self.noop_version = 0
        self.noop_epoch = 0
        # docs/operations.md §needs_restore: SERVING, or NEEDS_RESTORE with the details.
        self.state = SERVING
        self.needs_restore: dict[str, Any] | None = None
        self.last_self_restore: dict[str, Any] | None = None
        self._restorer: threading.Thread | None = None
        self._restore_stop = threading.Event()
        self._life_lock = threading.Lock()    # sync/vnode swapped by a self-restore vs stop()
        # Rounds of ingested files (docs/vnode.md §9, vrepl/node/ingest.py).
        self.rounds = Rounds(self)
        # Transactions (docs/transactions.md, vrepl/node/txnhost.py).
        self.txns = Txns(self)

    # -- start / stop (main thread) -----------------------------------------------------------
    def open(self) -> int:
        """Load the manifest and replay the WAL into the memtable (crash recovery). A vgroup
        whose WAL ends below its archived version is opened without replay and starts in
        needs_restore (start() then restores it instead of replicating)."""
        if os.path.isdir(self.path):
            # A swap that a crash interrupted is finished (or abandoned) before the vnode
            # reads its files: a self-restore's (complete copy) first, then the restore
            # flow's (docs/restore.md).
            done = selfrestore.roll_forward(self.path)
            if done:
                log.warning("vg%d n%d: self-restore swap after a crash: %s", self.id,
                            self.node_id, done)
            done = recover_interrupted_swap(self.path)
            if done:
                log.warning("vg%d n%d: restore swap after a crash: %s", self.id, self.node_id,
                            done)
        self.vnode = Vnode(self.path, self.node_cfg.vnode,
                           txn_label_retention_ms=self.node_cfg.txn.label_retention_ms)
        reason = selfrestore.wal_below_archive(self.path, self.node_cfg.vnode.max_payload_bytes)
        if reason is not None:
            self._mark_needs_restore(f"at start-up: {reason}")
            return 0
        self.recovered_records = self.vnode.recover()
        return self.recovered_records

    def _callbacks(self, vnode: Vnode) -> SyncCallbacks:
        return SyncCallbacks(write_to_cache_batch=self._write_to_cache_batch,
                             confirm_forward_range=self._confirm,
                             notify_role=self._notify_role,
                             notify_flow_control=self._notify_flow_control,
                             notify_wal_truncated=self._notify_wal_truncated,
                             # A size or age flush waiting for committed rows goes at once.
                             notify_commit=lambda version: self._maybe_flush(),
                             get_version=vnode.get_version,
                             # The restore flow's callbacks (docs/vnode.md §7).
                             get_file_info=vnode.get_file_info,
                             get_wal_info=vnode.get_wal_info,
                             notify_file_synced=vnode.notify_file_synced,
                             # Rounds of ingested files (docs/vnode.md §9).
                             serve_fetch=self.rounds.serve_fetch,
                             get_acked_version=self.rounds.acked_version_at_start)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        invariant(self.vnode is not None, "a vgroup starts after its vnode is open")
        if self.state == NEEDS_RESTORE:
            self._start_restorer()      # no replication on data that needs a restore
            return
        self.sync = SyncInstance(self.node_cfg.sync_config(self.spec), self._callbacks(self.vnode),
                                 restore=self.node_cfg.restore, observers=self.observers)
        self.sync.start()
        loop.call_soon_threadsafe(self.rounds.resume)    # rounds recovery found unstaged

    def stop(self) -> None:
        """Stop replicating (queued forwards fail), then flush the committed rows and close
        the vnode (the rows above the commit index are replayed from the WAL at the next
        start). A vgroup in needs_restore archives nothing."""
        self.stopping = True
        self._restore_stop.set()
        if self._restorer is not None:
            self._restorer.join(STOP_JOIN_S)
        with self._life_lock:
            limit = 0
            if self.sync is not None:
                self.sync.stop()
                limit = self.sync.committed_version
            self.rounds.stop()
            if self.vnode is not None:
                self.vnode.close(up_to_version=limit if self.state == SERVING else 0)

    # -- callbacks (I/O thread) ------------------------------------------------------------
    def _notify_role(self, role: str, epoch: int, master: int | None) -> None:
        self.role, self.epoch, self.master = role, epoch, master
        self.role_changes.append((time.time(), role, epoch))
        del self.role_changes[:-20]
        if self.vnode is not None:
            self.vnode.notify_role(role)
        # The sync layer logs the change (event role_change, docs/operations.md §Logs).
        log.debug("vg%d n%d: role %s, epoch %d, master %s", self.id, self.node_id, role, epoch,
                  master)
        if role == "master" and self.sync is not None:
            # Versions continue the log: a new master's WAL ends where its slave WAL ended.
            self.next_version = self.sync.last_version() + 1
            self._forward_noop(epoch)
            self.txns.became_master()

    def _forward_noop(self, epoch: int) -> None:
        """A new master commits the records it inherited from older epochs only together
        with a record of its own epoch (Raft's rule, in the core). Forward one at once, a
        no-op (docs/vnode.md §2), so they are committed, and archivable, without waiting for
        a client's write."""
        if self.stopping or self.state != SERVING:
            return
        version = self.next_version
        try:
            self.sync.forward(version, NOOP_PAYLOAD)  # type: ignore[union-attr]
        except (FlowControlError, NotRunningError) as exc:
            log.warning("vg%d n%d: no-op at v%d not forwarded (the first write commits the"
                        " inherited records instead): %s", self.id, self.node_id, version, exc)
            return
        self.noop_version, self.noop_epoch = version, epoch
        self.next_version = version + 1

    def _notify_flow_control(self, level: int) -> None:
        if self.vnode is not None:
            self.vnode.notify_flow_control(level)

    def _record_epoch(self, version: int) -> int:
        # write_to_cache_batch does not pass the record epochs (the WriteToCacheBatch action
        # has them): read them from the replica's epoch history, on this same thread.
        try:
            return self.sync.record_epoch(version)  # type: ignore[union-attr]
        except Exception:
            return self.epoch

    def _write_to_cache_batch(self, first: int, payloads: tuple[bytes, ...]) -> None:
        vnode, sync = self.vnode, self.sync
        assert vnode is not None and sync is not None
        if self.state != SERVING:
            return      # replication is being stopped: nothing applied, nothing acked
        last = first + len(payloads) - 1
        # Record epochs never go down within a log, so when the first and the last record of
        # the batch share an epoch, every record has it: one history lookup per batch
        # instead of one per record (the usual case; a batch that spans an epoch change
        # looks each record up).
        epoch = self._record_epoch(first)
        uniform = epoch == self._record_epoch(last)
        for i, payload in enumerate(payloads):
            version = first + i
            try:
                vnode.write_to_cache(version, epoch if uniform else self._record_epoch(version), payload)
            except VnodeError as exc:
                self.counters["apply_errors"] += 1
                log.error("vg%d n%d: cannot apply v%d: %s", self.id, self.node_id, version, exc)
                sync.ack_forward(version, AckStatus.FAILED)
                return
            if payload[3:4] == b"\x08" and is_ingest_payload(payload):
                self.rounds.on_record(version)     # stage the round's files if missing here
            elif payload[3:4] == b"\x09" and not payload.startswith(TXN_ROWS_PREFIX):
                # A transaction's files record (stage its files), publish or abort (its
                # records' staging jobs end): docs/transactions.md §4.1.
                self.rounds.resume()
        # Acks are cumulative: nothing at or above a round whose files are not staged here
        # yet (docs/vnode.md §9.3); staging it acks the rest (Rounds._staged).
        bound = self.rounds.ack_bound(last)
        if bound >= first:
            sync.ack_forward(bound)
        self._maybe_flush()

    def _confirm(self, first: int, last: int, status: ConfirmStatus) -> None:
        """Outcomes of forwards, in version order. The master applies a record to the memtable
        here, not before forward(): a record refused with NOT_MASTER never reached the WAL and
        must not reach the memtable either. OK, TIMED_OUT and FAILED records are in the WAL
        (TIMED_OUT may still be confirmed by the group; FAILED is a step-down), so they are
        applied, keeping memtable == WAL; a later truncation rebuilds the memtable. While
        stopping, FAILED may also be a queued record that never reached the WAL: nothing is
        applied then, and the next start replays the WAL."""
        vnode = self.vnode
        assert vnode is not None
        apply = status in _IN_LOG and not (self.stopping and status == ConfirmStatus.FAILED)
        if status == ConfirmStatus.OK:
            self.confirmed_through = max(self.confirmed_through, last)
        noop = self.noop_version
        if noop and first <= noop <= last:
            # The no-op comes before every write of this mastership: applied first.
            self.noop_version = 0
            if apply:
                try:
                    vnode.write_to_cache(noop, self.noop_epoch, NOOP_PAYLOAD)
                except VnodeError as exc:   # closed while stopping
                    log.warning("vg%d: no-op v%d not applied: %s", self.id, noop, exc)
        pending, rounds = self.pending, self.rounds
        txns = self.txns
        if not pending and not rounds.forwarded and not rounds.noops and not txns.forwarded:
            return
        for version in range(first, last + 1):
            if (rounds.forwarded or rounds.noops) and rounds.confirm(version, status, apply):
                continue
            if txns.forwarded and txns.confirm(version, status, apply):
                continue
            entry = pending.pop(version, None)
            if entry is None:
                continue
            rid = entry.rid
            if apply:
                try:
                    vnode.apply_prepared(version, entry.epoch, entry.rows, entry.nbytes, rid)
                except VnodeError as exc:   # closed while stopping
                    log.warning("vg%d: v%d not applied: %s", self.id, version, exc)
            if rid is not None:
                self.pending_rids.pop(rid, None)
            if entry.timer is not None:
                entry.timer.cancel()
            if not entry.answer.done():
                entry.answer.set_result(self._answer(status, version, len(entry.rows), False,
                                                     entry.epoch))
            if entry.status is not None and not entry.status.done():
                entry.status.set_result(status)
        if apply:
            self._maybe_flush()

    def _notify_wal_truncated(self, version: int) -> None:
        """The WAL was cut after `version` (a deposed master's suffix): rebuild the memtable.
        A cut below the archived version cannot be undone locally (archived files hold
        versions the log no longer has): the vgroup needs a restore."""
        vnode = self.vnode
        invariant(vnode is not None, "the WAL is cut under an open vnode")
        if self.state != SERVING:
            return
        archived = vnode.archived_version
        if version < archived:
            self._enter_needs_restore(f"WAL truncated after v{version}, below the archived"
                                      f" version v{archived}")
            return
        self.rounds.cut_after(version)
        try:
            n = vnode.rebuild()
            log.warning("vg%d n%d: WAL truncated after v%d: memtable rebuilt (%d records)",
                        self.id, self.node_id, version, n)
            self.rounds.resume()
        except VnodeError as exc:
            self._enter_needs_restore(f"WAL truncated after v{version}: {exc}")

    # -- flush ------------------------------------------------------------------------------
    def _maybe_flush(self) -> None:
        # No flush while a restore replaces the files under the vnode (role syncing).
        if self.flushing or self.stopping or self.vnode is None or self.role == "syncing" \
                or self.state != SERVING or self.sync is None:
            return
        # Only what the group committed may be archived (docs/vnode.md §5): read the commit
        # index here, on the I/O thread, when the flush is decided.
        limit = self.sync.committed_version
        reason = self.vnode.flush_due(up_to_version=limit)
        if reason is None:
            return
        self.flushing = True
        log.info("vg%d n%d: flush up to v%d: %s", self.id, self.node_id, limit, reason,
                 extra={"event": "flush", "up_to_version": limit})
        fut = self.loop.run_in_executor(self.flush_executor, self.vnode.flush,  # type: ignore[union-attr]
                                        None, limit)
        fut.add_done_callback(self._flushed)

    def _flushed(self, fut: asyncio.Future) -> None:
        self.flushing = False
        exc = fut.exception()
        if exc is not None:
            self.flush_errors += 1
            log.error("vg%d n%d: flush failed: %s", self.id, self.node_id, exc)
            return
        self.flushes += 1
        if self.vnode is not None:
            self.rounds.flushed(self.vnode.archived_version)
        # The WAL below the archived version may go now (docs/vnode.md §5). The sync instance
        # owns the WAL, so it deletes the files, on its WAL thread (sealed files only).
        if not self.stopping and self.state == SERVING and self.sync is not None \
                and self.vnode is not None:
            try:
                self.sync.recycle_wal(self.vnode.archived_version + 1)
            except Exception as exc:   # not running: the next flush tries again
                log.warning("vg%d n%d: WAL recycling: %s", self.id, self.node_id, exc)

    def tick(self) -> None:
        """Periodic (flush_check_ms): the memtable age limit; transaction timeouts (master)."""
        self._maybe_flush()
        self.txns.tick()

    def status(self) -> dict[str, Any]:
        sync, vnode = self.sync, self.vnode
        invariant(vnode is not None, "status is asked after the vnode is open")
        arb = self.spec.arbitrator
        doc: dict[str, Any] = {
            "vgroup": self.id, "state": self.state, "role": self.role, "epoch": self.epoch,
            "master": self.master, "master_http": self.master_http(),
            "version": vnode.get_version(), "wal_last_version": 0, "wal_durable_version": 0,
            "confirmed_version": self.confirmed_through, "committed_version": 0,
            "replicas": {}, "peers": {},
            "arbitrator": {"address": arb, "used": False, "connected": False, "lease": None},
            "flow_control": 0, "pending_writes": len(self.pending),
            "vnode": {**vnode.status(), "flushes": self.flushes, "flush_errors": self.flush_errors,
                      "recovered_records": self.recovered_records},
            "needs_restore": dict(self.needs_restore) if self.needs_restore else None,
            "last_self_restore": self.last_self_restore,
            "counters": dict(self.counters),
            "ingest": self.rounds.status(),
            "txn": self.txns.status(),
        }
        if self.state != SERVING or sync is None:
            # Replication is stopped: this replica takes no part in the group.
            doc.update(role="unsynced", master=None, master_http=None)
            return doc
        roles = sync.roles()
        stats = sync.stats()
        peers = {}
        for node, p in stats.get("peers", {}).items():
            peers[str(node)] = {"role": roles["replicas"].get(node, "offline"),
                                "acked_version": p.get("acked_version"),
                                "lag_versions": p.get("lag_versions"),
                                "lag_ms": p.get("lag_ms"),
                                "last_heard_ms": p.get("last_heard_ms"),
                                "state": p.get("state")}
        doc.update({
            "wal_last_version": roles["last_version"],
            "wal_durable_version": stats["wal"]["durable_version"],
            "committed_version": sync.committed_version,
            "replicas": {str(n): r for n, r in roles["replicas"].items()},
            "peers": peers,
            "arbitrator": {"address": arb, "used": sync.cfg.arbitrator_used,
                           "connected": stats.get("arbitrator_connected", False),
                           "lease": stats.get("arbitrator_lease")},
            "flow_control": stats.get("flow_control", 0),
        })
        return doc
