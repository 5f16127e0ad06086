"""The harness itself: the checker's verdicts on hand-made histories and logs, and the
topology's promise to leave nothing behind."""

from __future__ import annotations

import os
import subprocess

import pytest

from vrepl.testing.chaos import netns
from vrepl.testing.chaos.check import check
from vrepl.testing.chaos.node import payload_of

pytestmark = pytest.mark.timeout(60)


def _log(*keys, epoch=1):
    return [(epoch, v, payload_of(k)) for v, k in enumerate(keys, 1)]


def ok(key, version):
    return {"key": key, "status": "ok", "version": version}


def test_clean_run_is_safe():
    hist = [ok("a", 1), ok("b", 2), {"key": "c", "status": "unknown"}, {"key": "d", "status": "fail"}]
    v = check(hist, {1: _log("a", "b", "c"), 2: _log("a", "b", "c")})
    assert v.safe and v.ok == 2 and v.unknown_present == 1, v.problems()


def test_lost_confirmed_write_is_reported():
    v = check([ok("a", 1), ok("b", 2)], {1: _log("a", "b"), 2: _log("a")})
    assert v.lost == ["n2 b v2"] and v.diverged


def test_quorum_one_loss_is_counted_not_failed():
    v = check([ok("a", 1), ok("b", 2)], {1: _log("a"), 2: _log("a")}, allow_loss=True)
    assert v.safe and v.lost_allowed == ["b"]


def test_phantom_duplicate_moved_and_gap():
    hist = [ok("a", 1), ok("b", 2), {"key": "n", "status": "fail", "detail": "NM"}]
    v = check(hist, {1: _log("a", "a", "b", "n", "x")})
    assert v.duplicated and v.moved and any("never sent" in p for p in v.phantom)
    assert any("fail" in p for p in v.phantom)
    v = check([ok("a", 1)], {1: [(1, 1, payload_of("a")), (1, 3, payload_of("z"))]})
    assert v.gaps == ["n1"]


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
