"""The binary and InfluxDB write paths against 3 real `vrepl node` processes (quorum 2) on
127.0.0.1, written by the real client libraries (`influxdb` for v1, `influxdb-client` for v2,
vrepl.client with Arrow bodies) and read back on every replica through the vrepl client
(docs/client-api.md §Binary writes, §InfluxDB line protocol)."""
from __future__ import annotations

import gzip
import json
import os
import socket
import time

import pyarrow as pa
import pytest

from vrepl.client import BadRequestError, Client
from vrepl.node.local import LocalCluster
from vrepl.vnode.ingest import table_of_series
from vrepl.wal import read_records

pytestmark = pytest.mark.timeout(120)

VG = 1
TOKEN = "s3cret-token_1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("ingest")
    token_file = d / "token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    c = LocalCluster(str(d / "c"), 3, vgroup=VG, quorum=2, log_level="WARNING",
                     http={"token_file": str(token_file), "max_line_bytes": 4096},
                     client_kw={"token": TOKEN})
    c.start()
    c.wait_ready()
    c.wait_master(slaves=2)
    yield c
    c.close()


def master_ep(c: LocalCluster) -> str:
    return c.nodes[c.master()].http


def rows_everywhere(c: LocalCluster, table: str, want: int, timeout_s: float = 10.0) -> list:
    """The table's rows on every replica once each holds `want` of them (they must agree)."""
    deadline = time.monotonic() + timeout_s
    with c.client() as cl:
        while True:
            got = [cl.read(VG, table, node=n.http)["rows"] for n in c.nodes.values()]
            if all(len(r) == want for r in got) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    strip = [[{k: v for k, v in row.items() if k != "_epoch"} for row in r] for r in got]
    assert all(s == strip[0] for s in strip), strip
    assert len(got[0]) == want, got[0]
    return got[0]


def test_influxdb_client_v2_writes_points_every_replica_reads_them(cluster):
    from influxdb_client import InfluxDBClient, Point, WritePrecision
    from influxdb_client.client.write_api import SYNCHRONOUS
    with InfluxDBClient(url=f"http://{master_ep(cluster)}", token=TOKEN, org="any") as ic:
        w = ic.write_api(write_options=SYNCHRONOUS)
        w.write(bucket="vg1", record=[
            Point("cpu").tag("host", "a b").tag("dc", "x,y").field("usage", 0.5)
            .field("n", 3).field("up", True).field("note", 'say "hi"').time(1_700_000_000_001,
                                                                              WritePrecision.MS),
            Point("cpu").tag("dc", "x,y").tag("host", "a b").field("usage", 1.5)
            .time(1_700_000_000_002_000, WritePrecision.US)], write_precision=WritePrecision.US)
    table = table_of_series("cpu", {"host": "a b", "dc": "x,y"})
    rows = rows_everywhere(cluster, table, 2)
    assert [r["ts"] for r in rows] == [1_700_000_000_001, 1_700_000_000_002]
    assert rows[0]["host"] == "a b" and rows[0]["dc"] == "x,y"
    assert rows[0]["usage"] == 0.5 and rows[0]["n"] == 3 and rows[0]["up"] is True
    assert rows[0]["note"] == 'say "hi"'
    assert rows[1]["usage"] == 1.5 and rows[1]["n"] is None


def test_influxdb_client_v2_sees_a_bad_line_in_influx_shape_and_nothing_is_written(cluster):
    from influxdb_client import InfluxDBClient
    from influxdb_client.client.write_api import SYNCHRONOUS
    from influxdb_client.rest import ApiException
    body = "bad1 f=1i 1\nbad1 f=2i,f=3i 2\nbad1 f=4i 3"
    with InfluxDBClient(url=f"http://{master_ep(cluster)}", token=TOKEN, org="o") as ic, \
            pytest.raises(ApiException) as info:
        ic.write_api(write_options=SYNCHRONOUS).write(bucket="1", record=body,
                                                      write_precision="ms")
    assert info.value.status == 400
    doc = json.loads(info.value.body)
    assert doc["code"] == "invalid" and doc["line"] == 2, doc
    assert "duplicate field 'f'" in doc["message"] and "line 2" in doc["message"], doc
    with cluster.client() as cl:
        assert cl.read(VG, "bad1")["exists"] is False      # the valid lines 1 and 3 too


def test_influxdb_client_v2_with_a_wrong_token_gets_401(cluster):
    from influxdb_client import InfluxDBClient
    from influxdb_client.client.write_api import SYNCHRONOUS
    from influxdb_client.rest import ApiException
    with InfluxDBClient(url=f"http://{master_ep(cluster)}", token="nope", org="o") as ic, \
            pytest.raises(ApiException) as info:
        ic.write_api(write_options=SYNCHRONOUS).write(bucket="vg1", record="m f=1 1")
    assert info.value.status == 401
    assert json.loads(info.value.body)["code"] == "unauthorized"


