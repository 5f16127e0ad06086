"""A vgroup whose archived files hold versions its log no longer has (issue 13 Deliver 2,
docs/operations.md §A vgroup that needs a restore), with 3 real `vrepl node` processes
(quorum 2) on 127.0.0.1: it must not serve, vote or be elected on that data; it reports
`needs_restore`, restores itself from the master, rejoins as a slave and then holds exactly
the master's rows for every table.

"Older data on disk" is crafted the way the bug made it: a stopped replica gets records at
an old epoch appended to its WAL and flushed into its archive with the flush-everything
rule (`Vnode.flush()` without a limit, as `vrepl replay` does), so that the group, whose log
has other records at those versions, truncates it below its archive when it rejoins. The
start-up check is crafted directly: a WAL that ends below the archived version."""
from __future__ import annotations

import os
import signal
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vrepl.client import Client
from vrepl.node.local import LocalCluster
from vrepl.vnode import Vnode, VnodeConfig
from vrepl.vnode.rows import encode_rows
from vrepl.wal import WalOptions, WalWriter, inspect

pytestmark = pytest.mark.timeout(150)

VG = 1
GHOST = "ghost_table"


def rows(table: str, ts0: int, n: int, tag: str) -> list:
    return [[table, ts0 + i, {"n": i, "tag": tag}] for i in range(n)]


def vg_path(c: LocalCluster, node: int) -> str:
    return os.path.join(c.nodes[node].dir, "data", f"vg{VG}")


def write_old_records_and_archive_them(path: str, count: int, truncate_wal: bool) -> int:
    """Append `count` records at the WAL's own last epoch (older than the group's) holding
    rows the group never had, archive everything (the old flush rule), and with
    `truncate_wal` cut the WAL back to where it was. Returns the archived version."""
    wal_dir = os.path.join(path, "wal")
    state = inspect(wal_dir)
    w = WalWriter(wal_dir, WalOptions(durability="fsync"))
    for i in range(count):
        w.append(encode_rows(rows("t1", i, 5, "WRONG") + rows(GHOST, i, 1, "WRONG")),
                 state.last_epoch)
    v = Vnode(path, VnodeConfig())
    v.recover()
    v.flush()                       # everything applied, committed or not: the old rule
    archived = v.archived_version
    v.close(up_to_version=0)
    if truncate_wal:
        w.truncate_after(state.last_version)
    w.close()
    assert archived == state.last_version + count
    return archived


def table_names(c: LocalCluster, node: int) -> list[str]:
    with Client([c.nodes[node].http]) as cl:
        return [t["name"] for t in cl.tables(VG, node=c.nodes[node].http)["tables"]]


def assert_same_rows_as_master(c: LocalCluster, node: int) -> None:
    m = c.wait_master(slaves=2)
    c.wait_for(f"n{node} at the master's version", lambda: (
        c.vgroup_status(node)["version"] == c.vgroup_status(m)["version"]), 20)
    names = table_names(c, m)
    assert GHOST not in names and table_names(c, node) == names
    for t in names:
        assert c.replica_rows(node, t) == c.replica_rows(m, t), t


def self_restored(c: LocalCluster, node: int, count: int):
    def check():
        vs = c.vgroup_status(node)
        return (vs is not None and vs["state"] == "serving" and vs["role"] == "slave"
                and vs["counters"]["self_restores"] == count and vs)
    return check


