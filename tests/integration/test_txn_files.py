"""Whole Parquet files in a transaction (docs/transactions.md §4.1) on three real `vrepl node`
processes on 127.0.0.1: a file put streams a Parquet file to the master, which stages it and
forwards one "files" record; every replica fetches the file before acknowledging it; nothing
of the transaction is visible on any replica before the publish, all of it after (files and
inline rows, read through the client API from each replica, and the archived files in each
manifest); an abort removes the staged files everywhere; an archived-format file is checksummed once
per copy (as it arrives), never read back for it; a wrong checksum, a schema
conflict inside a file and a retried put are answered with their reasons; a master killed
between the files record and the commit leaves a new master that commits it, nothing lost
or doubled."""
from __future__ import annotations

import glob
import json
import os
import signal
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vrepl.client import Client
from vrepl.client_txn import TransactionError
from vrepl.node.local import LocalCluster

pytestmark = pytest.mark.timeout(150)

VG = 1


def parquet(tmp_path, name: str, ts: list[int], **cols) -> str:
    """A user's Parquet file: ts (int64, the vnode's precision) and value columns."""
    path = str(tmp_path / name)
    pq.write_table(pa.table({"ts": pa.array(ts, pa.int64()), **cols}), path)
    return path


@pytest.fixture
def cluster(make_local_cluster):
    # conftest's 3-node vgroup 1 (quorum 2) with these transaction settings
    return lambda **txn: make_local_cluster(txn=txn or None, http={"write_timeout_ms": 5000})


def vg_path(c: LocalCluster, n: int) -> str:
    return os.path.join(c.nodes[n].dir, "data", f"vg{VG}")


def staged(c: LocalCluster, n: int) -> list[str]:
    return sorted(glob.glob(os.path.join(vg_path(c, n), "ingest", "staged", "*", "*")))


def manifest_files(c: LocalCluster, n: int) -> list[dict]:
    with open(os.path.join(vg_path(c, n), "data", "manifest.json")) as fh:
        return json.load(fh)["files"]


def values(c: LocalCluster, n: int, table: str, col: str) -> list[tuple]:
    return [(r["ts"], r.get(col)) for r in c.replica_rows(n, table)]


def test_two_files_and_rows_invisible_until_published_then_everywhere(cluster, tmp_path):
    c = cluster()
    fa = parquet(tmp_path, "a.parquet", [3, 1, 2], x=[3.0, 1.0, 2.0])          # unsorted
    fb = parquet(tmp_path, "b.parquet", list(range(100)), y=list(range(100)))
    with c.client() as cl:
        with cl.transaction(VG, "files-1") as txn:
            got = txn.put_file(fa, table="ta")
            assert got["files"] == 1 and got["rows"] == 3
            with open(fb, "rb") as fh:
                txn.put_file(fh.read(), table="tb")
            txn.put([["tc", 7, {"z": 7}]])
            for n in c.nodes:       # every replica staged both files before acking them
                c.wait_for(f"n{n} staged the files", lambda n=n: len(staged(c, n)) == 2, 15)
                for t in ("ta", "tb", "tc"):
                    assert c.replica_rows(n, t) == []
            shown = txn.show()
            assert shown["state"] == "PREPARE" and shown["files"] == 2
            assert shown["tables"] == ["ta", "tb", "tc"] and shown["rows"] == 104
        v = txn.visible_version
        assert txn.state == "VISIBLE" and v > txn.id
        for n in c.nodes:
            c.wait_for(f"n{n} publishes", lambda n=n: len(c.replica_rows(n, "tb")) == 100, 15)
            assert values(c, n, "ta", "x") == [(1, 1.0), (2, 2.0), (3, 3.0)]
            assert values(c, n, "tb", "y") == [(i, i) for i in range(100)]
            assert [(r["ts"], r["_version"], r["z"]) for r in c.replica_rows(n, "tc")] == [(7, v, 7)]
            ingested = [f for f in manifest_files(c, n) if f.get("ingest_version")]
            assert sorted(f["table"] for f in ingested) == ["ta", "tb"]
            assert {f["ingest_version"] for f in ingested} == {v}
            c.wait_for(f"n{n} removed the staged copies", lambda n=n: staged(c, n) == [], 10)


