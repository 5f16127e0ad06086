"""The client API's protection against real `vrepl node` processes on 127.0.0.1: the bearer
token (http.token_file) and TLS (http.tls_cert / tls_key, a CA and certificate generated
here) accepted and refused, through vrepl.client, through raw http.client / ssl sockets, and
through the CLI (`vrepl status`, `vrepl bench`); a bad token or TLS file stops `vrepl node`
with exit 2 and one line; slow-loris sockets are closed by the read deadlines while the node
keeps serving; the default listen address is loopback (checked in a network namespace, as
root). Every node process is killed at the end (LocalCluster.close)."""
from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid

import pytest

from vrepl.child import free_ports, start_node
from vrepl.client import BadRequestError, Client, NotWrittenError, UnauthorizedError
from vrepl.node.local import LocalCluster, render_toml
from vrepl.testing.tls import make_tls_files

pytestmark = pytest.mark.timeout(90)

TOKEN = "vrepl-test-" + "0123456789abcdef" * 2
VG = 1


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("http-security")
    tls = make_tls_files(str(d / "tls"))
    token_file = d / "token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    return tls, str(token_file), d


def _cluster(base: str, http: dict, client_kw: dict) -> LocalCluster:
    c = LocalCluster(base, 1, vgroup=VG, http=http, client_kw=client_kw, log_level="INFO")
    c.start()
    c.wait_ready()
    c.wait_master()
    return c


@pytest.fixture(scope="module")
def secure(files):
    """One node with a token and TLS (and a short header deadline, for the handshake test)."""
    tls, token_file, d = files
    c = _cluster(str(d / "secure"), {"token_file": token_file, "tls_cert": tls.cert,
                                     "tls_key": tls.key, "header_timeout_ms": 1000},
                 {"token": TOKEN, "cafile": tls.ca})
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def tokened(files):
    """One node with a token on plain HTTP."""
    _, token_file, d = files
    c = _cluster(str(d / "tokened"), {"token_file": token_file}, {"token": TOKEN})
    try:
        yield c
    finally:
        c.close()


def ep_of(c: LocalCluster) -> str:
    return c.nodes[1].http


def host_port(c: LocalCluster) -> tuple[str, int]:
    host, port = ep_of(c).rsplit(":", 1)
    return host, int(port)


def rows(table: str, n: int = 3) -> list:
    return [[table, 1000 + i, {"v": i}] for i in range(n)]


# -- vrepl.client -------------------------------------------------------------------------------

def test_client_with_token_and_ca_writes_reads_and_sees_status(secure, files):
    tls, _, _ = files
    with Client([ep_of(secure)], token=TOKEN, cafile=tls.ca) as cl:
        r = cl.write(VG, rows("t_ok"))
        assert r.version >= 1 and not r.duplicate
        assert [row["v"] for row in cl.read(VG, "t_ok")["rows"]] == [0, 1, 2]
        assert cl.status()["node"] == 1
    with Client([ep_of(secure)], token=TOKEN, tls=True, verify=False) as cl:
        assert cl.status()["node"] == 1          # TLS without checking: still encrypted


def test_client_without_or_with_a_wrong_token_is_refused_at_once(secure, files):
    tls, _, _ = files
    for token in (None, "wrong-token", TOKEN + "x"):
        with Client([ep_of(secure)], token=token, cafile=tls.ca, timeout_s=10) as cl:
            with pytest.raises(UnauthorizedError) as exc:
                cl.status()
            assert exc.value.status == 401 and exc.value.code == "unauthorized"
            t0 = time.monotonic()
            with pytest.raises(UnauthorizedError):
                cl.write(VG, rows("t_refused"))
            assert time.monotonic() - t0 < 3           # not retried until timeout_s
            with pytest.raises(BadRequestError):       # UnauthorizedError is one
                cl.read(VG, "t_ok", node=ep_of(secure))
            assert "401" in cl.cluster_status()[ep_of(secure)]
    with secure.client() as cl:
        assert cl.read(VG, "t_refused")["rows"] == []  # nothing was written


