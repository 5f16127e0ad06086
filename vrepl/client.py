"""The Python client of the node's HTTP/JSON API (docs/client-api.md).

Owns: finding the master of a vgroup among the nodes it knows (and following it after a
failover), keep-alive connections per node, and retries that never turn an unknown outcome
into a silent duplicate: every write carries a request id (random unless the caller gives
one), a retry sends the same id, and the vgroup's replicas remember the ids in their log
(docs/client-api.md §Retries), so a retried write that had in fact been applied is answered
with its original version instead of being written twice. When the client cannot learn the
outcome before its deadline it raises OutcomeUnknownError carrying the request id; the
caller may retry later with that id. Also the client side of the API's protection
(docs/security.md §The HTTP API): the bearer token sent with every request, HTTPS with the
certificate checked against a CA file (or the system's CAs), and reading a token file.
Must not: retry a write that the server refused as bad input (or a wrong token), or change a
request id.
"""
from __future__ import annotations

import http.client
import json
import os
import random
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from vrepl.client_txn import Transaction, TransactionError
from vrepl.errors import (
    BadRequestError,
    ClientError,
    ConfigError,
    NotWrittenError,
    OutcomeUnknownError,
    UnauthorizedError,
)

# A bearer token: visible ASCII without spaces, so it travels in a header as it is.
TOKEN_MAX_BYTES = 4096


@dataclass(frozen=True)
class WriteResult:
    version: int          # the record's version in the vgroup's log
    epoch: int
    node: int             # the master that answered
    duplicate: bool       # True: an earlier attempt with this request id had been applied
    request_id: str
    attempts: int


def token_invalid(token: str) -> str | None:
    """Why `token` cannot be a bearer token, or None."""
    if not token:
        return "the token is empty"
    if len(token) > TOKEN_MAX_BYTES:
        return f"the token is longer than {TOKEN_MAX_BYTES} characters"
    if any(not 0x21 <= ord(ch) <= 0x7E for ch in token):
        return "the token holds a space, a control or a non-ASCII character"
    return None


