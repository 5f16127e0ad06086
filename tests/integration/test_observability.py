"""Metrics, logs and `vrepl status` of real processes (issue 14 §3-5): 3 `vrepl node`
processes on 127.0.0.1 and the real arbitrator, scraped with HTTP and parsed with
prometheus_client's own parser; JSON log lines parsed; SIGHUP after a rename; `vrepl status`
with one node killed and one paused. Every process is killed at the end of its test."""
from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vrepl.client import Client
from vrepl.node.local import LocalCluster
from vrepl.replica.messages import ArbitratorRequest
from vrepl.testing.arbitrator_proc import ArbitratorProcess
from vrepl.transport import codec
from vrepl.transport.codec import ConnKind
from vrepl.transport.framed import FramedStream, client_handshake
from vrepl.transport.handshake import ClientHandshake

pytestmark = pytest.mark.timeout(120)

VG = 1
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d$")


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} from a real GET of the metrics page."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def raw_get(ep: str, method: str, path: str, body: bytes | None = None) -> int:
    c = Client([ep], request_timeout_s=5)
    try:
        return c.request(ep, method, path, body)[0]
    finally:
        c.close()


def settled(c: LocalCluster, m: int, version: int) -> bool:
    """Every replica applied `version` and the master has every ack."""
    vs = [c.vgroup_status(n) for n in c.nodes]
    if any(v is None or v["version"] != version for v in vs):
        return False
    ms = c.vgroup_status(m)
    return all(p["acked_version"] == version for p in ms["peers"].values())