def test_files_published_while_an_older_transaction_is_open_are_read_at_once(cluster, tmp_path):
    """The flush cannot archive past the begin of an open transaction (docs/transactions.md
    §4), so a later transaction's files wait for it in the staging area. Reads show them
    meanwhile, on every replica, and the commit is answered at once, not after
    write_timeout_ms (5 s here). Found by an audit: the commit used to wait, answer VISIBLE,
    and the rows stayed unreadable until the older transaction finished."""
    c = cluster()
    fa = parquet(tmp_path, "a.parquet", [1, 2, 3], x=[1.0, 2.0, 3.0])
    with c.client() as cl:
        older = cl.transaction(VG, "older").begin()
        older.put([["to", 5, {"o": 1}]])
        t0 = time.monotonic()
        with cl.transaction(VG, "newer") as txn:
            txn.put_file(fa, table="ta")
            txn.put([["tb", 9, {"y": 9}]])
        took = time.monotonic() - t0
        v = txn.visible_version
        assert txn.state == "VISIBLE"
        assert took < 4.0, f"the commit waited {took:.1f} s for the older transaction"
        # Read at once through the client API, from the master, as_of the publish included.
        assert [(r["ts"], r["x"]) for r in cl.read(VG, "ta", 0, 10)["rows"]] == [(1, 1.0), (2, 2.0), (3, 3.0)]
        assert [(r["ts"], r["y"], r["_version"]) for r in cl.read(VG, "tb", 0, 10, as_of=v)["rows"]] == [(9, 9, v)]
        for n in c.nodes:
            c.wait_for(f"n{n} shows the newer load", lambda n=n: len(c.replica_rows(n, "ta")) == 3, 15)
            assert values(c, n, "ta", "x") == [(1, 1.0), (2, 2.0), (3, 3.0)]
            assert values(c, n, "tb", "y") == [(9, 9)]
            assert c.replica_rows(n, "to") == []           # the older one is not published
            # Not archived: held in the staging area behind the older transaction's begin.
            has_manifest = os.path.exists(os.path.join(vg_path(c, n), "data", "manifest.json"))
            assert not has_manifest or not [f for f in manifest_files(c, n) if f.get("ingest_version")]
            assert len(staged(c, n)) == 1
        older.commit()
        for n in c.nodes:
            c.wait_for(f"n{n} archives both", lambda n=n: staged(c, n) == [], 15)
            assert [f["table"] for f in manifest_files(c, n) if f.get("ingest_version")] == ["ta"]
            assert values(c, n, "ta", "x") == [(1, 1.0), (2, 2.0), (3, 3.0)]
            assert values(c, n, "tb", "y") == [(9, 9)]
            assert values(c, n, "to", "o") == [(5, 1)]


