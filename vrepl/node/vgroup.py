"""One vgroup hosted by a node: a reference Vnode embedding one SyncInstance.

Owns: the write path of the master (validate, assign the next version, `forward()`, apply to
the memtable once the record's outcome is known, answer the client), the no-op a new master
forwards at once, the slave's `write_to_cache` (apply, then `ack_forward`), request-id dedup
for retried writes, the flush trigger (in a background thread, so the I/O thread never
waits for Parquet) with the group's commit index as its limit, WAL truncation (rebuild the
memtable), the `needs_restore` state (a vgroup whose archived files hold versions its log
no longer has: replication stopped, 503 to clients, a restore from the master by itself,
vrepl/node/selfrestore.py) and the vgroup's status. docs/operations.md §The write path
explains the ordering.

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
import json
import logging
import os
import threading
import time
from typing import Any, Awaitable

from vrepl.node import selfrestore
from vrepl.node.config import NodeConfig, VgroupSpec
from vrepl.node.ingest import IngestError, IngestFile, IngestResult, Rounds
from vrepl.node.http import Response, error
from vrepl.replica import AckStatus, ConfirmStatus, invariant
from vrepl.restore import recover_interrupted_swap
from vrepl.sync import FlowControlError, NotRunningError, SyncCallbacks, SyncInstance, SyncObservers
from vrepl.vnode import Vnode
from vrepl.vnode.errors import VnodeClosedError, VnodeError
from vrepl.vnode.rows import NOOP_PAYLOAD
from vrepl.vnode.staging import is_ingest_payload

log = logging.getLogger("vrepl.node")

# Statuses after which the record IS in this node's WAL (docs/embedding.md: NOT_MASTER means
# "version not consumed"; FAILED during stop() may be a record never appended, see _confirm).
_IN_LOG = (ConfirmStatus.OK, ConfirmStatus.TIMED_OUT, ConfirmStatus.FAILED)

SERVING, NEEDS_RESTORE = "serving", "needs_restore"
# The formats of a write's body (VgroupHost.write).
KIND_JSON, KIND_ARROW, KIND_LINES = "json", "arrow", "lines"
# A failed self-restore is retried after [restore] retry_interval_ms, doubled after each
# failure up to this (the pull's I/O timeout is [restore] io_timeout_s).
SELF_RESTORE_RETRY_MAX_MS = 10_000
STOP_JOIN_S = 10.0                  # how long stop() waits for a self-restore to give up


def _step(step: str, duration_ms: int | None, **fields: Any) -> dict[str, Any]:
    """The `extra` of a self-restore log line (docs/operations.md §Logs: event self_restore)."""
    return {"event": "self_restore", "step": step, "duration_ms": duration_ms, **fields}


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(ConfirmStatus.TIMED_OUT)


class _Pending:
    """A forwarded write waiting for its outcome. `answer` is the HTTP response future of the
    request that wrote it: _confirm (or the write timeout) sets it directly, so a write
    costs no Task and no coroutine (docs/perf.md §HTTP). `status` exists only once a retry
    with the same request id waits on the same record (_duplicate)."""

    __slots__ = ("answer", "rows", "nbytes", "rid", "timer", "status", "epoch")

    def __init__(self, answer: asyncio.Future, rows: list, nbytes: int, rid: str | None,
                 timer: asyncio.TimerHandle | None, epoch: int) -> None:
        self.answer = answer
        self.rows = rows            # checked by prepare_raw; applied once the outcome is known
        self.nbytes = nbytes
        self.rid = rid
        self.timer = timer
        self.status: asyncio.Future | None = None
        self.epoch = epoch          # the record's epoch (this master's)


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
        self.vnode = Vnode(self.path, self.node_cfg.vnode)
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
        if not pending and not rounds.forwarded and not rounds.noops:
            return
        for version in range(first, last + 1):
            if (rounds.forwarded or rounds.noops) and rounds.confirm(version, status, apply):
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
        """Periodic (flush_check_ms): the memtable age limit."""
        self._maybe_flush()

    # -- client API (I/O thread) -----------------------------------------------------------
    def master_http(self) -> str | None:
        return self.http_of(self.master)

    def http_of(self, node: int | None) -> str | None:
        if node is None or node not in self.node_cfg.nodes:
            return None
        return self.node_cfg.nodes[node].http_endpoint

    def _role_now(self) -> tuple[str, int | None]:
        """This node's role and master as the replication core has them at this moment. The
        core reports a step-down's outcomes (FAILED) before it notifies the new role, so
        while _confirm answers, self.role and self.master still say master."""
        if self.stopping:
            return "stopping", None
        now = self.sync.role_now() if self.sync is not None and self.state == SERVING else None
        return now if now is not None else (self.role, self.master)

    def _not_master(self) -> Response:
        self.counters["writes_not_master"] += 1
        role, master = self._role_now()
        where = (f"the master is n{master} at {self.http_of(master)}" if master is not None
                 else "no master is known yet (election in progress)")
        return error(409, "not_master",
                     f"vg{self.id}: this node (n{self.node_id}) is {role}; {where}",
                     master=master, master_http=self.http_of(master), outcome="not_written")

    def _needs_restore_answer(self, what: str) -> Response:
        nr = self.needs_restore or {}
        return error(503, "needs_restore",
                     f"vg{self.id}: this node (n{self.node_id}) needs a restore"
                     f" ({nr.get('reason', 'its data is being replaced')}) and {what} until"
                     " it restored itself from the master; ask another replica",
                     outcome="not_written")

    def write(self, body: bytes, request_id: str | None, kind: str = KIND_JSON,
              unit: int = 0) -> "Response | Awaitable[Response]":
        """A client write: a Response at once (refused), else a future of the Response,
        set when the record's outcome is known (_confirm) or the write timeout expires.
        `kind`: the body's format, KIND_JSON (rows), KIND_ARROW (an Arrow IPC stream) or
        KIND_LINES (InfluxDB line protocol, timestamps in `unit`, ingest.UNIT_CODES); each
        is one WAL record of its own payload format (docs/vnode.md §2)."""
        if self.state != SERVING:
            self.counters["writes_needs_restore"] += 1
            return self._needs_restore_answer("takes no writes")
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
        line = 0
        if kind == KIND_JSON:
            reason, rows, payload = vnode.prepare_raw(body, request_id)
        elif kind == KIND_ARROW:
            reason, rows, payload = vnode.prepare_arrow(body, request_id)
        else:
            reason, line, rows, payload = vnode.prepare_lines(
                body, unit, self.node_cfg.http.max_line_bytes, request_id)
        if reason is not None:
            self.counters["writes_bad"] += 1
            if line:
                return error(400, "bad_rows", reason, outcome="not_written", line=line)
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
        self.pending[version] = _Pending(answer, rows, len(payload), request_id, timer, self.epoch)
        if request_id is not None:
            self.pending_rids[request_id] = version
        return answer

    # -- rounds of ingested files (docs/vnode.md §9; vrepl/node/ingest.py) --------------------
    def staging_dir(self) -> str:
        """Where a producer on this node writes the files of a round before ingest()."""
        return self.rounds.staging_dir()

    async def ingest(self, files: "list[IngestFile]", kind: str,
                     meta: dict[str, Any] | None = None) -> IngestResult:
        """Forward one record naming `files` (in staging_dir()) and return once committed;
        IngestError otherwise. On this vgroup's I/O loop (docs/vnode.md §9.1)."""
        return await self.rounds.ingest(files, kind, meta)

    async def ingest_http(self, body: bytes) -> Response:
        """POST /v1/vgroups/{id}/ingest (docs/client-api.md §Ingesting files)."""
        try:
            doc = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            return error(400, "bad_ingest", f"body is not UTF-8 JSON ({exc})", outcome="not_written")
        try:
            if not isinstance(doc, dict) or set(doc) - {"files", "kind", "meta"}:
                raise ValueError('the body is {"files": [...], "kind": ..., "meta": {...}}')
            files = doc.get("files")
            if not isinstance(files, list):
                raise ValueError("files is not a list")
            specs = []
            for f in files:
                if not isinstance(f, dict) or set(f) - {"name", "table", "origin", "size",
                                                        "crc32c"}:
                    raise ValueError("a file is {name, table[, origin, size, crc32c]}")
                specs.append(IngestFile(f.get("name"), f.get("table"), f.get("origin", ""),
                                        f.get("size"), f.get("crc32c")))
        except ValueError as exc:
            return error(400, "bad_ingest", str(exc), outcome="not_written")
        try:
            res = await self.ingest(specs, doc.get("kind", "api"), doc.get("meta"))
        except IngestError as exc:
            return self._ingest_refusal(exc)
        return Response(200, {"vgroup": self.id, "node": self.node_id, **res._asdict()})

    def _ingest_refusal(self, exc: IngestError) -> Response:
        if exc.code == "bad_files":
            return error(400, "bad_ingest", str(exc), outcome="not_written")
        if exc.code == "not_master":
            self.counters["writes_not_master"] += 1
            _, master = self._role_now()
            return error(409, "not_master", str(exc), master=master,
                         master_http=self.http_of(master), outcome="not_written")
        if exc.code == "unknown_outcome":
            return error(504, "timeout", str(exc), outcome="unknown", version=exc.version)
        return error(503, exc.code, str(exc), outcome=exc.outcome)

    def _write_expired(self, version: int) -> None:
        entry = self.pending.get(version)
        if entry is None:
            return
        entry.timer = None
        if not entry.answer.done():
            entry.answer.set_result(self._answer(ConfirmStatus.TIMED_OUT, version,
                                                 len(entry.rows), False, entry.epoch))
        if entry.status is not None:
            _expire(entry.status)

    async def _outcome(self, fut: asyncio.Future, version: int, nrows: int,
                       duplicate: bool, epoch: int) -> Response:
        # A timer, not asyncio.wait_for (a task per write): on expiry the shared future says
        # TIMED_OUT; the record is still applied by _confirm when its outcome comes.
        timer = self.loop.call_later(self.node_cfg.http.write_timeout_ms / 1000,  # type: ignore[union-attr]
                                     _expire, fut)
        try:
            status = await fut
        finally:
            timer.cancel()
        return self._answer(status, version, nrows, duplicate, epoch)

    def _answer(self, status: ConfirmStatus, version: int, nrows: int,
                duplicate: bool, epoch: int) -> Response:
        """The client's answer for a record of `epoch` whose outcome is `status`."""
        if status == ConfirmStatus.OK:
            self.counters["writes_ok"] += 1
            self.counters["rows_written"] += nrows
            return Response(200, {"version": version, "epoch": epoch, "rows": nrows,
                                  "duplicate": duplicate, "node": self.node_id})
        if status == ConfirmStatus.NOT_MASTER:
            return self._not_master()
        self.counters["writes_unknown"] += 1
        if status == ConfirmStatus.TIMED_OUT:
            return error(504, "timeout", f"vg{self.id}: v{version} not confirmed by a quorum in"
                         " time: the outcome is unknown (retry with the same request_id)",
                         outcome="unknown", version=version)
        role, master = self._role_now()
        return error(503, "not_confirmed", f"vg{self.id}: v{version} failed ({status.describe()}):"
                     f" this node is now {role}; the outcome is unknown (retry with the same"
                     " request_id)", outcome="unknown", version=version, master=master,
                     master_http=self.http_of(master))

    def _committed(self) -> int:
        """The group's commit index as this node knows it (docs/embedding.md)."""
        return self.sync.committed_version if self.sync is not None else 0

    async def _duplicate(self, request_id: str, version: int) -> Response:
        """A retried request whose id this vgroup's log already holds at `version`: answered
        with the record's own version and epoch once the group committed it."""
        self.counters["writes_duplicate"] += 1
        entry = self.pending.get(version)
        if entry is not None:
            if entry.status is None:
                entry.status = self.loop.create_future()  # type: ignore[union-attr]
            return await self._outcome(entry.status, version, len(entry.rows), True, entry.epoch)
        # In the log, maybe inherited from an older epoch: committed only once the commit
        # index covers it. (A quorum holding an inherited record does not commit it: a newer
        # master may still cut it, docs/design.md §4.3.)
        deadline = time.monotonic() + self.node_cfg.http.write_timeout_ms / 1000
        while True:
            if self.state != SERVING:
                return self._needs_restore_answer("takes no writes")
            if version <= self._committed():
                return Response(200, {"version": version, "epoch": self._record_epoch(version),
                                      "duplicate": True, "node": self.node_id,
                                      "request_id": request_id})
            if time.monotonic() > deadline or self.role != "master":
                return error(504, "timeout", f"vg{self.id}: request {request_id} is in the log at"
                             f" v{version} but not yet committed by the group: the outcome is"
                             " unknown (retry)", outcome="unknown", version=version)
            await asyncio.sleep(0.02)

    async def query(self, table: str, start: int, end: int, limit: int) -> Response:
        vnode = self.vnode
        invariant(vnode is not None and self.loop is not None, "queries come after start()")
        if self.state != SERVING:
            return self._needs_restore_answer("serves no reads")
        try:
            rows = await self.loop.run_in_executor(None, vnode.query, table, start, end)
            exists = bool(rows) or vnode.has_table(table)
        except VnodeClosedError:
            if self.state != SERVING:
                return self._needs_restore_answer("serves no reads")
            return error(503, "stopping", f"vg{self.id}: this node is stopping")
        except VnodeError as exc:
            return error(400, "bad_query", str(exc))
        if self.state != SERVING:     # entered needs_restore while the query ran
            return self._needs_restore_answer("serves no reads")
        truncated = len(rows) > limit
        return Response(200, {"vgroup": self.id, "node": self.node_id, "role": self.role,
                              "version": vnode.get_version(), "table": table, "exists": exists,
                              "rows": rows[:limit], "truncated": truncated})

    def tables(self) -> Response:
        """GET /v1/vgroups/{id}/tables: the tables this replica holds rows of."""
        vnode = self.vnode
        invariant(vnode is not None, "tables are listed after the vnode is open")
        if self.state != SERVING:
            return self._needs_restore_answer("serves no reads")
        return Response(200, {"vgroup": self.id, "node": self.node_id, "role": self.role,
                              "version": vnode.get_version(), "tables": vnode.tables()})

    # -- needs_restore (docs/operations.md §A vgroup that needs a restore) -------------------
    def _mark_needs_restore(self, reason: str) -> None:
        self.state = NEEDS_RESTORE
        self.needs_restore = {"reason": reason, "since": round(time.time(), 3),
                              "phase": "stopping replication", "source": None, "attempts": 0,
                              "last_error": None, "wal_end": None}
        log.critical("vg%d n%d: needs a restore: %s. This replica stops replicating (peers see"
                     " it offline: it neither votes nor can be elected), answers 503"
                     " needs_restore to reads and writes, and restores itself from the master",
                     self.id, self.node_id, reason, extra={"event": "needs_restore", "reason": reason})

    def _enter_needs_restore(self, reason: str) -> None:
        """(I/O thread) From now on nothing is served, applied or acked; the self-restore
        thread stops replication (that cannot be done on this thread) and restores."""
        if self.state == NEEDS_RESTORE:
            return
        self._mark_needs_restore(reason)
        self.rounds.cut_after(0)            # the data is being replaced: no staging now
        self._start_restorer()

    def _start_restorer(self) -> None:
        if self.stopping or (self._restorer is not None and self._restorer.is_alive()):
            return
        self._restorer = threading.Thread(target=self._self_restore, daemon=True,
                                          name=f"vrepl-self-restore-vg{self.id}")
        self._restorer.start()

    def _phase(self, phase: str, **fields: Any) -> None:
        if self.needs_restore is not None:
            self.needs_restore.update(phase=phase, **fields)

    def _self_restore(self) -> None:
        try:
            self._self_restore_loop()
        except Exception:     # a bug: the vgroup stays in needs_restore (a restart retries)
            log.exception("vg%d n%d: needs_restore: the self-restore thread failed; the"
                          " vgroup stays in needs_restore until the node restarts", self.id,
                          self.node_id)

    def _self_restore_loop(self) -> None:
        """(self-restore thread) Stop replicating, close the vnode without archiving
        anything, then until it works: pull a complete copy from the master, check it, swap
        it in (the promise file stays), reopen the vnode and start replicating again."""
        t0 = time.monotonic()
        known_master = self.master if self.master != self.node_id else None
        with self._life_lock:
            if self.sync is not None:
                t = time.monotonic()
                self.sync.stop()
                ms = selfrestore.ms_since(t)
                log.info("vg%d n%d: needs_restore: replication stopped in %d ms", self.id,
                         self.node_id, ms, extra=_step("stopped", ms))
            if self.vnode is not None:
                self.vnode.close(up_to_version=0)      # archive nothing more of this data
        max_record = self.node_cfg.vnode.max_payload_bytes
        own_end = selfrestore.wal_end(self.path, max_record)
        self._phase("waiting for a source", wal_end={"epoch": own_end[0], "version": own_end[1]})
        pause_ms = self.node_cfg.restore.retry_interval_ms
        attempt = 0
        while not self._restore_stop.is_set():
            attempt += 1
            self._phase("looking for the master", attempts=attempt)
            try:
                done = self._restore_attempt(attempt, known_master, own_end, max_record)
            except Exception as exc:    # every failure is retried: one line, then a pause
                done = False
                self.counters["self_restore_failures"] += 1
                self._phase("waiting to retry", last_error=str(exc) or type(exc).__name__)
                log.warning("vg%d n%d: needs_restore: attempt %d failed: %s; retrying in %d ms",
                            self.id, self.node_id, attempt, exc, pause_ms,
                            extra=_step("failed", None, attempt=attempt, retry_ms=pause_ms))
            if done:
                took = selfrestore.ms_since(t0)
                self.counters["self_restores"] += 1
                self.last_self_restore = {**(self.needs_restore or {}), "took_ms": took,
                                          "finished": round(time.time(), 3)}
                self.last_self_restore.pop("phase", None)
                self.needs_restore = None
                log.warning("vg%d n%d: needs_restore: restored in %d ms (%d attempts); serving"
                            " again", self.id, self.node_id, took, attempt,
                            extra=_step("restored", took, attempt=attempt))
                return
            if self._restore_stop.wait(pause_ms / 1000):
                return
            pause_ms = max(min(pause_ms * 2, SELF_RESTORE_RETRY_MAX_MS), pause_ms)

    def _restore_source(self, attempt: int, known_master: int | None) -> int:
        """Where to pull a copy from: the master this replica last followed (first attempt),
        else the master the peers' /v1/status name, else each peer in turn. A copy from a
        slave is safe too (archives hold committed rows only, docs/vnode.md §5, and the
        rejoin matches the log with the master): the peers' HTTP API may not be reachable
        from here (it listens on loopback by default), their replication port is."""
        peers = [n for n in self.spec.replicas if n != self.node_id and n in self.node_cfg.nodes]
        if not peers:
            raise selfrestore.SelfRestoreError("this vgroup has no other replica to restore from")
        if attempt == 1 and known_master in peers:
            return known_master  # type: ignore[return-value]
        h = self.node_cfg.http
        named = selfrestore.find_master([self.node_cfg.nodes[n].http_endpoint for n in peers],
                                        self.id, token=h.token.decode() if h.token else None,
                                        tls=h.tls)
        if named in peers:
            return named  # type: ignore[return-value]
        return peers[(attempt - 2) % len(peers)]

    def _restore_attempt(self, attempt: int, known_master: int | None,
                         own_end: tuple[int, int], max_record: int) -> bool:
        """One try of the self-restore; False when stopped, raises on failure."""
        t = time.monotonic()
        swapped = selfrestore.roll_forward(self.path)     # a swap a failure interrupted
        if swapped is None:
            source = self._restore_source(attempt, known_master)
            where = self.node_cfg.nodes[source].replication_endpoint
            self._phase("pulling a copy", source=source)
            log.info("vg%d n%d: needs_restore: pulling a complete copy from n%d at %s"
                     " (attempt %d)", self.id, self.node_id, source, where, attempt,
                     extra=_step("pulling", None, attempt=attempt, source=source))
            copy = selfrestore.pull(self.path, where, vgroup=self.id, secret=self.node_cfg.secret,
                                    timeout_s=self.node_cfg.restore.io_timeout_s,
                                    max_record_bytes=max_record)
            ms = selfrestore.ms_since(t)
            log.info("vg%d n%d: needs_restore: copy from n%d in %d ms: %d files (%d bytes"
                     " received), %d WAL records, log end e%dv%d", self.id, self.node_id,
                     source, ms, copy.files, copy.file_bytes, copy.wal_records, copy.epoch,
                     copy.version, extra=_step("pulled", ms, source=source))
            # A master's log holds every committed record: a copy ending at or after this
            # node's own log end misses nothing this node ever acknowledged.
            if (copy.epoch, copy.version) < own_end:
                raise selfrestore.SelfRestoreError(
                    f"the copy from n{source} ends at e{copy.epoch}v{copy.version}, before this"
                    f" node's own log end e{own_end[0]}v{own_end[1]}: refused (is n{source}"
                    " really the master?)")
            if self._restore_stop.is_set():
                return False
            self._phase("swapping in the copy")
            t = time.monotonic()
            swapped = selfrestore.swap(self.path)
            ms = selfrestore.ms_since(t)
            log.info("vg%d n%d: needs_restore: %s in %d ms", self.id, self.node_id, swapped, ms,
                     extra=_step("swapped", ms))
        self._phase("reopening")
        t = time.monotonic()
        vnode = Vnode(self.path, self.node_cfg.vnode)
        reason = selfrestore.wal_below_archive(self.path, max_record)
        if reason is not None:
            vnode.close(up_to_version=0)
            raise selfrestore.SelfRestoreError(f"the restored copy is not usable: {reason}")
        replayed = vnode.recover()
        with self._life_lock:
            if self._restore_stop.is_set():
                vnode.close(up_to_version=0)
                return False
            self.vnode = vnode
            self.recovered_records = replayed
            self.role, self.master, self.pending_rids = "unsynced", None, {}
            self.sync = SyncInstance(self.node_cfg.sync_config(self.spec), self._callbacks(vnode),
                                     restore=self.node_cfg.restore, observers=self.observers)
            self.state = SERVING
            try:
                self.sync.start()
            except BaseException:
                self.state = NEEDS_RESTORE
                vnode.close(up_to_version=0)
                raise
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self.rounds.resume)
        ms = selfrestore.ms_since(t)
        log.info("vg%d n%d: needs_restore: vnode reopened (archived v%d, %d WAL records"
                 " replayed) and replication started in %d ms", self.id, self.node_id,
                 vnode.archived_version, replayed, ms, extra=_step("reopened", ms))
        return True

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