def test_the_certificate_is_checked(secure, files):
    tls, _, d = files
    # System CAs do not know the test CA: refused before any request is sent.
    with Client([ep_of(secure)], token=TOKEN, tls=True, timeout_s=0.5) as cl:
        with pytest.raises(NotWrittenError) as exc:
            cl.status()
        assert "CERTIFICATE_VERIFY_FAILED" in str(exc.value)
    # A certificate for another name than the one dialled is refused too.
    other = make_tls_files(str(d / "other"), hosts=("node9.example",))
    with Client([ep_of(secure)], token=TOKEN, cafile=other.ca) as cl:
        with pytest.raises(NotWrittenError, match="CERTIFICATE_VERIFY_FAILED"):
            cl.status()
    # Plain HTTP to the TLS port: no answer to misread; the node keeps serving.
    with Client([ep_of(secure)], token=TOKEN, request_timeout_s=3) as cl:
        with pytest.raises(NotWrittenError):
            cl.status()
    assert secure.status(1) is not None


# -- raw HTTP ----------------------------------------------------------------------------------

def _exchange(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None,
              headers: dict | None = None) -> tuple[int, dict, dict]:
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, doc


ROUTES = [("GET", "/v1/status", None), ("GET", f"/v1/vgroups/{VG}/rows?table=t_ok", None),
          ("POST", f"/v1/vgroups/{VG}/write", json.dumps(rows("t_raw")).encode()),
          ("GET", "/v2/no/such/route", None)]


@pytest.mark.parametrize("method,path,body", ROUTES, ids=[r[1] for r in ROUTES])
def test_raw_http_every_route_needs_the_token(tokened, method, path, body):
    host, port = host_port(tokened)
    for auth, challenge in [(None, 'Bearer realm="vrepl"'),
                            ("Bearer nope", 'Bearer realm="vrepl", error="invalid_token"'),
                            ("Basic " + TOKEN, 'Bearer realm="vrepl", error="invalid_token"')]:
        conn = http.client.HTTPConnection(host, port, timeout=5)
        status, headers, doc = _exchange(conn, method, path, body,
                                         {"Authorization": auth} if auth else {})
        conn.close()
        assert status == 401 and headers["www-authenticate"] == challenge
        assert doc["code"] == "unauthorized" and doc["outcome"] == "not_written"
        assert doc["error"] and "\n" not in doc["error"] and TOKEN not in doc["error"]
        assert headers["connection"] == "close"
    conn = http.client.HTTPConnection(host, port, timeout=5)
    status, _, doc = _exchange(conn, method, path, body, {"Authorization": f"Bearer {TOKEN}"})
    conn.close()
    assert status == (404 if path.startswith("/v2") else 200), doc