def test_abort_removes_staged_files_everywhere_and_refusals(cluster, tmp_path):
    c = cluster()
    f = parquet(tmp_path, "a.parquet", [1, 2], x=[1, 2])
    with c.client() as cl:
        txn = cl.transaction(VG, "files-abort").begin()
        first = txn.put_file(f, table="ta", seq=5)
        again = txn.put_file(f, table="ta", seq=5)          # a retried put: answered
        assert again["duplicate"] is True and again["files"] == first["files"] == 1
        for n in c.nodes:
            c.wait_for(f"n{n} staged", lambda n=n: len(staged(c, n)) == 1, 15)
        m = c.master()
        # A wrong checksum: refused, nothing staged, the transaction stays open.
        code, doc = cl.request(c.nodes[m].http, "POST",
                               f"/v1/vgroups/{VG}/txn/{txn.id}/file?table=ta&seq=6&crc32c=12345",
                               open(f, "rb").read())
        assert code == 400 and doc["code"] == "bad_checksum"
        # A schema conflict inside a file: x is a float column of ta now... as an int64 file
        # it is accepted (int into float); a string x is not.
        bad = parquet(tmp_path, "bad.parquet", [10], x=["text"])
        with pytest.raises(TransactionError) as err:
            txn.put_file(bad, table="ta", seq=7)
        assert err.value.status == 400 and err.value.code == "bad_file" and "'x'" in str(err.value)
        # A file overlapping one already staged for the same table would tie: refused.
        with pytest.raises(TransactionError) as err:
            txn.put_file(parquet(tmp_path, "o.parquet", [2, 3], x=[0, 0]), table="ta", seq=8)
        assert err.value.code == "bad_file" and "overlap" in str(err.value)
        with pytest.raises(TransactionError) as err:
            txn.put_file(b"not parquet at all", table="ta", seq=9)
        assert err.value.code == "bad_file"
        assert txn.show()["state"] == "PREPARE" and txn.show()["files"] == 1
        txn.abort("test")
        assert txn.state == "ABORTED"
        for n in c.nodes:
            c.wait_for(f"n{n} dropped the staged files", lambda n=n: staged(c, n) == [], 15)
            assert c.replica_rows(n, "ta") == []
        with pytest.raises(TransactionError) as err:
            txn.put_file(f, table="ta", seq=10)
        assert err.value.code == "txn_not_open"


def test_staged_file_bytes_limit(cluster, tmp_path):
    c = cluster(max_staged_file_bytes=2000)
    f = parquet(tmp_path, "a.parquet", list(range(200)), x=[float(i) for i in range(200)])
    assert os.path.getsize(f) > 2000
    with c.client() as cl:
        txn = cl.transaction(VG, "files-big").begin()
        with pytest.raises(TransactionError) as err:
            txn.put_file(f, table="ta")
        assert err.value.status == 429 and err.value.code == "too_many_staged_bytes"
        assert "max_staged_file_bytes" in str(err.value)
        txn.abort()


def test_master_killed_between_files_record_and_commit(cluster, tmp_path):
    c = cluster()
    fa = parquet(tmp_path, "a.parquet", list(range(50)), x=[float(i) for i in range(50)])
    with c.client() as cl:
        txn = cl.transaction(VG, "files-failover").begin()
        txn.put_file(fa, table="ta")
        txn.put([["tb", 1, {"y": 1}]])
        for n in c.nodes:
            c.wait_for(f"n{n} staged", lambda n=n: len(staged(c, n)) == 1, 15)
    m = c.master()
    c.kill(m, signal.SIGKILL)
    m2 = c.wait_master(slaves=1, timeout_s=20, exclude=m)
    with Client(c.endpoints, timeout_s=20) as cl:
        again = cl.transaction(VG, "files-failover").begin()     # the label: the same txn
        assert again.id == txn.id and again.state == "PREPARE"
        assert again.put_file(fa, table="ta", seq=0)["duplicate"] is True
        done = again.commit()
    v = done["visible_version"]
    c.start(m)
    c.wait_master(slaves=2, timeout_s=20)
    for n in c.nodes:
        c.wait_for(f"n{n} publishes", lambda n=n: len(c.replica_rows(n, "ta")) == 50, 20)
        assert values(c, n, "ta", "x") == [(i, float(i)) for i in range(50)]
        assert [(r["ts"], r["_version"]) for r in c.replica_rows(n, "tb")] == [(1, v)]
        c.wait_for(f"n{n} cleaned", lambda n=n: staged(c, n) == [], 15)
    assert m2 != m


