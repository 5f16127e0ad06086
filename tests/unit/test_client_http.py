"""The client's own HTTP/1.1 connection (vrepl/client.py _Conn) against a raw socket server
that answers in awkward pieces: responses split byte by byte, several in one segment,
Connection: close, a dropped connection, a malformed status line."""
from __future__ import annotations

import http.client
import socket
import threading

import pytest

from vrepl.client import _Conn

pytestmark = pytest.mark.timeout(30)


def _server(script):
    """A one-connection server: script(conn) runs in a thread; returns the endpoint."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)

    def run():
        conn, _ = ls.accept()
        try:
            script(conn)
        finally:
            conn.close()
            ls.close()

    threading.Thread(target=run, daemon=True).start()
    return f"127.0.0.1:{ls.getsockname()[1]}"


def _read_request(conn) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":")[1])
            while len(body) < n:
                body += conn.recv(65536)
    return head


def _resp(doc: bytes, status=b"200 OK", extra=b"") -> bytes:
    return (b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (status, len(doc), extra, doc))


def test_byte_by_byte_and_keep_alive():
    def script(conn):
        for i in range(3):
            head = _read_request(conn)
            assert head.startswith(b"POST /w HTTP/1.1\r\n") or head.startswith(b"GET /s ")
            for b in _resp(b'{"n":%d}' % i):
                conn.sendall(bytes([b]))

    c = _Conn(_server(script), 5)
    assert c.request("POST", "/w", b"[1]") == (200, {"n": 0})
    assert c.request("GET", "/s") == (200, {"n": 1})
    assert c.request("POST", "/w", b"[]") == (200, {"n": 2})
    c.close()


def test_connection_close_reopens_and_errors_are_http_exceptions():
    def script(conn):
        _read_request(conn)
        conn.sendall(_resp(b'{"error":"x","code":"bad"}', b"400 Bad Request",
                           b"Connection: close\r\n"))

    c = _Conn(_server(script), 5)
    assert c.request("POST", "/w", b"x") == (400, {"error": "x", "code": "bad"})
    assert c.sock is None            # closed after Connection: close

    def drop(conn):
        _read_request(conn)

    c = _Conn(_server(drop), 5)
    with pytest.raises(http.client.RemoteDisconnected):
        c.request("GET", "/s")
    assert c.sock is None

    def garbage(conn):
        _read_request(conn)
        conn.sendall(b"SPAM 200 nope\r\n\r\n")

    c = _Conn(_server(garbage), 5)
    with pytest.raises(http.client.HTTPException):
        c.request("GET", "/s")


def test_non_json_body_is_reported_not_raised():
    def script(conn):
        _read_request(conn)
        conn.sendall(_resp(b"<html>", b"502 Bad Gateway"))

    c = _Conn(_server(script), 5)
    code, doc = c.request("GET", "/s")
    assert code == 502 and doc["code"] == "not_json"
