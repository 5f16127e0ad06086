"""Fixtures for multi-process tests on 127.0.0.1: every cluster a test starts is killed at
the end of the test, pass or fail (ProcessCluster.close, LocalCluster.close), and every node
process also exits by itself when its stdin closes, its parent dies, or its lifetime_s passes.

`make_cluster`: ProcessCluster (the test harness's node body); `make_local_cluster`: three
shipped `vrepl node` processes of vgroup 1, quorum 2 (LocalCluster), returned once one master
has two slaves."""

from __future__ import annotations

import pytest

from vrepl.node.local import LocalCluster
from vrepl.testing.cluster import ProcessCluster


@pytest.fixture
def make_cluster(tmp_path):
    clusters: list[ProcessCluster] = []

    def make(n: int = 3, **kw) -> ProcessCluster:
        c = ProcessCluster(str(tmp_path / f"c{len(clusters)}"), n, lifetime_s=90, **kw)
        clusters.append(c)
        c.start()
        return c

    yield make
    for c in clusters:
        c.close()


@pytest.fixture
def make_local_cluster(tmp_path):
    made: list[LocalCluster] = []

    def make(**kw) -> LocalCluster:
        c = LocalCluster(str(tmp_path / f"c{len(made)}"), 3, vgroup=1, quorum=2, **kw)
        made.append(c)
        c.start()
        c.wait_ready()
        c.wait_master(slaves=2)
        return c

    yield make
    for c in made:
        c.close()