def read_token_file(path: str) -> str:
    """The bearer token in file `path`: its text without surrounding whitespace (the node's
    `http.token_file` and the CLI's `--token-file` read it the same way). ConfigError with one
    line ("<path>: <reason>") if it cannot be read or is not a token."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(TOKEN_MAX_BYTES + 64)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        token = "\x80"                       # refused below as non-ASCII
    reason = token_invalid(token)
    if reason:
        raise ConfigError(f"{path}: {reason}")
    return token


def client_ssl_context(cafile: str | None = None, verify: bool = True) -> ssl.SSLContext:
    """A TLS context for HTTPS to the nodes: the certificate is checked against `cafile` (PEM;
    default: the system's CAs) and must name the address dialled; `verify=False` checks
    nothing (tests only). ConfigError if `cafile` cannot be loaded."""
    try:
        ctx = ssl.create_default_context(cafile=cafile)
    except OSError as exc:       # FileNotFoundError, ssl.SSLError (not PEM)
        reason = exc.strerror or getattr(exc, "reason", None) or str(exc)
        raise ConfigError(f"CA file {cafile}: {reason}") from None
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"node address {text!r} is not host:port")
    return host.strip("[]"), int(port)


class _Conn:
    """One keep-alive HTTP/1.1 connection to a node, reopened after any error.

    A plain socket rather than http.client: a request is one sendall of pre-built bytes and
    the answer is parsed from one receive buffer, which costs a fraction of http.client's
    per-request work (docs/perf.md §client). Errors are OSError or http.client.HTTPException
    (RemoteDisconnected when the node closed the connection), as with http.client."""

    MAX_HEAD_BYTES = 65536

    def __init__(self, endpoint: str, timeout_s: float, ssl_context: ssl.SSLContext | None = None,
                 extra_headers: bytes = b"") -> None:
        self.endpoint = endpoint
        self.host, self.port = _endpoint(endpoint)
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context
        self.sock: socket.socket | None = None
        self.buf = bytearray()
        # After "Host: ": the endpoint and any further header lines (Authorization).
        self._head_lines = endpoint.encode() + extra_headers

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            try:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self.buf = bytearray()

    def request(self, method: str, path: str, body: bytes | None = None,
                content_type: bytes = b"application/json") -> tuple[int, dict]:
        if self.sock is None:
            self.connect()
        try:
            if body is None:
                msg = b"%s %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (
                    method.encode(), path.encode(), self._head_lines)
            else:
                msg = (b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (method.encode(), path.encode(),
                                                          self._head_lines, content_type,
                                                          len(body), body))
            self.sock.sendall(msg)  # type: ignore[union-attr]
            status, close, data = self._response()
            if close:
                self.close()
        except BaseException:
            self.close()
            raise
        try:
            doc = json.loads(data) if data else {}
        except ValueError:
            doc = {"error": data[:200].decode("latin-1"), "code": "not_json"}
        return status, doc

    def _recv(self) -> None:
        data = self.sock.recv(262144)  # type: ignore[union-attr]
        if not data:
            raise http.client.RemoteDisconnected("the node closed the connection")
        self.buf += data

    def _response(self) -> tuple[int, bool, bytes]:
        buf = self.buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buf) > self.MAX_HEAD_BYTES:
                raise http.client.LineTooLong("response head")
            self._recv()
        lines = bytes(buf[:end]).split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise http.client.BadStatusLine(lines[0][:80].decode("latin-1"))
        status = int(parts[1])
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                value = value.strip()
                if not value.isdigit():
                    raise http.client.HTTPException(f"bad Content-Length {value[:20]!r}")
                length = int(value)
            elif name == b"connection":
                close = value.strip().lower() == b"close"
        total = end + 4 + length
        while len(buf) < total:
            self._recv()
        data = bytes(buf[end + 4:total])
        del buf[:total]
        return status, close, data

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None
                self.buf = bytearray()


ARROW_CONTENT_TYPE = b"application/vnd.apache.arrow.stream"
# Below this many rows JSON costs less than Arrow at both ends (building and reading an IPC
# stream has a fixed cost of tens of µs; docs/perf.md §13.3): write() sends them as JSON.
BINARY_MIN_ROWS = 64
JSON_CONTENT_TYPE = b"application/json"
_ARROW_TYPES = {bool: "bool", int: "int64", float: "float64", str: "string"}


def rows_to_arrow(rows: Sequence[Sequence[Any]]) -> bytes | None:
    """The Arrow IPC stream of rows [table, ts, {column: value}] (docs/client-api.md §Binary
    writes: one table in the `vrepl.table` metadata, else a dictionary `_table` column; a
    column absent from a row is null there), or None when the rows do not map one to one
    (a column mixing value types, a non-int ts, a row without values, anything unexpected):
    the caller then sends them as JSON, and the node's answer explains what is wrong."""
    import pyarrow as pa
    try:
        if not rows:
            return None
        tables = [r[0] for r in rows]
        ts = [r[1] for r in rows]
        values = [r[2] for r in rows]
        if any(len(r) != 3 for r in rows) or {type(t) for t in ts} != {int} \
                or {type(t) for t in tables} != {str} or not all(values):
            return None
        names: dict[str, None] = {}
        for v in values:
            names.update(dict.fromkeys(v))
        arrays, fields = [], []
        for name in names:
            col = [v.get(name) for v in values]
            kinds = {type(x) for x in col}
            kinds.discard(type(None))
            if len(kinds) > 1 or type(name) is not str:
                return None
            typ = _ARROW_TYPES.get(kinds.pop()) if kinds else "null"
            if typ is None:
                return None
            arrays.append(pa.array(col, typ))
            fields.append(name)
        first = tables[0]
        metadata = None
        if tables.count(first) == len(tables):
            metadata = {"vrepl.table": first}
        else:
            arrays.insert(0, pa.array(tables, pa.string()).dictionary_encode())
            fields.insert(0, "_table")
        arrays.insert(0, pa.array(ts, pa.int64()))
        fields.insert(0, "ts")
        return arrow_stream(pa.record_batch(arrays, names=fields, metadata=metadata))
    except (pa.ArrowException, OverflowError, TypeError, ValueError, AttributeError,
            KeyError, IndexError):
        return None


ARROW_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def arrow_stream(data: Any) -> bytes:
    """The IPC stream bytes of a pyarrow RecordBatch or Table (uncompressed)."""
    import pyarrow as pa
    if isinstance(data, pa.RecordBatch) and not any(pa.types.is_dictionary(t)
                                                    for t in data.schema.types):
        # schema message + record batch message + end of stream: what the stream writer
        # writes for one batch without dictionaries, for a fraction of its cost
        return (data.schema.serialize().to_pybytes() + data.serialize().to_pybytes()
                + ARROW_END_OF_STREAM)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as w:
        w.write(data)
    return sink.getvalue().to_pybytes()


def _refused(endpoint: str, code: int, doc: dict) -> BadRequestError:
    """The error for a 4xx answer (not 409 not_master): UnauthorizedError for a 401."""
    if code == 401:
        return UnauthorizedError(code, doc.get("code", ""), f"{endpoint}: {doc.get('error', '')}")
    return BadRequestError(code, doc.get("code", ""), doc.get("error", ""))


def _arrow_refused(code: int, doc: dict) -> bool:
    """Whether an answer says the node does not read Arrow bodies: 415, or the 400 of a node
    that parsed the stream as JSON (one from before binary writes)."""
    if code == 415:
        return True
    reason = str(doc.get("error", ""))
    return code == 400 and reason.startswith(("body is not UTF-8", "body is not JSON"))


class Client:
    """`Client(["127.0.0.1:6201", ...])`: any subset of the cluster's nodes (HTTP addresses);
    the others are learnt from their status. Not thread-safe: one per thread."""

    def __init__(self, nodes: Sequence[str] | str, *, timeout_s: float = 10.0,
                 request_timeout_s: float = 15.0, retry_pause_s: float = 0.05,
                 token: str | None = None, tls: bool | ssl.SSLContext = False,
                 cafile: str | None = None, verify: bool = True, binary: bool = True) -> None:
        """`token`: sent as `Authorization: Bearer <token>` (the nodes' http.token_file).
        `binary`: write rows as an Arrow IPC stream (docs/client-api.md §Binary writes),
        falling back to JSON for a node that does not take it (415) and for rows that do
        not map to Arrow one to one; False: always JSON.
        HTTPS when `tls` is True (or an ssl.SSLContext, used as it is) or `cafile` is given:
        the nodes' certificates are checked against `cafile` (PEM; default: the system's
        CAs) and must name the address dialled; `verify=False` checks nothing (tests only)."""
        if isinstance(nodes, str):
            nodes = [n for n in nodes.split(",") if n]
        if not nodes:
            raise ValueError("give at least one node address (host:port)")
        for n in nodes:
            _endpoint(n)
        self.nodes: list[str] = list(dict.fromkeys(nodes))
        self.timeout_s = timeout_s                  # whole operation, retries included
        self.request_timeout_s = request_timeout_s  # one HTTP exchange
        self.retry_pause_s = retry_pause_s
        if token is not None and token_invalid(token):
            raise ValueError(f"bad token: {token_invalid(token)}")
        self.token = token
        self.ssl_context: ssl.SSLContext | None
        if isinstance(tls, ssl.SSLContext):
            self.ssl_context = tls
        elif tls or cafile is not None:
            self.ssl_context = client_ssl_context(cafile, verify)
        elif not verify:
            raise ValueError("verify=False needs tls=True")
        else:
            self.ssl_context = None
        self._extra_headers = (b"\r\nAuthorization: Bearer " + token.encode()) if token else b""
        self.binary = binary
        self._json_only: set[str] = set()           # nodes that refused Arrow bodies (415)
        self._conns: dict[str, _Conn] = {}
        self._master: dict[int, str] = {}           # vgroup -> master's http endpoint
        self.last_error: str | None = None          # why find_master last failed to reach a node

    # -- plumbing -----------------------------------------------------------------------------
    def _conn(self, endpoint: str) -> _Conn:
        c = self._conns.get(endpoint)
        if c is None:
            c = self._conns[endpoint] = _Conn(endpoint, self.request_timeout_s, self.ssl_context,
                                              self._extra_headers)
        return c

    def request(self, endpoint: str, method: str, path: str,
                body: bytes | None = None) -> tuple[int, dict]:
        """One exchange with one node: (status, JSON answer). UnauthorizedError on a 401."""
        code, doc = self._conn(endpoint).request(method, path, body)
        if code == 401:
            raise _refused(endpoint, code, doc)
        return code, doc

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _learn(self, status: dict) -> None:
        for info in status.get("nodes", {}).values():
            ep = info.get("http")
            if ep and ep not in self.nodes:
                self.nodes.append(ep)

    # -- API ------------------------------------------------------------------------------------
    def status(self, node: str | None = None) -> dict:
        """The status document of one node (the first that answers if none is named)."""
        errors = []
        for ep in [node] if node else list(self.nodes):
            try:
                code, doc = self.request(ep, "GET", "/v1/status")
            except (OSError, http.client.HTTPException) as exc:
                errors.append(f"{ep}: {exc}")
                continue
            if code == 200:
                self._learn(doc)
                return doc
            errors.append(f"{ep}: {code} {doc.get('error')}")
        raise NotWrittenError(f"no node answered: {'; '.join(errors)}")

    def cluster_status(self) -> dict[str, dict | str]:
        """Every known node's status (or the error reaching it), by http address."""
        out: dict[str, dict | str] = {}
        i = 0
        while i < len(self.nodes):
            ep = self.nodes[i]
            i += 1
            try:
                code, doc = self.request(ep, "GET", "/v1/status")
                if code == 200:
                    self._learn(doc)
                    out[ep] = doc
                else:
                    out[ep] = f"{code} {doc.get('error')}"
            except UnauthorizedError as exc:
                out[ep] = f"401 {exc.reason}"
            except (OSError, http.client.HTTPException) as exc:
                out[ep] = f"unreachable: {exc}"
        return out

    def find_master(self, vgroup: int) -> str | None:
        """The http address of the node that says it is vgroup's master, or None."""
        hint = None
        self.last_error = None
        for ep in list(self.nodes):
            try:
                code, doc = self.request(ep, "GET", "/v1/status")
            except (OSError, http.client.HTTPException) as exc:
                self.last_error = f"{ep}: {type(exc).__name__}: {exc}"
                continue
            if code != 200:
                continue
            self._learn(doc)
            for vg in doc.get("vgroups", []):
                if vg.get("vgroup") != vgroup:
                    continue
                if vg.get("role") == "master":
                    self._master[vgroup] = ep
                    return ep
                hint = hint or vg.get("master_http")
        if hint:
            self._master[vgroup] = hint
        return hint

    def write(self, vgroup: int, rows: Iterable[Sequence[Any]] | bytes,
              request_id: str | None = None) -> WriteResult:
        """Write a batch of rows ([table, ts, {column: value}], or their JSON bytes) and return
        its version once a quorum confirmed it. Rows go as an Arrow IPC stream when the
        client is `binary` (the default), they are BINARY_MIN_ROWS or more and they map to
        one, else as JSON. Follows the
        master; retries with the same request id. Raises BadRequestError (refused: nothing
        written), NotWrittenError (no master took it) or OutcomeUnknownError (retry later
        with e.request_id)."""
        if isinstance(rows, bytes):
            return self._write(vgroup, None, lambda: rows, request_id)  # type: ignore[arg-type,return-value]
        rows = rows if isinstance(rows, list) else list(rows)
        arrow = rows_to_arrow(rows) if self.binary and len(rows) >= BINARY_MIN_ROWS else None
        return self._write(vgroup, arrow, lambda: json.dumps(
            rows, separators=(",", ":"), allow_nan=False).encode(), request_id)

    def write_arrow(self, vgroup: int, data: Any, request_id: str | None = None) -> WriteResult:
        """write() for columnar data: a pyarrow RecordBatch or Table, or the bytes of an Arrow
        IPC stream, following docs/client-api.md §Binary writes. A node that does not take
        Arrow bodies (415) raises BadRequestError: there is no JSON form to fall back to."""
        body = data if isinstance(data, bytes) else arrow_stream(data)
        return self._write(vgroup, body, None, request_id)

    def _write(self, vgroup: int, arrow: bytes | None, json_body: Any,
               request_id: str | None) -> WriteResult:
        """One write until its outcome: `arrow` (an IPC stream, or None) is sent to nodes that
        take it, else `json_body()` (None: none)."""
        body: bytes | None = None
        rid = request_id or os.urandom(16).hex()
        path = f"/v1/vgroups/{vgroup}/write?request_id={rid}"
        deadline = time.monotonic() + self.timeout_s
        unknown: str | None = None     # the last reason the outcome was unknown
        last = "no node tried"
        attempts = 0
        pause = self.retry_pause_s
        while True:
            ep = self._master.get(vgroup) or self.find_master(vgroup)
            if ep is None and self.last_error:
                last = f"no master found; {self.last_error}"
            if ep is not None:
                attempts += 1
                sent = False
                try:
                    conn = self._conn(ep)
                    if conn.sock is None:      # connect first: a refused connect sent nothing
                        code, doc = conn.request("GET", "/v1/status")
                    sent = True
                    if arrow is not None and (ep not in self._json_only or json_body is None):
                        code, doc = conn.request("POST", path, arrow, ARROW_CONTENT_TYPE)
                        if json_body is not None and _arrow_refused(code, doc):
                            self._json_only.add(ep)      # an older node: JSON from now on
                            code, doc = conn.request("POST", path, body or json_body(),
                                                     JSON_CONTENT_TYPE)
                    else:
                        body = body or json_body()
                        code, doc = conn.request("POST", path, body)
                except (OSError, http.client.HTTPException) as exc:
                    self._master.pop(vgroup, None)
                    last = f"{ep}: {type(exc).__name__}: {exc}"
                    if sent:   # the request may have reached the master
                        unknown = last
                else:
                    if code == 200:
                        return WriteResult(doc["version"], doc.get("epoch", 0), doc.get("node", 0),
                                           bool(doc.get("duplicate")), rid, attempts)
                    outcome = doc.get("outcome")
                    last = f"{ep}: {code} {doc.get('error')}"
                    if 400 <= code < 500 and doc.get("code") != "not_master":
                        raise _refused(ep, code, doc)
                    if outcome == "unknown":
                        unknown = last
                    if doc.get("code") in ("not_master", "not_confirmed", "needs_restore"):
                        self._master.pop(vgroup, None)
                        if doc.get("master_http") and doc.get("master_http") != ep:
                            self._master[vgroup] = doc["master_http"]
                            continue
            if time.monotonic() + pause > deadline:
                if unknown is not None:
                    raise OutcomeUnknownError(rid, unknown)
                raise NotWrittenError(f"vg{vgroup}: no master took the write within"
                                      f" {self.timeout_s} s ({last})")
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 0.5)

    def _get(self, vgroup: int, path: str, node: str | None) -> dict:
        """GET a vgroup's `path` from one replica (the master by default); the answer, or
        BadRequestError (4xx) / ClientError (5xx: e.g. 503 needs_restore)."""
        ep = node or self._master.get(vgroup) or self.find_master(vgroup) or self.nodes[0]
        code, doc = self.request(ep, "GET", f"/v1/vgroups/{vgroup}/{path}")
        if code != 200:
            if 400 <= code < 500:
                raise _refused(ep, code, doc)
            raise ClientError(f"{ep}: {code} {doc.get('error')}")
        return doc

    def tables(self, vgroup: int, node: str | None = None) -> dict:
        """The tables one replica (the master by default) holds rows of: {"tables": [{"name",
        "columns": {column: type}, "archived_rows", "memtable_rows"}], "version", ...}."""
        return self._get(vgroup, "tables", node)

    def read(self, vgroup: int, table: str, start: int | None = None, end: int | None = None,
             node: str | None = None, limit: int | None = None, as_of: int | None = None
             ) -> dict:
        """Rows of `table` with start <= ts < end from one replica (the master by default):
        {"rows": [{"ts", "_version", "_epoch", columns...}], "exists", "truncated",
        "version", "visible_version", ...}; "exists" is False when the replica holds no row
        of the table. `as_of=V`: once the replica applied V, without the rows written after
        V (docs/client-api.md §Read)."""
        q = [f"table={table}"]
        if start is not None:
            q.append(f"start={start}")
        if end is not None:
            q.append(f"end={end}")
        if limit is not None:
            q.append(f"limit={limit}")
        if as_of is not None:
            q.append(f"as_of={as_of}")
        return self._get(vgroup, f"rows?{'&'.join(q)}", node)

    def transaction(self, vgroup: int, label: str, timeout_ms: int | None = None) -> Transaction:
        """A transaction of `vgroup` under `label` (docs/client-api.md §Transactions): `with
        client.transaction(1, "job-7") as txn: txn.put(rows)` commits on a normal exit and
        aborts on an exception; a label already VISIBLE (a retried job) loads nothing."""
        return Transaction(self, vgroup, label, timeout_ms)

    def load(self, vgroup: int, label: str, rows: Any, timeout_ms: int | None = None) -> dict:
        """A whole small transaction in one request: begin, `rows` as batch 0, commit;
        the commit's answer (VISIBLE, `visible_version`). Transaction.load() explains."""
        return Transaction(self, vgroup, label, timeout_ms).load(rows)

    def transactions(self, vgroup: int, node: str | None = None, open_only: bool = False
                     ) -> dict:
        """GET /v1/vgroups/{vgroup}/txn from one replica (the master by default)."""
        return self._get(vgroup, "txn?open=1" if open_only else "txn", node)
