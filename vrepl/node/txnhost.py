"""Transactions of one vgroup on a node (docs/transactions.md, docs/client-api.md
§Transactions): the master's API (begin, put rows, pre-commit, commit, abort) and every
replica's answers (show, list).

Owns: turning each client step into one format-9 WAL record (vrepl/txn/record.py) forwarded
by the master, waiting for the group to commit it, applying it (the vnode's TxnTable decides
what it did, identically on every replica) and answering from that outcome; the refusals at
begin (limits of [txn]), the timeout abort on the master's own tick clock (a monotonic
deadline per open transaction, restarted when a node becomes master), the COMMITTED view (a
commit record forwarded, not yet applied) and the transaction counters for the metrics.
Runs on the node's I/O thread (like VgroupHost).
Must not: write the WAL or touch the memtable (the sync instance and the vnode do), or trust
the client's clock.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

from vrepl.killpoints import killpoint, register
from vrepl.node.config import NodeConfig
from vrepl.node.http import Response, error
from vrepl.node.txnfile import TxnFiles
from vrepl.replica import ConfirmStatus, invariant
from vrepl.sync import FlowControlError, NotRunningError, SyncInstance
from vrepl.txn.machine import (ABORTED, ABORTED_NOW, BEGUN, COMMITTED, IGNORED,
                               PRECOMMITTED, PREPARE, PUBLISHED, SEALED, STAGED, VISIBLE,
                               Outcome, Txn)
from vrepl.txn.record import TxnRecord, encode_rows_payload, encode_txn_payload, label_invalid
from vrepl.vnode import Vnode
from vrepl.vnode.errors import VnodeError

log = logging.getLogger("vrepl.node")

KP_BEGIN = register("txn.master.after_begin", "a transaction's begin record is committed; the"
                    " loader has no answer")
KP_ROWS = register("txn.master.after_rows", "a batch of a transaction is committed in the log;"
                   " the loader has no answer")
KP_PRECOMMIT = register("txn.master.after_precommit", "the pre-commit record is committed; the"
                        " loader has no answer")
KP_COMMIT_FORWARDED = register("txn.master.after_commit_forwarded", "the commit (publish)"
                               " record is handed to forward(); it may or may not be in the WAL")
KP_COMMIT = register("txn.master.after_commit", "the publish record is committed and applied"
                     " here (VISIBLE); the loader has no answer")
KP_ABORT = register("txn.master.after_abort", "the abort record is committed; the loader has"
                    " no answer")

LIST_MAX = 1000


class TxnNodeHost(Protocol):
    """What Txns needs of its VgroupHost (vrepl/node/vgroup.py)."""

    id: int
    node_id: int
    path: str
    node_cfg: NodeConfig
    rounds: Any     # vrepl/node/ingest.py Rounds: the ingest executor, staging jobs
    vnode: Vnode | None
    sync: SyncInstance | None
    loop: asyncio.AbstractEventLoop | None
    state: str
    role: str
    epoch: int
    next_version: int
    stopping: bool

    def _not_master(self) -> Response: ...

    def _needs_restore_answer(self, what: str) -> Response: ...

    def _maybe_flush(self) -> None: ...


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result((ConfirmStatus.TIMED_OUT, None))


@dataclass
class _Forwarded:
    payload: bytes
    epoch: int
    future: asyncio.Future       # -> (ConfirmStatus, Outcome | None)


class Txns:
    def __init__(self, host: TxnNodeHost) -> None:
        self.host = host
        self.forwarded: dict[int, _Forwarded] = {}      # master: version -> outcome awaited
        self.begins: dict[str, asyncio.Future] = {}     # master: label -> its begin in flight
        self.finishing: dict[int, tuple[str, asyncio.Future]] = {}   # txn -> commit/abort
        self.deadlines: dict[int, float] = {}           # master: txn -> monotonic deadline
        self.commit_started: dict[int, float] = {}      # txn -> when its commit was forwarded
        self.visible_lag_ms: list[float] = []           # commit forwarded -> VISIBLE, recent
        self.refusals: Counter[str] = Counter()
        self.files = TxnFiles(self)                     # master: file puts (txnfile.py)

    @property
    def cfg(self):
        return self.host.node_cfg.txn

    # -- every replica ----------------------------------------------------------------------
    def _table(self):
        vnode = self.host.vnode
        return vnode.txns.table if vnode is not None else None

    def show(self, key: str) -> Response:
        """GET .../txn/{txn}: a transaction by id, or by label ("label:<label>")."""
        t = self._find(key)
        if isinstance(t, Response):
            return t
        return Response(200, {"vgroup": self.host.id, "node": self.host.node_id,
                              **self._describe(t)})

    def list(self, open_only: bool = False) -> Response:
        table = self._table()
        if table is None:
            return error(503, "not_running", f"vg{self.host.id}: not serving")
        txns = [self._describe(t) for t in reversed(table.txns.values())
                if not open_only or t.open][:LIST_MAX]
        return Response(200, {"vgroup": self.host.id, "node": self.host.node_id,
                              "role": self.host.role, "txns": txns})

    def _find(self, key: str, step: bool = False) -> Txn | Response:
        """The transaction `key` names (an id or label:<label>), or the refusal; a `step`'s
        refusal (a POST) says `"outcome": "not_written"`, as every step refusal does."""
        extra = {"outcome": "not_written"} if step else {}
        table = self._table()
        if table is None:
            return error(503, "not_running", f"vg{self.host.id}: not serving", **extra)
        if key.startswith("label:"):
            t = table.by_label(key[6:])
        elif key.isdigit() and len(key) < 19:
            t = table.get(int(key))
        else:
            return error(400, "bad_txn", f"{key[:40]!r} is neither a transaction id nor"
                         " label:<label>", **extra)
        if t is None:
            return error(404, "no_txn", f"vg{self.host.id}: no transaction {key[:140]} on"
                         f" n{self.host.node_id} (never begun, not replicated here yet, or"
                         " its label expired)", **extra)
        return t

    def _describe(self, t: Txn) -> dict[str, Any]:
        doc = t.describe()
        now = time.monotonic()
        if t.open and t.id in self.finishing and self.finishing[t.id][0] == "commit":
            doc["state"] = COMMITTED       # the publish record is forwarded, not yet applied
        doc["waits_on"] = {PREPARE: "the loader: rows, then pre-commit or commit",
                           PRECOMMITTED: "the loader: commit or abort",
                           COMMITTED: "the group: the publish record to be committed",
                           VISIBLE: "nothing", ABORTED: "nothing"}[doc["state"]]
        deadline = self.deadlines.get(t.id)
        if t.open and deadline is not None and self.host.role == "master":
            doc["timeout_in_ms"] = max(0, round((deadline - now) * 1000))
        return doc

    # -- master: refusals -------------------------------------------------------------------
    def _refusal(self) -> Response | None:
        host = self.host
        if host.state != "serving":
            return host._needs_restore_answer("takes no transactions")
        if host.role != "master" or host.stopping or host.sync is None or host.vnode is None:
            return host._not_master()
        return None

    def _refuse(self, status: int, code: str, reason: str) -> Response:
        self.refusals[code] += 1
        return error(status, code, reason, outcome="not_written")

    # -- master: forwarding one record -------------------------------------------------------
    def _send(self, payload: bytes) -> tuple[int, asyncio.Future]:
        """Forward one record at the next version (FlowControlError, NotRunningError)."""
        host = self.host
        version = host.next_version
        host.sync.forward(version, payload)  # type: ignore[union-attr]
        host.next_version = version + 1
        fut = host.loop.create_future()  # type: ignore[union-attr]
        self.forwarded[version] = _Forwarded(payload, host.epoch, fut)
        return version, fut

    async def _outcome(self, fut: asyncio.Future) -> tuple[ConfirmStatus, Outcome | None]:
        # A timer, not asyncio.wait_for (two more tasks and loop turns per step, as the
        # write path avoids, docs/perf.md §HTTP): on expiry the outcome is unknown; the
        # record stays forwarded and confirm() still applies it.
        timer = self.host.loop.call_later(  # type: ignore[union-attr]
            self.host.node_cfg.http.write_timeout_ms / 1000, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    def confirm(self, version: int, status: ConfirmStatus, apply: bool) -> bool:
        """(from VgroupHost._confirm, in version order) A transaction record's outcome:
        apply it (it is in the log) and wake its caller. False if not ours."""
        fwd = self.forwarded.pop(version, None)
        if fwd is None:
            return False
        outcome = None
        if apply:
            try:
                outcome = self.host.vnode.apply_txn(version, fwd.epoch, fwd.payload)  # type: ignore[union-attr]
                self.on_applied(outcome)
            except VnodeError as exc:     # closed while stopping, or a diverged schema
                log.warning("vg%d: transaction record v%d not applied: %s", self.host.id,
                            version, exc)
        if not fwd.future.done():
            fwd.future.set_result((status, outcome))
        return True

    def on_applied(self, outcome: Outcome | None) -> None:
        """A transaction record applied here (master or slave): keep the deadlines."""
        if outcome is None or outcome.txn is None:
            return
        t = outcome.txn
        if outcome.effect == BEGUN:
            self.deadlines[t.id] = time.monotonic() + t.timeout_ms / 1000
        elif outcome.effect in (PUBLISHED, ABORTED_NOW):
            if t.files:     # its files records' staging jobs end (the TxnRound's go on)
                self.host.rounds.resume()
            self.deadlines.pop(t.id, None)
            started = self.commit_started.pop(t.id, None)
            if started is not None and outcome.effect == PUBLISHED:
                self.visible_lag_ms.append((time.monotonic() - started) * 1000)
                del self.visible_lag_ms[:-1000]

    def became_master(self) -> None:
        """Every open transaction gets a full timeout from now on this master's clock."""
        table = self._table()
        now = time.monotonic()
        self.deadlines = {t.id: now + t.timeout_ms / 1000 for t in table.open_txns()} \
            if table is not None else {}

    def _unknown(self, status: ConfirmStatus, version: int, what: str) -> Response:
        if status == ConfirmStatus.NOT_MASTER:
            return self.host._not_master()
        return error(504, "timeout", f"vg{self.host.id}: the {what} record at v{version} was not"
                     f" confirmed by a quorum in time ({status.describe()}): the outcome is"
                     " unknown; ask again (show) or retry with the same label",
                     outcome="unknown", version=version)

    # -- master: the steps ------------------------------------------------------------------
    async def begin(self, body: bytes) -> Response:
        refused = self._refusal()
        if refused is not None:
            return refused
        try:
            doc = json.loads(body.decode("utf-8") or "{}")
            if not isinstance(doc, dict) or set(doc) - {"label", "timeout_ms", "rows", "commit"}:
                raise ValueError('the body is {"label": L[, "timeout_ms": T][, "rows": [...]]'
                                 '[, "commit": true]}')
            rows, commit = doc.get("rows"), doc.get("commit", False)
            if type(commit) is not bool:
                raise ValueError("commit is not true or false")
            if rows is not None and (not isinstance(rows, list) or not rows):
                raise ValueError("rows is not a non-empty array of rows")
            rows_json = None if rows is None else json.dumps(
                rows, separators=(",", ":"), allow_nan=False).encode()
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            return self._refuse(400, "bad_txn", f"begin: {exc}")
        label, timeout_ms = doc.get("label"), doc.get("timeout_ms", self.cfg.timeout_ms)
        reason = label_invalid(label)
        if reason is None and (type(timeout_ms) is not int
                               or not 0 < timeout_ms <= self.cfg.max_timeout_ms):
            reason = (f"timeout_ms {str(timeout_ms)[:20]} is not in 1..{self.cfg.max_timeout_ms}"
                      " (max_timeout_ms)")
        if reason is not None:
            return self._refuse(400, "bad_txn", f"begin: {reason}")
        inflight = self.begins.get(label)
        if inflight is not None:            # the same label's begin is on its way: its answer
            await asyncio.shield(inflight)
        table = self._table()
        prev = table.by_label(label)
        if prev is not None and prev.state != ABORTED:
            if prev.state == VISIBLE or (rows_json is None and not commit):
                return self._answer(prev, duplicate=True)
            return await self._load_again(prev, rows_json, commit)
        running = len(table.open_txns()) + len(self.begins)
        if running >= self.cfg.max_running:
            return self._refuse(429, "too_many_txns", f"vg{self.host.id}: {running} transactions"
                                f" are running (max_running {self.cfg.max_running}); finish or"
                                " abort one, or retry later")
        staged = table.staged_bytes()
        if staged >= self.cfg.max_staged_bytes:
            return self._refuse(429, "too_many_staged_bytes", f"vg{self.host.id}: {staged} bytes"
                                f" are staged by running transactions (max_staged_bytes"
                                f" {self.cfg.max_staged_bytes}); retry later")
        version = self.host.next_version
        payloads = [encode_txn_payload(TxnRecord("begin", version, label=label,
                                                 timeout_ms=timeout_ms,
                                                 at_ms=int(time.time() * 1000)))]
        if rows_json is not None:
            payloads.append(encode_rows_payload(version, 0, rows_json))
            refused = self._rows_refusal(version, rows_json, payloads[-1], staged)
            if refused is not None:
                return refused
        if commit:
            payloads.append(encode_txn_payload(TxnRecord("commit", version,
                                                         at_ms=int(time.time() * 1000))))
        fut = self.host.loop.create_future()  # type: ignore[union-attr]
        self.begins[label] = fut
        try:
            if len(payloads) == 1:
                return await self._step(payloads[0], "begin", KP_BEGIN)
            return await self._load(version, tuple(payloads), commit)
        finally:
            del self.begins[label]
            fut.set_result(None)

    async def _load_again(self, t: Txn, rows_json: bytes | None, commit: bool) -> Response:
        """A one-request load whose label is an open transaction (a retry after an unknown
        outcome): its rows as batch 0 (answered, not staged again, if already staged), then
        its commit, each step as if sent on its own."""
        if rows_json is not None:
            r = await self.put(str(t.id), rows_json, "0")
            if r.status != 200 or not commit:
                return r
        return await self._finish_step(str(t.id), "commit")

    async def _load(self, version: int, payloads: tuple[bytes, ...], commit: bool) -> Response:
        """Begin, batch 0 and (with `commit`) the publish, forwarded back to back in one
        forward_many (flow control takes all or none) and answered once the last is
        committed and applied. The log orders them: if the begin is not committed (a
        step-down, a timeout), neither is anything after it; each record's outcome is read
        in order and the first that is not OK answers, as a lone step's would."""
        host = self.host
        try:
            host.sync.forward_many(version, payloads)  # type: ignore[union-attr]
        except FlowControlError as exc:
            return self._refuse(503, "overloaded", f"{exc}; retry later")
        except NotRunningError as exc:
            return self._refuse(503, "not_running", str(exc))
        futs = []
        for i, payload in enumerate(payloads):
            futs.append(host.loop.create_future())  # type: ignore[union-attr]
            self.forwarded[version + i] = _Forwarded(payload, host.epoch, futs[-1])
        host.next_version = version + len(payloads)
        done = host.loop.create_future()  # type: ignore[union-attr]
        if commit:
            self.finishing[version] = ("commit", done)
            self.commit_started[version] = time.monotonic()
            killpoint(KP_COMMIT_FORWARDED)
        try:
            whats = ("begin", "rows", "commit") if len(payloads) == 3 else \
                ("begin", "commit" if commit else "rows")
            kps = {"begin": KP_BEGIN, "rows": KP_ROWS, "commit": KP_COMMIT}
            for i, (what, fut) in enumerate(zip(whats, futs)):
                answer = await self._answer_step(version + i, fut, what, kps[what])
                if answer.status != 200 or i == len(futs) - 1:
                    break
            return answer
        finally:
            if commit:
                del self.finishing[version]
                done.set_result(version + len(payloads) - 1)

    async def put(self, key: str, body: bytes, seq_text: str | None = None) -> Response:
        """Stage a batch of rows (a JSON array) as batch `seq` of the transaction: a seq
        already staged is answered, not staged again (a retried or speculative put)."""
        refused = self._refusal()
        if refused is not None:
            return refused
        t = self._find(key, step=True)
        if isinstance(t, Response):
            return t
        if seq_text is None:
            seq = self.host.next_version        # unique: no dedup for a loader without seqs
        elif seq_text.isdigit() and len(seq_text) < 19:
            seq = int(seq_text)
        else:
            return self._refuse(400, "bad_txn", f"seq {seq_text[:30]!r} is not an integer >= 0")
        if seq in t.seqs:
            return self._answer(t, duplicate=True)
        if t.state != PREPARE or t.id in self.finishing:
            return self._refuse(409, "txn_not_open", f"transaction {t.id} is {self._state(t)}"
                                f"{self._why(t)}: it takes no more rows")
        vnode = self.host.vnode
        staged = vnode.txns.table.staged_bytes()  # type: ignore[union-attr]
        if staged + len(body) > self.cfg.max_staged_bytes:
            return self._refuse(429, "too_many_staged_bytes", f"transaction {t.id}: {staged} +"
                                f" {len(body)} bytes would exceed max_staged_bytes"
                                f" {self.cfg.max_staged_bytes} (nothing staged)")
        payload = encode_rows_payload(t.id, seq, bytes(body))
        refused = self._rows_refusal(t.id, bytes(body), payload, None)
        if refused is not None:
            return refused
        return await self._step(payload, "rows", KP_ROWS)

    def _rows_refusal(self, txn: int, rows_json: bytes, payload: bytes, staged: int | None
                      ) -> Response | None:
        """A batch's refusals before it is forwarded: too many staged bytes (when `staged`
        is given: a one-request load, whose begin is not forwarded either), a record above
        max_payload_bytes, rows failing the write rules. The check reserves the batch's new
        columns, as a write's does, so it comes last."""
        if staged is None:
            who, then = f"transaction {txn}", "nothing staged; the transaction stays open"
        else:       # a one-request load: no transaction exists, none is begun
            who, then = "begin", "nothing written, no transaction begun"
        if staged is not None and staged + len(rows_json) > self.cfg.max_staged_bytes:
            return self._refuse(429, "too_many_staged_bytes", f"{who}: {staged} +"
                                f" {len(rows_json)} bytes would exceed max_staged_bytes"
                                f" {self.cfg.max_staged_bytes} ({then})")
        size = len(payload)
        limit = self.host.node_cfg.vnode.max_payload_bytes
        if size > limit:
            return self._refuse(413, "too_large", f"{who}: the batch's record would be {size}"
                                f" bytes, above max_payload_bytes {limit}: put it in several"
                                f" batches ({then})")
        reason, _, _ = self.host.vnode.prepare_raw(rows_json)  # type: ignore[union-attr]
        if reason is not None:
            return self._refuse(400, "bad_rows", f"{who}: {reason} ({then})")
        return None

    async def precommit(self, key: str) -> Response:
        return await self._finish_step(key, "precommit")

    async def commit(self, key: str) -> Response:
        return await self._finish_step(key, "commit")

    async def abort(self, key: str, body: bytes = b"") -> Response:
        reason = "client"
        if body.strip():
            try:
                doc = json.loads(body.decode("utf-8"))
                given = doc.get("reason") if isinstance(doc, dict) else None
                if not isinstance(given, str) or not given.isprintable():
                    raise ValueError('the body is {"reason": "<printable text>"}')
                reason = f"client: {given[:180]}"
            except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                return self._refuse(400, "bad_txn", f"abort: {exc}")
        return await self._finish_step(key, "abort", reason)

    async def _finish_step(self, key: str, op: str, reason: str = "") -> Response:
        refused = self._refusal()
        if refused is not None:
            return refused
        t = self._find(key, step=True)
        if isinstance(t, Response):
            return t
        going = self.finishing.get(t.id)
        if going is not None:               # a commit or abort on its way: its outcome
            await asyncio.shield(going[1])
            t = self._table().get(t.id) or t
        if t.state == VISIBLE:
            if op == "abort":
                return self._refuse(409, "txn_visible", f"transaction {t.id} is VISIBLE at"
                                    f" v{t.finish_version}: it cannot be aborted")
            return self._answer(t, duplicate=True)
        if t.state == ABORTED:
            if op == "abort":
                return self._answer(t, duplicate=True)
            what = "committed" if op == "commit" else "pre-committed"
            return self._refuse(409, "txn_aborted", f"transaction {t.id} is ABORTED"
                                f"{self._why(t)}: it cannot be {what}")
        if op == "precommit" and t.state == PRECOMMITTED:
            return self._answer(t, duplicate=True)
        version = self.host.next_version
        payload = encode_txn_payload(TxnRecord(op, t.id, at_ms=int(time.time() * 1000),
                                               reason=reason))
        if op == "precommit":
            return await self._step(payload, op, KP_PRECOMMIT)
        fut = self.host.loop.create_future()  # type: ignore[union-attr]
        self.finishing[t.id] = (op, fut)
        if op == "commit":
            self.commit_started[t.id] = time.monotonic()
        try:
            return await self._step(payload, op, KP_COMMIT if op == "commit" else KP_ABORT,
                                    KP_COMMIT_FORWARDED if op == "commit" else None)
        finally:
            del self.finishing[t.id]
            fut.set_result(version)

    async def _step(self, payload: bytes, what: str, kp: str, kp_forwarded: str | None = None,
                    patient: bool = False) -> Response:
        try:
            version, fut = self._send(payload)
        except FlowControlError as exc:
            return self._refuse(503, "overloaded", f"{exc}; retry later")
        except NotRunningError as exc:
            return self._refuse(503, "not_running", str(exc))
        if kp_forwarded is not None:
            killpoint(kp_forwarded)
        return await self._answer_step(version, fut, what, kp, patient)

    async def _answer_step(self, version: int, fut: asyncio.Future, what: str, kp: str,
                           patient: bool = False) -> Response:
        """A forwarded record's answer, once its outcome is known. `patient` (a files
        record): the replicas acknowledge it only once they fetched its files, often after
        the sync layer's forward timeout; it is in the log and commits with a later record,
        so wait (nudging with no-ops, as ingest does) until `write_timeout_ms`."""
        host = self.host
        epoch, deadline = host.epoch, host.loop.time() + host.node_cfg.http.write_timeout_ms / 1000  # type: ignore[union-attr]
        status, outcome = await self._outcome(fut)
        if patient and status == ConfirmStatus.TIMED_OUT and outcome is not None:
            status = await host.rounds._await_commit(version, epoch, deadline)
        if status != ConfirmStatus.OK or outcome is None:
            return self._unknown(status, version, what)
        killpoint(kp)
        if outcome.effect == IGNORED:
            if outcome.duplicate and outcome.txn is not None:    # a repeated step: its answer
                return self._answer(outcome.txn, duplicate=True)
            return error(409, "txn_refused", f"the {what} record at v{version} was ignored:"
                         f" {outcome.reason}", outcome="written", version=version)
        if outcome.effect == PUBLISHED:
            self.host._maybe_flush()
            if outcome.txn is not None and outcome.txn.files:
                # Its files and rows are visible here once a flush archives them (a flush
                # point, due at once): answer then, so the loader reads its load.
                await self.host.rounds._wait_applied(
                    version, self.host.node_cfg.http.write_timeout_ms / 1000)
        invariant(outcome.effect in (BEGUN, STAGED, SEALED, PUBLISHED, ABORTED_NOW)
                  and outcome.txn is not None, "an applied record names its transaction")
        return self._answer(outcome.txn, version=version)

    # -- answers ----------------------------------------------------------------------------
    def _state(self, t: Txn) -> str:
        return COMMITTED if t.open and t.id in self.finishing \
            and self.finishing[t.id][0] == "commit" else t.state

    @staticmethod
    def _why(t: Txn) -> str:
        return f" ({t.reason})" if t.reason else ""

    def _answer(self, t: Txn, duplicate: bool = False, version: int = 0) -> Response:
        doc = {"vgroup": self.host.id, "node": self.host.node_id, **self._describe(t),
               "duplicate": duplicate}
        if version:
            doc["version"] = version
        return Response(200, doc)

    # -- master: the timeout abort ----------------------------------------------------------
    def tick(self) -> None:
        """(node tick) Abort the open transactions past their deadline on this master's
        clock (never the client's): one abort record each, reason "timeout"."""
        host = self.host
        if host.role != "master" or host.stopping or host.state != "serving" \
                or host.sync is None or host.loop is None:
            return
        table = self._table()
        if table is None:
            return
        now = time.monotonic()
        for t in table.open_txns():
            deadline = self.deadlines.setdefault(t.id, now + t.timeout_ms / 1000)
            if deadline <= now and t.id not in self.finishing:
                log.warning("vg%d n%d: transaction %d (label %s) is %s after its timeout of"
                            " %d ms: aborting it", host.id, host.node_id, t.id, t.label,
                            t.state, t.timeout_ms, extra={"event": "txn_timeout", "txn": t.id})
                self.deadlines[t.id] = now + 1.0      # retried a second later if it fails
                host.loop.create_task(self._finish_step(
                    str(t.id), "abort", f"timeout: still {t.state} after {t.timeout_ms} ms"))

    def cut_after(self) -> None:
        """The WAL was cut: the table is rebuilt by the vnode; nothing of ours to keep."""
        self.deadlines.clear()

    def status(self) -> dict[str, Any]:
        vnode = self.host.vnode
        doc = vnode.txns.status() if vnode is not None else {}
        lags = sorted(self.visible_lag_ms)
        doc["visible_lag_ms_p50"] = round(lags[len(lags) // 2], 3) if lags else None
        doc["visible_lag_ms_max"] = round(lags[-1], 3) if lags else None
        doc["refusals"] = dict(self.refusals)
        doc["committing"] = sum(1 for op, _ in self.finishing.values() if op == "commit")
        return doc

