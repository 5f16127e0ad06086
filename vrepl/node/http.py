"""A small HTTP/1.1 server on asyncio for the node's JSON API (docs/client-api.md).

Owns: parsing requests (request line, headers, Content-Length bodies) with limits on header
and body sizes, keep-alive and pipelining (one request at a time per connection, in order),
the connection limit and idle timeout, and writing JSON responses. Every malformed request
gets a 4xx with a one-line reason; nothing the client sends raises out of this module.
Must not: know vgroups or rows: it calls `handler(request)`, which returns a Response or an
awaitable of one.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qsl, unquote

from vrepl.untrusted import printable

log = logging.getLogger("vrepl.node.http")

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 409: "Conflict", 411: "Length Required",
           413: "Content Too Large", 414: "URI Too Long", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
           504: "Gateway Timeout", 505: "HTTP Version Not Supported"}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class Response:
    status: int
    body: dict[str, Any] = field(default_factory=dict)
    close: bool = False


def error(status: int, code: str, reason: str, **extra: Any) -> Response:
    """A JSON error answer: {"error": one-line reason, "code": ...}."""
    return Response(status, {"error": reason.replace("\n", " "), "code": code, **extra})


Handler = Callable[[Request], "Response | Awaitable[Response]"]


def encode_response(resp: Response, keep_alive: bool) -> bytes:
    body = json.dumps(resp.body, separators=(",", ":")).encode()
    conn = b"keep-alive" if keep_alive and not resp.close else b"close"
    head = (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: %s\r\n\r\n" % (resp.status, REASONS.get(resp.status, "Error").encode(),
                                         len(body), conn))
    return head + body


class HttpProtocol(asyncio.Protocol):
    def __init__(self, server: "HttpServer") -> None:
        self.server = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False          # a request is being handled: later ones wait (pipelining)
        self.closing = False
        self.last_active = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        srv = self.server
        if len(srv.conns) >= srv.max_connections:
            self._reply_close(error(503, "too_many_connections",
                                    f"this node has {srv.max_connections} connections (max_connections)"))
            return
        srv.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.conns.discard(self)
        self.closing = True

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        if self.closing:
            return
        self.buf += data
        if not self.busy:
            self._next()

    def _reply_close(self, resp: Response) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.write(encode_response(resp, False))
            self.transport.close()

    def _next(self) -> None:
        """Parse and handle requests from the buffer until it holds no whole request."""
        srv = self.server
        while not self.closing and not self.busy:
            buf = self.buf
            end = buf.find(b"\r\n\r\n", 0, srv.max_header_bytes + 4)
            if end < 0:
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
                if version not in ("HTTP/1.1", "HTTP/1.0"):
                    self._reply_close(error(505, "bad_version", f"unsupported {version[:20]!r}"))
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
            if "transfer-encoding" in headers:
                self._reply_close(error(501, "chunked_unsupported",
                                        "Transfer-Encoding is not supported: send Content-Length"))
                return
            length_text = headers.get("content-length", "0")
            if not length_text.isdigit() or len(length_text) > 15:
                self._reply_close(error(400, "bad_request", f"bad Content-Length {length_text[:20]!r}"))
                return
            length = int(length_text)
            if length > srv.max_body_bytes:
                self._reply_close(error(413, "body_too_large",
                                        f"body of {length} bytes is above max_body_bytes {srv.max_body_bytes}"))
                return
            total = end + 4 + length
            if len(buf) < total:
                return
            body = bytes(buf[end + 4:total])
            del buf[:total]
            keep = (headers.get("connection", "").lower() != "close" if version == "HTTP/1.1"
                    else headers.get("connection", "").lower() == "keep-alive")
            path, _, qs = target.partition("?")
            try:
                query = dict(parse_qsl(qs, keep_blank_values=True, strict_parsing=False))
                path = unquote(path)
            except ValueError as exc:
                self._reply_close(error(400, "bad_request", f"bad query string: {exc}"))
                return
            req = Request(method, path, query, headers, body)
            try:
                result = srv.handler(req)
            except Exception as exc:  # a bug: answer 500, keep serving
                log.exception("handler failed on %s %s", printable(method), printable(path))  # the client's text
                result = error(500, "internal", f"internal error: {type(exc).__name__}: {exc}")
            if isinstance(result, Response):
                self._send(result, keep)
                continue
            self.busy = True
            task = asyncio.ensure_future(result)
            task.add_done_callback(lambda t, keep=keep: self._done(t, keep))
            return

    def _done(self, task: asyncio.Future, keep: bool) -> None:
        self.busy = False
        if task.cancelled():
            resp = error(503, "stopping", "the node is stopping")
        elif task.exception() is not None:
            exc = task.exception()
            log.error("handler failed: %r", exc, exc_info=exc)
            resp = error(500, "internal", f"internal error: {type(exc).__name__}: {exc}")
        else:
            resp = task.result()
        self._send(resp, keep)
        if not self.closing:
            self._next()

    def _send(self, resp: Response, keep: bool) -> None:
        if self.closing or self.transport is None:
            return
        self.last_active = time.monotonic()
        self.transport.write(encode_response(resp, keep))
        if not keep or resp.close:
            self.closing = True
            self.transport.close()


class HttpServer:
    """`await HttpServer(handler, ...).start(host, port)`; `close()` stops accepting and drops
    idle connections."""

    def __init__(self, handler: Handler, *, max_body_bytes: int, max_header_bytes: int,
                 max_connections: int, idle_timeout_ms: int) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_ms / 1000.0
        self.conns: set[HttpProtocol] = set()
        self.server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: HttpProtocol(self), host, port,
                                               reuse_address=True, backlog=1024)
        self._sweep()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    def _sweep(self) -> None:
        now = time.monotonic()
        for c in list(self.conns):
            if not c.busy and now - c.last_active > self.idle_timeout_s and c.transport:
                c.closing = True
                c.transport.close()
        loop = asyncio.get_running_loop()
        self._sweeper = loop.call_later(min(1.0, self.idle_timeout_s), self._sweep)

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.server is not None:
            self.server.close()
        for c in list(self.conns):
            if not c.busy and c.transport is not None:
                c.closing = True
                c.transport.close()
