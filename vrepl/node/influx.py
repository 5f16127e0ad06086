"""InfluxDB's write API on the node's HTTP port: `POST /write` (v1), `POST /api/v2/write`
(v2) and `GET /ping` (docs/client-api.md §InfluxDB line protocol).

Owns: reading the routes' parameters (`db` / `bucket` naming the vgroup, `precision`), a
gzip body (Telegraf's default for v2), and answering in InfluxDB's shapes and status codes
(204 when written; v2 errors `{"code": "invalid", "message": ..., "line": N}`, v1 errors
`{"error": ...}`) so that InfluxDB clients and Telegraf show them. The write itself is the
vgroup's (`VgroupHost.write(..., kind="lines")`): the same master, quorum, WAL and retry
rules as the JSON route. Must not: parse line protocol (vrepl/_core, through the vnode) or
know the replication.
"""
from __future__ import annotations

import asyncio
import re
import zlib
from typing import Any

from vrepl.node.http import Request, Response, error
from vrepl.vnode.ingest import UNIT_CODES

ROUTE_V1_WRITE = "/write"
ROUTE_V2_WRITE = "/api/v2/write"
ROUTE_PING = "/ping"
V1_PRECISIONS = ("n", "ns", "u", "us", "ms", "s", "m", "h")
V2_PRECISIONS = ("ns", "us", "ms", "s")
# `db` (v1) or `bucket` (v2): the vgroup, as "vg<N>" or "<N>".
VGROUP_NAME_RE = re.compile(r"(?:vg)?([0-9]{1,10})")
# InfluxDB v2's error codes by HTTP status (its API's "code" field).
V2_CODES = {400: "invalid", 401: "unauthorized", 404: "not found", 405: "method not allowed",
            408: "request timeout", 411: "invalid", 413: "request too large",
            415: "unsupported media type", 431: "invalid", 500: "internal error",
            503: "unavailable", 504: "unavailable", 505: "invalid"}


def is_v1(path: str) -> bool:
    return path in (ROUTE_V1_WRITE, ROUTE_PING)


def is_influx(path: str) -> bool:
    return path in (ROUTE_V1_WRITE, ROUTE_V2_WRITE, ROUTE_PING)


def shaped(v1: bool, resp: Response) -> Response:
    """One of the node's answers in InfluxDB's shape: 2xx becomes 204 with no body; an error
    keeps its status (a 409 not_master becomes 503, which InfluxDB clients and Telegraf
    retry, on another URL when they have one) and its one-line reason, as v1's `{"error"}` or
    v2's `{"code", "message"}` (plus `line` for a line-protocol error), keeping the node's
    own fields (`outcome`, `master_http`, ...)."""
    if 200 <= resp.status < 300:
        return Response(204, raw=b"", close=resp.close, headers=resp.headers)
    body = dict(resp.body) if isinstance(resp.body, dict) else {}
    status = 503 if resp.status == 409 else resp.status
    reason = body.pop("error", "") or f"HTTP {status}"
    node_code = body.pop("code", "")
    if v1:
        doc = {"error": reason, **body}
    else:
        doc = {"code": V2_CODES.get(status, "invalid"), "message": reason, **body}
    if node_code:
        doc["vrepl_code"] = node_code
    return Response(status, doc, close=resp.close, headers=resp.headers)


def shape_refusal(target: str, resp: Response) -> Response:
    """HttpServer's hook: refusals before routing (401, 413, ...) of InfluxDB's routes in
    InfluxDB's shape; others unchanged."""
    path = target.partition("?")[0]
    if not is_influx(path):
        return resp
    return shaped(is_v1(path), resp)


def ping() -> Response:
    return Response(204, raw=b"", headers=(("X-Influxdb-Version", "vrepl"),))


def write_params(req: Request, v1: bool) -> tuple[str | None, int | None, Response | None]:
    """(vgroup id text, unit code, None) of a write's query, or (None, None, its refusal)."""
    q = req.query
    name = q.get("db") if v1 else q.get("bucket")
    what = "db" if v1 else "bucket"
    if not name:
        return None, None, shaped(v1, error(400, "bad_request", f"{what} is missing: it names"
                                            " the vgroup (vg1 or 1)", outcome="not_written"))
    m = VGROUP_NAME_RE.fullmatch(name)
    if m is None:
        return None, None, shaped(v1, error(404, "no_vgroup", f"{what} {name[:40]!r} is not a"
                                            " vgroup: vg<N> or <N>", outcome="not_written"))
    precision = q.get("precision") or "ns"
    allowed = V1_PRECISIONS if v1 else V2_PRECISIONS
    if precision not in allowed:
        return None, None, shaped(v1, error(400, "bad_request", f"precision {precision[:20]!r}"
                                            f" is not one of {', '.join(allowed)}",
                                            outcome="not_written"))
    return m.group(1), UNIT_CODES[precision], None


def body_of(req: Request, limit: int) -> tuple[bytes | None, Response | None]:
    """The request's body, gunzipped when `Content-Encoding: gzip` (at most `limit` bytes
    once decompressed: 413 beyond), or its refusal (unshaped)."""
    enc = req.headers.get("content-encoding", "identity").lower()
    if enc in ("", "identity"):
        return req.body, None
    if enc != "gzip":
        return None, error(415, "unsupported_encoding", f"Content-Encoding {enc[:20]!r}:"
                           " identity or gzip", outcome="not_written")
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(req.body, limit + 1)
    except zlib.error as exc:
        return None, error(400, "bad_request", f"gzip body: {exc}", outcome="not_written")
    if len(out) > limit:
        return None, error(413, "body_too_large", f"gzip body above max_body_bytes {limit}"
                           " once decompressed", outcome="not_written")
    if not d.eof:
        return None, error(400, "bad_request", "gzip body is truncated", outcome="not_written")
    return out, None


async def _shape_later(v1: bool, pending: Any) -> Response:
    return shaped(v1, await pending)


def answer(v1: bool, result: Any) -> Any:
    """The vgroup's answer (a Response or an awaitable of one) in InfluxDB's shape."""
    if isinstance(result, Response):
        return shaped(v1, result)
    if isinstance(result, asyncio.Future):
        out = asyncio.get_running_loop().create_future()

        def done(f: asyncio.Future) -> None:
            if out.done():
                return
            if f.cancelled():
                out.cancel()
            elif f.exception() is not None:
                out.set_exception(f.exception())  # type: ignore[arg-type]
            else:
                out.set_result(shaped(v1, f.result()))
        result.add_done_callback(done)
        return out
    return _shape_later(v1, result)
