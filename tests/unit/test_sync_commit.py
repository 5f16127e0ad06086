"""The commit index through the embedding API (docs/embedding.md §Commit index): the
notify_commit callback, SyncInstance.committed_version and stats()["committed_version"], with
three real instances on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import time

import pytest

from vrepl.replica import ConfirmStatus
from vrepl.sync import SyncCallbacks

# The group helpers of the embedding API's main tests (same directory, imported by name).
from test_sync import App as SyncApp  # noqa: E402
from test_sync import make_group, start, stop_all, wait_master  # noqa: E402

pytestmark = pytest.mark.timeout(30)


class App(SyncApp):
    """test_sync's app (applies forwarded records, acks at once) that also records every
    commit notification with what it had applied at that moment."""

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[tuple[int, int]] = []  # (committed version, highest applied then)

    def callbacks(self) -> SyncCallbacks:
        return dataclasses.replace(super().callbacks(), notify_commit=self.notify_commit)

    def confirm_forward(self, version: int, status: ConfirmStatus) -> None:
        if status == ConfirmStatus.OK:
            self.applied.setdefault(version, b"")  # a master applies at confirmation
        super().confirm_forward(version, status)

    def notify_commit(self, version: int) -> None:
        with self.cond:
            self.commits.append((version, max(self.applied, default=0)))
            self.cond.notify_all()

    def wait_commit(self, version: int, timeout_s: float = 10) -> None:
        with self.cond:
            ok = self.cond.wait_for(lambda: self.commits and self.commits[-1][0] >= version, timeout_s)
            assert ok, f"no commit of v{version}: {self.commits[-3:]}"


def test_commit_is_notified_on_master_and_slaves_and_never_goes_back(tmp_path):
    cfgs = make_group(tmp_path)
    apps, insts = start(cfgs, range(3), App)
    try:
        m = wait_master(insts)
        assert all(x.committed_version == 0 for x in insts.values())
        for v in range(1, 201):
            insts[m].forward(v, b"rec%d" % v)
        for i in insts:
            apps[i].wait_commit(200)  # slaves learn it from the master's Commit on a tick
        for i, x in insts.items():
            assert x.committed_version == 200
            assert x.stats()["committed_version"] == 200
            versions = [c for c, _ in apps[i].commits]
            assert versions == sorted(set(versions)), "notified once per increase, in order"
            # Every notified version was applied first (it may be archived at once).
            assert all(c <= applied for c, applied in apps[i].commits)
        # The master stops: a new one keeps committing from where the group was.
        insts[m].stop()
        rest = {i: x for i, x in insts.items() if i != m}
        m2 = wait_master(rest)
        assert all(x.committed_version == 200 for x in rest.values())
        insts[m2].forward(201, b"rec201")
        for i in rest:
            apps[i].wait_commit(201)
    finally:
        stop_all({i: x for i, x in insts.items()})
    # After a restart the instance starts at 0 (the app keeps its own archived version).
    apps2, insts2 = start(cfgs, [m], App)
    try:
        assert insts2[m].committed_version == 0
    finally:
        stop_all(insts2)


def test_a_single_replica_commits_what_it_confirms(tmp_path):
    cfgs = make_group(tmp_path, n=1)
    apps, insts = start(cfgs, [0], App)
    try:
        wait_master(insts)
        insts[0].forward(1, b"a")
        apps[0].wait_commit(1)
        deadline = time.monotonic() + 5
        while insts[0].committed_version < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert insts[0].committed_version == 1 and apps[0].confirms[1] == ConfirmStatus.OK
    finally:
        stop_all(insts)
