"""One vgroup hosted by a node: a reference Vnode embedding one SyncInstance.

Owns: the write path of the master (validate, assign the next version, `forward()`, apply to
the memtable once the record's outcome is known, answer the client), the slave's
`write_to_cache` (apply, then `ack_forward`), request-id dedup for retried writes, the flush
trigger (in a background thread, so the I/O thread never waits for Parquet), WAL
truncation (rebuild the memtable) and the vgroup's status. docs/operations.md §The write
path explains the ordering.

Threads: everything here except `open()`/`close()` runs on the process's I/O thread (the
sync instance's asyncio loop, shared with the HTTP server), so role, versions and pending
writes need no lock. Flushes run on `flush_executor`; queries on the default executor.
Must not: write the WAL (the sync instance owns it) or block the I/O thread on disk.
"""
from __future__ import annotations

import asyncio
import os
import concurrent.futures
import logging
import time
from typing import Any, Awaitable

from vrepl.node.config import NodeConfig, VgroupSpec
from vrepl.node.http import Response, error
from vrepl.replica import AckStatus, ConfirmStatus
from vrepl.restore import recover_interrupted_swap
from vrepl.sync import FlowControlError, NotRunningError, SyncCallbacks, SyncInstance, SyncObservers
from vrepl.vnode import Vnode
from vrepl.vnode.errors import VnodeError

log = logging.getLogger("vrepl.node")

# Statuses after which the record IS in this node's WAL (docs/embedding.md: NOT_MASTER means
# "version not consumed"; FAILED during stop() may be a record never appended, see _confirm).
_IN_LOG = (ConfirmStatus.OK, ConfirmStatus.TIMED_OUT, ConfirmStatus.FAILED)


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(ConfirmStatus.TIMED_OUT)


class _Pending:
    """A forwarded write waiting for its outcome. `answer` is the HTTP response future of the
    request that wrote it: _confirm (or the write timeout) sets it directly, so a write
    costs no Task and no coroutine (docs/perf.md §HTTP). `status` exists only once a retry
    with the same request id waits on the same record (_duplicate)."""

    __slots__ = ("answer", "rows", "nbytes", "rid", "timer", "status")

    def __init__(self, answer: asyncio.Future, rows: list, nbytes: int, rid: str | None,
                 timer: asyncio.TimerHandle | None) -> None:
        self.answer = answer
        self.rows = rows            # checked by prepare_raw; applied once the outcome is known
        self.nbytes = nbytes
        self.rid = rid
        self.timer = timer
        self.status: asyncio.Future | None = None


