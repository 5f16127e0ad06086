"""Rounds of ingested files through real `vrepl node` processes (docs/vnode.md §9, docs/
client-api.md §Ingesting files): the files a producer put in the master's staging directory
reach every replica's archive through one WAL record; slaves fetch what they lack from a
replica that has it over a FETCH connection (or take it from their own incoming/ when the
producer put the same bytes there); a slave that cannot fetch does not acknowledge the
record, so the round (and writes after it) wait, and go through once the files can be
fetched. Every process is killed at the end (LocalCluster.close)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import threading

import pytest

from vrepl.client import Client
from vrepl.node.local import LocalCluster
from vrepl.testing.ingestfiles import ORIGIN_COLUMNS, origin_rows, write_round_file

pytestmark = pytest.mark.timeout(120)

VG = 1


def vg_path(c: LocalCluster, node: int) -> str:
    return os.path.join(c.nodes[node].dir, "data", f"vg{VG}")


def incoming(c: LocalCluster, node: int) -> str:
    return os.path.join(vg_path(c, node), "ingest", "incoming")


def place_round(c: LocalCluster, node: int, spec: dict[str, list]) -> list[dict]:
    """Write the round's files ({name: rows}) into a node's incoming/; the request's files."""
    out = []
    for name, rows in spec.items():
        write_round_file(os.path.join(incoming(c, node), name), rows, ORIGIN_COLUMNS)
        out.append({"name": name, "table": "ing", "origin": "dc9/vg4"})
    return out


def post_ingest(c: LocalCluster, node: int, files: list[dict], meta=None, timeout_s=30.0):
    cl = Client([c.nodes[node].http], request_timeout_s=timeout_s)
    try:
        return cl.request(c.nodes[node].http, "POST", f"/v1/vgroups/{VG}/ingest",
                          json.dumps({"files": files, "kind": "test", "meta": meta or {}}).encode())
    finally:
        cl.close()


def ingest_status(c: LocalCluster, node: int) -> dict:
    st = c.vgroup_status(node)
    return st["ingest"] if st else {}


def expected_rows(spec: dict[str, list]) -> list[tuple]:
    rows = sorted(r for rs in spec.values() for r in rs)
    return [(ts, v, e, vals["x"], vals["tag"]) for ts, v, e, vals in rows]


def got_rows(c: LocalCluster, node: int, table: str = "ing") -> list[tuple]:
    return [(r["ts"], r["_version"], r["_epoch"], r["x"], r["tag"])
            for r in c.replica_rows(node, table)]


def staging_leftovers(c: LocalCluster, node: int) -> list[str]:
    root = os.path.join(vg_path(c, node), "ingest", "staged")
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def wait_round_everywhere(c: LocalCluster, spec: dict[str, list], nodes=None,
                          timeout_s: float = 20.0) -> None:
    want = expected_rows(spec)
    for nid in nodes or list(c.nodes):
        c.wait_for(f"n{nid} holds the round", lambda nid=nid: got_rows(c, nid) == want
                   and ingest_status(c, nid).get("pending_rounds") == 0, timeout_s, 0.1)


def archived_round_files(c: LocalCluster, node: int) -> list[dict]:
    try:
        with open(os.path.join(vg_path(c, node), "data", "manifest.json")) as fh:
            return [f for f in json.load(fh)["files"] if f.get("ingest_version")]
    except FileNotFoundError:      # never flushed
        return []


ROUND = {"a/0.parquet": origin_rows(40, ts0=1_000, version0=500, tag="r0"),
         "a/1.parquet": origin_rows(30, ts0=2_000, version0=900, tag="r1")}


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(n=3, quorum=0, **kw):
        c = LocalCluster(str(tmp_path / f"c{len(made)}"), n, vgroup=VG, quorum=quorum, **kw)
        made.append(c)
        c.start()
        c.wait_ready()
        c.wait_master(slaves=n - 1)
        return c

    yield make
    for c in made:
        c.close()