def test_raw_https_with_http_client_and_an_ssl_socket(secure, files):
    tls, _, _ = files
    host, port = host_port(secure)
    ctx = ssl.create_default_context(cafile=tls.ca)
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=5)
    status, headers, doc = _exchange(conn, "GET", "/v1/status")
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    conn.close()
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=5)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for _ in range(3):                                       # keep-alive over TLS
        status, _, doc = _exchange(conn, "GET", "/v1/status", headers=auth)
        assert status == 200 and doc["node"] == 1
    status, _, doc = _exchange(conn, "POST", f"/v1/vgroups/{VG}/write",
                               json.dumps(rows("t_https")).encode(),
                               {**auth, "Content-Type": "application/json"})
    assert status == 200 and doc["rows"] == 3
    conn.close()
    # A bare ssl socket: the bytes on the wire are exactly an HTTP/1.1 exchange.
    with socket.create_connection((host, port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as s:
            assert s.version() in ("TLSv1.2", "TLSv1.3")
            s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                      b"Connection: close\r\n\r\n" % TOKEN.encode())
            out = b""
            while chunk := s.recv(65536):
                out += chunk
    assert out.startswith(b"HTTP/1.1 200 OK\r\n")
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["node"] == 1


def test_a_silent_tls_handshake_is_closed_by_the_header_deadline(secure):
    host, port = host_port(secure)
    with socket.create_connection((host, port), timeout=10) as s:
        t0 = time.monotonic()
        assert s.recv(100) == b""            # header_timeout_ms = 1000 bounds the handshake
        assert 0.9 <= time.monotonic() - t0 < 6
    assert secure.status(1) is not None


# -- the CLI -------------------------------------------------------------------------------------

def vrepl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "vrepl.cli", *args], capture_output=True,
                       text=True, timeout=timeout)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_cli_status_with_token_and_tls(secure, files):
    tls, token_file, d = files
    ep = ep_of(secure)
    p = vrepl("status", "--node", ep, "--token-file", token_file, "--cacert", tls.ca, "--json")
    assert p.returncode == 0, p.stderr
    view = json.loads(p.stdout)
    assert view["nodes"]["1"]["state"] == "up" and view["nodes"]["1"]["status"]["node"] == 1
    p = vrepl("status", "--node", ep, "--token-file", token_file, "--cacert", tls.ca)
    assert p.returncode == 0 and "master" in p.stdout
    p = vrepl("status", "--node", ep, "--cacert", tls.ca)          # no token
    assert p.returncode == 1 and "401" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = vrepl("status", "--node", ep, "--token-file", token_file, "--tls")   # system CAs
    assert p.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in p.stderr
    p = vrepl("status", "--node", ep, "--token-file", token_file, "--insecure")
    assert p.returncode == 0, p.stderr
    for flag, path, words in [("--token-file", str(d / "nope"), "--token-file"),
                              ("--cacert", str(d / "nope"), "CA file")]:
        p = vrepl("status", "--node", ep, flag, path)
        assert p.returncode == 2 and words in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


