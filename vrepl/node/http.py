"""A small HTTP/1.1 server on asyncio for the node's JSON API (docs/client-api.md).

Owns: parsing requests (request line, headers, Content-Length bodies) with limits on header
and body sizes, keep-alive and pipelining (one request at a time per connection, in order),
the connection limit, the read deadlines (headers, body progress, idle keep-alive, a client
that does not read its answers), the optional bearer token and TLS (docs/security.md §The
HTTP API), and writing JSON responses. Every malformed request gets a 4xx (505 for an HTTP
version it does not speak) with a one-line reason; nothing the client sends raises out of
this module.
Must not: know vgroups or rows: it calls `handler(request)`, which returns a Response or an
awaitable of one. The handler names the request's route (`request.route`, a pattern such as
`/v1/vgroups/{id}/write`); every response written is counted by (route, status) in
`HttpServer.responses` (the metrics, docs/operations.md §Metrics), with route "none" for a
request refused before it was parsed.
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import re
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qsl, unquote

from vrepl.errors import ConfigError, InvariantViolation
from vrepl.untrusted import printable

log = logging.getLogger("vrepl.node.http")

REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           405: "Method Not Allowed",
           408: "Request Timeout", 409: "Conflict", 411: "Length Required",
           413: "Content Too Large", 414: "URI Too Long", 415: "Unsupported Media Type", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
           504: "Gateway Timeout", 507: "Insufficient Storage", 505: "HTTP Version Not Supported"}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    route: str = "none"    # set by the handler: the route pattern, for the request counts
    sink: Any = None       # a streamed body (HttpServer's body_sink): `body` is then empty


@dataclass
class Response:
    status: int
    body: dict[str, Any] = field(default_factory=dict)
    close: bool = False
    headers: tuple[tuple[str, str], ...] = ()   # extra header lines (WWW-Authenticate)
    raw: bytes | None = None                  # sent as is instead of `body` as JSON
    content_type: str = "application/json"


def error(status: int, code: str, reason: str, **extra: Any) -> Response:
    """A JSON error answer: {"error": one-line reason, "code": ...}."""
    return Response(status, {"error": reason.replace("\n", " "), "code": code, **extra})


Handler = Callable[[Request], "Response | Awaitable[Response]"]


# One encoder for every answer: json.dumps with non-default arguments builds a new
# JSONEncoder (Python code) per call, a measurable share of a small write's cost.
_JSON = json.JSONEncoder(separators=(",", ":"))


def encode_response(resp: Response, keep_alive: bool) -> bytes:
    body = _JSON.encode(resp.body).encode() if resp.raw is None else resp.raw
    conn = b"keep-alive" if keep_alive and not resp.close else b"close"
    extra = (b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in resp.headers)
             if resp.headers else b"")
    if resp.status == 204:
        # RFC 9110 §8.6: no Content-Length in a 204, and it has no content to type.
        return b"HTTP/1.1 204 No Content\r\nConnection: %s\r\n%s\r\n" % (conn, extra)
    head = (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
            b"Connection: %s\r\n%s\r\n" % (resp.status, REASONS.get(resp.status, "Error").encode(),
                                           resp.content_type.encode(), len(body), conn, extra))
    return head + body


# Every TLS connection opens with a handshake record (content type 22); no request line starts
# with that byte, so a client speaking TLS to a plain-HTTP port is told apart at once.
TLS_HANDSHAKE_BYTE = b"\x16"
# `body_timeout_ms` bounds a body twice: no pause longer than it, and no more than one window
# of it per started BODY_WINDOW_BYTES in all, so a client dripping a byte at a time cannot
# hold a connection (docs/client-api.md §Deadlines).
BODY_WINDOW_BYTES = 64 * 1024
# How long a connection closed with an answer (a 408, a 413...) keeps reading what the client
# still sends, so that its answer reaches it (HttpProtocol._reply_close).
LINGER_S = 2.0
AUTH_CHALLENGE = 'Bearer realm="vrepl"'
# A well-formed version this server does not speak gets 505; anything else in its place, 400.
HTTP_VERSION_RE = re.compile(r"HTTP/[0-9](?:\.[0-9])?")


# Paths of InfluxDB's v1 API (docs/client-api.md §InfluxDB line protocol): their clients
# send the token as a password, in HTTP Basic auth or the `p` query parameter.
INFLUX_V1_PATHS = ("/write", "/ping")


def bearer_token_invalid(headers: dict[str, str], token: bytes, target: str = "") -> str | None:
    """Why the request does not prove `token` ("missing" or "wrong"), or None: `Authorization:
    Bearer <token>` (or `Token <token>`, InfluxDB v2's scheme), and on InfluxDB v1 paths
    also HTTP Basic auth or `?p=` with the token as the password (any user name).
    Constant-time in the token (hmac.compare_digest)."""
    value = headers.get("authorization")
    path, _, qs = target.partition("?")
    v1 = path in INFLUX_V1_PATHS
    if value is None:
        if v1 and qs:
            password = dict(parse_qsl(qs, keep_blank_values=True)).get("p")
            if password is not None:
                return None if hmac.compare_digest(password.encode("utf-8", "replace"),
                                                   token) else "wrong"
        return "missing"
    scheme, _, cred = value.partition(" ")
    scheme = scheme.lower()
    if scheme == "basic" and v1:
        try:
            cred = base64.b64decode(cred.strip(), validate=True).decode("utf-8").partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            return "wrong"
    elif scheme not in ("bearer", "token"):
        return "wrong"
    if not hmac.compare_digest(cred.strip().encode("utf-8", "replace"), token):
        return "wrong"
    return None


def unauthorized(why: str) -> Response:
    """401 with the challenge (RFC 6750 §3); the connection is closed after it."""
    if why == "missing":
        return Response(401, {"error": "this node requires a bearer token: send Authorization:"
                                       " Bearer <token> (docs/security.md)",
                              "code": "unauthorized", "outcome": "not_written"},
                        close=True, headers=(("WWW-Authenticate", AUTH_CHALLENGE),))
    return Response(401, {"error": "wrong bearer token", "code": "unauthorized",
                          "outcome": "not_written"}, close=True,
                    headers=(("WWW-Authenticate", AUTH_CHALLENGE + ', error="invalid_token"'),))


def _no_passphrase() -> bytes:
    raise ConfigError("the key is protected by a passphrase: give an unencrypted key file"
                      " readable only by the service user")


def server_ssl_context(cert_path: str, key_path: str) -> ssl.SSLContext:
    """The HTTP API's TLS context from PEM files (certificate chain, private key). ConfigError
    with one line when a file is missing or unreadable, not PEM, protected by a passphrase (a
    node never prompts), or the key does not match the certificate."""
    for what, path in (("tls_cert", cert_path), ("tls_key", key_path)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"{what} {path}: {exc.strerror}") from None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert_path, key_path, password=_no_passphrase)
    except ConfigError as exc:
        raise ConfigError(f"tls_key {key_path}: {exc}") from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(f"tls_key {key_path} does not match the certificate in tls_cert"
                              f" {cert_path}") from None
        raise ConfigError(f"tls_cert {cert_path} / tls_key {key_path}: not a PEM certificate"
                          f" chain and its private key ({exc.reason or exc})") from None
    return ctx
# The start of a request line: a method (an RFC 9110 token) and a space.
_METHOD_RE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]{0,32}")


# A `%` that does not start a percent-escape (RFC 3986: `%` and two hex digits).
_BAD_PERCENT_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def split_target(target: str) -> tuple[str, dict[str, str]]:
    """A request target's path (percent-decoded) and query parameters; ValueError for a
    malformed query string: a bare `%`, or escapes that do not decode to UTF-8 (400
    bad_request, docs/client-api.md §HTTP errors), rather than a value silently mangled."""
    path, _, qs = target.partition("?")
    bad = _BAD_PERCENT_RE.search(qs)
    if bad is not None:
        raise ValueError(f"malformed query string: {qs[bad.start():bad.start() + 3]!r} is not"
                         " a percent-escape (% and two hex digits)")
    try:
        query = dict(parse_qsl(qs, keep_blank_values=True, errors="strict"))
    except UnicodeDecodeError:
        raise ValueError("malformed query string: its percent-escapes are not UTF-8") from None
    return unquote(path), query


def _could_start_request(buf: bytearray) -> bool:
    """False once the bytes received cannot begin an HTTP request line."""
    n = _METHOD_RE.match(buf).end()  # type: ignore[union-attr]  (matches the empty string)
    return n == len(buf) or (n > 0 and buf[n] == 0x20)


class HttpProtocol(asyncio.Protocol):
    def __init__(self, server: "HttpServer") -> None:
        self.server = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.busy = False          # a request is being handled: later ones wait (pipelining)
        self.closing = False
        now = time.monotonic()
        self.last_active = now     # the last byte received or answer sent
        # Read deadlines, checked by HttpServer._sweep (docs/client-api.md §Deadlines): when
        # the request being read began (its first byte; a new connection's: when accepted),
        # None while idle between requests; when its headers were complete and its body not.
        self.request_started: float | None = now
        self.body_started: float | None = None
        self.body_length = 0
        self.write_paused_at: float | None = None   # the client stopped reading our answers
        self.target: str | None = None    # the request target being read (refusals' shape)
        self.linger_until: float | None = None  # answered and half-closed: see _reply_close
        # A body streamed to a sink (HttpServer.body_sink) instead of buffered: the sink,
        # the bytes still to come, and the request waiting for them.
        self.sink: Any = None
        self.sink_left = 0
        self.sink_request: tuple[Request, bool] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        srv = self.server
        if len(srv.conns) >= srv.max_connections:
            self._reply_close(error(503, "too_many_connections",
                                    f"this node has {srv.max_connections} connections (max_connections)"),
                              linger=False)  # not in srv.conns: nothing would end its linger
            return
        srv.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.conns.discard(self)
        self.closing = True
        self._drop_sink()

    def _drop_sink(self) -> None:
        sink, self.sink, self.sink_request = self.sink, None, None
        if sink is not None:
            sink.abort()        # the body never came whole: nothing of it is kept

    def _feed_sink(self, data: bytes | bytearray) -> int:
        """Hand the streamed body its next bytes; how many it took. Once it has them all,
        the request is handled (with `sink` set and an empty body)."""
        n = min(len(data), self.sink_left)
        if n:
            self.sink.write(data if n == len(data) else data[:n])
            self.sink_left -= n
        if self.sink_left == 0:
            req, keep = self.sink_request  # type: ignore[misc]
            self.sink = self.sink_request = None
            self.body_started = self.request_started = None
            self._dispatch(req, keep)
        return n

    def data_received(self, data: bytes) -> None:
        now = self.last_active = time.monotonic()
        if self.closing:
            return
        if self.sink is not None and not self.buf:     # a streamed body's bytes, as they are
            n = self._feed_sink(data)
            if n == len(data):
                return
            data = data[n:]
        if not self.buf:
            if self.request_started is None:
                self.request_started = now
            if data[:1] == TLS_HANDSHAKE_BYTE and self.server.ssl_context is None:
                log.info("http: %s speaks TLS to a plain-HTTP port: closed", self.peer)
                self._close()
                return
        self.buf += data
        if not self.busy and self.write_paused_at is None:
            self._next()

    def pause_writing(self) -> None:
        # The client is not reading its answers: read no more requests until it does
        # (asyncio's write buffer high-water mark), and HttpServer._sweep closes it if it
        # stays so for idle_timeout_ms.
        self.write_paused_at = time.monotonic()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused_at = None
        if self.closing or self.transport is None:
            return
        if self.request_started is not None:
            self.request_started = time.monotonic()
        self.transport.resume_reading()
        if not self.busy:
            self._next()

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None  # the client closed its side: close ours (a lingering close ends here)

    def _reply_close(self, resp: Response, linger: bool = True) -> None:
        self.closing = True
        self._drop_sink()
        shape = self.server.shape_refusal
        if shape is not None and self.target is not None:
            resp = shape(self.target, resp)
        if self.transport is not None:
            self.server.responses[("none", resp.status)] += 1
            self.transport.write(encode_response(resp, False))
            if linger and self.transport.can_write_eof():
                # Half-close and keep reading (and dropping) what the client still sends for
                # LINGER_S: closing a socket with unread bytes makes the kernel answer RST,
                # which destroys this answer in the client's receive buffer before it reads
                # it (a client still sending its body would never see its 408).
                self.transport.write_eof()
                self.linger_until = time.monotonic() + LINGER_S
            else:
                self.transport.close()

    def expire(self, now: float) -> None:
        """Close this connection if it missed a deadline (HttpServer._sweep calls it)."""
        srv = self.server
        if self.linger_until is not None and now > self.linger_until and self.transport is not None:
            self.transport.abort()
            return
        if self.closing or self.transport is None:
            return
        if self.write_paused_at is not None:
            if now - self.write_paused_at > srv.idle_timeout_s:
                log.info("http: %s read no answer for %d ms: closed", self.peer,
                         srv.idle_timeout_s * 1000)
                self.closing = True
                self.transport.abort()
            return
        if self.busy:
            return              # the handler's own deadline (write_timeout_ms) answers
        if self.request_started is None:
            if now - self.last_active > srv.idle_timeout_s:
                self._close()   # idle keep-alive: closed without an answer
        elif self.body_started is None:
            if now - self.request_started > srv.header_timeout_s:
                log.info("http: %s sent no whole request line and headers within %d ms:"
                         " 408, closed", self.peer, srv.header_timeout_s * 1000)
                self._reply_close(error(408, "header_timeout", "request line and headers not"
                                        f" received within {srv.header_timeout_s * 1000:.0f} ms"
                                        " (header_timeout_ms)"))
        else:
            windows = max(1, -(-self.body_length // BODY_WINDOW_BYTES))
            if (now - self.last_active > srv.body_timeout_s
                    or now - self.body_started > srv.body_timeout_s * windows):
                log.info("http: %s body of %d bytes stalled: 408, closed", self.peer,
                         self.body_length)
                self._reply_close(error(408, "body_timeout", "the body did not progress within"
                                        f" {srv.body_timeout_s * 1000:.0f} ms (body_timeout_ms)",
                                        outcome="not_written"))

    def _next(self) -> None:
        """Parse and handle requests from the buffer until it holds no whole request."""
        srv = self.server
        while not self.closing and not self.busy and self.write_paused_at is None:
            buf = self.buf
            end = buf.find(b"\r\n\r\n", 0, srv.max_header_bytes + 4)
            if end < 0:
                if not _could_start_request(buf):
                    # Binary bytes (say a `vrepl restore` HELLO sent to this port instead of
                    # the replication port): answer at once rather than wait for a request
                    # line that never comes.
                    self._reply_close(error(400, "bad_request", "malformed request line:"
                                            " not an HTTP request (this is a node's HTTP"
                                            " client API port)"))
                    return
                if len(buf) > srv.max_header_bytes:
                    self._reply_close(error(431, "headers_too_large",
                                            f"request line and headers above {srv.max_header_bytes} bytes"))
                return
            try:
                head = bytes(buf[:end]).decode("latin-1")
                lines = head.split("\r\n")
                parts = lines[0].split(" ")
                if len(parts) != 3:
                    raise ValueError(f"malformed request line {lines[0][:80]!r}")
                method, target, version = parts
                self.target = target
                if version not in ("HTTP/1.1", "HTTP/1.0"):
                    if HTTP_VERSION_RE.fullmatch(version) is None:
                        raise ValueError(f"malformed HTTP version {version[:20]!r}")
                    self._reply_close(error(505, "bad_version", f"unsupported {version!r}:"
                                            " this node speaks HTTP/1.1 and HTTP/1.0"))
                    return
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if not sep or not name or name != name.strip():
                        raise ValueError(f"malformed header line {line[:80]!r}")
                    headers[name.lower()] = value.strip()
            except ValueError as exc:
                self._reply_close(error(400, "bad_request", str(exc)))
                return
            if srv.token is not None:
                why = bearer_token_invalid(headers, srv.token, target)
                if why is not None:
                    log.info("http: %s: 401, %s bearer token", self.peer, why)
                    self._reply_close(unauthorized(why))
                    return
            if "transfer-encoding" in headers:
                self._reply_close(error(411, "length_required", "Transfer-Encoding (a chunked"
                                        " body) is not supported: send Content-Length"))
                return
            length_text = headers.get("content-length", "0")
            if not length_text.isdigit() or len(length_text) > 15:
                self._reply_close(error(400, "bad_request", f"bad Content-Length {length_text[:20]!r}"))
                return
            length = int(length_text)
            try:
                path, query = split_target(target)
            except ValueError as exc:
                self._reply_close(error(400, "bad_request", str(exc)))
                return
            keep = (headers.get("connection", "").lower() != "close" if version == "HTTP/1.1"
                    else headers.get("connection", "").lower() == "keep-alive")
            sink = srv.body_sink(method, target, headers, length) \
                if srv.body_sink is not None and method == "POST" else None
            if isinstance(sink, Response):     # refused before its body is read
                self._reply_close(sink)
                return
            if sink is not None:               # streamed to the sink, not buffered
                del buf[:end + 4]
                self.target = None
                self.sink, self.sink_left = sink, length
                self.sink_request = (Request(method, path, query, headers, b"",
                                             sink=sink), keep)
                self.body_started, self.body_length = time.monotonic(), length
                del buf[:self._feed_sink(buf)]
                if self.sink is not None:
                    return
                continue
            if length > srv.max_body_bytes:
                self._reply_close(error(413, "body_too_large",
                                        f"body of {length} bytes is above max_body_bytes {srv.max_body_bytes}",
                                        outcome="not_written"))
                return
            total = end + 4 + length
            if len(buf) < total:
                if self.body_started is None:
                    self.body_started = time.monotonic()
                    self.body_length = length
                return
            body = bytes(buf[end + 4:total])
            del buf[:total]
            self.request_started = time.monotonic() if buf else None
            self.body_started = None
            self.target = None
            if not self._dispatch(Request(method, path, query, headers, body), keep):
                return

    def _dispatch(self, req: Request, keep: bool) -> bool:
        """Handle a whole request; True if it was answered at once (the next may follow)."""
        try:
            result = self.server.handler(req)
        except Exception as exc:  # a bug: answer 500, keep serving
            log.exception("handler failed on %s %s", printable(req.method), printable(req.path))  # the client's text
            result = error(500, "internal", f"internal error: {type(exc).__name__}: {exc}")
        if isinstance(result, Response):
            self._send(result, keep, req.route)
            return True
        self.busy = True
        task = asyncio.ensure_future(result)
        task.add_done_callback(lambda t, keep=keep, route=req.route: self._done(t, keep, route))
        return False

    def _done(self, task: asyncio.Future, keep: bool, route: str) -> None:
        self.busy = False
        if task.cancelled():
            resp = error(503, "stopping", "the node is stopping")
        elif task.exception() is not None:
            exc = task.exception()
            log.error("handler failed: %r", exc, exc_info=exc)
            resp = error(500, "internal", f"internal error: {type(exc).__name__}: {exc}")
        else:
            resp = task.result()
        self._send(resp, keep, route)
        if self.request_started is not None:    # a pipelined request's clock starts now
            self.request_started = self.last_active
        if not self.closing:
            self._next()

    def _send(self, resp: Response, keep: bool, route: str) -> None:
        if self.closing or self.transport is None:
            return
        self.server.responses[(route, resp.status)] += 1
        self.last_active = time.monotonic()
        self.transport.write(encode_response(resp, keep))
        if not keep or resp.close:
            self.closing = True
            self.transport.close()


class HttpServer:
    """`await HttpServer(handler, ...).start(host, port)`; `close()` stops accepting and drops
    idle connections. `token`: every request must carry `Authorization: Bearer <token>`;
    `ssl_context`: serve HTTPS (server_ssl_context)."""

    def __init__(self, handler: Handler, *, max_body_bytes: int, max_header_bytes: int,
                 max_connections: int, idle_timeout_ms: int, header_timeout_ms: int = 10_000,
                 body_timeout_ms: int = 10_000, token: bytes | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 shape_refusal: Callable[[str, Response], Response] | None = None,
                 body_sink: Callable[[str, str, dict[str, str], int], Any] | None = None
                 ) -> None:
        self.handler = handler
        # body_sink(method, target, headers, length) for a POST once its headers are read:
        # None (the body is buffered, up to max_body_bytes), a Response (refused at once,
        # the connection closed) or a sink: `write(bytes)` takes the body as it arrives (no
        # max_body_bytes), `abort()` if the connection ends first; the handler then gets
        # the request with `sink` set (a file upload, docs/client-api.md §Transactions).
        self.body_sink = body_sink
        # Refusals made before the handler sees a request (401, 413, ...) pass through
        # shape_refusal(target, response) when given: InfluxDB's routes answer in
        # InfluxDB's error shape (vrepl/node/influx.py).
        self.shape_refusal = shape_refusal
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_ms / 1000.0
        self.header_timeout_s = header_timeout_ms / 1000.0
        self.body_timeout_s = body_timeout_ms / 1000.0
        self.token = token
        self.ssl_context = ssl_context
        self.conns: set[HttpProtocol] = set()
        self.responses: Counter[tuple[str, int]] = Counter()  # (route, status) -> responses written
        self.server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        # The TLS handshake comes before the request line: it gets the header deadline too.
        self.server = await loop.create_server(
            lambda: HttpProtocol(self), host, port, reuse_address=True, backlog=1024,
            ssl=self.ssl_context,
            ssl_handshake_timeout=self.header_timeout_s if self.ssl_context else None)
        self._sweep()

    @property
    def port(self) -> int:
        if self.server is None:
            raise InvariantViolation("the HTTP server's port is asked before start()")
        return self.server.sockets[0].getsockname()[1]

    def _sweep(self) -> None:
        # One timer for all connections rather than one per request: the request path only
        # stores times. A deadline is seen at most one sweep interval late.
        now = time.monotonic()
        for c in list(self.conns):
            c.expire(now)
        loop = asyncio.get_running_loop()
        interval = min(self.idle_timeout_s, self.header_timeout_s, self.body_timeout_s) / 4
        self._sweeper = loop.call_later(min(1.0, max(interval, 0.01)), self._sweep)

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.server is not None:
            self.server.close()
        for c in list(self.conns):
            if not c.busy and c.transport is not None:
                c.closing = True
                c.transport.close()
