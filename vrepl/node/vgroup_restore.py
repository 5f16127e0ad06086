"""The needs_restore state of one vgroup and its self-restore thread (the mixin
VgroupSelfRestore of VgroupHost, vrepl/node/vgroup.py).

Owns: entering needs_restore (a vgroup whose archived files hold versions its log no longer
has: replication stopped, 503 to clients), and the thread that restores it from the master
by itself until it works (stop replicating, pull a complete copy with
vrepl/node/selfrestore.py, check it, swap it in, reopen the vnode, start replicating again),
with its phases for the vgroup's status. docs/operations.md §A vgroup that needs a restore.

The state it reads and writes lives on VgroupHost and is set up by its __init__. The thread
swaps the sync instance and the vnode under VgroupHost._life_lock (stop() takes it too).
Must not: run the pull or stop the sync instance on the I/O thread, or serve, apply or ack
anything while the vgroup is in needs_restore.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from vrepl.node import selfrestore
from vrepl.sync import SyncInstance
from vrepl.vnode import Vnode

log = logging.getLogger("vrepl.node")

SERVING, NEEDS_RESTORE = "serving", "needs_restore"
# A failed self-restore is retried after [restore] retry_interval_ms, doubled after each
# failure up to this (the pull's I/O timeout is [restore] io_timeout_s).
SELF_RESTORE_RETRY_MAX_MS = 10_000


def _step(step: str, duration_ms: int | None, **fields: Any) -> dict[str, Any]:
    """The `extra` of a self-restore log line (docs/operations.md §Logs: event self_restore)."""
    return {"event": "self_restore", "step": step, "duration_ms": duration_ms, **fields}



class VgroupSelfRestore:
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
        vnode = Vnode(self.path, self.node_cfg.vnode,
                      txn_label_retention_ms=self.node_cfg.txn.label_retention_ms)
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