def test_influxdb_v1_client_writes_with_the_token_as_password(cluster):
    from influxdb import InfluxDBClient
    from influxdb.exceptions import InfluxDBClientError
    host, port = master_ep(cluster).rsplit(":", 1)
    v1 = InfluxDBClient(host=host, port=int(port), username="anyone", password=TOKEN,
                        database="vg1")
    assert v1.write_points([{"measurement": "disk", "tags": {"dev": "sda"},
                             "fields": {"used": 5, "free": 2.5}, "time": 1_700_000_000_123}],
                           time_precision="ms")
    rows = rows_everywhere(cluster, table_of_series("disk", {"dev": "sda"}), 1)
    assert rows[0]["ts"] == 1_700_000_000_123 and rows[0]["used"] == 5
    with pytest.raises(InfluxDBClientError) as info:
        v1.write_points(["disk,dev=sda used=1.5 1"], protocol="line")    # int column
    assert info.value.code == 400
    assert "is int, got float" in json.loads(info.value.content)["error"]
    bad = InfluxDBClient(host=host, port=int(port), username="u", password="wrong",
                         database="vg1")
    with pytest.raises(InfluxDBClientError) as info:
        bad.write_points(["m f=1 1"], protocol="line")
    assert info.value.code == 401


def test_line_protocol_gzip_precision_and_errors_over_plain_http(cluster):
    ep = master_ep(cluster)
    with Client([ep], token=TOKEN) as cl:
        lines = b"gz,k=v f=1i 1700000000\ngz,k=v f=2i 1700000001\n"
        conn = cl._conn(ep)
        conn._head_lines += b"\r\nContent-Encoding: gzip"
        try:
            code, doc = conn.request("POST", "/api/v2/write?bucket=vg1&precision=s",
                                     gzip.compress(lines), b"text/plain")
        finally:
            conn._head_lines = conn._head_lines.replace(b"\r\nContent-Encoding: gzip", b"")
        assert code == 204, doc
        code, doc = cl.request(ep, "POST", "/api/v2/write?bucket=vg1&precision=xs", lines)
        assert code == 400 and "precision" in doc["message"], doc
        code, doc = cl.request(ep, "POST", "/write?db=vg9", lines)
        assert code == 404 and "error" in doc, doc
        long_line = b"ll g=\"" + b"x" * 5000 + b"\" 1\n"
        code, doc = cl.request(ep, "POST", "/api/v2/write?bucket=vg1", b"ll f=1 1\n" + long_line)
        assert code == 400 and doc["line"] == 2 and "max_line_bytes" in doc["message"], doc
        code, doc = cl.request(ep, "GET", "/ping")
        assert code == 204
    rows = rows_everywhere(cluster, table_of_series("gz", {"k": "v"}), 2)
    assert [r["ts"] for r in rows] == [1_700_000_000_000, 1_700_000_001_000]


def _raw_exchange(ep: str, head: bytes) -> tuple[int, dict]:
    """Send only a request's head (its Content-Length promises a body that never comes) and
    read the answer to the end: (status, JSON body)."""
    host, port = ep.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    status = int(out.split(b" ", 2)[1])
    return status, json.loads(out.split(b"\r\n\r\n", 1)[1])