def test_a_round_reaches_every_replica_through_one_record(cluster):
    c = cluster()
    m = c.master()
    slaves = [n for n in c.nodes if n != m]
    with c.client() as cl:
        w1 = cl.write(VG, [["ing", 1_005, {"x": -1, "tag": "before"}],
                           ["ing", 1_010, {"x": -2, "tag": "before"}]])
    # One slave already has file 1 (the producer sent it there too): it takes it from its
    # own incoming/; everything else is fetched from the master.
    files = place_round(c, m, ROUND)
    write_round_file(os.path.join(incoming(c, slaves[0]), "a/1.parquet"), ROUND["a/1.parquet"],
                     ORIGIN_COLUMNS)
    code, doc = post_ingest(c, m, files, meta={"round_id": "r-1"})
    assert code == 200, doc
    assert doc["rows"] == 70 and doc["files"] == 2 and doc["applied"] is True
    assert doc["version"] == w1.version + 1
    with c.client() as cl:
        w2 = cl.write(VG, [["ing", 1_010, {"x": -3, "tag": "after"}]])
    want = expected_rows(ROUND)
    # ts 1005: the round (v) beats the write before it; ts 1010: the write after it wins.
    want = [r if r[0] != 1_010 else (1_010, w2.version, w2.epoch, -3, "after") for r in want]
    for nid in c.nodes:
        c.wait_for(f"n{nid} rows", lambda nid=nid: got_rows(c, nid) == want, 20, 0.1)
        files_here = archived_round_files(c, nid)
        assert len(files_here) == 2 and {f["ingest_version"] for f in files_here} == {doc["version"]}
        assert {f["origin"] for f in files_here} == {"dc9/vg4"}
        assert staging_leftovers(c, nid) == []
    assert ingest_status(c, slaves[0])["files_from_incoming"] == 1
    assert ingest_status(c, slaves[0])["files_fetched"] == 1
    assert ingest_status(c, slaves[1])["files_fetched"] == 2
    assert ingest_status(c, m)["rounds_ingested"] == 1
    assert ingest_status(c, m)["files_served"] == 3
    # The same counts in /metrics (docs/operations.md §Metrics).
    vg = str(VG)
    assert c.metric(m, "vrepl_ingest_rounds_total", vgroup=vg, result="ingested") == 1
    assert c.metric(m, "vrepl_ingest_rounds_total", vgroup=vg, result="refused") == 0
    assert c.metric(m, "vrepl_ingest_files_total", vgroup=vg, how="served") == 3
    assert c.metric(slaves[0], "vrepl_ingest_files_total", vgroup=vg, how="incoming") == 1
    assert c.metric(slaves[1], "vrepl_ingest_files_total", vgroup=vg, how="fetched") == 2
    for nid in slaves:
        assert c.metric(nid, "vrepl_ingest_rounds_staged_total", vgroup=vg) == 1
    # CRC-32C passes: a producer's files are read back for it (the master's check, the slave
    # taking its incoming copy), fetched files only as they arrive.
    sizes = {f["name"].rsplit("-", 1)[1]: f["size"] for f in archived_round_files(c, m)}
    crc = {(nid, how): c.metric(nid, "vrepl_ingest_checksum_bytes_total", vgroup=vg, how=how)
           for nid in c.nodes for how in ("received", "reread")}
    assert (crc[m, "received"], crc[m, "reread"]) == (0, sum(sizes.values()))
    assert (crc[slaves[0], "received"], crc[slaves[0], "reread"]) == (
        sizes["0.parquet"], sizes["1.parquet"])
    assert (crc[slaves[1], "received"], crc[slaves[1], "reread"]) == (sum(sizes.values()), 0)
    # The table's schema came with the round, on every replica.
    with c.client() as cl:
        for nid in c.nodes:
            (t,) = cl.tables(VG, node=c.nodes[nid].http)["tables"]
            assert t["columns"] == {"x": "int", "tag": "str", "y": "float"}
    # A restart replays nothing of it (it is archived) and keeps it.
    c.kill(slaves[1], signal.SIGTERM)
    c.start(slaves[1])
    c.wait_ready(slaves[1])
    c.wait_for("slave back", lambda: got_rows(c, slaves[1]) == want, 20, 0.1)


def test_refusals_leave_nothing_written(cluster):
    c = cluster()
    m = c.master()
    slave = next(n for n in c.nodes if n != m)
    files = place_round(c, m, {"b.parquet": origin_rows(5)})
    code, doc = post_ingest(c, slave, files)
    assert code == 409 and doc["code"] == "not_master" and doc["master"] == m
    code, doc = post_ingest(c, m, [{"name": "../etc/passwd", "table": "ing"}])
    assert code == 400 and doc["code"] == "bad_ingest" and doc["outcome"] == "not_written"
    code, doc = post_ingest(c, m, [{"name": "missing.parquet", "table": "ing"}])
    assert code == 400 and "no such file" in doc["error"]
    code, doc = post_ingest(c, m, [{**files[0], "crc32c": 12345}])
    assert code == 400 and "magic" in doc["error"]
    with c.client() as cl:
        cl.write(VG, [["ing", 1, {"x": "text"}]])       # ing.x is a string column now
    code, doc = post_ingest(c, m, files)
    assert code == 400 and "cannot change" in doc["error"]
    # The refused file is still where the producer put it; nothing reached the log.
    assert os.path.exists(os.path.join(incoming(c, m), "b.parquet"))
    for nid in c.nodes:
        assert archived_round_files(c, nid) == [] and staging_leftovers(c, nid) == []
    # Four refused on the master (name, missing file, checksum, schema), one on the slave.
    assert c.metric(m, "vrepl_ingest_rounds_total", vgroup=str(VG), result="refused") == 4
    assert c.metric(slave, "vrepl_ingest_rounds_total", vgroup=str(VG), result="refused") == 1
    assert c.metric(m, "vrepl_ingest_rounds_total", vgroup=str(VG), result="ingested") == 0


