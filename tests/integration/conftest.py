"""Fixtures for multi-process tests on 127.0.0.1: every cluster a test starts is killed at
the end of the test, pass or fail (ProcessCluster.close), and every node process also exits
by itself when its stdin closes, its parent dies, or its lifetime_s passes."""

from __future__ import annotations

import pytest

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
