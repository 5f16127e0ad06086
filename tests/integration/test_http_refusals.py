"""Every refusal of the routes that write says whether anything was written, against real
`vrepl node` processes (docs/client-api.md §Write, §Ingest, §InfluxDB line protocol: "every
error carries outcome"): an unknown vgroup (404), the wrong method (405), a bad body (400),
a slave (409), InfluxDB's v1 and v2 shapes; the read routes' 404 stays as it is."""
from __future__ import annotations

import http.client
import json

import pytest

pytestmark = pytest.mark.timeout(90)


def ask(addr: str, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data else {}
    finally:
        conn.close()


def test_write_route_refusals_carry_outcome_not_written(make_local_cluster):
    c = make_local_cluster()
    m = c.master()
    master = c.nodes[m].http
    slave = next(n.http for nid, n in c.nodes.items() if nid != m)
    row = b'[["cpu", 1700000000000, {"v": 1}]]'
    cases = [
        (master, "POST", "/v1/vgroups/9/write", row, 404, "no_vgroup", "code"),
        (master, "POST", "/v1/vgroups/x/write", row, 404, "no_vgroup", "code"),
        (master, "GET", "/v1/vgroups/1/write", None, 405, "bad_method", "code"),
        (master, "POST", "/v1/vgroups/1/write", b"not json", 400, "bad_rows", "code"),
        (slave, "POST", "/v1/vgroups/1/write", row, 409, "not_master", "code"),
        (master, "POST", "/v1/vgroups/9/ingest", b"{}", 404, "no_vgroup", "code"),
        (master, "GET", "/v1/vgroups/1/ingest", None, 405, "bad_method", "code"),
        (master, "POST", "/write?db=vg9", b"cpu v=1 1", 404, "no_vgroup", "vrepl_code"),
        (master, "POST", "/api/v2/write?bucket=9", b"cpu v=1 1", 404, "no_vgroup", "vrepl_code"),
    ]
    for addr, method, path, body, status, code, key in cases:
        got_status, doc = ask(addr, method, path, body)
        assert (got_status, doc.get(key)) == (status, code), (method, path, doc)
        assert doc.get("outcome") == "not_written", (method, path, doc)
    # A read route's refusal is not about a write: no outcome there.
    got_status, doc = ask(master, "GET", "/v1/vgroups/9/rows?table=cpu")
    assert (got_status, doc["code"]) == (404, "no_vgroup") and "outcome" not in doc
