"""vrepl.client against a scripted in-process server (vrepl.node.http): retries keep the
request id, an unknown outcome is surfaced (never silently re-sent under a new id), bad
input is not retried, and a 409 is followed to the master it names."""
from __future__ import annotations

import asyncio
import threading

import pytest

from vrepl.client import BadRequestError, Client, NotWrittenError, OutcomeUnknownError
from vrepl.node.http import HttpServer, Response, error

pytestmark = pytest.mark.timeout(30)


class Scripted:
    """HTTP servers on a private loop; `answers[port]` is a list of Responses, last repeats."""

    def __init__(self, n: int):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.seen: list[tuple[int, str, dict]] = []
        self.answers: dict[int, list] = {}
        self.servers = []
        for _ in range(n):
            srv = HttpServer(lambda req, srv_i=len(self.servers): self.handle(srv_i, req),
                             max_body_bytes=1 << 20, max_header_bytes=1 << 14,
                             max_connections=10, idle_timeout_ms=10_000)
            asyncio.run_coroutine_threadsafe(srv.start("127.0.0.1", 0), self.loop).result(5)
            self.servers.append(srv)
        self.eps = [f"127.0.0.1:{s.port}" for s in self.servers]

    def handle(self, i, req):
        self.seen.append((i, req.path, dict(req.query)))
        if req.path == "/v1/status":
            return Response(200, {"node": i + 1, "nodes": {}, "vgroups": [
                {"vgroup": 1, "role": "master" if i == 0 else "slave",
                 "master_http": self.eps[0]}]})
        answers = self.answers.get(i) or [error(500, "x", "no script")]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def close(self):
        for s in self.servers:
            self.loop.call_soon_threadsafe(s.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def srv():
    s = Scripted(2)
    yield s
    s.close()


def writes(srv):
    return [(i, q.get("request_id")) for i, p, q in srv.seen if p.endswith("/write")]


def test_unknown_outcome_is_retried_with_the_same_id_then_surfaced(srv):
    srv.answers[0] = [error(504, "timeout", "not confirmed", outcome="unknown")]
    with Client([srv.eps[0]], timeout_s=0.5, retry_pause_s=0.01) as cl:
        with pytest.raises(OutcomeUnknownError) as exc:
            cl.write(1, [["t", 1, {"a": 1}]], request_id="rid-1")
    assert exc.value.request_id == "rid-1"
    ids = {rid for _, rid in writes(srv)}
    assert ids == {"rid-1"} and len(writes(srv)) >= 2


def test_retry_after_unknown_returns_the_original_version(srv):
    srv.answers[0] = [error(504, "timeout", "not confirmed", outcome="unknown"),
                      Response(200, {"version": 7, "epoch": 1, "duplicate": True, "node": 1})]
    with Client([srv.eps[0]], retry_pause_s=0.01) as cl:
        r = cl.write(1, [["t", 1, {"a": 1}]])
    assert r.version == 7 and r.duplicate and r.attempts == 2
    assert len({rid for _, rid in writes(srv)}) == 1


def test_bad_input_is_not_retried(srv):
    srv.answers[0] = [error(400, "bad_rows", "row 0: ts 'x' is not an int")]
    with Client([srv.eps[0]]) as cl:
        with pytest.raises(BadRequestError) as exc:
            cl.write(1, [["t", "x", {"a": 1}]])
    assert exc.value.status == 400 and "not an int" in exc.value.reason
    assert len(writes(srv)) == 1


def test_not_master_is_followed_to_the_named_master(srv):
    srv.answers[1] = [error(409, "not_master", "slave", master=1, master_http=srv.eps[0],
                            outcome="not_written")]
    srv.answers[0] = [Response(200, {"version": 3, "epoch": 2, "node": 1})]
    with Client([srv.eps[1]]) as cl:
        cl._master[1] = srv.eps[1]           # a stale belief: node 2 was the master
        r = cl.write(1, [["t", 1, {"a": 1}]])
    assert r.version == 3
    assert [i for i, _ in writes(srv)] == [1, 0]


def test_no_master_at_all_is_not_written(srv):
    srv.answers[0] = [error(409, "not_master", "no master", master=None, master_http=None,
                            outcome="not_written")]
    with Client([srv.eps[0]], timeout_s=0.3, retry_pause_s=0.01) as cl:
        with pytest.raises(NotWrittenError):
            cl.write(1, [["t", 1, {"a": 1}]])
