"""Answers that tell the truth (issue 13 Deliver 6, docs/client-api.md), with 3 real
`vrepl node` processes (quorum 2) on 127.0.0.1: a master that steps down names its role and
master after the step-down; a retried write answered as a duplicate carries its record's
own epoch, once the group committed it (a new master commits what it inherited with its
no-op, without waiting for a client's write); a read says whether the table exists, and
the table list says what a replica holds."""
from __future__ import annotations

import json
import os
import signal

import pytest

from vrepl.client import Client
from vrepl.vnode.rows import NOOP_PAYLOAD
from vrepl.wal import read_records

pytestmark = pytest.mark.timeout(90)

VG = 1


def test_a_master_stepping_down_answers_with_its_role_after_the_step_down(make_local_cluster):
    # The forward timeout (10 s) is longer than the heartbeat timeout (2 s): the write's
    # outcome comes from the step-down (FAILED), not from a timeout.
    c = make_local_cluster(sync={"forward_timeout_ticks": 100}, http={"write_timeout_ms": 15000})
    m = c.master()
    slaves = [n for n in c.nodes if n != m]
    ep = c.nodes[m].http
    body = json.dumps([["t_down", 1, {"x": 1}]]).encode()
    with Client([ep], request_timeout_s=20) as cl:
        for s in slaves:
            c.nodes[s].proc.send_signal(signal.SIGSTOP)
        try:
            code, doc = cl.request(ep, "POST", f"/v1/vgroups/{VG}/write?request_id=rid-down", body)
        finally:
            for s in slaves:
                c.nodes[s].proc.send_signal(signal.SIGCONT)
    assert code == 503 and doc["code"] == "not_confirmed" and doc["outcome"] == "unknown", doc
    assert "this node is now master" not in doc["error"], doc
    assert "this node is now unsynced" in doc["error"], doc
    assert doc["master"] != m and doc["master_http"] != ep, doc


def test_a_retried_write_carries_its_records_epoch_once_committed(make_local_cluster):
    c = make_local_cluster()
    with c.client(timeout_s=20) as cl:
        first = cl.write(VG, [["t_dup", 1, {"x": 1}]], request_id="rid-epoch")
        old = c.master()
        c.kill(old, signal.SIGKILL)
        new = c.wait_master(slaves=1, exclude=old)
        new_epoch = c.vgroup_status(new)["epoch"]
        assert new_epoch > first.epoch
        # No client write since the failover: only the new master's no-op can commit the
        # inherited record, and the retry waits for exactly that.
        again = cl.write(VG, [["t_dup", 1, {"x": 1}]], request_id="rid-epoch")
    assert again.duplicate and again.version == first.version
    assert again.epoch == first.epoch != new_epoch
    # The new master's first record is a no-op of its own epoch (docs/vnode.md §2), and
    # the group committed its whole log with it.
    st = c.wait_for("the new master's log committed", lambda: (
        lambda s: s["committed_version"] == s["wal_last_version"] and s)(c.vgroup_status(new)), 10)
    recs = read_records(os.path.join(c.nodes[new].dir, "data", f"vg{VG}", "wal"),
                        first.version + 1)
    # (One no-op per time it became master: one, unless the election churned.)
    assert recs and all(r.payload == NOOP_PAYLOAD and r.epoch > first.epoch for r in recs)
    assert recs[-1].epoch == st["epoch"] and recs[-1].version == st["wal_last_version"]
    assert st["counters"]["writes_duplicate"] == 1 and st["counters"]["writes_ok"] == 0
    assert c.replica_rows(new, "t_dup") == [
        {"ts": 1, "_version": first.version, "_epoch": first.epoch, "x": 1}]


def test_tables_and_whether_a_read_table_exists(make_local_cluster):
    c = make_local_cluster()
    with c.client() as cl:
        r = cl.write(VG, [["t_b", 2, {"x": 1, "s": "a"}], ["t_a", 1, {"y": 0.5}]])
        cl.write(VG, [["t_b", 3, {"x": 2}]])
        c.wait_for("every replica at the same version", lambda: all(
            c.vgroup_status(n)["version"] >= r.version + 1 for n in c.nodes), 15)
        for n in c.nodes:
            ep = c.nodes[n].http
            doc = cl.tables(VG, node=ep)
            assert doc["vgroup"] == VG and doc["node"] == n
            assert doc["tables"] == [
                {"name": "t_a", "columns": {"y": "float"}, "archived_rows": 0, "memtable_rows": 1},
                {"name": "t_b", "columns": {"x": "int", "s": "str"}, "archived_rows": 0,
                 "memtable_rows": 2}]
            got = cl.read(VG, "t_b", node=ep)
            assert got["exists"] is True and len(got["rows"]) == 2
            empty = cl.read(VG, "t_b", start=100, end=200, node=ep)
            assert empty["exists"] is True and empty["rows"] == []
            missing = cl.read(VG, "no_such_table", node=ep)
            assert missing["exists"] is False and missing["rows"] == []
        code, doc = cl.request(c.nodes[1].http, "POST", f"/v1/vgroups/{VG}/tables", b"")
        assert code == 405 and doc["code"] == "bad_method"
        code, doc = cl.request(c.nodes[1].http, "GET", "/v1/vgroups/77/tables")
        assert code == 404 and doc["code"] == "no_vgroup"