class VgroupHost:
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
                                       "writes_duplicate", "rows_written", "apply_errors"), 0)

    # -- start / stop (main thread) -----------------------------------------------------------
    def open(self) -> int:
        """Load the manifest and replay the WAL into the memtable (crash recovery)."""
        # A restore's file swap that a crash interrupted is finished (or abandoned) before
        # the vnode reads its files (docs/restore.md).
        done = recover_interrupted_swap(self.path) if os.path.isdir(self.path) else None
        if done:
            log.warning("vg%d n%d: restore swap after a crash: %s", self.id, self.node_id, done)
        self.vnode = Vnode(self.path, self.node_cfg.vnode)
        self.recovered_records = self.vnode.recover()
        return self.recovered_records

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        cb = SyncCallbacks(write_to_cache_batch=self._write_to_cache_batch,
                           confirm_forward_range=self._confirm,
                           notify_role=self._notify_role,
                           notify_flow_control=self._notify_flow_control,
                           notify_wal_truncated=self._notify_wal_truncated,
                           get_version=self.vnode.get_version,  # type: ignore[union-attr]
                           # The restore flow's callbacks (docs/vnode.md §7).
                           get_file_info=self.vnode.get_file_info,  # type: ignore[union-attr]
                           get_wal_info=self.vnode.get_wal_info,  # type: ignore[union-attr]
                           notify_file_synced=self.vnode.notify_file_synced)  # type: ignore[union-attr]
        self.sync = SyncInstance(self.node_cfg.sync_config(self.spec), cb,
                                 restore=self.node_cfg.restore, observers=self.observers)
        self.sync.start()

    def stop(self) -> None:
        """Stop replicating (queued forwards fail), then flush and close the vnode."""
        self.stopping = True
        if self.sync is not None:
            self.sync.stop()
        if self.vnode is not None:
            self.vnode.close()

    # -- callbacks (I/O thread) ------------------------------------------------------------
    def _notify_role(self, role: str, epoch: int, master: int | None) -> None:
        self.role, self.epoch, self.master = role, epoch, master
        self.role_changes.append((time.time(), role, epoch))
        del self.role_changes[:-20]
        if self.vnode is not None:
            self.vnode.notify_role(role)
        if role == "master" and self.sync is not None and self.sync.replica is not None:
            # Versions continue the log: a new master's WAL ends where its slave WAL ended.
            self.next_version = self.sync.replica.last_version + 1
        # The sync layer logs the change (event role_change, docs/operations.md §Logs).
        log.debug("vg%d n%d: role %s, epoch %d, master %s", self.id, self.node_id, role, epoch,
                  master)

    def _notify_flow_control(self, level: int) -> None:
        if self.vnode is not None:
            self.vnode.notify_flow_control(level)

    def _record_epoch(self, version: int) -> int:
        # write_to_cache_batch does not pass the record epochs (the WriteToCacheBatch action
        # has them): read them from the replica's epoch history, on this same thread.
        try:
            return int(self.sync.replica.history.epoch_at(version))  # type: ignore[union-attr]
        except Exception:
            return self.epoch

    def _write_to_cache_batch(self, first: int, payloads: tuple[bytes, ...]) -> None:
        vnode, sync = self.vnode, self.sync
        assert vnode is not None and sync is not None
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
        sync.ack_forward(last)
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
        pending = self.pending
        if not pending:
            return
        for version in range(first, last + 1):
            entry = pending.pop(version, None)
            if entry is None:
                continue
            rid = entry.rid
            if apply:
                try:
                    vnode.apply_prepared(version, self.epoch, entry.rows, entry.nbytes, rid)
                except VnodeError as exc:   # closed while stopping
                    log.warning("vg%d: v%d not applied: %s", self.id, version, exc)
            if rid is not None:
                self.pending_rids.pop(rid, None)
            if entry.timer is not None:
                entry.timer.cancel()
            if not entry.answer.done():
                entry.answer.set_result(self._answer(status, version, len(entry.rows), False))
            if entry.status is not None and not entry.status.done():
                entry.status.set_result(status)
        if apply:
            self._maybe_flush()

    def _notify_wal_truncated(self, version: int) -> None:
        """The WAL was cut after `version` (a deposed master's suffix): rebuild the memtable."""
        vnode = self.vnode
        assert vnode is not None
        try:
            n = vnode.rebuild()
            log.warning("vg%d n%d: WAL truncated after v%d: memtable rebuilt (%d records)",
                        self.id, self.node_id, version, n)
        except VnodeError as exc:
            log.critical("vg%d n%d: WAL truncated after v%d below the archived files: %s",
                         self.id, self.node_id, version, exc)

    # -- flush ------------------------------------------------------------------------------
    def _maybe_flush(self) -> None:
        # No flush while a restore replaces the files under the vnode (role syncing).
        if self.flushing or self.stopping or self.vnode is None or self.role == "syncing":
            return
        reason = self.vnode.flush_due()
        if reason is None:
            return
        self.flushing = True
        log.info("vg%d n%d: flush: %s", self.id, self.node_id, reason)
        fut = self.loop.run_in_executor(self.flush_executor, self.vnode.flush)  # type: ignore[union-attr]
        fut.add_done_callback(self._flushed)

    def _flushed(self, fut: asyncio.Future) -> None:
        self.flushing = False
        exc = fut.exception()
        if exc is not None:
            self.flush_errors += 1
            log.error("vg%d n%d: flush failed: %s", self.id, self.node_id, exc)
            return
        self.flushes += 1
        # The WAL below the archived version may go now (docs/vnode.md §5). The sync instance
        # owns the WAL, so it deletes the files, on its WAL thread (sealed files only).
        recycle = getattr(self.sync, "recycle_wal", None)
        if recycle is not None and not self.stopping and self.vnode is not None:
            try:
                recycle(self.vnode.archived_version + 1)
            except Exception as exc:   # not running: the next flush tries again
                log.warning("vg%d n%d: WAL recycling: %s", self.id, self.node_id, exc)

    def tick(self) -> None:
        """Periodic (flush_check_ms): the memtable age limit."""
        self._maybe_flush()

    # -- client API (I/O thread) -----------------------------------------------------------
    def master_http(self) -> str | None:
        if self.master is None or self.master not in self.node_cfg.nodes:
            return None
        return self.node_cfg.nodes[self.master].http_endpoint

    def _not_master(self) -> Response:
        self.counters["writes_not_master"] += 1
        where = (f"the master is n{self.master} at {self.master_http()}" if self.master is not None
                 else "no master is known yet (election in progress)")
        return error(409, "not_master",
                     f"vg{self.id}: this node (n{self.node_id}) is {self.role}; {where}",
                     master=self.master, master_http=self.master_http(), outcome="not_written")

    def write(self, body: bytes, request_id: str | None) -> "Response | Awaitable[Response]":
        """A client write: a Response at once (refused), else a future of the Response,
        set when the record's outcome is known (_confirm) or the write timeout expires."""
        if self.role != "master" or self.stopping:
            return self._not_master()
        vnode, sync = self.vnode, self.sync
        assert vnode is not None and sync is not None and self.loop is not None
        if request_id is not None:
            version = self.pending_rids.get(request_id) or vnode.request_version(request_id)
            if version is not None:
                return self._duplicate(request_id, version)
        if len(self.pending) >= self.node_cfg.http.max_pending_writes:
            self.counters["writes_overloaded"] += 1
            return error(503, "overloaded", f"vg{self.id}: {len(self.pending)} writes wait for"
                         " confirmation (max_pending_writes); retry later", outcome="not_written")
        reason, rows, payload = vnode.prepare_raw(body, request_id)
        if reason is not None:
            self.counters["writes_bad"] += 1
            return error(400, "bad_rows", reason, outcome="not_written")
        version = self.next_version
        try:
            sync.forward(version, payload)
        except FlowControlError as exc:
            self.counters["writes_overloaded"] += 1
            return error(503, "overloaded", f"{exc}; retry later", outcome="not_written")
        except NotRunningError as exc:
            return error(503, "not_running", str(exc), outcome="not_written")
        self.next_version = version + 1
        loop = self.loop
        answer = loop.create_future()
        # A timer, not asyncio.wait_for (a task per write): on expiry the client is told the
        # outcome is unknown; the record stays pending and _confirm still applies it.
        timer = loop.call_later(self.node_cfg.http.write_timeout_ms / 1000, self._write_expired,
                                version)
        self.pending[version] = _Pending(answer, rows, len(payload), request_id, timer)
        if request_id is not None:
            self.pending_rids[request_id] = version
        return answer

    def _write_expired(self, version: int) -> None:
        entry = self.pending.get(version)
        if entry is None:
            return
        entry.timer = None
        if not entry.answer.done():
            entry.answer.set_result(self._answer(ConfirmStatus.TIMED_OUT, version,
                                                 len(entry.rows), False))
        if entry.status is not None:
            _expire(entry.status)

    async def _outcome(self, fut: asyncio.Future, version: int, nrows: int,
                       duplicate: bool) -> Response:
        # A timer, not asyncio.wait_for (a task per write): on expiry the shared future says
        # TIMED_OUT; the record is still applied by _confirm when its outcome comes.
        timer = self.loop.call_later(self.node_cfg.http.write_timeout_ms / 1000,  # type: ignore[union-attr]
                                     _expire, fut)
        try:
            status = await fut
        finally:
            timer.cancel()
        return self._answer(status, version, nrows, duplicate)

    def _answer(self, status: ConfirmStatus, version: int, nrows: int,
                duplicate: bool) -> Response:
        """The client's answer for a record whose outcome is `status`."""
        if status == ConfirmStatus.OK:
            self.counters["writes_ok"] += 1
            self.counters["rows_written"] += nrows
            return Response(200, {"version": version, "epoch": self.epoch, "rows": nrows,
                                  "duplicate": duplicate, "node": self.node_id})
        if status == ConfirmStatus.NOT_MASTER:
            return self._not_master()
        self.counters["writes_unknown"] += 1
        if status == ConfirmStatus.TIMED_OUT:
            return error(504, "timeout", f"vg{self.id}: v{version} not confirmed by a quorum in"
                         " time: the outcome is unknown (retry with the same request_id)",
                         outcome="unknown", version=version)
        return error(503, "not_confirmed", f"vg{self.id}: v{version} failed ({status.describe()}):"
                     f" this node is now {self.role}; the outcome is unknown (retry with the same"
                     " request_id)", outcome="unknown", version=version, master=self.master,
                     master_http=self.master_http())

    async def _duplicate(self, request_id: str, version: int) -> Response:
        """A retried request whose id this vgroup's log already holds at `version`."""
        self.counters["writes_duplicate"] += 1
        entry = self.pending.get(version)
        if entry is not None:
            if entry.status is None:
                entry.status = self.loop.create_future()  # type: ignore[union-attr]
            return await self._outcome(entry.status, version, len(entry.rows), duplicate=True)
        # In the log: answer once a quorum holds it (a record inherited from an older epoch
        # was never confirmed on this master, so ask the replication state).
        deadline = time.monotonic() + self.node_cfg.http.write_timeout_ms / 1000
        while True:
            if version <= self.confirmed_through or version <= self._quorum_version():
                return Response(200, {"version": version, "epoch": self.epoch, "duplicate": True,
                                      "node": self.node_id, "request_id": request_id})
            if time.monotonic() > deadline or self.role != "master":
                return error(504, "timeout", f"vg{self.id}: request {request_id} is in the log at"
                             f" v{version} but not yet confirmed by a quorum: the outcome is"
                             " unknown (retry)", outcome="unknown", version=version)
            await asyncio.sleep(0.02)

    def _quorum_version(self) -> int:
        """The highest version a quorum of replicas holds durably (from sync.stats())."""
        try:
            st = self.sync.stats()  # type: ignore[union-attr]
        except Exception:
            return 0
        held = [st["wal"]["durable_version"]]
        held += [p.get("acked_version", 0) for p in st.get("peers", {}).values()]
        held.sort(reverse=True)
        quorum = self.spec.quorum or len(self.spec.replicas) // 2 + 1
        return held[quorum - 1] if len(held) >= quorum else 0

    async def query(self, table: str, start: int, end: int, limit: int) -> Response:
        vnode = self.vnode
        assert vnode is not None and self.loop is not None
        try:
            rows = await self.loop.run_in_executor(None, vnode.query, table, start, end)
        except VnodeError as exc:
            return error(400, "bad_query", str(exc))
        truncated = len(rows) > limit
        return Response(200, {"vgroup": self.id, "node": self.node_id, "role": self.role,
                              "version": vnode.get_version(), "table": table,
                              "rows": rows[:limit], "truncated": truncated})

    def status(self) -> dict[str, Any]:
        sync, vnode = self.sync, self.vnode
        assert sync is not None and vnode is not None
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
        arb = self.spec.arbitrator
        return {
            "vgroup": self.id, "role": self.role, "epoch": self.epoch, "master": self.master,
            "master_http": self.master_http(), "version": vnode.get_version(),
            "wal_last_version": roles["last_version"],
            "wal_durable_version": stats["wal"]["durable_version"],
            "confirmed_version": self.confirmed_through,
            "replicas": {str(n): r for n, r in roles["replicas"].items()},
            "peers": peers,
            "arbitrator": {"address": arb, "used": sync.cfg.arbitrator_used,
                           "connected": stats.get("arbitrator_connected", False),
                           "lease": stats.get("arbitrator_lease")},
            "flow_control": stats.get("flow_control", 0),
            "pending_writes": len(self.pending),
            "vnode": {**vnode.status(), "flushes": self.flushes, "flush_errors": self.flush_errors,
                      "recovered_records": self.recovered_records},
            "counters": dict(self.counters),
        }