def test_slave_restarted_between_staging_and_publish_fetches_what_it_lacks(cluster, tmp_path):
    """A slave killed after staging file 1 misses file 2 and the publish; restarted, its WAL
    replay finds file 1 staged, it fetches file 2 from the others (archived there by then)
    before acknowledging, and publishes both with the rows."""
    c = cluster()
    f1 = parquet(tmp_path, "1.parquet", list(range(10)), x=list(range(10)))
    f2 = parquet(tmp_path, "2.parquet", list(range(10)), y=[float(i) for i in range(10)])
    with c.client() as cl:
        txn = cl.transaction(VG, "files-lag").begin()
        txn.put_file(f1, table="ta")
        for n in c.nodes:
            c.wait_for(f"n{n} staged", lambda n=n: len(staged(c, n)) == 1, 15)
        s = next(n for n in c.nodes if n != c.master())
        c.kill(s, signal.SIGKILL)
        kept = staged(c, s)
        txn.put_file(f2, table="tb")
        txn.put([["tc", 1, {"z": 1}]])
        v = txn.commit()["visible_version"]
    assert staged(c, s) == kept         # the killed slave has file 1 only
    c.start(s)
    c.wait_master(slaves=2, timeout_s=20)
    c.wait_for(f"n{s} publishes", lambda: len(c.replica_rows(s, "tb")) == 10, 30)
    assert values(c, s, "ta", "x") == [(i, i) for i in range(10)]
    assert values(c, s, "tb", "y") == [(i, float(i)) for i in range(10)]
    assert [(r["ts"], r["_version"]) for r in c.replica_rows(s, "tc")] == [(1, v)]
    c.wait_for(f"n{s} cleaned", lambda: staged(c, s) == [], 15)


def test_an_archived_format_file_is_staged_as_it_is_and_all_nodes_restart_before_commit(
        cluster, tmp_path):
    """A file with _version and _epoch is an archived file (docs/vnode.md §9.1): staged byte
    for byte, its rows keep their _version. Every node restarted between the files record
    and the commit: the staged files survive (found by WAL replay) and the commit publishes."""
    c = cluster()
    path = str(tmp_path / "arch.parquet")
    pq.write_table(pa.table({"ts": pa.array([5, 6, 7], pa.timestamp("ms")),
                             "_version": pa.array([41, 42, 43], pa.int64()),
                             "_epoch": pa.array([1, 1, 1], pa.int64()),
                             "x": pa.array([0.5, 0.6, 0.7])}), path)
    size = os.path.getsize(path)
    with c.client() as cl:
        txn = cl.transaction(VG, "files-arch").begin()
        assert txn.put_file(path, table="ta", origin="dc1/vg9")["file_bytes"] == size
        for n in c.nodes:
            c.wait_for(f"n{n} staged", lambda n=n: len(staged(c, n)) == 1, 15)
            assert [os.path.getsize(f) for f in staged(c, n)] == [size]
        # One CRC-32C pass per copy (docs/operations.md §Metrics): the master's as the
        # upload arrived, each slave's as its fetch arrived; no node read the file back.
        for n in c.nodes:
            assert c.metric(n, "vrepl_ingest_checksum_bytes_total", vgroup=str(VG),
                            how="received") == size
            assert c.metric(n, "vrepl_ingest_checksum_bytes_total", vgroup=str(VG),
                            how="reread") == 0
    c.stop_all(signal.SIGKILL)
    c.start()
    c.wait_ready()
    c.wait_master(slaves=2, timeout_s=30)
    with Client(c.endpoints, timeout_s=20) as cl:
        again = cl.transaction(VG, "files-arch").begin()
        assert again.id == txn.id and again.state == "PREPARE"
        v = again.commit()["visible_version"]
    for n in c.nodes:
        c.wait_for(f"n{n} publishes", lambda n=n: len(c.replica_rows(n, "ta")) == 3, 20)
        assert [(r["ts"], r["_version"], r["x"]) for r in c.replica_rows(n, "ta")] == [
            (5, 41, 0.5), (6, 42, 0.6), (7, 43, 0.7)]
        (f,) = [f for f in manifest_files(c, n) if f.get("ingest_version")]
        assert (f["ingest_version"], f["origin"], f["size"]) == (v, "dc1/vg9", size)