def test_node_metrics_match_a_known_workload(make_local_cluster):
    c = make_local_cluster()
    m = c.master()
    ep = c.nodes[m].http
    url = f"http://{ep}/metrics"
    before = scrape(url)
    writes, bad, reads, misses = 25, 3, 4, 2
    for i in range(writes):
        assert raw_get(ep, "POST", f"/v1/vgroups/{VG}/write",
                       json.dumps([["cpu", 1000 + i, {"v": i}]]).encode()) == 200
    for _ in range(bad):
        assert raw_get(ep, "POST", f"/v1/vgroups/{VG}/write", b"not json") == 400
    for _ in range(reads):
        assert raw_get(ep, "GET", f"/v1/vgroups/{VG}/rows?table=cpu") == 200
    for i in range(misses):
        assert raw_get(ep, "GET", f"/no/such/route/{i}") == 404
    assert raw_get(ep, "GET", "/v1/vgroups/99/rows?table=cpu") == 404
    version = c.vgroup_status(m)["version"]
    c.wait_for("replicas settled", lambda: settled(c, m, version), 15)
    status = c.vgroup_status(m)
    after = scrape(url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - before.get((name, tuple(sorted(labels.items()))), 0)

    # HTTP requests by route pattern and status, exactly (raw paths never become labels).
    assert delta("vrepl_http_requests_total", route="/v1/vgroups/{id}/write", status="200") == writes
    assert delta("vrepl_http_requests_total", route="/v1/vgroups/{id}/write", status="400") == bad
    assert delta("vrepl_http_requests_total", route="/v1/vgroups/{id}/rows", status="200") == reads
    assert delta("vrepl_http_requests_total", route="/v1/vgroups/{id}/rows", status="404") == 1
    assert delta("vrepl_http_requests_total", route="other", status="404") == misses
    assert delta("vrepl_http_requests_total", route="/metrics", status="200") == 1  # the first scrape
    assert not any("no/such" in dict(k[1]).get("route", "") for k in after)
    # Forwards and writes.
    assert delta("vrepl_writes_total", vgroup="1", result="ok") == writes
    assert delta("vrepl_writes_total", vgroup="1", result="bad") == bad
    assert delta("vrepl_forwards_confirmed_total", vgroup="1", status="ok") >= writes
    assert delta("vrepl_forwards_total", vgroup="1") == writes
    assert value(after, "vrepl_forwards_confirmed_total", vgroup="1", status="failed") == 0
    assert 1 <= delta("vrepl_confirm_latency_seconds_count", vgroup="1") <= writes
    assert delta("vrepl_confirm_latency_seconds_sum", vgroup="1") > 0
    # Role, epoch and versions equal the status.
    assert value(after, "vrepl_role", vgroup="1", role="master") == 1
    assert value(after, "vrepl_role", vgroup="1", role="slave") == 0
    assert value(after, "vrepl_epoch", vgroup="1") == status["epoch"]
    assert value(after, "vrepl_master_node", vgroup="1") == m
    assert value(after, "vrepl_last_version", vgroup="1") == status["wal_last_version"] == version
    assert value(after, "vrepl_applied_version", vgroup="1") == status["version"]
    assert value(after, "vrepl_committed_version", vgroup="1") == version
    assert value(after, "vrepl_archived_version", vgroup="1") == status["vnode"]["archived_version"]
    # Per peer: all acked, no lag, heard recently.
    for peer in (n for n in c.nodes if n != m):
        assert value(after, "vrepl_peer_acked_version", vgroup="1", peer=str(peer)) == version
        assert value(after, "vrepl_peer_lag_versions", vgroup="1", peer=str(peer)) == 0
        assert value(after, "vrepl_peer_lag_seconds", vgroup="1", peer=str(peer)) == 0
        assert value(after, "vrepl_peer_connected", vgroup="1", peer=str(peer)) == 1
        assert value(after, "vrepl_peer_last_heard_seconds", vgroup="1", peer=str(peer)) < 2
    # The WAL: one histogram observation per group commit.
    commits = value(after, "vrepl_wal_group_commits_total", vgroup="1")
    assert commits >= 1
    assert value(after, "vrepl_wal_fsync_seconds_count", vgroup="1") == commits
    assert value(after, "vrepl_wal_written_bytes_total", vgroup="1") > 0
    assert value(after, "vrepl_role_changes_total", vgroup="1", role="master") >= 1
    assert value(after, "vrepl_elections_won_total", vgroup="1") >= 1
    assert value(after, "vrepl_epochs_total", vgroup="1") >= 1
    assert value(after, "vrepl_restores_running") == 0
    assert value(after, "vrepl_node_info", node=str(m), version=__import__("vrepl").__version__) == 1
    # A slave's view: its role and the versions it applied.
    slave = next(n for n in c.nodes if n != m)
    s = scrape(f"http://{c.nodes[slave].http}/metrics")
    assert value(s, "vrepl_role", vgroup="1", role="slave") == 1
    assert value(s, "vrepl_applied_version", vgroup="1") == version
    assert value(s, "vrepl_peer_last_heard_seconds", vgroup="1", peer=str(m)) < 2
    assert ("vrepl_peer_lag_versions", (("peer", str(m)), ("vgroup", "1"))) not in s


def test_peer_lag_grows_while_a_slave_is_paused(make_local_cluster):
    c = make_local_cluster()
    m = c.master()
    slave = next(n for n in c.nodes if n != m)
    url = f"http://{c.nodes[m].http}/metrics"
    os.kill(c.nodes[slave].proc.pid, signal.SIGSTOP)
    try:
        cl = Client([c.nodes[m].http])
        for i in range(5):
            cl.write(VG, [["t", 10 + i, {"v": i}]])
        cl.close()
        first = scrape(url)
        time.sleep(0.5)
        second = scrape(url)
    finally:
        os.kill(c.nodes[slave].proc.pid, signal.SIGCONT)
    key = {"vgroup": "1", "peer": str(slave)}
    lag1 = value(first, "vrepl_peer_lag_seconds", **key)
    lag2 = value(second, "vrepl_peer_lag_seconds", **key)
    assert value(second, "vrepl_peer_lag_versions", **key) >= 5
    assert lag1 > 0 and lag2 >= lag1 + 0.4, (lag1, lag2)
    assert value(second, "vrepl_peer_last_heard_seconds", **key) >= 0.4


def test_connection_refusals_are_counted_by_reason(make_local_cluster):
    c = make_local_cluster()

    def order(n: int) -> tuple[str, int]:   # the lower (host, port) opens a peer connection
        host, port = c.nodes[n].replication.rsplit(":", 1)
        return host, int(port)

    target = max(c.nodes, key=order)
    url = f"http://{c.nodes[target].http}/metrics"
    host, port = c.nodes[target].replication.rsplit(":", 1)
    # A hello for a vgroup this node does not host.
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(codec.encode(codec.Hello(ConnKind.PEER, 99, 1, target, b"n" * 32)))
        assert s.recv(1024) == b""
    # The right hello with a wrong proof (answered past the client's own check).
    lower = min(c.nodes, key=order)
    hs = ClientHandshake(b"not-the-secret", ConnKind.PEER, VG, lower, target)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(hs.start())
        assert s.recv(4096)          # the challenge
        s.sendall(codec.encode(codec.Auth(b"\0" * 32)))
        while s.recv(4096):
            pass
    # Bytes that are not a frame.
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n" * 4)
        while s.recv(4096):
            pass
    samples = c.wait_for("refusals counted", lambda: (lambda s: s if len(
        [k for k in s if k[0] == "vrepl_connection_refusals_total"]) >= 3 else None)(scrape(url)), 5)
    assert value(samples, "vrepl_connection_refusals_total", reason="hello_refused") == 1
    assert value(samples, "vrepl_connection_refusals_total", reason="wrong_secret") == 1
    assert value(samples, "vrepl_connection_refusals_total", reason="bad_frame") == 1


async def _arbitrator_client(port: int, node: int, vgroup: int, secret: bytes) -> FramedStream:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    stream = FramedStream(reader, writer)
    await client_handshake(stream, secret=secret, kind=codec.ConnKind.ARBITRATOR, vgroup_id=vgroup,
                           node=node, target_node=codec.ARBITRATOR_NODE_ID)
    return stream


async def _ask(stream: FramedStream, vgroup: int, node: int, epoch: int, lease_ms: int = 500) -> int:
    stream.send(ArbitratorRequest(vgroup, node, epoch, lease_ms))
    await stream.drain()
    return (await asyncio.wait_for(stream.recv(), 5)).granted


def test_arbitrator_metrics_and_json_logs(tmp_path):
    secret = b"arb-metrics-secret"
    log_file = tmp_path / "arb.log"
    # A 600 ms lease with a 50 ms allowance backs the 500 ms replica leases asked below
    # (docs/arbitrator.md §The lease margin).
    arb = ArbitratorProcess(str(tmp_path), secret, lease_ms=600,
                            extra=("--lease-allowance-ms", "50", "--log-format", "json",
                                   "--log-file", str(log_file)))
    try:
        assert arb.metrics_url and arb.metrics_url.startswith("http://127.0.0.1:")
        empty = scrape(arb.metrics_url)
        assert value(empty, "vrepl_arbitrator_connections") == 0

        async def run() -> None:
            n1 = await _arbitrator_client(arb.port, 1, 5, secret)
            n2 = await _arbitrator_client(arb.port, 2, 5, secret)
            assert await _ask(n1, 5, 1, 3) == 1          # new grant
            assert await _ask(n1, 5, 1, 3) == 1          # renewal
            assert await _ask(n1, 5, 1, 3) == 1          # renewal
            assert await _ask(n2, 5, 2, 3) == 0          # e3 is n1's
            assert await _ask(n2, 5, 2, 4) == 0          # n1's lease is live
            assert await _ask(n2, 5, 2, 1, lease_ms=60_000) == 0
            live = scrape(arb.metrics_url)
            assert value(live, "vrepl_arbitrator_connections") == 2
            assert value(live, "vrepl_arbitrator_lease_live", vgroup="5") == 1
            n1.close()
            n2.close()

        asyncio.run(run())
        s = scrape(arb.metrics_url)
        assert value(s, "vrepl_arbitrator_grants_total", kind="new") == 1
        assert value(s, "vrepl_arbitrator_grants_total", kind="renewal") == 2
        assert value(s, "vrepl_arbitrator_refusals_total", reason="epoch_taken") == 1
        assert value(s, "vrepl_arbitrator_refusals_total", reason="lease_held") == 1
        assert value(s, "vrepl_arbitrator_refusals_total", reason="lease_margin") == 1
        assert value(s, "vrepl_arbitrator_granted_epoch", vgroup="5", node="1") == 3
        time.sleep(0.7)                                   # the lease runs out
        assert value(scrape(arb.metrics_url), "vrepl_arbitrator_lease_live", vgroup="5") == 0
        # logrotate: rename, SIGHUP, the arbitrator writes a new file.
        os.rename(log_file, str(log_file) + ".1")
        arb.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while not log_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads(log_file.read_text().splitlines()[0])["event"] == "log_reopened"
        assert arb.proc.poll() is None
    finally:
        arb.stop()
    lines = [json.loads(line) for line in (open(str(log_file) + ".1").read() + log_file.read_text()).splitlines()]
    grants = [e for e in lines if e["event"] == "grant"]
    refusals = [e for e in lines if e["event"] == "refusal"]
    assert [(e["vgroup"], e["node"], e["epoch"], e["level"]) for e in grants] == [(5, 1, 3, "INFO")]
    assert sorted(e["reason"] for e in refusals) == ["epoch_taken", "lease_held", "lease_margin"]
    held = next(e for e in refusals if e["reason"] == "lease_held")
    assert re.search(r"for another \d+ ms", held["message"]) and "tick" not in held["message"]
    assert all(ISO_MS.match(e["time"]) for e in lines)


def test_node_json_logs_and_sighup_reopen(make_local_cluster):
    c = make_local_cluster(log_format="json")
    m = c.master()
    cl = c.client()
    cl.write(VG, [["t", 1, {"v": 1}]])
    cl.close()
    node = c.nodes[m]
    path = os.path.join(node.dir, "node.log")
    lines = [json.loads(line) for line in open(path)]      # every line one JSON object
    for e in lines:
        assert {"time", "level", "logger", "node", "vgroup", "epoch", "event", "message"} <= set(e)
        assert ISO_MS.match(e["time"]), e["time"]
        assert e["node"] == m
    changes = [e for e in lines if e["event"] == "role_change"]
    last = changes[-1]
    assert (last["role"], last["vgroup"], last["level"]) == ("master", VG, "INFO")
    assert last["epoch"] == c.vgroup_status(m)["epoch"]
    assert isinstance(last["previous_role_ms"], int) and f"{last['previous_role_ms']} ms" in last["message"]
    assert any(e["event"] == "election" and e["vgroup"] == VG for e in lines)
    assert not any(re.search(r"\bticks?\b", e["message"]) for e in lines if e["level"] != "DEBUG")

    # logrotate: rename, SIGHUP, new lines go to a new file at the same path.
    os.rename(path, path + ".1")
    os.kill(node.proc.pid, signal.SIGHUP)
    c.wait_for("a new log file", lambda: os.path.exists(path), 5)
    other = next(n for n in c.nodes if n != m)
    c.kill(other)                                # the master logs the lost connection
    c.wait_for("the master logs the lost peer",
               lambda: "lost" in open(path).read(), 10)
    fresh = [json.loads(line) for line in open(path)]
    assert fresh[0]["event"] == "log_reopened"
    assert any(e["event"] == "sync" and "lost" in e["message"] for e in fresh)
    old = open(path + ".1").read()
    assert "log_reopened" not in old and "lost" not in old
    assert c.nodes[m].alive()


def _vrepl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vrepl.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_status_shows_down_and_stalled_nodes(make_local_cluster):
    c = make_local_cluster()
    m = c.master()
    cl = c.client()
    for i in range(10):
        cl.write(VG, [["t", i, {"v": i}]])
    cl.close()
    last = c.vgroup_status(m)["wal_last_version"]     # the writes and the no-op(s) of elections
    assert last >= 11
    killed, paused = (n for n in c.nodes if n != m)
    c.kill(killed)
    os.kill(c.nodes[paused].proc.pid, signal.SIGSTOP)
    try:
        seed = c.nodes[m].http
        out = _vrepl("status", "--node", seed, "--json", "--timeout", "1")
        assert out.returncode == 0, out.stderr
        view = json.loads(out.stdout)
        rows = {r["node"]: r for r in view["vgroups"][0]["replicas"]}
        assert set(rows) == set(c.nodes)
        assert rows[killed]["state"] == "down" and rows[paused]["state"] == "stalled"
        assert rows[m]["state"] == "up" and rows[m]["last_version"] == last
        # Every field a node of this version sends is known: notes stay empty (they are for
        # a newer node's fields and a vgroup that needs a restore, docs/operations.md).
        assert rows[m]["notes"] == {}, rows[m]["notes"]
        assert view["nodes"][str(m)]["status"]["node"] == m
        assert rows[killed]["role"] in ("offline", "slave")

        # --watch with a bounded count, one JSON document per refresh: last heard grows.
        out = _vrepl("status", "--node", seed, "--json", "--timeout", "1", "--watch", "0.5",
                     "--count", "3")
        assert out.returncode == 0, out.stderr
        views = [json.loads(line) for line in out.stdout.splitlines()]
        assert len(views) == 3
        heard = [next(r for r in v["vgroups"][0]["replicas"] if r["node"] == paused)["last_heard_ms"]
                 for v in views]
        assert all(h is not None for h in heard) and heard[0] < heard[1] < heard[2], heard
        assert all(next(r for r in v["vgroups"][0]["replicas"] if r["node"] == paused)["state"] == "stalled"
                   for v in views)

        # The table, refreshed in place in a terminal (rich Live in a pty).
        text = _run_in_pty([sys.executable, "-m", "vrepl.cli", "status", "--node", seed, "--timeout", "1",
                            "--watch", "0.3", "--count", "2"], timeout_s=30)
        assert "stalled" in text and "down" in text and f"n{m}" in text
        # Redrawn in place: the cursor goes up over the previous table and erases it.
        assert "\x1b[1A" in text and "\x1b[2K" in text
    finally:
        os.kill(c.nodes[paused].proc.pid, signal.SIGCONT)

    # The node named must answer: exit 1 with one line.
    out = _vrepl("status", "--node", c.nodes[killed].http, "--timeout", "1")
    assert out.returncode == 1 and out.stderr.startswith("vrepl: error:") and "down" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def _run_in_pty(argv: list[str], timeout_s: float) -> str:
    master_fd, slave_fd = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave_fd, stdout=slave_fd, stderr=slave_fd, close_fds=True,
                            env={**os.environ, "TERM": "xterm", "COLUMNS": "160"})
    os.close(slave_fd)
    chunks = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master_fd], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master_fd, 65536)
                except OSError:       # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        os.close(master_fd)
    return b"".join(chunks).decode(errors="replace")


