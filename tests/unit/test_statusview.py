"""`vrepl status`'s view (vrepl/node/statusview.py): how a node's answer is classified over
real sockets (up / down / stalled), and how the view is built from the nodes' answers,
including status fields this version does not know (shown as they are)."""
from __future__ import annotations

import socket
import threading

from rich.console import Console

from vrepl.node.statusview import build_view, fetch_status, render


def test_a_refused_connection_is_down():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                   # nothing listens there now
    got = fetch_status(f"127.0.0.1:{port}", 1.0)
    assert (got["state"], got["status"]) == ("down", None)


def test_a_listener_that_never_answers_is_stalled():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)                               # the kernel accepts; nobody answers (SIGSTOP)
    try:
        got = fetch_status(f"127.0.0.1:{srv.getsockname()[1]}", 0.3)
        assert got["state"] == "stalled" and "0.3 s" in got["error"]
    finally:
        srv.close()


def test_an_http_error_is_an_error():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def answer() -> None:
        conn, _ = srv.accept()
        conn.recv(4096)
        body = b'{"error":"nope","code":"x"}'
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        conn.close()

    t = threading.Thread(target=answer)
    t.start()
    try:
        got = fetch_status(f"127.0.0.1:{srv.getsockname()[1]}", 2.0)
    finally:
        t.join(5)
        srv.close()
    assert got["state"] == "error" and got["error"] == "HTTP 503: nope"


def _vg(role: str, epoch: int, master: int, version: int, peers: dict, **extra) -> dict:
    return {"vgroup": 1, "role": role, "epoch": epoch, "master": master, "version": version,
            "wal_last_version": version, "replicas": {"1": "master", "2": "slave", "3": "offline"},
            "peers": peers, "arbitrator": {"address": "127.0.0.1:6042", "used": True, "connected": True,
                                           "lease": {"epoch": epoch, "remaining_ms": 1500} if role == "master" else None},
            **extra}


def _node(nid: int, vg: dict | None, state: str = "up") -> dict:
    status = None if vg is None else {"node": nid, "nodes": {}, "vgroups": [vg]}
    return {"http": f"127.0.0.1:{6200 + nid}", "state": state, "status": status,
            "error": None if vg else "connection refused"}


def test_view_rows_for_every_replica_with_lag_heard_and_unknown_fields():
    master = _vg("master", 4, 1, 50, {
        "2": {"acked_version": 48, "lag_versions": 2, "lag_ms": 7, "last_heard_ms": 30},
        "3": {"acked_version": 20, "lag_versions": 30, "lag_ms": 9000, "last_heard_ms": 12000}})
    slave = _vg("slave", 4, 1, 48, {"1": {"last_heard_ms": 40}, "3": {"last_heard_ms": 11000}},
                state="needs_restore", restore_reason="WAL recycled",
                needs_restore={"phase": "pulling a copy", "attempts": 2, "last_error": "refused"})
    view = build_view({"1": _node(1, master), "2": _node(2, slave), "3": _node(3, None, "down")})
    (vg,) = view["vgroups"]
    assert (vg["master"], vg["epoch"], vg["arbitrator"]["connected"]) == (1, 4, [1, 2])
    assert vg["arbitrator"]["lease_holder"] == {"node": 1, "epoch": 4, "remaining_ms": 1500}
    rows = {r["node"]: r for r in vg["replicas"]}
    assert (rows[1]["lag_versions"], rows[1]["last_heard_ms"]) == (0, 40)
    assert (rows[2]["lag_versions"], rows[2]["lag_ms"], rows[2]["last_heard_ms"]) == (2, 7, 30)
    # A vgroup in needs_restore shows that state as its role, its progress as a note
    # (docs/operations.md §vrepl status); a field this version does not know, as it is.
    assert rows[2]["role"] == "needs_restore"
    assert rows[2]["notes"] == {"restore_reason": "WAL recycled",
                                "needs_restore": "pulling a copy, attempt 2, last error: refused"}
    assert (rows[3]["state"], rows[3]["role"], rows[3]["last_version"], rows[3]["last_version_from"]) == (
        "down", "offline", 20, "master")
    assert rows[3]["last_heard_ms"] == 11000          # the most recent any node reports
    console = Console(width=200, record=True, color_system=None)
    console.print(render(view))
    text = console.export_text()
    assert "needs_restore=pulling a copy, attempt 2" in text and "restore_reason=WAL recycled" in text
    assert "lease n1 e4 (1500 ms left)" in text and "20*" in text and "12.0 s" not in text
    assert "11.0 s" in text and "connection refused" in text
