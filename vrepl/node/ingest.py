"""Ingesting files into a vgroup by one replicated record (docs/vnode.md §9; issue 16).

The master API (a producer such as `vrepl ship`'s receiver, the transactional load, the
slot migration and `POST /v1/vgroups/{id}/ingest` build on it):

    host.staging_dir() -> str
        `<vgroup path>/ingest/incoming`, created if missing: where a producer on this node
        writes the files of a round before it calls ingest(). Names given to ingest() are
        relative to it. The directory is emptied when the node opens the vgroup (a crash
        leaves nothing a producer can resume there).

    await host.ingest(files: Sequence[IngestFile], kind: str,
                      meta: Mapping[str, Any] | None = None) -> IngestResult
        On the node's I/O loop (`host.loop`; from another thread:
        `asyncio.run_coroutine_threadsafe(host.ingest(...), host.loop)`). Checks every file
        (confined name, regular file, size and CRC-32C if the producer gave them, read
        again unless `crc_on_write`, the Parquet format of an archived file from its footer
        and key columns, types against the table's schema), moves the
        files into the staging area (fsynced), then forwards ONE WAL record (payload format
        8, docs/vnode.md §2) naming them, and returns once the group committed it:
        `IngestResult(version, epoch, rows, files, applied)`. The round then reaches every
        replica's archive at that version, all files at once (never half a round).
        `applied` says whether this node already archived it (its rows visible here); it
        normally is, within `write_timeout_ms`.

        Raises IngestError (a RuntimeError) with `code` and `outcome`:
          code "bad_files" (IngestFileError, also a ValueError): a file fails its check;
              nothing was forwarded, the files stay in staging_dir() (outcome "not_written");
              StagingError (vrepl/errors.py, re-exported here), a subclass, when moving or
              fsyncing the files into the staging area failed (its `errno`: ENOSPC, EIO);
          "not_master", "not_running", "needs_restore", "overloaded": nothing was
              forwarded (outcome "not_written"); a file named by another round being
              ingested at the same time is "bad_files";
          "unknown_outcome": forwarded, but not confirmed by a quorum in time or this node
              stepped down: the record may still be committed or cut (outcome "unknown");
              a producer retries with a round it can recognise (its own id in `meta`).

    IngestFile(name: str, table: str, origin: str = "", size: int | None = None,
               crc32c: int | None = None, crc_on_write: bool = False)
    IngestRemove(name: str, size: int, crc32c: int)
        `remove=` of ingest() (`host.ingest(..., remove=...)`): an ingested file of the
        archive (its name there, `data/<table>/b<bucket>-i<version>-<k>.parquet`, size and
        magic as the manifest names it) that the same record removes, at the same flush
        point as its adds (record version 2, docs/vnode.md §9.2). A round adds 0..1000 and
        removes 0..1000 files, at least one in all.
        `name`: relative to staging_dir(), '/'-separated components of [A-Za-z0-9_.-]
        (not starting with '.'), at most 255 bytes; `table`: the table its rows belong to;
        `origin`: who wrote the rows (printable, at most 128 bytes): their `_version` and
        `_epoch` are that origin's, not this vgroup's; `size`, `crc32c`: checked if given
        (`crc32c` is the file's magic: CRC-32C of its bytes, 1 if that is 0);
        `crc_on_write`: the producer computed `crc32c` over the bytes as it wrote them, in
        this node process (needs `size` and `crc32c`): the master then checks the size and
        reads the footer and key columns only, not every byte again.
    kind: `[a-z][a-z0-9_.-]{0,31}` (e.g. "ship", "load"); meta: a JSON object of at most
        64 KiB, opaque to vrepl, stored in the record (a ship round id, a transaction id).

Owns, besides the API (its types and the master's checks are in vrepl/node/ingestcheck.py,
re-exported here): the replica's bookkeeping of a round (a staging job per round whose files
are missing here, run on the ingest executor by `Fetcher`, vrepl/node/ingestfetch.py, which
also serves FETCH connections; ack the record only once its files are durable, in version
order), the master's wait for a timed-out round and its nudges, and the master's kill
points of the ingest path (vrepl/killpoints.py).
Must not: block the I/O thread on disk or sockets (checks, moves and fetches run on the
ingest executor), write the WAL, or touch the archive (the vnode applies a round, at a
flush, once its version is committed: vrepl/vnode/staging.py, vnode.py).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from vrepl.errors import IngestError, IngestFileError, StagingError
from vrepl.killpoints import killpoint, register
from vrepl.node.ingestcheck import (
    IngestFile,
    IngestResult,
    archived_key,
    check_files,
    pending_names,
    request_invalid,
)
from vrepl.node.ingestfetch import Fetcher, IngestHost, OfHost, StagingJob
from vrepl.replica import ConfirmStatus
from vrepl.restore.stream import SyncStream
from vrepl.sync import FlowControlError, NotRunningError
from vrepl.untrusted import printable
from vrepl.vnode import staging as S
from vrepl.vnode.errors import VnodeError
from vrepl.vnode.rows import NOOP_PAYLOAD
from vrepl.vnode.staging import IngestRemove

log = logging.getLogger("vrepl.node")

# docs/vnode.md §9.5: a test arms these (VREPL_KILLPOINT) to kill a real node at each step.
KP_MASTER_CHECKED = register("ingest.master.after_check",
                             "master: the round's files are checked in incoming/; nothing moved,"
                             " nothing forwarded")
KP_MASTER_STAGED = register("ingest.master.after_stage",
                            "master: the round is staged (fsynced in ingest/staged/<round>/),"
                            " its record not forwarded yet")
KP_MASTER_FORWARDED = register("ingest.master.after_forward",
                               "master: the record is handed to forward(); it may or may not be"
                               " in the WAL, no outcome yet")
KP_MASTER_CONFIRMED = register("ingest.master.after_confirm",
                               "master: the record is committed (confirmed by a quorum); the"
                               " producer has no answer yet")
KP_SLAVE_ACKED = register("ingest.slave.after_ack",
                          "a replica: the record is acknowledged after its files were staged")

RETRY_MAX_MS = 10_000           # a failed staging job is retried, backing off up to this
COMMIT_POLL_S = 0.02            # a timed-out round's producer checks the commit index this often


@dataclass
class _Forwarded:
    """(master) A round's record forwarded, waiting for its outcome."""

    payload: bytes
    epoch: int
    future: asyncio.Future



