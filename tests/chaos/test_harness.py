"""The harness itself: the checker's verdicts on hand-made histories and logs, and the
topology's promise to leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from vrepl.testing.chaos import netns
from vrepl.testing.chaos.check import check
from vrepl.testing.chaos.harness import ChaosCluster, NodeProc
from vrepl.vnode.rows import encode_payload

pytestmark = pytest.mark.timeout(60)

TABLE = "t"


def write(key, version=None, epoch=1, status="ok", ts=None, **extra):
    """A history entry: key k<n> writes ts n of table t."""
    ts = ts if ts is not None else int(key[1:])
    op = {"key": key, "table": TABLE, "ts": ts, "values": {"k": key}, "status": status, **extra}
    if status == "ok":
        op.update(version=version, epoch=epoch)
    return op


def row(key, version, epoch=1, ts=None, **values):
    return {"ts": ts if ts is not None else int(key[1:]), "_version": version, "_epoch": epoch,
            "k": key, **values}


def replica(*rows):
    return {TABLE: sorted(rows, key=lambda r: r["ts"])}


def record(key, version, epoch=1):
    body = json.dumps([[TABLE, int(key[1:]), {"k": key}]]).encode()
    return (epoch, version, encode_payload(body, key))


def test_clean_run_is_safe():
    hist = [write("k1", 1), write("k2", 2), write("k3", status="unknown"), write("k4", status="fail")]
    rows = {n: replica(row("k1", 1), row("k2", 2), row("k3", 3)) for n in (1, 2)}
    logs = {n: [record("k1", 1), record("k2", 2), record("k3", 3)] for n in (1, 2)}
    v = check(hist, rows, logs)
    assert v.safe and v.ok == 2 and v.unknown_present == 1 and v.rows == 3 and v.records == 3, v.problems()


def test_acknowledged_write_missing_on_one_replica_is_lost_and_diverged():
    # Issue 13: the WAL of n2 is identical, but its rows lack v2 (it serves its own discarded row).
    hist = [write("k1", 1), write("k2", 2, epoch=2)]
    v = check(hist, {1: replica(row("k1", 1), row("k2", 2, 2)), 2: replica(row("k1", 1))},
              {n: [record("k1", 1), record("k2", 2, 2)] for n in (1, 2)})
    assert v.lost == ["n2 k2 v2 e2 (t ts 2)"] and v.diverged and not v.gaps, v.problems()


def test_row_at_another_version_or_epoch_is_moved():
    hist = [write("k1", 1), write("k2", 2, epoch=2)]
    v = check(hist, {1: replica(row("k1", 1), row("k2", 3, 2))})
    assert v.moved == ["n1 k2 confirmed v2 e2, row holds v3 e2"], v.problems()
    v = check(hist, {1: replica(row("k1", 1), row("k2", 2, 1))})
    assert v.moved == ["n1 k2 confirmed v2 e2, row holds v2 e1"], v.problems()
    # A duplicate answer must give the record's own epoch too.
    v = check([write("k1", 1, epoch=3, duplicate=True)], {1: replica(row("k1", 1, 1))})
    assert v.moved == ["n1 k1 confirmed v1 e3, row holds v1 e1"], v.problems()


def test_phantom_altered_duplicated_and_unreadable():
    hist = [write("k1", 1), write("k2", status="fail", detail="409"), write("k3", 3)]
    rows = {1: replica(row("k1", 1), row("k2", 2), row("k3", 3, x=5), row("k9", 4)),
            2: {"error": "ConnectionRefusedError"}}
    v = check(hist, rows)
    assert any("k2" in p and "fail" in p for p in v.phantom), v.phantom
    assert any("k9" in p and "never sent" in p for p in v.phantom), v.phantom
    assert len(v.altered) == 1 and "k3" in v.altered[0], v.altered
    assert v.unreadable == ["n2: ConnectionRefusedError"] and v.replicas_read == 1
    v = check([write("k1", 1)], {1: replica(row("k1", 1), row("k1", 1, ts=7))})
    assert v.duplicated and not v.lost, v.problems()


def test_write_applied_twice_shows_in_the_wal():
    # The retry overwrote the same ts, so the rows look fine; the log has the key twice.
    hist = [write("k1", 2, duplicate=False)]
    v = check(hist, {1: replica(row("k1", 2))}, {1: [record("k1", 1), record("k1", 2)]})
    assert v.duplicated == ["n1 k1 WAL: at v1 and v2 (applied twice)"], v.problems()


def test_wal_gaps_divergence_and_recycled_start():
    hist = [write("k3", 3), write("k4", 4)]
    rows = {n: replica(row("k3", 3), row("k4", 4)) for n in (1, 2)}
    # Logs recycled below v3 are fine; a hole is not; a different record is divergence.
    assert check(hist, rows, {n: [record("k3", 3), record("k4", 4)] for n in (1, 2)}).safe
    v = check(hist, rows, {1: [record("k3", 3), record("k4", 5)], 2: [record("k3", 3), record("k4", 4)]})
    assert v.gaps == ["n1 WAL: versions 3..5 not contiguous (2 records)"] and v.moved and v.diverged
    v = check(hist, rows, {1: [record("k3", 3), record("k4", 4)], 2: [record("k3", 3), record("k4", 4, 2)]})
    assert v.diverged and not v.gaps, v.problems()


def test_quorum_one_loss_is_counted_not_failed():
    hist = [write("k1", 1), write("k2", 2)]
    v = check(hist, {n: replica(row("k1", 1)) for n in (1, 2)}, allow_loss=True)
    assert v.safe and v.lost_allowed == ["k2"], v.problems()


def test_node_role_history_from_its_log_across_restarts(tmp_path):
    log = tmp_path / "node.log"
    p = NodeProc("n2", ["true"], str(tmp_path / "stderr.log"), stdin=False, log_path=str(log))
    log.write_text("08:51:08.954 INFO vrepl.node vg7 n2: role slave, epoch 1, master 1\n"
                   "08:51:12.955 INFO vrepl.node vg7 n2: role master, epoch 2, master 2\n")
    assert p.role() == "master"
    p.started_at_event = len(p.role_events)      # as start() does: a restarted process
    assert p.role() is None
    with open(log, "a") as fh:                   # the sync layer's form of the line; a partial line
        fh.write("2026-03-01T12:34:56.789+01:00 INFO vrepl.sync vg7 n2 e3: role unsynced -> slave,"
                 " epoch 3, master n1 (12 ms as unsynced)\n08:51:13 INFO vrepl.node vg7 n2: role ma")
    assert p.role() == "slave"
    assert [(e["role"], e["epoch"], e["master"]) for e in p.role_events] == [
        ("slave", 1, 1), ("master", 2, 2), ("slave", 3, 1)]


needs_root = pytest.mark.skipif(netns.namespaces_available() is not None,
                                reason=f"namespaces: {netns.namespaces_available()}")


def _present(run: str) -> list[str]:
    left = netns.leftovers(stale_only=False, run=run)
    return left["netns"] + left["mounts"]


@needs_root
def test_topology_close_removes_namespaces_and_mounts(tmp_path):
    topo = netns.Topology.create(str(tmp_path), 2, True, namespaced=True)
    topo.mount_tmpfs(os.path.join(topo.base_dir, "n1", "data"), 512)
    topo.cut("n1", "n2")
    assert "drop" in topo.rules()
    assert len(_present(topo.run)) == 6  # br, n1, n2, cl, arb + the mount
    # Nothing in the root namespace carries the chaos subnet.
    root = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
    assert netns.SUBNET not in root
    topo.close()
    assert _present(topo.run) == []


@needs_root
def test_cleanup_removes_a_run_whose_owner_forgot(tmp_path):
    topo = netns.Topology.create(str(tmp_path), 1, False, namespaced=True)
    netns._REGISTRY.remove(topo)  # as if the owner died before closing
    topo.mount_tmpfs(os.path.join(topo.base_dir, "n1", "data"), 256)
    sleeper = subprocess.Popen([*topo.exec_prefix("n1"), "sleep", "60"])
    try:
        assert netns.leftovers(stale_only=True, run=topo.run) == {"netns": [], "mounts": []}  # owner alive
        netns.cleanup(stale_only=False, run=topo.run)
        assert _present(topo.run) == []
        assert sleeper.wait(5) == -9
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        netns.cleanup(stale_only=False, run=topo.run)


def test_a_node_that_cannot_start_is_named_and_the_run_is_removed(tmp_path, no_leftovers):
    # `vrepl node` refuses the config (exit 2, one line); the harness says so and leaves
    # no process, namespace or mount behind.
    c = ChaosCluster(str(tmp_path), vnode={"max_memtable_rows": 0})
    with pytest.raises(RuntimeError, match=r"n1 did not start \(exit 2\): .*max_memtable_rows"):
        c.start()
    assert not any(p.alive() for p in c.nodes.values()) and not c.workload.alive()
    assert _present(c.run) == []
