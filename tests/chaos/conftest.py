"""Chaos tests (docs/reliability.md): real node processes in network namespaces (root) or on
127.0.0.1 (fallback), a nemesis, and a checker. Before the session, anything left by chaos
runs whose owner died is removed (tools/chaos_cleanup.py); after each test, the test's own
namespaces and mounts must be gone."""

from __future__ import annotations

import os

import pytest

from vrepl.testing.chaos import netns


@pytest.fixture(scope="session", autouse=True)
def _remove_stale_runs():
    if os.geteuid() == 0:
        netns.cleanup(stale_only=True)
    yield


@pytest.fixture
def no_leftovers():
    yield
    if os.geteuid() == 0:
        mine = f"{netns.PREFIX}{os.getpid()}-"
        left = netns.leftovers(stale_only=False)
        ours = [x for kind in left.values() for x in kind if mine in x]
        assert not ours, f"the test left these behind: {ours}"