class Rounds(OfHost):
    """The ingest side of one VgroupHost: the master API, staging a round's files on every
    replica, acking in version order, and serving fetches (see the module doc). Runs on the
    I/O thread except where a method says otherwise."""

    def __init__(self, host: IngestHost) -> None:
        self.host = host
        self.forwarded: dict[int, _Forwarded] = {}      # master: version -> outcome awaited
        self.noops: dict[int, int] = {}                 # master: nudge no-ops -> epoch
        self._nudging: asyncio.TimerHandle | None = None
        self.jobs: dict[int, StagingJob] = {}                 # version -> staging job
        self.applied_waiters: dict[int, list[asyncio.Future]] = {}
        self.counters = dict.fromkeys(("rounds_ingested", "rounds_refused", "rounds_unknown",
                                       "rounds_staged", "files_from_incoming",
                                       "files_fetched", "fetch_failures", "files_served",
                                       "checksum_bytes_received", "checksum_bytes_reread"), 0)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._stopped = False
        self._lock = threading.Lock()                   # counters touched by fetch threads
        self._in_flight: set[str] = set()               # master: names of rounds being ingested
        self.fetcher = Fetcher(host, self.count)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                2, thread_name_prefix=f"vrepl-ingest-vg{self.host.id}")
        return self._pool

    # -- the master API -------------------------------------------------------------------------
    def staging_dir(self) -> str:
        path = S.incoming_path(self.path)
        os.makedirs(path, exist_ok=True)
        return path

    def _refusal(self) -> IngestError | None:
        host = self.host
        if self._stopped or host.stopping:
            return IngestError("not_running", f"vg{host.id}: this node is stopping")
        if host.state != "serving":
            return IngestError("needs_restore", f"vg{host.id}: this node (n{host.node_id}) needs"
                               " a restore and takes no rounds; ask the master")
        if host.role != "master" or host.sync is None:
            role, master = host._role_now()
            where = f"the master is n{master}" if master is not None else "no master is known yet"
            return IngestError("not_master", f"vg{host.id}: this node (n{host.node_id}) is"
                               f" {role}; {where}")
        return None

    def _check_refusal(self) -> None:
        err = self._refusal()
        if err is not None:
            self.count("rounds_refused")
            raise err

    async def ingest(self, files: Sequence[IngestFile], kind: str,
                     meta: Mapping[str, Any] | None = None,
                     remove: Sequence[IngestRemove] = ()) -> IngestResult:
        self._check_refusal()
        files = list(files)
        meta = {} if meta is None else dict(meta)
        reason = request_invalid(files, kind, meta, remove)
        if reason is not None:
            self.count("rounds_refused")
            raise IngestFileError(reason)
        busy = [f.name for f in files if f.name in self._in_flight]
        if busy:
            self.count("rounds_refused")
            raise IngestFileError(f"{busy[0]}: named by another round being ingested now")
        names = {f.name for f in files}
        self._in_flight |= names
        try:
            return await self._ingest(files, kind, meta, tuple(remove))
        finally:
            self._in_flight -= names

    async def _ingest(self, files: list[IngestFile], kind: str, meta: dict[str, Any],
                      remove: tuple[IngestRemove, ...] = ()) -> IngestResult:
        host = self.host
        vnode, loop = host.vnode, host.loop
        if vnode is None or loop is None:       # closed by a stop or a self-restore meanwhile
            raise IngestError("not_running", f"vg{host.id}: this node is not serving the vgroup")
        t_start = time.monotonic()
        try:
            entries, sources = await loop.run_in_executor(self.pool(), check_files, self.path, files,
                                                          host.node_cfg.vnode, vnode.schemas)
        except IngestError:     # a file missing, of another size or checksum, not Parquet
            self.count("rounds_refused")
            raise
        self.count("checksum_bytes_reread",
                   sum(e.size for e, f in zip(entries, files) if not f.crc_on_write))
        rec = S.IngestRecord(S.new_round_id(), kind, meta, tuple(entries), remove)
        reason = S.round_invalid(entries, len(remove))
        self._check_refusal()
        if reason is None and remove:
            reason = S.removes_invalid(remove, functools.partial(archived_key, vnode),
                                       pending_names(vnode))
        if reason is None:
            reason = vnode.reserve_columns(rec)
        payload = S.encode_ingest_payload(rec)
        if reason is None and len(payload) > host.node_cfg.vnode.max_payload_bytes:
            reason = (f"the round's record would be {len(payload)} bytes, above"
                      f" max_payload_bytes {host.node_cfg.vnode.max_payload_bytes}")
        if reason is not None:
            self.count("rounds_refused")
            raise IngestFileError(reason)
        killpoint(KP_MASTER_CHECKED)
        t_checked = time.monotonic()
        try:
            await loop.run_in_executor(self.pool(), S.stage_round, self.path, rec, sources,
                                       self.fsync)
        except OSError as exc:     # a file went away meanwhile, a full disk, a failed fsync
            await loop.run_in_executor(self.pool(), self._unstage, rec, sources)
            self.count("rounds_refused")
            raise StagingError(f"cannot stage the round: {exc.strerror or exc}:"
                               f" {printable(str(exc.filename or ''))}", exc.errno) from None
        killpoint(KP_MASTER_STAGED)
        t_staged = time.monotonic()
        version = host.next_version
        err = self._refusal()
        if err is None:
            try:
                host.sync.forward(version, payload)  # type: ignore[union-attr]
            except FlowControlError as exc:
                err = IngestError("overloaded", f"vg{host.id}: {exc}; retry later")
            except NotRunningError as exc:
                err = IngestError("not_running", str(exc))
        if err is not None:
            await loop.run_in_executor(self.pool(), self._unstage, rec, sources)
            self.count("rounds_refused")
            raise err
        host.next_version = version + 1
        epoch = host.epoch
        killpoint(KP_MASTER_FORWARDED)
        fut = loop.create_future()
        self.forwarded[version] = _Forwarded(payload, epoch, fut)
        log.info("vg%d n%d: round %s (%s, %d files, %d rows) forwarded at v%d", host.id,
                 host.node_id, rec.round, kind, len(rec.files), rec.rows, version,
                 extra={"event": "ingest_round", "round": rec.round, "version": version})
        timeout_s = host.node_cfg.http.write_timeout_ms / 1000
        deadline = loop.time() + timeout_s
        try:
            status = await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except asyncio.TimeoutError:
            status = ConfirmStatus.TIMED_OUT
        if status == ConfirmStatus.TIMED_OUT:
            status = await self._await_commit(version, epoch, deadline)
        if status == ConfirmStatus.NOT_MASTER:
            # Refused by the core: never in the log. The files go back to the producer.
            await loop.run_in_executor(self.pool(), self._unstage, rec, sources)
            self.count("rounds_refused")
            raise IngestError("not_master", f"vg{host.id}: this node stopped being master"
                              " before the round's record was taken; nothing was written")
        if status != ConfirmStatus.OK:
            self.count("rounds_unknown")
            if status == ConfirmStatus.TIMED_OUT:
                self._nudge(version, host.node_cfg.restore.retry_interval_ms)
            what = ("not confirmed by a quorum within write_timeout_ms" if status ==
                    ConfirmStatus.TIMED_OUT else f"failed ({status.describe()}): this node"
                    " stepped down")
            raise IngestError("unknown_outcome", f"vg{host.id}: round {rec.round} at v{version}"
                              f" {what}: the outcome is unknown (replicas that cannot stage its"
                              " files do not acknowledge it)", outcome="unknown",
                              version=version)
        killpoint(KP_MASTER_CONFIRMED)
        self.count("rounds_ingested")
        t_committed = time.monotonic()
        applied = await self._wait_applied(version, timeout_s)
        t_end = time.monotonic()
        # Where a round's time goes (docs/benchmarks.md §ship reads these).
        log.info("vg%d n%d: round %s at v%d: %d files checked in %.3f s, staged in %.3f s,"
                 " committed in %.3f s, %s in %.3f s", host.id, host.node_id, rec.round,
                 version, len(rec.files), t_checked - t_start, t_staged - t_checked,
                 t_committed - t_staged, "applied" if applied else "not applied",
                 t_end - t_committed, extra={"event": "ingest_round_done", "version": version})
        return IngestResult(version, epoch, rec.rows, len(rec.files), applied)

    def _unstage(self, rec: S.IngestRecord, sources: list[str]) -> None:
        """(ingest executor) A round refused after staging: its files go back where the
        producer put them."""
        for k, src in enumerate(sources):
            try:
                os.replace(S.abspath(self.path, rec.staged_name(k)), src)
            except OSError:
                pass
        try:
            os.rmdir(S.staged_round_path(self.path, rec.round))
        except OSError:
            pass

    async def _wait_applied(self, version: int, timeout_s: float) -> bool:
        """Whether the round at `version` was archived here within `timeout_s`. Not waited
        for while an open transaction holds the archive below it: the round is readable
        already (reads show applied rounds, vrepl/vnode/query.py) and its flush waits for
        that transaction to finish, which may take up to its timeout."""
        vnode = self.host.vnode
        if vnode is None:
            return False
        if vnode.archived_version >= version:
            return True
        holder = vnode.archive_held_by(version)
        if holder is not None:
            log.info("vg%d n%d: the round at v%d is readable; it is archived once transaction %d"
                     " (begun at v%d) finishes", self.host.id, self.host.node_id, version, holder,
                     holder, extra={"event": "round_archive_held", "version": version, "txn": holder})
            return False
        fut = self.host.loop.create_future()  # type: ignore[union-attr]
        self.applied_waiters.setdefault(version, []).append(fut)
        self.host._maybe_flush()
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            return False

    def flushed(self, archived_version: int) -> None:
        """(I/O thread) A flush finished: answer the producers whose round it archived."""
        for version in [v for v in self.applied_waiters if v <= archived_version]:
            for fut in self.applied_waiters.pop(version):
                if not fut.done():
                    fut.set_result(True)

    def _nudge(self, version: int, delay_ms: int) -> None:
        """(master) A round timed out (replicas could not stage its files in time): it and
        the records after it are committed only with a later record confirmed by a quorum
        (docs/design.md §4.4). Once the replicas have staged the files that happens at the
        next write; without writes, forward a no-op now and then until it is committed."""
        host = self.host
        if self._nudging is not None:
            return

        def run() -> None:
            self._nudging = None
            sync = host.sync
            if self._stopped or host.stopping or host.state != "serving" or sync is None \
                    or host.role != "master" or sync.committed_version >= version:
                return
            self._forward_noop()
            self._nudge(version, min(delay_ms * 2, RETRY_MAX_MS))
        self._nudging = host.loop.call_later(delay_ms / 1000, run)  # type: ignore[union-attr]

    def _forward_noop(self) -> None:
        """(master) Forward a no-op: once a quorum confirms it, every record below it is
        committed (docs/design.md §4.4)."""
        host = self.host
        v = host.next_version
        try:
            host.sync.forward(v, NOOP_PAYLOAD)  # type: ignore[union-attr]
        except (FlowControlError, NotRunningError):
            return
        host.next_version = v + 1
        self.noops[v] = host.epoch

    async def _await_commit(self, version: int, epoch: int, deadline: float) -> ConfirmStatus:
        """(master) The sync layer timed the round's record out: its forward timeout (2 s by
        default) is shorter than a producer's wait, and the replicas may still be fetching
        the files (they acknowledge nothing before). The record is in the log and commits
        with the next record a quorum confirms, so until `deadline` keep one no-op in flight
        at a time: OK once the commit index reaches `version` in this mastership (the
        replicas staged the files), FAILED if this node stepped down, TIMED_OUT at the
        deadline."""
        host = self.host
        loop = host.loop
        while loop.time() < deadline:  # type: ignore[union-attr]
            sync = host.sync
            if self._stopped or host.stopping or sync is None or host.role != "master" \
                    or host.epoch != epoch:
                return ConfirmStatus.FAILED
            if sync.committed_version >= version:
                return ConfirmStatus.OK
            if not self.noops:
                self._forward_noop()
            await asyncio.sleep(COMMIT_POLL_S)
        return ConfirmStatus.TIMED_OUT

    def confirm(self, version: int, status: ConfirmStatus, apply: bool) -> bool:
        """(I/O thread, from VgroupHost._confirm, in version order) The outcome of a round's
        record: apply it to the vnode (it is in the log) and tell its producer. False if
        `version` is not a round (or a no-op) this node forwarded."""
        epoch = self.noops.pop(version, None)
        if epoch is not None:
            if apply:
                try:
                    self.host.vnode.write_to_cache(version, epoch, NOOP_PAYLOAD)  # type: ignore[union-attr]
                except VnodeError:
                    pass
            return True
        fwd = self.forwarded.pop(version, None)
        if fwd is None:
            return False
        if apply:
            try:
                self.host.vnode.write_to_cache(version, fwd.epoch, fwd.payload)  # type: ignore[union-attr]
                self.on_record(version)
            except VnodeError as exc:       # closed while stopping
                log.warning("vg%d: round at v%d not applied: %s", self.host.id, version, exc)
        if not fwd.future.done():
            fwd.future.set_result(status)
        return True

    # -- every replica: stage what a record names, ack in order ---------------------------------
    def acked_version_at_start(self) -> int | None:
        """(SyncCallbacks.get_acked_version) The records above the first round whose files
        are not staged here must not be acked for the app when the instance starts."""
        first = self.host.vnode.first_unstaged_ingest() if self.host.vnode else None
        return None if first is None else first - 1

    def ack_bound(self, last: int) -> int:
        """The highest version this replica may acknowledge of those up to `last`: below the
        first round whose files are not staged yet (acks are cumulative)."""
        first = self.host.vnode.first_unstaged_ingest()  # type: ignore[union-attr]
        return last if first is None else min(last, first - 1)

    def on_record(self, version: int) -> None:
        """(I/O thread) A round's record was applied to the vnode: stage its files if some
        are missing here."""
        p = self.host.vnode.pending_ingest(version)  # type: ignore[union-attr]
        if p is None or p.staged:
            return
        job = self.jobs.get(version)
        if job is not None and job.record.round == p.record.round and not job.cancelled:
            return
        if job is not None:
            job.cancel()
        job = self.jobs[version] = StagingJob(version, p.record)
        self._submit(job)

    def resume(self) -> None:
        """(I/O thread) After a start or a rebuild: a job for every round whose files are
        not all staged, none for rounds no longer pending."""
        vnode = self.host.vnode
        if vnode is None:
            return
        pending = {p.version: p for p in vnode.pending_ingests()}
        for version, job in list(self.jobs.items()):
            p = pending.get(version)
            if p is None or p.record.round != job.record.round:
                job.cancel()
                del self.jobs[version]
        for version, p in pending.items():
            if not p.staged:
                self.on_record(version)

    def cut_after(self, version: int) -> None:
        """(I/O thread) The WAL was cut after `version`: rounds above it are gone."""
        for v in [v for v in self.jobs if v > version]:
            self.jobs.pop(v).cancel()

    def _submit(self, job: StagingJob) -> None:
        if job.cancelled or self._stopped:
            return
        job.timer = None
        job.started = time.monotonic()
        fut = self.host.loop.run_in_executor(self.pool(), self.fetcher.stage_job, job)  # type: ignore[union-attr]
        fut.add_done_callback(functools.partial(self._job_done, job))

    def _job_done(self, job: StagingJob, fut: asyncio.Future) -> None:
        if job.cancelled or self._stopped or self.jobs.get(job.version) is not job:
            return
        exc = fut.exception()
        host = self.host
        if exc is None:
            del self.jobs[job.version]
            self._staged(job)
            return
        job.attempts += 1
        self.count("fetch_failures")
        base = host.node_cfg.restore.retry_interval_ms
        delay_ms = min(base * 2 ** min(job.attempts - 1, 10), max(RETRY_MAX_MS, base))
        log.warning("vg%d n%d: round %s at v%d: cannot stage its files (attempt %d): %s;"
                    " not acknowledged, retrying in %d ms", host.id, host.node_id,
                    job.record.round, job.version, job.attempts, exc, delay_ms,
                    extra={"event": "ingest_fetch_failed", "version": job.version})
        job.timer = host.loop.call_later(delay_ms / 1000, self._submit, job)  # type: ignore[union-attr]

    def _staged(self, job: StagingJob) -> None:
        """(I/O thread) Every file of the round is staged here: ack up to the next round
        that is not, and let a flush apply it once it is committed."""
        host = self.host
        vnode, sync = host.vnode, host.sync
        if vnode is None or not vnode.ingest_staged(job.version):
            return
        self.count("rounds_staged")
        log.info("vg%d n%d: round %s at v%d staged (%d files) in %.3f s", host.id, host.node_id,
                 job.record.round, job.version, len(job.record.files),
                 time.monotonic() - job.started,
                 extra={"event": "ingest_staged", "version": job.version})
        if sync is not None and host.state == "serving" and host.role != "master":
            bound = self.ack_bound(vnode.get_version())
            if bound >= job.version:
                sync.ack_forward(bound)
                killpoint(KP_SLAVE_ACKED)
        host._maybe_flush()

    def serve_fetch(self, stream: SyncStream, node: int) -> None:
        """(SyncCallbacks.serve_fetch, a thread per FETCH connection) Fetcher.serve_fetch."""
        self.fetcher.serve_fetch(stream, node)

    # -- life ---------------------------------------------------------------------------------------
    def stop(self) -> None:
        """(any thread) Cancel the staging jobs and the executor."""
        self._stopped = True
        if self._nudging is not None:
            self._nudging.cancel()
        for job in list(self.jobs.values()):
            job.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def status(self) -> dict[str, Any]:
        vnode = self.host.vnode
        pending = vnode.pending_ingests() if vnode is not None else []
        with self._lock:
            counters = dict(self.counters)
        return {"pending_rounds": len(pending),
                "unstaged_rounds": sum(1 for p in pending if not p.staged),
                "staging_jobs": len(self.jobs), **counters}