@pytest.mark.parametrize("v1", [True, False])
def test_line_protocol_bad_input_is_refused_in_influx_shape_and_writes_nothing(cluster, v1):
    """The issue's bad-input list over HTTP, v1 and v2 shapes: a body over max_body_bytes
    (declared, and once gunzipped), an unknown precision, a field changing type against the
    stored table, a partial last line; each refusal names its line and nothing of the
    request (its valid lines included) is written."""
    ep = master_ep(cluster)
    route = "/write?db=vg1" if v1 else "/api/v2/write?bucket=vg1"
    msg = "error" if v1 else "message"
    series = "bi1" if v1 else "bi2"
    table = table_of_series(series, {"k": "v"})
    code, doc = _raw_exchange(ep, (f"POST {route} HTTP/1.1\r\nHost: x\r\nAuthorization: Token"
                                   f" {TOKEN}\r\nContent-Length: {9 * 2**20}\r\n\r\n").encode())
    assert code == 413 and "max_body_bytes" in doc[msg] and "\n" not in doc[msg], doc
    assert v1 or doc["code"] == "request too large", doc
    with Client([ep], token=TOKEN) as cl:
        assert cl.request(ep, "POST", route, f"{series},k=v f=1i 1\n".encode())[0] == 204
        before = rows_everywhere(cluster, table, 1)
        bomb = gzip.compress(f"{series},k=v f=2i 2\n".encode() * (9 * 2**20 // 16))
        conn = cl._conn(ep)
        conn._head_lines += b"\r\nContent-Encoding: gzip"
        try:
            code, doc = conn.request("POST", route, bomb, b"text/plain")
        finally:
            conn._head_lines = conn._head_lines.replace(b"\r\nContent-Encoding: gzip", b"")
        assert code == 413 and "once decompressed" in doc[msg], doc
        code, doc = cl.request(ep, "POST", route + "&precision=fortnight", b"x f=1 1\n")
        assert code == 400 and "precision 'fortnight'" in doc[msg], doc
        for body, line, what in [
                (f"{series},k=v f=3i 3\n{series},k=v f=4.5 4\n", 2, "is int, got float"),
                (f"{series},k=v f=3i 3\n{series},k=v f=4i 4\n{series},k=v f=", 3,
                 "missing value"),
                (f"{series},k=v f=3i 3\n{series},k=v\\", 2, "bad escape")]:
            code, doc = cl.request(ep, "POST", route, body.encode())
            assert code == 400 and doc[msg].startswith(f"line {line}: ") and what in doc[msg], doc
            assert v1 or doc["line"] == line, doc
    assert rows_everywhere(cluster, table, 1) == before       # nothing half-applied


def test_the_client_writes_arrow_by_default_and_every_replica_agrees(cluster):
    with cluster.client() as cl:
        filler = [["arrf", 100 + i, {"k": i}] for i in range(61)]   # 64 rows: Arrow
        res = cl.write(VG, [["arr", 1, {"v": 1.0, "s": "a"}], ["arr", 2, {"v": 2.5}],
                            ["arr2", 3, {"b": True}], *filler])
        assert not res.duplicate
        # an int and a float in one new column: sent as JSON, whose rule (the first value
        # fixes the type) refuses it, as it would without Arrow
        with pytest.raises(BadRequestError) as info:
            cl.write(VG, [["mixed", 1, {"v": 1}], ["mixed", 2, {"v": 2.5}], *filler])
        assert "is int, got float" in info.value.reason
        small = cl.write(VG, [["arrs", 1, {"v": 1}]])                  # 1 row: JSON
        ids = cl.write_arrow(VG, pa.record_batch(
            {"ts": pa.array([10, 11], pa.timestamp("s")), "x": pa.array([1, None], pa.uint8())},
            metadata={"vrepl.table": "arr3"}))
        assert ids.version > res.version
        with pytest.raises(BadRequestError) as info:
            cl.write_arrow(VG, b"not an arrow stream")
        assert info.value.code == "bad_rows" and "Arrow" in info.value.reason
        with pytest.raises(BadRequestError) as info:   # the JSON fallback explains
            cl.write(VG, [["arr", 4, {"v": "text"}]])
        assert "cannot change" in info.value.reason
    wal = os.path.join(cluster.nodes[cluster.master()].dir, "data", f"vg{VG}", "wal")
    formats = {r.version: r.payload[3] for r in read_records(wal, res.version)}
    assert formats[res.version] == 4 and formats[ids.version] == 4     # Arrow payloads
    assert formats[small.version] == 2                                  # JSON, request id
    rows = rows_everywhere(cluster, "arr", 2)
    assert rows[0]["v"] == 1.0 and rows[0]["s"] == "a" and rows[1]["v"] == 2.5 \
        and rows[1]["s"] is None
    assert rows_everywhere(cluster, "arr2", 1)[0]["b"] is True
    assert [r["x"] for r in rows_everywhere(cluster, "arr3", 2)] == [1, None]
    assert [r["ts"] for r in rows_everywhere(cluster, "arr3", 2)] == [10_000, 11_000]


def test_the_write_route_refuses_an_unknown_content_type_with_415(cluster):
    ep = master_ep(cluster)
    with cluster.client() as cl:
        code, doc = cl._conn(ep).request("POST", f"/v1/vgroups/{VG}/write", b"[]",
                                         b"application/x-protobuf")
    assert code == 415 and doc["code"] == "unsupported_media_type", doc


def test_line_protocol_survives_a_restart_replay(cluster):
    """The payload (format 5) replays into the same rows after a node restarts."""
    with cluster.client() as cl:
        ep = master_ep(cluster)
        code, doc = cl.request(ep, "POST", "/api/v2/write?bucket=vg1&precision=ms",
                               b"rp,h=1 a=1i,b=\"x\" 1700000000000\nrp,h=1 a=2i 1700000000001\n")
        assert code == 204, doc
    table = table_of_series("rp", {"h": "1"})
    before = rows_everywhere(cluster, table, 2)
    slave = next(n for n in cluster.nodes if n != cluster.master())
    cluster.kill(slave)
    cluster.start(slave)
    cluster.wait_ready(slave)
    cluster.wait_master(slaves=2, timeout_s=30)
    after = rows_everywhere(cluster, table, 2)
    assert [(r["ts"], r["a"], r["b"]) for r in after] == [(r["ts"], r["a"], r["b"]) for r in before]