def test_one_replica(cluster):
    c = cluster(n=1)
    spec = {"only.parquet": origin_rows(10, ts0=50)}
    code, doc = post_ingest(c, 1, place_round(c, 1, spec))
    assert code == 200 and doc["applied"], doc
    assert got_rows(c, 1) == expected_rows(spec)


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def ingest_with_the_round_hidden(cluster, monkeypatch, write_timeout_ms: int):
    """A cluster whose master is frozen (a pause point) right after staging a round; its
    staged copy, the only one, is moved away before it goes on. (cluster, the producer's
    thread, its answer {"r": (code, doc)} once it has one, a function that puts the copy
    back)."""
    monkeypatch.setenv("VREPL_KILLPOINT", "ingest.master.after_stage:stop")
    c = cluster(http={"write_timeout_ms": write_timeout_ms})
    monkeypatch.delenv("VREPL_KILLPOINT")
    m = c.master()
    pid = c.nodes[m].proc.pid
    files = place_round(c, m, ROUND)
    answer: dict = {}
    t = threading.Thread(target=lambda: answer.update(
        r=post_ingest(c, m, files, timeout_s=write_timeout_ms / 1000 + 20)))
    t.start()
    c.wait_for("master paused after staging", lambda: _stopped(pid), 20, 0.005)
    staged = os.path.join(vg_path(c, m), "ingest", "staged")
    (rnd,) = os.listdir(staged)
    hidden = os.path.join(c.base_dir, "hidden-round")
    shutil.move(os.path.join(staged, rnd), hidden)
    os.kill(pid, signal.SIGCONT)
    return c, t, answer, lambda: shutil.move(hidden, os.path.join(staged, rnd))


def test_a_slave_that_cannot_fetch_does_not_ack(cluster, monkeypatch):
    """The master's only copy of the round vanishes right after it was staged (a pause
    point freezes the master there): no slave can stage the files, so none acknowledges the
    record; the producer's request and a client write after it time out with an unknown
    outcome. When the files are back, the slaves fetch them, acknowledge, and the round
    and the write go through on every replica."""
    c, t, answer, put_back = ingest_with_the_round_hidden(cluster, monkeypatch, 3000)
    m = c.master()
    t.join(30)
    code, doc = answer["r"]
    assert code == 504 and doc["code"] == "timeout" and doc["outcome"] == "unknown", doc
    version = doc["version"]
    # Writes after it wait too: acks are cumulative.
    cl = Client([c.nodes[m].http], request_timeout_s=10)
    try:
        code, wdoc = cl.request(c.nodes[m].http, "POST", f"/v1/vgroups/{VG}/write",
                                json.dumps([["ing", 99_999, {"x": 1, "tag": "w"}]]).encode())
    finally:
        cl.close()
    # Above the round's version (and the no-ops the master forwarded while the producer
    # waited: the round commits with the next record a quorum confirms).
    assert code == 504 and wdoc["version"] > version
    for nid in c.nodes:
        st = ingest_status(c, nid)
        assert st["unstaged_rounds"] == 1, (nid, st)      # the master lost its copy too
        assert st["fetch_failures"] >= 1
        assert archived_round_files(c, nid) == []
        # Nothing of the round is visible (the write after it is, from the memtable).
        assert [r[0] for r in got_rows(c, nid)] == [99_999]
    # The files come back: the replicas stage them, acknowledge, and everything commits
    # (the master forwards a no-op now and then until the timed-out round is committed).
    put_back()
    want = [r[:2] + r[3:] for r in expected_rows(ROUND)] + [(99_999, wdoc["version"], 1, "w")]
    for nid in c.nodes:
        c.wait_for(f"n{nid} converges",
                   lambda nid=nid: [r[:2] + r[3:] for r in got_rows(c, nid)] == want
                   and ingest_status(c, nid)["pending_rounds"] == 0, 30, 0.1)
        assert staging_leftovers(c, nid) == []
        assert len(archived_round_files(c, nid)) == 2


def test_a_round_whose_files_come_late_commits_within_the_producers_wait(cluster, monkeypatch):
    """The slaves cannot fetch the round's files for longer than the sync layer's forward
    timeout (2 s: the master's staged copy is away for 3.5 s), but less than the producer's
    wait (write_timeout_ms 20 s): the round is not given up as of unknown outcome; the
    master keeps a no-op in flight, and the producer gets 200 once the slaves staged it."""
    c, t, answer, put_back = ingest_with_the_round_hidden(cluster, monkeypatch, 20_000)
    t.join(3.5)
    assert t.is_alive() and "r" not in answer      # past the forward timeout: still waiting
    put_back()
    t.join(30)
    code, doc = answer["r"]
    assert code == 200, doc
    assert doc["files"] == 2
    wait_round_everywhere(c, ROUND)
