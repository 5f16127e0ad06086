"""The client API of one vgroup (the mixin VgroupClientApi of VgroupHost, vrepl/node/vgroup.py).

Owns: a client's write (validate, assign the next version, `forward()`, a future answered
when the record's outcome is known or the write timeout expires), retried writes answered
from the log (request-id dedup), the answers (200, 409 not_master, 503, 504 with the
outcome), queries and the table list, and the HTTP face of ingested files' rounds
(vrepl/node/ingest.py owns the rounds). docs/operations.md §The write path explains the
ordering.

The state it reads and writes (role, versions, pending writes, counters) lives on
VgroupHost and is set up by its __init__; everything here runs on the I/O thread, so it
needs no lock.
Must not: apply a record to the memtable before its outcome (VgroupHost._confirm does), write
the WAL (the sync instance owns it), or block the I/O thread on disk.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Awaitable, Sequence

from vrepl.node.http import Response, error
from vrepl.node.ingest import IngestError, IngestFile, IngestRemove, IngestResult
from vrepl.node.vgroup_restore import SERVING
from vrepl.replica import ConfirmStatus, invariant
from vrepl.sync import FlowControlError, NotRunningError
from vrepl.vnode.errors import VnodeClosedError, VnodeError

# The formats of a write's body (VgroupHost.write).
KIND_JSON, KIND_ARROW, KIND_LINES = "json", "arrow", "lines"


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




class VgroupClientApi:
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
                     meta: dict[str, Any] | None = None,
                     remove: Sequence[IngestRemove] = ()) -> IngestResult:
        """Forward one record naming `files` (in staging_dir()) and the archived files it
        removes (`remove`, docs/vnode.md §9.2) and return once committed; IngestError
        otherwise. On this vgroup's I/O loop (docs/vnode.md §9.1)."""
        return await self.rounds.ingest(files, kind, meta, remove)

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

    async def query(self, table: str, start: int, end: int, limit: int,
                    as_of: int | None = None) -> Response:
        vnode = self.vnode
        invariant(vnode is not None and self.loop is not None, "queries come after start()")
        if self.state != SERVING:
            return self._needs_restore_answer("serves no reads")
        if as_of is not None and vnode.get_version() < as_of:
            # "As of V" on a replica behind V: wait for it (docs/client-api.md §Read).
            deadline = time.monotonic() + self.node_cfg.http.write_timeout_ms / 1000
            while vnode.get_version() < as_of:
                if time.monotonic() > deadline or self.state != SERVING:
                    return error(504, "behind", f"vg{self.id}: this replica (n{self.node_id})"
                                 f" has applied up to v{vnode.get_version()}, not v{as_of},"
                                 " within write_timeout_ms; retry or ask another replica")
                await asyncio.sleep(0.01)
        seen: list[int] = []
        try:
            # One row past the limit says whether the answer is truncated. "As of V" leaves
            # rows out after the merge, so it cannot stop early (docs/client-api.md §Read).
            rows = await self.loop.run_in_executor(None, vnode.query, table, start, end, seen,
                                                   limit + 1 if as_of is None else None)
            exists = bool(rows) or vnode.has_table(table)
        except VnodeClosedError:
            if self.state != SERVING:
                return self._needs_restore_answer("serves no reads")
            return error(503, "stopping", f"vg{self.id}: this node is stopping")
        except VnodeError as exc:
            return error(400, "bad_query", str(exc))
        if self.state != SERVING:     # entered needs_restore while the query ran
            return self._needs_restore_answer("serves no reads")
        extra: dict[str, Any] = {}
        if as_of is not None:
            # Rows written after V are left out; a ts written again after V has no older row
            # to show (no history per ts), so it is left out too and counted.
            kept = [r for r in rows if r["_version"] <= as_of]
            extra = {"as_of": as_of, "left_out": len(rows) - len(kept)}
            rows = kept
        truncated = len(rows) > limit
        return Response(200, {"vgroup": self.id, "node": self.node_id, "role": self.role,
                              "version": vnode.get_version(),
                              "visible_version": seen[-1] if seen else vnode.get_version(),
                              "table": table, "exists": exists,
                              "rows": rows[:limit], "truncated": truncated, **extra})

    def tables(self) -> Response:
        """GET /v1/vgroups/{id}/tables: the tables this replica holds rows of."""
        vnode = self.vnode
        invariant(vnode is not None, "tables are listed after the vnode is open")
        if self.state != SERVING:
            return self._needs_restore_answer("serves no reads")
        return Response(200, {"vgroup": self.id, "node": self.node_id, "role": self.role,
                              "version": vnode.get_version(), "tables": vnode.tables()})