def test_cli_bench_with_token_and_tls(secure, files):
    tls, token_file, _ = files
    p = vrepl("bench", "--nodes", ep_of(secure), "--token-file", token_file, "--cacert", tls.ca,
              "--clients", "2", "--batch", "10", "--duration", "1", "--warmup", "0.2", "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["rows"] > 0 and res["errors"] == {}
    p = vrepl("bench", "--nodes", ep_of(secure), "--cacert", tls.ca, "--duration", "1")
    assert p.returncode == 1 and "401" in p.stderr
    p = vrepl("bench", "--nodes", ep_of(secure), "--token-file", token_file, "--tls",
              "--duration", "1")                                # system CAs: refused
    assert p.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = vrepl("bench", "--token-file", token_file)            # the local cluster has no token
    assert p.returncode == 2 and "--nodes" in p.stderr


# -- refusing to start ---------------------------------------------------------------------------

def test_bad_token_or_tls_files_stop_the_node_with_exit_2(files, tmp_path):
    tls, token_file, _ = files
    (tmp_path / "empty").write_text("")
    p1, p2 = free_ports(2)
    cases = [
        ({"token_file": str(tmp_path / "missing")}, "http.token_file"),
        ({"token_file": str(tmp_path / "empty")}, "the token is empty"),
        ({"tls_cert": str(tmp_path / "missing.pem"), "tls_key": tls.key}, "http.tls_cert"),
        ({"tls_cert": tls.cert, "tls_key": tls.other_key}, "does not match the certificate"),
        ({"tls_cert": tls.cert}, "give both"),
    ]
    for http, words in cases:
        doc = {"node_id": 1, "data_dir": str(tmp_path / "data"), "secret": "s", "http": http,
               "nodes": [{"id": 1, "replication": f"127.0.0.1:{p1}", "http": f"127.0.0.1:{p2}"}],
               "vgroups": [{"id": 1, "replicas": [1]}]}
        path = tmp_path / "node.toml"
        path.write_text(render_toml(doc))
        p = vrepl("node", "--config", str(path), timeout=30)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, (http, p.stderr)
        assert words in lines[0] and str(path) in lines[0], lines[0]
        assert not (tmp_path / "data").exists()               # nothing started


# -- deadlines on a real node --------------------------------------------------------------------

def test_slow_loris_sockets_are_closed_and_the_node_keeps_serving(tmp_path):
    c = _cluster(str(tmp_path / "loris"), {"header_timeout_ms": 800, "body_timeout_ms": 800,
                                           "max_connections": 40}, {})
    try:
        host, port = host_port(c)
        lorises = []
        for i in range(40):
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(b"GET /v1/status HTTP/1.1\r\n" if i % 2 else
                      b"POST /v1/vgroups/1/write HTTP/1.1\r\nContent-Length: 500\r\n\r\n[")
            lorises.append(s)
        t0 = time.monotonic()
        refused = 0
        for _ in range(3):                        # drip: every byte is progress, none suffices
            for i, s in enumerate(lorises):
                if i % 2:
                    s.sendall(b"X-Drip: 1\r\n")
            refused += c.status(1, timeout_s=2) is None   # the limit is full: 503
            time.sleep(0.15)
        assert refused >= 1
        for s in lorises:
            s.settimeout(10)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            assert out.startswith(b"HTTP/1.1 408 "), out[:100]
            s.close()
        assert time.monotonic() - t0 < 8
        with c.client() as cl:
            assert cl.write(VG, rows("t_after_loris")).version >= 1
    finally:
        c.close()


# -- the default listen address ------------------------------------------------------------------

def _have_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None:
        return "needs iproute2"
    return None


@pytest.mark.skipif(_have_netns() is not None, reason=str(_have_netns()))
def test_listen_is_loopback_unless_the_operator_asks(tmp_path):
    """In a namespace of its own with address 10.88.0.1: a node whose `http` is
    10.88.0.1:PORT listens on 127.0.0.1:PORT only, until [http] listen says otherwise."""
    ns = f"vrepl-http-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    ip = "10.88.0.1"

    def run(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)

    def probe(host: str, port: int) -> str:
        code = ("import socket,sys\ntry:\n s=socket.create_connection((sys.argv[1],"
                "int(sys.argv[2])),timeout=3)\n s.sendall(b'GET /v1/status HTTP/1.1\\r\\n"
                "Connection: close\\r\\n\\r\\n')\n print(s.recv(12).decode())\n"
                "except OSError as e:\n print(type(e).__name__)")
        p = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, host,
                            str(port)], capture_output=True, text=True, timeout=30)
        return p.stdout.strip()

    run("ip", "netns", "add", ns)
    proc = None
    try:
        run("ip", "-n", ns, "link", "set", "lo", "up")
        # Both ends of a veth pair inside the namespace: an address that is not loopback.
        run("ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "v0")
        run("ip", "-n", ns, "link", "set", "v0", "up")
        run("ip", "-n", ns, "link", "set", "v1", "up")
        for listen, expect_routable in ((None, "ConnectionRefusedError"),
                                        ("0.0.0.0", "HTTP/1.1 200")):
            d = tmp_path / f"n-{listen}"
            d.mkdir()
            doc = {"node_id": 1, "data_dir": str(d / "data"), "secret": "s",
                   "log_file": str(d / "node.log"),
                   "nodes": [{"id": 1, "replication": f"{ip}:6101", "http": f"{ip}:6201"}],
                   "vgroups": [{"id": 1, "replicas": [1]}]}
            if listen:
                doc["http"] = {"listen": f"{listen}:6201"}
            (d / "node.toml").write_text(render_toml(doc))
            proc = start_node(str(d / "node.toml"), prefix=["ip", "netns", "exec", ns],
                              stdout=subprocess.PIPE, text=True, new_session=False)
            ready = json.loads(proc.stdout.readline())
            assert ready["http"] == (f"{listen}:6201" if listen else "127.0.0.1:6201")
            assert probe("127.0.0.1", 6201) == "HTTP/1.1 200"
            assert probe(ip, 6201) == expect_routable
            if not listen:
                with open(d / "node.log") as fh:
                    assert "http.listen is not set" in fh.read()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0
            proc.stdout.close()
            proc = None
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