def test_arbitrator_metrics_listen_errors(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s")
    base = [sys.executable, "-m", "arbitrator.main", "--port", "0", "--secret-file", str(secret),
            "--state-dir", str(tmp_path / "state")]
    bad = subprocess.run([*base, "--metrics-listen", "nowhere"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and bad.stderr.startswith("vrepl-arbitrator: error: metrics_listen 'nowhere'")
    assert len(bad.stderr.strip().splitlines()) == 1
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        busy = subprocess.run([*base, "--metrics-listen", f"127.0.0.1:{taken.getsockname()[1]}"],
                              capture_output=True, text=True, timeout=30)
    finally:
        taken.close()
    assert busy.returncode == 1 and "cannot start" in busy.stderr
    assert len(busy.stderr.strip().splitlines()) == 1


def test_status_shows_the_arbitrator_and_the_lease_holder(tmp_path):
    arb = ArbitratorProcess(str(tmp_path / "arb"), b"vrepl-local-secret")   # its default lease
    c = LocalCluster(str(tmp_path / "c"), 2, vgroup=VG, quorum=1, arbitrator=arb.address)
    try:
        c.start()
        c.wait_ready()
        m = c.wait_master(slaves=1, timeout_s=20)
        c.wait_for("both replicas reach the arbitrator",
                   lambda: all(c.vgroup_status(n)["arbitrator"]["connected"] for n in c.nodes), 10)
        out = _vrepl("status", "--node", c.nodes[m].http, "--json")
        assert out.returncode == 0, out.stderr
        arbv = json.loads(out.stdout)["vgroups"][0]["arbitrator"]
        assert arbv["address"] == arb.address and arbv["connected"] == [1, 2]
        holder = arbv["lease_holder"]
        assert (holder["node"], holder["epoch"]) == (m, c.vgroup_status(m)["epoch"])
        assert 0 < holder["remaining_ms"] <= 2000
        table = _vrepl("status", "--node", c.nodes[m].http)
        assert f"arbitrator {arb.address} (connected: n1 n2), lease n{m} e{holder['epoch']}" in table.stdout
        s = scrape(arb.metrics_url)
        assert value(s, "vrepl_arbitrator_lease_live", vgroup=str(VG)) == 1
        assert value(s, "vrepl_arbitrator_granted_epoch", vgroup=str(VG), node=str(m)) == holder["epoch"]
        assert value(s, "vrepl_arbitrator_connections") == 2
    finally:
        c.close()
        arb.stop()
