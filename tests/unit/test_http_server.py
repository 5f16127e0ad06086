"""vrepl.node.http on a private loop against raw sockets: the read deadlines (slow-loris
headers, a stalled or dripped body, idle keep-alive, a client that never reads), the
connection limit recovering once the deadlines free it, the status codes for chunked bodies
(411) and unknown HTTP versions (505), the bearer token (401 with WWW-Authenticate) and the
TLS context's refusals (missing file, key mismatch, passphrase)."""
from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time

import pytest

from vrepl.errors import ConfigError
from vrepl.node.http import HttpServer, Response, server_ssl_context

pytestmark = pytest.mark.timeout(60)

TOKEN = b"s3cret-token_0123456789"


class Served:
    """One HttpServer on its own loop thread; every request answers {"path": ...}."""

    def __init__(self, **kw):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        opts = dict(max_body_bytes=1 << 20, max_header_bytes=1 << 14, max_connections=100,
                    idle_timeout_ms=10_000, header_timeout_ms=10_000, body_timeout_ms=10_000)
        opts.update(kw)
        self.srv = HttpServer(self.handle, **opts)
        asyncio.run_coroutine_threadsafe(self.srv.start("127.0.0.1", 0), self.loop).result(5)
        self.addr = ("127.0.0.1", self.srv.port)

    def handle(self, req):
        if req.path == "/nothing":
            return Response(204, raw=b"", headers=(("X-Influxdb-Version", "vrepl"),))
        return Response(200, {"path": req.path, "query": req.query, "len": len(req.body),
                              "pad": "x" * (100_000 if req.path == "/big" else 0)})

    def write_buffered(self) -> int:
        async def size():
            return max(c.transport.get_write_buffer_size() for c in self.srv.conns)
        return asyncio.run_coroutine_threadsafe(size(), self.loop).result(5)

    def conns(self) -> int:
        return asyncio.run_coroutine_threadsafe(self._count(), self.loop).result(5)

    async def _count(self) -> int:
        return len(self.srv.conns)

    def close(self):
        self.loop.call_soon_threadsafe(self.srv.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def served():
    made: list[Served] = []

    def make(**kw) -> Served:
        s = Served(**kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def connect(addr, timeout=5.0) -> socket.socket:
    s = socket.create_connection(addr, timeout=timeout)
    return s


def read_all(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> dict:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def get(addr, path=b"/ok", extra=b"") -> bytes:
    with connect(addr) as s:
        s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n%sConnection: close\r\n\r\n" % (path, extra))
        return read_all(s)


def test_slow_loris_headers_get_408_and_others_are_served_meanwhile(served):
    srv = served(header_timeout_ms=600)
    lorises = [connect(srv.addr) for _ in range(20)]
    t0 = time.monotonic()
    for s in lorises:
        s.sendall(b"GET /ok HTTP/1.1\r\n")
    # Drip a header line every 100 ms: each byte is progress, but the headers never end.
    served_meanwhile = 0
    while time.monotonic() - t0 < 0.4:
        for s in lorises:
            s.sendall(b"X-Drip: 1\r\n")
        assert status_of(get(srv.addr)) == 200
        served_meanwhile += 1
        time.sleep(0.1)
    for s in lorises:
        out = read_all(s)
        assert status_of(out) == 408 and body_of(out)["code"] == "header_timeout", out[:200]
        assert "\n" not in body_of(out)["error"]
        s.close()
    took = time.monotonic() - t0
    assert 0.6 <= took < 5, took
    assert served_meanwhile >= 3
    assert status_of(get(srv.addr)) == 200


def test_a_silent_new_connection_gets_the_header_deadline(served):
    srv = served(header_timeout_ms=300, idle_timeout_ms=60_000)
    with connect(srv.addr) as s:
        t0 = time.monotonic()
        out = read_all(s)
    assert status_of(out) == 408 and 0.3 <= time.monotonic() - t0 < 3


def test_a_stalled_body_gets_408(served):
    srv = served(body_timeout_ms=400)
    with connect(srv.addr) as s:
        s.sendall(b"POST /w HTTP/1.1\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        t0 = time.monotonic()
        out = read_all(s)
    assert status_of(out) == 408 and body_of(out)["code"] == "body_timeout"
    assert body_of(out)["outcome"] == "not_written"
    assert 0.4 <= time.monotonic() - t0 < 3


def test_a_dripped_body_is_closed_although_it_never_pauses_long(served):
    # One byte per 100 ms never pauses for body_timeout_ms (500), but a 1000-byte body gets
    # one window of it in all (docs/client-api.md §Deadlines).
    srv = served(body_timeout_ms=500)
    with connect(srv.addr) as s:
        s.sendall(b"POST /w HTTP/1.1\r\nContent-Length: 1000\r\n\r\n")
        t0 = time.monotonic()
        s.settimeout(0.1)
        out = b""
        while True:
            try:
                s.sendall(b"x")
            except OSError:        # reset after the server closed
                break
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            if time.monotonic() - t0 > 5:
                break
    assert status_of(out) == 408, out[:200]
    assert 0.5 <= time.monotonic() - t0 < 4


def test_the_408_reaches_a_client_that_keeps_sending_after_the_deadline(served):
    # The client writes after the server answered 408: without a lingering close the kernel
    # answers those bytes with RST, which destroys the unread 408 (ECONNRESET, no answer).
    srv = served(body_timeout_ms=200)
    with connect(srv.addr) as s:
        s.sendall(b"POST /w HTTP/1.1\r\nContent-Length: 100000\r\n\r\n")
        time.sleep(0.8)                     # the 408 is sent and waits unread
        s.sendall(b"x" * 5000)
        time.sleep(0.3)                     # an RST would have arrived by now
        out = read_all(s)
    assert status_of(out) == 408, out[:200]
    assert body_of(out)["code"] == "body_timeout"


def test_a_large_body_arriving_steadily_is_not_cut(served):
    srv = served(body_timeout_ms=300)
    body = b"y" * (300 * 1024)      # 5 windows of 300 ms; sent in 1.0 s with short pauses
    with connect(srv.addr) as s:
        s.sendall(b"POST /w HTTP/1.1\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                  % len(body))
        for i in range(0, len(body), 30 * 1024):
            s.sendall(body[i:i + 30 * 1024])
            time.sleep(0.1)
        out = read_all(s)
    assert status_of(out) == 200 and body_of(out)["len"] == len(body)


def test_idle_keep_alive_is_closed_without_an_answer(served):
    srv = served(idle_timeout_ms=300, header_timeout_ms=5000)
    with connect(srv.addr) as s:
        s.sendall(b"GET /a HTTP/1.1\r\n\r\n")
        first = s.recv(65536)
        assert status_of(first) == 200
        t0 = time.monotonic()
        rest = read_all(s)
    assert rest == b"" and 0.3 <= time.monotonic() - t0 < 3


def test_connection_limit_frees_up_when_lorises_time_out(served):
    srv = served(max_connections=5, header_timeout_ms=500)
    lorises = [connect(srv.addr) for _ in range(5)]
    for s in lorises:
        s.sendall(b"GET / HTTP/1.1\r\n")
    deadline = time.monotonic() + 2
    while srv.conns() < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    out = get(srv.addr)
    assert status_of(out) == 503 and body_of(out)["code"] == "too_many_connections"
    for s in lorises:
        assert status_of(read_all(s)) == 408
        s.close()
    assert status_of(get(srv.addr)) == 200


def test_a_client_that_never_reads_is_closed(served):
    srv = served(idle_timeout_ms=500)
    s = connect(srv.addr)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(0.2)
    # Pipelined requests for 100 KB answers, never read: the server stops reading requests
    # once its write buffer is full, and closes the connection after idle_timeout_ms.
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 0.3:
            s.send(b"GET /big HTTP/1.1\r\n\r\n" * 50)
    except (socket.timeout, OSError):
        pass
    # What the server holds for this client stays near asyncio's high-water mark (64 KiB)
    # plus one answer, however many requests wait in the kernel's buffers.
    assert 0 < srv.write_buffered() < 64 * 1024 + 2 * 100_000
    deadline = time.monotonic() + 5
    while srv.conns() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.conns() == 0
    s.close()
    assert status_of(get(srv.addr)) == 200


@pytest.mark.parametrize("request_bytes,status,code", [
    (b"POST /w HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411,
     "length_required"),
    (b"POST /w HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 411, "length_required"),
    (b"GET /ok HTTP/2.0\r\n\r\n", 505, "bad_version"),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "bad_version"),
    (b"GET /ok HTTP/3\r\n\r\n", 505, "bad_version"),
    (b"GET /ok HTTPS/1.1\r\n\r\n", 400, "bad_request"),
    (b"GET /ok HTTP/1.1.1\r\n\r\n", 400, "bad_request"),
])
def test_chunked_is_411_and_unknown_versions_505(served, request_bytes, status, code):
    srv = served()
    with connect(srv.addr) as s:
        s.sendall(request_bytes)
        out = read_all(s)
    assert status_of(out) == status and body_of(out)["code"] == code, out[:200]
    assert "\n" not in body_of(out)["error"]


@pytest.mark.parametrize("request_bytes", [
    b"\x00\x01\x02HELLO",                       # binary bytes: not a request line at all
    b"GET /ok?a=%zz HTTP/1.1\r\n\r\n",              # a bare % in the query string
    b"GET /ok?a=1&b=% HTTP/1.1\r\n\r\n",
    b"GET /ok?table=%ff%fe HTTP/1.1\r\n\r\n",       # escapes that are not UTF-8
    b"POST /ok?a=%g1 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
])
def test_a_malformed_request_line_or_query_string_is_400_bad_request(served, request_bytes):
    """docs/client-api.md §HTTP errors: a malformed request line or query string is 400
    bad_request (one line) and the connection is closed."""
    srv = served()
    with connect(srv.addr) as s:
        s.sendall(request_bytes)
        out = read_all(s)
    assert status_of(out) == 400 and body_of(out)["code"] == "bad_request", out[:200]
    assert b"Connection: close" in out and "\n" not in body_of(out)["error"]
    # Well-formed escapes still decode, and the server goes on serving.
    doc = body_of(get(srv.addr, b"/ok%2Fx?t=%C3%A9&u=a+b&v=&w=%25"))
    assert doc["path"] == "/ok/x" and doc["query"] == {"t": "\u00e9", "u": "a b", "v": "", "w": "%"}


def test_tls_on_a_plain_port_is_closed_at_once(served):
    srv = served(header_timeout_ms=30_000)
    with connect(srv.addr) as s:
        t0 = time.monotonic()
        s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40)
        assert read_all(s) == b"" and time.monotonic() - t0 < 2


def test_bearer_token(served):
    srv = served(token=TOKEN)
    out = get(srv.addr)
    assert status_of(out) == 401 and body_of(out)["code"] == "unauthorized"
    assert b'\r\nWWW-Authenticate: Bearer realm="vrepl"\r\n' in out
    assert b"Connection: close" in out and "\n" not in body_of(out)["error"]
    out = get(srv.addr, extra=b"Authorization: Bearer wrong\r\n")
    assert status_of(out) == 401 and b'error="invalid_token"' in out
    assert b"wrong" not in out.split(b"\r\n\r\n")[1].replace(b"wrong bearer", b"")
    for value in (b"Bearer " + TOKEN, b"bearer " + TOKEN, b"Bearer  " + TOKEN + b" "):
        out = get(srv.addr, extra=b"Authorization: " + value + b"\r\n")
        assert status_of(out) == 200, (value, out[:200])
    for value in (b"Basic " + TOKEN, TOKEN, b"Bearer " + TOKEN[:-1], b"Bearer " + TOKEN + b"x"):
        assert status_of(get(srv.addr, extra=b"Authorization: " + value + b"\r\n")) == 401
    # The token is checked before the body is awaited: no body is buffered for a stranger.
    with connect(srv.addr) as s:
        s.sendall(b"POST /w HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n")
        assert status_of(read_all(s)) == 401


def test_tls_context_refusals(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from vrepl.testing.tls import make_tls_files

    f = make_tls_files(str(tmp_path))
    assert server_ssl_context(f.cert, f.key) is not None
    locked = tmp_path / "locked.pem"
    locked.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pass")))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    for cert, key, words in [
        (str(tmp_path / "nope.pem"), f.key, "tls_cert"),
        (f.cert, str(tmp_path / "nope.pem"), "No such file"),
        (f.cert, f.other_key, "does not match the certificate"),
        (f.cert, str(locked), "passphrase"),
        (str(garbage), f.key, "not a PEM certificate"),
    ]:
        with pytest.raises(ConfigError) as exc:
            server_ssl_context(cert, key)
        assert words in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_a_body_above_the_limit_is_413_not_written(served):
    # docs/client-api.md §HTTP errors: 413 body_too_large, closed, and nothing written.
    srv = served(max_body_bytes=100)
    with connect(srv.addr) as s:
        s.sendall(b"POST /v1/vgroups/1/write HTTP/1.1\r\nContent-Length: 101\r\n\r\n")
        out = read_all(s)
    assert status_of(out) == 413
    assert body_of(out)["code"] == "body_too_large"
    assert body_of(out)["outcome"] == "not_written"


class Sink:
    def __init__(self):
        self.data = bytearray()
        self.aborted = False

    def write(self, b):
        self.data += b

    def abort(self):
        self.aborted = True


def test_a_streamed_body_goes_to_its_sink_whatever_its_bytes(served):
    """body_sink (a transaction's file put): the body goes to the sink as it arrives, past
    max_body_bytes, even a chunk starting with the TLS handshake byte (0x16) or looking
    like a request line; the handler gets the request with the sink; a pipelined request
    after it is served; a body cut short aborts the sink."""
    sinks: list[Sink] = []

    def body_sink(method, target, headers, length):
        if not target.startswith("/up"):
            return None
        if target.startswith("/up/refuse"):
            return Response(429, {"code": "no"})
        sinks.append(Sink())
        return sinks[-1]

    s = served(body_sink=body_sink, max_body_bytes=100)
    s.srv.handler = lambda req: Response(200, {"path": req.path, "sink": req.sink is not None,
                                               "got": len(req.sink.data) if req.sink else -1,
                                               "q": req.query})
    body = b"\x16\x03\x01" + b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)) * 40
    with connect(s.addr) as c:
        c.sendall(b"POST /up?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
        time.sleep(0.2)                     # the head alone first: the body starts a read
        c.sendall(body[:5000])
        time.sleep(0.1)
        c.sendall(body[5000:] + b"GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = read_all(c)
    first, second = answer.split(b"HTTP/1.1 ")[1:3]
    assert status_of(b"HTTP/1.1 " + first) == 200
    assert body_of(b"HTTP/1.1 " + first) == {"path": "/up", "sink": True, "got": len(body),
                                             "q": {"x": "1"}}
    assert bytes(sinks[0].data) == body and not sinks[0].aborted
    assert body_of(b"HTTP/1.1 " + second)["path"] == "/after"
    with connect(s.addr) as c:      # refused before the body: answered, closed
        c.sendall(b"POST /up/refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
        assert status_of(read_all(c)) == 429
    with connect(s.addr) as c:      # cut short: the sink is aborted
        c.sendall(b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while not sinks[-1].aborted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sinks[-1].aborted and bytes(sinks[-1].data) == b"abc"


def test_a_204_has_no_content_length_and_keeps_the_connection(served):
    """RFC 9110 §8.6: a 204 carries no Content-Length (the InfluxDB routes answer 204);
    a real client reads it and the next answer on the same connection."""
    srv = served()
    with connect(srv.addr) as s:
        s.sendall(b"POST /nothing HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        head = s.recv(65536)
    assert head.startswith(b"HTTP/1.1 204 No Content\r\n") and head.endswith(b"\r\n\r\n")
    assert b"content-length" not in head.lower() and b"content-type" not in head.lower()
    assert b"X-Influxdb-Version: vrepl\r\n" in head
    conn = http.client.HTTPConnection(*srv.addr, timeout=5)
    try:
        conn.request("POST", "/nothing", body=b"")
        r = conn.getresponse()
        assert (r.status, r.read()) == (204, b"")
        conn.request("GET", "/ok")
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["path"] == "/ok"
    finally:
        conn.close()
