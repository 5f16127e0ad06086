"""The fault schedules (vrepl/testing/chaos/schedules.py), one test each, named after the
failure it prevents. Each builds its own cluster of shipped `vrepl node` processes, runs the
workload under the fault, heals, converges and checks, reading every table from every
replica through the client API: every acknowledged write on every replica at the version it
was confirmed at, no phantom, altered or duplicated row, replicas identical row for row,
identical WALs, at most one master per epoch.

As root they run in network namespaces (required: no silent fallback); otherwise on
127.0.0.1, and the schedules that need partitions, packet loss or tmpfs are skipped, named.
VREPL_CHAOS_LONG=1 runs the long versions. Reproduce one: python -m vrepl.testing.chaos NAME.
"""

from __future__ import annotations

import json
import os

import pytest

from vrepl.testing.chaos.netns import NemesisUnsupported
from vrepl.testing.chaos.schedules import SCHEDULES

LONG = os.environ.get("VREPL_CHAOS_LONG") == "1"
pytestmark = pytest.mark.timeout(600 if LONG else 90)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedule(name, tmp_path, no_leftovers):
    try:
        res = SCHEDULES[name](str(tmp_path), long=LONG)
    except NemesisUnsupported as exc:
        pytest.skip(f"{name}: {exc}")
    summary = res.summary()
    print(json.dumps({"schedule": name, **summary}))
    assert res.verdict.ok > 0, f"no write was confirmed: {summary}"
    assert not res.masters_in_one_epoch, f"two masters in one epoch: {res.masters_in_one_epoch}"
    assert res.verdict.safe, f"{res.verdict.problems()} (logs: {res.dir})"
