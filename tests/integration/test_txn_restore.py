"""Labels across a restore from files (docs/transactions.md §4, docs/restore.md §3), with three
real `vrepl node` processes on 127.0.0.1: a replica whose data directory is wiped while the
master flushes and recycles its WAL past a transaction's records is restored from the
master's files; the labels file travels in the files phase with the manifest, so the
restored replica answers the label, and once it is the master a retried begin with that
label answers the original transaction (`duplicate: true`) and nothing is loaded twice."""
from __future__ import annotations

import json
import shutil
import signal

import pytest

from vrepl.client import Client
from vrepl.node.local import LocalCluster

pytestmark = pytest.mark.timeout(180)

VG = 1
LABEL = "restored-label"


def call(c: LocalCluster, node: int, method: str, path: str, body: bytes | None = None):
    cl = Client([c.nodes[node].http])
    try:
        return cl.request(c.nodes[node].http, method, f"/v1/vgroups/{VG}/{path}", body)
    finally:
        cl.close()


def test_restored_replica_made_master_answers_a_retried_label(tmp_path):
    c = LocalCluster(str(tmp_path / "c"), 3, vgroup=VG, vnode={"max_memtable_rows": 200},
                     sync={"max_wal_file_bytes": 32768}, http={"write_timeout_ms": 3000})
    try:
        c.start()
        c.wait_ready()
        m = c.wait_master(slaves=2)
        with c.client() as cl:
            with cl.transaction(VG, LABEL) as txn:
                txn.put([["loaded", 1, {"x": 1.0}], ["loaded", 2, {"x": 2.0}]])
            v = txn.visible_version
        wiped = next(n for n in c.nodes if n != m)
        c.kill(wiped, signal.SIGKILL)
        shutil.rmtree(f"{c.nodes[wiped].dir}/data")
        # Enough writes for flushes past the transaction and the WAL recycled below it, so
        # the wiped replica can only be restored from files.
        with c.client() as cl:
            for i in range(60):
                cl.write(VG, [["other", i * 100 + k, {"x": k}] for k in range(100)])
        c.wait_for("the master flushed past the transaction",
                   lambda: c.vgroup_status(m)["vnode"]["archived_version"] > v + 20, 20)
        with open(f"{c.nodes[m].dir}/data/vg{VG}/data/txn_labels.json") as fh:
            assert [d["label"] for d in json.load(fh)["txns"]] == [LABEL]
        c.start(wiped)
        c.wait_master(slaves=2, timeout_s=30)
        c.wait_for("the wiped replica caught up", lambda: (
            c.vgroup_status(wiped) or {}).get("version") == c.vgroup_status(m)["version"], 30)
        # It was restored from files: its log starts above the transaction's records.
        st = c.vgroup_status(wiped)
        assert st["vnode"]["archived_version"] > v and st["vnode"]["files"] > 0
        code, shown = call(c, wiped, "GET", f"txn/label:{LABEL}")
        assert code == 200 and shown["state"] == "VISIBLE" and shown["visible_version"] == v

        # Make the restored replica the master: kill whoever else is master until it is.
        for _ in range(6):
            cur = c.master()
            if cur == wiped:
                break
            c.kill(cur, signal.SIGKILL)
            new = c.wait_master(slaves=1, timeout_s=30, exclude=cur)
            c.start(cur)
            c.wait_master(slaves=2, timeout_s=30)
            if new == wiped:
                break
        assert c.master() == wiped
        body = json.dumps({"label": LABEL}).encode()
        code, doc = call(c, wiped, "POST", "txn", body)
        assert code == 200 and doc["duplicate"] is True
        assert doc["state"] == "VISIBLE" and doc["visible_version"] == v
        with c.client() as cl:
            again = cl.transaction(VG, LABEL).begin()
            assert again.already_done and again.visible_version == v
        for n in c.nodes:
            got = [(r["ts"], r["_version"]) for r in c.replica_rows(n, "loaded")]
            assert got == [(1, v), (2, v)]
    finally:
        c.close()
