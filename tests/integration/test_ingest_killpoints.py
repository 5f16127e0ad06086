"""Kill -9 at every kill point of the ingest path (vrepl/killpoints.py; docs/vnode.md §9.5),
with real `vrepl node` processes and a real SIGKILL: the process kills itself at the named
step (VREPL_KILLPOINT in its environment), the test restarts it without the kill point and
checks that the group converges with the round on every replica exactly once (nothing lost,
nothing applied twice) and no staging leftovers, reading rows back from every replica
through the client API.

Two parties per point:
* `every`: the kill point is armed on all three nodes, so every process that reaches the
  step dies there: the master for the master's points, both slaves for a slave's points,
  and all replicas (one after the other, as each applies the round) for the apply points.
* `slave`: one slave only (restarted with the kill point armed before the round): the
  group goes on without it, and it catches up after its restart.

A producer whose request got no answer, or an unknown outcome, retries the round once the
group has settled if the round is not there (its files put into the new master's incoming/
again, as `vrepl ship`'s receiver does after a crash). A round answered 200 must be there
without a retry.
"""
from __future__ import annotations

import json
import os
import signal
import threading

import pytest

import vrepl.node.ingest  # noqa: F401  (registers the node's ingest kill points)
import vrepl.vnode.vnode  # noqa: F401  (registers the apply kill points)
from vrepl import killpoints
from vrepl.client import Client
from vrepl.node.local import LocalCluster
from vrepl.testing.ingestfiles import ORIGIN_COLUMNS, origin_rows, write_round_file

pytestmark = pytest.mark.timeout(150)

VG = 1
POINTS = sorted(killpoints.registered("ingest."))
# Points a slave reaches (a master reaches the others, and the apply points too).
SLAVE_POINTS = [p for p in POINTS if p.startswith(("ingest.slave.", "ingest.fetch.",
                                                     "ingest.apply."))]
ROUND = {"k/0.parquet": origin_rows(30, ts0=1_000, version0=500, tag="r0"),
         "k/1.parquet": origin_rows(20, ts0=5_000, version0=800, tag="r1")}


def vg_path(c: LocalCluster, node: int) -> str:
    return os.path.join(c.nodes[node].dir, "data", f"vg{VG}")


def place_round(c: LocalCluster, node: int) -> list[dict]:
    out = []
    for name, rows in ROUND.items():
        write_round_file(os.path.join(vg_path(c, node), "ingest", "incoming", name), rows,
                         ORIGIN_COLUMNS)
        out.append({"name": name, "table": "ing", "origin": "edge7/vg2"})
    return out


def post_ingest(c: LocalCluster, node: int, files: list[dict]) -> tuple[int, dict]:
    cl = Client([c.nodes[node].http], request_timeout_s=30)
    try:
        return cl.request(c.nodes[node].http, "POST", f"/v1/vgroups/{VG}/ingest",
                          json.dumps({"files": files, "kind": "test",
                                      "meta": {"round_id": "kp-1"}}).encode())
    finally:
        cl.close()


def rows(c: LocalCluster, node: int) -> list[tuple]:
    return [(r["ts"], r["_version"], r["x"], r["tag"]) for r in c.replica_rows(node, "ing")]


def ingest_status(c: LocalCluster, node: int) -> dict:
    st = c.vgroup_status(node)
    return (st or {}).get("ingest") or {}


def archived_round_files(c: LocalCluster, node: int) -> list[dict]:
    try:
        with open(os.path.join(vg_path(c, node), "data", "manifest.json")) as fh:
            return [f for f in json.load(fh)["files"] if f.get("ingest_version")]
    except FileNotFoundError:
        return []


def leftovers(c: LocalCluster, node: int) -> list[str]:
    out = []
    for sub in ("staged", "incoming"):
        root = os.path.join(vg_path(c, node), "ingest", sub)
        for dirpath, dirnames, filenames in os.walk(root):
            # Empty directories a producer made in incoming/ may stay; in staged/ nothing.
            names = filenames + (dirnames if sub == "staged" else [])
            out += [os.path.relpath(os.path.join(dirpath, n), root) for n in names]
    return out


def died_by_kill(c: LocalCluster, node: int) -> bool:
    p = c.nodes[node].proc
    return p is not None and p.poll() == -signal.SIGKILL


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    made: list[LocalCluster] = []

    def make(armed: str | None):
        c = LocalCluster(str(tmp_path / "c"), 3, vgroup=VG, http={"write_timeout_ms": 3000})
        made.append(c)
        if armed:
            monkeypatch.setenv(killpoints.ENV, armed)
        c.start()
        monkeypatch.delenv(killpoints.ENV, raising=False)
        c.wait_ready()
        c.wait_master(slaves=2)
        return c

    yield make
    for c in made:
        c.close()


