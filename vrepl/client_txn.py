"""The Python client's transactions (docs/client-api.md §Transactions):

    with client.transaction(vgroup=1, label="load-2026-11-24") as txn:
        txn.put([["cpu", 1, {"x": 1.0}], ...])      # batch 0
        txn.put(more_rows)                          # batch 1
        txn.put_file("cpu.parquet", table="cpu")    # batch 2: a whole Parquet file
    # commit on a normal exit (VISIBLE: txn.visible_version), abort on an exception

Owns: Transaction, which follows the vgroup's master for every step, numbers the batches
(seq 0, 1, ...) so a retried put is never staged twice, and retries a begin or a commit whose
outcome was unknown (both are answered by label / state, never applied twice).
Must not: import vrepl.client (the Client hands itself in), or retry a step that is not safe
to retry.
"""
from __future__ import annotations

import http.client
import json
import os
import random
import time
from typing import Any, Iterable, Sequence
from urllib.parse import urlencode

from vrepl._core.crc32c import crc32c

from vrepl.errors import ClientError, NotWrittenError, OutcomeUnknownError, TransactionError


class Transaction:
    """One transaction of one vgroup. Made by Client.transaction(); begin() is called by the
    `with` statement (or by hand). After a duplicate begin whose transaction is already
    VISIBLE (a retried job), `already_done` is True: put() and commit() do nothing."""

    def __init__(self, client: Any, vgroup: int, label: str, timeout_ms: int | None = None):
        self.client = client
        self.vgroup = vgroup
        self.label = label
        self.timeout_ms = timeout_ms
        self.id: int | None = None
        self.state = ""
        self.visible_version = 0
        self.already_done = False
        self.next_seq = 0
        self.last: dict[str, Any] = {}

    # -- the steps ----------------------------------------------------------------------------
    def begin(self) -> "Transaction":
        body: dict[str, Any] = {"label": self.label}
        if self.timeout_ms is not None:
            body["timeout_ms"] = self.timeout_ms
        doc = self._call("POST", "txn", json.dumps(body).encode(), retry_unknown=True)
        self._take(doc)
        self.already_done = doc["state"] == "VISIBLE"
        if doc["state"] not in ("PREPARE", "VISIBLE"):
            raise TransactionError(409, "txn_not_open", f"label {self.label} is transaction"
                                   f" {self.id}, {doc['state']} ({doc.get('reason', '')})")
        return self

    def put(self, rows: Iterable[Sequence[Any]] | bytes, seq: int | None = None) -> dict:
        """Stage a batch (rows [table, ts, {column: value}] or their JSON bytes) as batch
        `seq` (default: the next number). Retried with the same seq when the outcome is
        unknown: the vgroup stages each seq once."""
        if self.already_done:
            return self.last
        if seq is None:
            seq, self.next_seq = self.next_seq, self.next_seq + 1
        body = rows if isinstance(rows, bytes) else json.dumps(
            list(rows), separators=(",", ":"), allow_nan=False).encode()
        doc = self._call("POST", f"txn/{self._id()}/rows?seq={seq}", body, retry_unknown=True)
        self._take(doc)
        return doc

    def put_file(self, file: str | os.PathLike | bytes, table: str, seq: int | None = None,
                 origin: str = "") -> dict:
        """Stage a whole Parquet file (its path, or its bytes) holding rows of `table` as
        batch `seq` (default: the next number; file puts and row batches share the
        numbers): streamed to the master with its CRC-32C, which the master checks, then
        staged on every replica and published by the commit with the rest
        (docs/transactions.md §4.1). Retried with the same seq when the outcome is
        unknown: staged once."""
        if self.already_done:
            return self.last
        if seq is None:
            seq, self.next_seq = self.next_seq, self.next_seq + 1
        if isinstance(file, bytes):
            data = file
        else:
            with open(file, "rb") as fh:
                data = fh.read()
        query = urlencode({"table": table, "seq": seq, "crc32c": crc32c(data) or 1,
                           **({"origin": origin} if origin else {})})
        doc = self._call("POST", f"txn/{self._id()}/file?{query}", data, retry_unknown=True)
        self._take(doc)
        return doc

    def load(self, rows: Iterable[Sequence[Any]] | bytes, commit: bool = True) -> dict:
        """Begin, stage `rows` as batch 0 and (with `commit`) publish, in one request
        (docs/client-api.md §Transactions): the master forwards the records back to back
        and answers once the last is committed. Retried on an unknown outcome: the label
        answers the original transaction, and an open one is completed, never doubled."""
        body: dict[str, Any] = {"label": self.label, "commit": commit}
        if self.timeout_ms is not None:
            body["timeout_ms"] = self.timeout_ms
        raw = rows if isinstance(rows, bytes) else json.dumps(
            list(rows), separators=(",", ":"), allow_nan=False).encode()
        head = json.dumps(body, separators=(",", ":")).encode()
        doc = self._call("POST", "txn", head[:-1] + b',"rows":' + raw + b"}", retry_unknown=True)
        self._take(doc)
        self.next_seq = 1
        self.already_done = doc["state"] == "VISIBLE"
        return doc

    def precommit(self) -> dict:
        if self.already_done:
            return self.last
        doc = self._call("POST", f"txn/{self._id()}/precommit", b"", retry_unknown=True)
        self._take(doc)
        return doc

    def commit(self) -> dict:
        """Publish: answered once the publish record is committed and applied (VISIBLE)."""
        if self.already_done:
            return self.last
        doc = self._call("POST", f"txn/{self._id()}/commit", b"", retry_unknown=True)
        self._take(doc)
        return doc

    def abort(self, reason: str = "") -> dict:
        body = json.dumps({"reason": reason}).encode() if reason else b""
        doc = self._call("POST", f"txn/{self._id()}/abort", body, retry_unknown=True)
        self._take(doc)
        return doc

    def show(self, node: str | None = None) -> dict:
        return self.client._get(self.vgroup, f"txn/{self._id()}", node)

    def __enter__(self) -> "Transaction":
        return self.begin()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.id is None or self.already_done:
            return
        if exc_type is None:
            self.commit()
            return
        try:
            self.abort(f"{exc_type.__name__} in the loader")
        except ClientError:
            pass        # the master's timeout aborts it anyway

    # -- plumbing -----------------------------------------------------------------------------
    def _id(self) -> int:
        if self.id is None:
            raise RuntimeError("the transaction is not begun")
        return self.id

    def _take(self, doc: dict) -> None:
        self.last = doc
        self.id = doc.get("txn", self.id)
        self.state = doc.get("state", self.state)
        self.visible_version = doc.get("visible_version", self.visible_version)

    def _call(self, method: str, path: str, body: bytes, retry_unknown: bool) -> dict:
        """One step on the vgroup's master, following it; retried on an unknown outcome
        (every step here is answered, not repeated, when asked again)."""
        c, vgroup = self.client, self.vgroup
        full = f"/v1/vgroups/{vgroup}/{path}"
        deadline = time.monotonic() + c.timeout_s
        pause = c.retry_pause_s
        last, unknown = "no node tried", None
        while True:
            ep = c._master.get(vgroup) or c.find_master(vgroup)
            if ep is not None:
                try:
                    code, doc = c.request(ep, method, full, body)
                except (OSError, http.client.HTTPException) as exc:
                    c._master.pop(vgroup, None)
                    last = unknown = f"{ep}: {type(exc).__name__}: {exc}"
                else:
                    if code == 200:
                        return doc
                    last = f"{ep}: {code} {doc.get('error')}"
                    if 400 <= code < 500 and doc.get("code") != "not_master":
                        raise TransactionError(code, doc.get("code", ""), doc.get("error", ""))
                    if doc.get("outcome") == "unknown":
                        unknown = last
                        if not retry_unknown:
                            raise OutcomeUnknownError(self.label, last)
                    c._master.pop(vgroup, None)
                    if doc.get("master_http") and doc.get("master_http") != ep:
                        c._master[vgroup] = doc["master_http"]
                        continue
            if time.monotonic() + pause > deadline:
                if unknown is not None:
                    raise OutcomeUnknownError(self.label, unknown)
                raise NotWrittenError(f"vg{vgroup}: no master took {method} {path} within"
                                      f" {c.timeout_s} s ({last})")
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 0.5)