def test_truncated_below_its_archive_the_node_restores_itself_and_rejoins(tmp_path):
    c = LocalCluster(str(tmp_path / "c"), 3, vgroup=VG, quorum=2)
    try:
        c.start()
        c.wait_ready()
        m = c.wait_master(slaves=2)
        with c.client() as cl:
            for i in range(5):
                cl.write(VG, rows("t1", i * 100, 50, "a") + rows("t2", i * 100, 10, "a"))
        c.wait_for("every replica at the same version", lambda: len(
            {c.vgroup_status(n)["version"] for n in c.nodes}) == 1, 15)
        x = next(n for n in c.nodes if n != m)
        assert c.kill(x, signal.SIGTERM) == 0
        # A new epoch without x: kill the master, restart it, the two left elect.
        c.kill(m, signal.SIGKILL)
        c.start(m)
        c.wait_ready(m)
        c.wait_for("a master without x", lambda: sum(
            1 for n, r in c.roles().items() if r == "master" and n != x) == 1, 20)
        with c.client(timeout_s=20) as cl:
            for i in range(5):
                cl.write(VG, rows("t1", 10_000 + i * 100, 50, "b") + rows("t3", i, 3, "b"))
        archived = write_old_records_and_archive_them(vg_path(c, x), 4, truncate_wal=False)

        c.start(x)
        c.wait_ready(x)
        vs = c.wait_for("x restored itself and is a slave", self_restored(c, x, 1), 60)
        assert vs["needs_restore"] is None
        last = vs["last_self_restore"]
        assert "below the archived version v%d" % archived in last["reason"]
        assert last["attempts"] >= 1 and last["took_ms"] >= 0
        with open(os.path.join(c.nodes[x].dir, "node.log")) as fh:
            text = fh.read()
        assert "CRITICAL" in text and "needs a restore" in text
        assert_same_rows_as_master(c, x)
        # The wrong rows are gone from x for good: a restart keeps the restored data.
        assert c.kill(x, signal.SIGTERM) == 0
        c.start(x)
        c.wait_ready(x)
        c.wait_for("x a slave again", lambda: c.roles()[x] == "slave", 20)
        assert c.vgroup_status(x)["state"] == "serving"
        assert_same_rows_as_master(c, x)
    finally:
        c.close()


def test_a_wal_ending_below_the_archive_starts_in_needs_restore_and_serves_nothing(tmp_path):
    c = LocalCluster(str(tmp_path / "c"), 3, vgroup=VG, quorum=2)
    try:
        c.start()
        c.wait_ready()
        m = c.wait_master(slaves=2)
        with c.client() as cl:
            for i in range(3):
                cl.write(VG, rows("t1", i * 100, 20, "a"))
        c.wait_for("every replica at the same version", lambda: len(
            {c.vgroup_status(n)["version"] for n in c.nodes}) == 1, 15)
        x = next(n for n in c.nodes if n != m)
        others = [n for n in c.nodes if n != x]
        c.stop_all(signal.SIGTERM)
        write_old_records_and_archive_them(vg_path(c, x), 3, truncate_wal=True)

        c.start(x)          # alone: no master to restore from yet
        c.wait_ready(x)
        vs = c.vgroup_status(x)
        assert vs["state"] == "needs_restore" and vs["role"] == "unsynced"
        assert vs["master"] is None
        nr = vs["needs_restore"]
        assert nr["reason"].startswith("at start-up: the WAL ends at v") and nr["since"] > 0
        ep = c.nodes[x].http
        with Client([ep]) as cl:
            for path in (f"/v1/vgroups/{VG}/rows?table=t1", f"/v1/vgroups/{VG}/rows?table={GHOST}",
                         f"/v1/vgroups/{VG}/tables"):
                code, doc = cl.request(ep, "GET", path)
                assert code == 503 and doc["code"] == "needs_restore", (path, doc)
                assert "\n" not in doc["error"] and "WRONG" not in str(doc)
            code, doc = cl.request(ep, "POST", f"/v1/vgroups/{VG}/write",
                                   b'[["t1", 5, {"n": 1}]]')
            assert code == 503 and doc["code"] == "needs_restore"
            assert doc["outcome"] == "not_written"
        c.wait_for("x keeps trying", lambda: c.vgroup_status(x)["needs_restore"]["attempts"] >= 2
                   and c.vgroup_status(x)["needs_restore"]["last_error"], 20)
        assert c.metric(x, "vrepl_needs_restore", vgroup=str(VG)) == 1
        assert c.metric(x, "vrepl_self_restores_total", vgroup=str(VG), result="failed") >= 1
        for n in others:
            c.start(n)
        c.wait_ready()
        c.wait_for("x restored itself and is a slave", self_restored(c, x, 1), 60)
        assert c.metric(x, "vrepl_needs_restore", vgroup=str(VG)) == 0
        assert c.metric(x, "vrepl_self_restores_total", vgroup=str(VG), result="ok") == 1
        assert_same_rows_as_master(c, x)
        with c.client() as cl:              # and it takes part again
            cl.write(VG, rows("t1", 5000, 10, "c"))
        assert_same_rows_as_master(c, x)
    finally:
        c.close()