def _settle(c: LocalCluster, victims: list[int], restarted: set[int], point: str = "") -> int:
    """Restart every victim that died at the kill point (once each, without it: the env is
    clean), until every node is up, one master has two slaves and no round is pending
    anywhere; the master. Armed nodes go on dying as they reach the point (the apply points:
    a slave reaches it once a new master commits the round), so this revives as it waits.
    An armed node that archived the round at an apply point is about to die at it (the
    points after the manifest commit, when its round is no longer pending): not settled."""
    def settled() -> int | None:
        for n in c.nodes:
            if c.nodes[n].proc.poll() is None:
                continue
            assert n in victims and n not in restarted and died_by_kill(c, n), \
                (n, c.stderr_tail(n))
            restarted.add(n)
            c.start(n)
        if any(c.status(n, 0.5) is None for n in c.nodes):
            return None
        roles = c.roles()
        masters = [n for n, r in roles.items() if r == "master"]
        if len(masters) != 1 or sorted(roles.values()).count("slave") != 2:
            return None
        if any(ingest_status(c, n).get("pending_rounds") != 0 for n in c.nodes):
            return None
        if point.startswith("ingest.apply.") and any(
                n not in restarted and archived_round_files(c, n) for n in victims):
            return None
        return masters[0]
    return c.wait_for("the group settles after the kill", settled, 60, 0.1)


def run_case(c: LocalCluster, point: str, victims: list[int]) -> None:
    m = c.master()
    with c.client() as cl:
        before = cl.write(VG, [["ing", 1_003, {"x": -1, "tag": "before"}],
                               ["ing", 9_000, {"x": -2, "tag": "before"}]])
    files = place_round(c, m)
    answer: dict = {}

    def producer() -> None:
        try:
            answer["r"] = post_ingest(c, m, files)
        except Exception as exc:     # the node died under the request: no answer
            answer["exc"] = exc
    t = threading.Thread(target=producer)
    t.start()
    c.wait_for(f"a victim dies at {point}", lambda: any(died_by_kill(c, n) for n in victims),
               40, 0.05)
    restarted: set[int] = set()
    m2 = _settle(c, victims, restarted, point)
    assert restarted, "no process died at the kill point"
    t.join(40)
    assert not t.is_alive()
    want_round = sorted((ts, v, vals["x"], vals["tag"]) for rs in ROUND.values()
                        for ts, v, _e, vals in rs)
    got = {n: rows(c, n) for n in c.nodes}
    assert len({tuple(r) for r in got.values()}) == 1, got      # the replicas agree
    has_round = [r for r in got[m2] if r[3] in ("r0", "r1")]
    code = answer.get("r", (None,))[0]
    if code == 200:
        assert has_round, "a round answered 200 was lost"
    if not has_round:
        # The producer's retry: nothing of the round is anywhere, so it goes again.
        assert all(archived_round_files(c, n) == [] for n in c.nodes)
        # Nodes still armed (they never reached the point) would die at the retry: restart
        # them without it first.
        for n in [n for n in victims if n not in restarted]:
            c.kill(n, signal.SIGTERM)
            restarted.add(n)
            c.start(n)
        m2 = _settle(c, victims, restarted, point)
        code, doc = post_ingest(c, m2, place_round(c, m2))
        assert code == 200, doc
    with c.client() as cl:
        after = cl.write(VG, [["ing", 5_000, {"x": -3, "tag": "after"}]])
    # The round beats the write before it at ts 1003; the write after it wins at ts 5000;
    # ts 9000 is the write's alone.
    want = [r if r[0] != 5_000 else (5_000, after.version, -3, "after") for r in want_round]
    want = sorted(want + [(9_000, before.version, -2, "before")])
    for n in c.nodes:
        c.wait_for(f"n{n} converges", lambda n=n: rows(c, n) == want
                   and ingest_status(c, n).get("pending_rounds") == 0, 30, 0.1)
        files_here = archived_round_files(c, n)
        # Exactly one round of two files: never applied twice.
        assert len(files_here) == 2, (n, files_here)
        assert len({f["ingest_version"] for f in files_here}) == 1
        assert leftovers(c, n) == [], (n, leftovers(c, n))


@pytest.mark.parametrize("point", POINTS)
def test_every_party_killed_at(cluster, monkeypatch, point):
    c = cluster(point)
    run_case(c, point, list(c.nodes))


@pytest.mark.parametrize("point", SLAVE_POINTS)
def test_one_slave_killed_at(cluster, monkeypatch, point):
    c = cluster(None)
    m = c.master()
    s = next(n for n in c.nodes if n != m)
    c.kill(s, signal.SIGTERM)
    monkeypatch.setenv(killpoints.ENV, point)
    c.start(s)
    monkeypatch.delenv(killpoints.ENV)
    c.wait_ready(s)
    assert c.wait_master(slaves=2, timeout_s=30) == m
    run_case(c, point, [s])


def test_every_ingest_kill_point_is_covered():
    """A kill point added to the ingest path gets a case here without further ado; this
    guards against the registry being empty (imports moved) and the test passing vacuously."""
    assert len(POINTS) >= 11
    assert {"ingest.master.after_confirm", "ingest.fetch.after_receive",
            "ingest.apply.after_manifest"} <= set(POINTS)
