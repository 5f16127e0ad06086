"""SyncInstance.forward_many() (docs/embedding.md §Calls): a run of records in one call, the
same outcome as forward() per record, flow control all or nothing."""

from __future__ import annotations

import threading
import time

import pytest

from vrepl.replica import ConfirmStatus
from vrepl.sync import FlowControlError, NotRunningError, SyncCallbacks, SyncInstance
from vrepl.wal import read_records

# The group helpers of the embedding API's main tests (same directory, imported by name).
from test_sync import make_group, stop_all, wait_master  # noqa: E402

pytestmark = pytest.mark.timeout(30)


class App:
    """Applies forwarded records (keeps them), acks at once; records confirmation ranges."""

    def __init__(self) -> None:
        self.inst: SyncInstance | None = None
        self.applied: dict[int, bytes] = {}
        self.ranges: list[tuple[int, int, ConfirmStatus]] = []
        self.cond = threading.Condition()

    def callbacks(self) -> SyncCallbacks:
        return SyncCallbacks(write_to_cache_batch=self.write_to_cache_batch, confirm_forward_range=self.confirm)

    def write_to_cache_batch(self, first: int, payloads: tuple[bytes, ...]) -> None:
        for i, p in enumerate(payloads):
            self.applied[first + i] = p
        assert self.inst is not None
        self.inst.ack_forward(first + len(payloads) - 1)

    def confirm(self, first: int, last: int, status: ConfirmStatus) -> None:
        with self.cond:
            self.ranges.append((first, last, status))
            self.cond.notify_all()

    def status_of(self, version: int) -> ConfirmStatus | None:
        for first, last, status in self.ranges:
            if first <= version <= last:
                return status
        return None

    def wait_confirm(self, version: int, timeout_s: float = 10) -> ConfirmStatus:
        with self.cond:
            assert self.cond.wait_for(lambda: self.status_of(version) is not None, timeout_s), f"no confirm for v{version}"
            return self.status_of(version)  # type: ignore[return-value]


def start(cfgs):
    apps, insts = {}, {}
    for i in range(len(cfgs)):
        app = App()
        inst = SyncInstance(cfgs[i], app.callbacks())
        app.inst = inst
        inst.start()
        apps[i], insts[i] = app, inst
    return apps, insts


def covered_in_order(ranges) -> list[int]:
    """Every confirmed version, in the order the confirmations came."""
    return [v for first, last, _ in ranges for v in range(first, last + 1)]


def test_forward_many_replicates_like_forward_per_record(tmp_path):
    cfgs = make_group(tmp_path)
    apps, insts = start(cfgs)
    try:
        m = wait_master(insts)
        insts[m].forward_many(1, [b"a%d" % v for v in range(1, 301)])
        insts[m].forward(301, b"single")  # continues the run
        insts[m].forward_many(302, tuple(b"b%d" % v for v in range(302, 352)))  # a tuple works too
        insts[m].forward_many(352, [])  # nothing
        assert apps[m].wait_confirm(351) == ConfirmStatus.OK
        assert covered_in_order(apps[m].ranges) == list(range(1, 352))
        assert all(s == ConfirmStatus.OK for _, _, s in apps[m].ranges)
        stats = insts[m].stats()
        assert stats["sync"]["forwards"] == 351 and stats["sync"]["confirmed_ok"] == 351
        slaves = [i for i in insts if i != m]
        deadline = time.monotonic() + 5
        while any(len(apps[s].applied) < 351 for s in slaves) and time.monotonic() < deadline:
            time.sleep(0.01)
        sent_bytes = sum(len(apps[slaves[0]].applied[v]) for v in range(1, 352))
        for s in slaves:
            assert apps[s].applied[1] == b"a1" and apps[s].applied[300] == b"a300"
            assert apps[s].applied[301] == b"single" and apps[s].applied[351] == b"b351"
            # Payload bytes, counted from the received blocks: the same total the master sent.
            assert insts[s].stats()["counters"]["forward_bytes_received"] == sent_bytes
        assert stats["sync"]["forward_bytes"] == sent_bytes
        # A run that does not start at the next version is refused as a whole (failed),
        # consuming no version: the next version is still 352.
        insts[m].forward_many(400, [b"x", b"y"])
        assert apps[m].wait_confirm(401) == ConfirmStatus.FAILED
        assert apps[m].status_of(400) == ConfirmStatus.FAILED
        insts[m].forward_many(352, [b"c352", b"c353"])
        assert apps[m].wait_confirm(353) == ConfirmStatus.OK
        # Confirmations never go backwards for the accepted versions.
        oks = [v for first, last, s in apps[m].ranges if s == ConfirmStatus.OK for v in range(first, last + 1)]
        assert oks == list(range(1, 354))
    finally:
        stop_all(insts)
    wals = [[(r.epoch, r.version, r.payload) for r in read_records(f"{c.data_path}/wal")] for c in cfgs]
    assert [w[2] for w in wals[0]][:3] == [b"a1", b"a2", b"a3"]
    assert len(wals[0]) == 353 and wals[0] == wals[1] == wals[2]


def test_forward_many_on_a_slave_is_not_master_for_the_whole_run(tmp_path):
    cfgs = make_group(tmp_path)
    apps, insts = start(cfgs)
    try:
        m = wait_master(insts)
        slave = next(i for i in insts if i != m)
        insts[slave].forward_many(1, [b"x"] * 5)
        assert apps[slave].wait_confirm(5) == ConfirmStatus.NOT_MASTER
        assert covered_in_order(apps[slave].ranges) == [1, 2, 3, 4, 5]
        assert all(s == ConfirmStatus.NOT_MASTER for _, _, s in apps[slave].ranges)
    finally:
        stop_all(insts)


def test_forward_many_flow_control_takes_all_or_nothing(tmp_path):
    # quorum 3 with a slave down: nothing is confirmed, so forwards stay in flight.
    cfgs = make_group(tmp_path, quorum=3, max_inflight_forwards=50, forward_timeout_ticks=200)
    apps, insts = start(cfgs)
    try:
        m = wait_master(insts)
        down = next(i for i in insts if i != m)
        insts.pop(down).stop()
        insts[m].forward_many(1, [b"f"] * 30)
        with pytest.raises(FlowControlError, match="max_inflight_forwards"):
            insts[m].forward_many(31, [b"g"] * 21)  # 30 + 21 > 50: none taken
        assert insts[m].stats()["sync"]["forwards_refused_flow_control"] == 21
        insts[m].forward_many(31, [b"h"] * 20)  # 30 + 20 = 50: fits, v31 was not taken before
        with pytest.raises(FlowControlError):
            insts[m].forward(51, b"i")
        with pytest.raises(ValueError, match="exceed max_inflight_forwards"):
            insts[m].forward_many(51, [b"j"] * 51)
        deadline = time.monotonic() + 5
        while insts[m].stats()["sync"]["forwards"] < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = insts[m].stats()
        assert stats["sync"]["forwards"] == 50
        assert stats["last_version"] == 50
        assert apps[m].ranges == []  # nothing confirmed yet (quorum 3, one replica down)
    finally:
        stop_all(insts)
    # Stopping fails what was in flight, in one range each, in order.
    assert covered_in_order(apps[m].ranges) == list(range(1, 51))
    assert all(s == ConfirmStatus.FAILED for _, _, s in apps[m].ranges)
    # The master's WAL holds exactly the 50 taken records: v31..v50 are the second run.
    recs = list(read_records(f"{cfgs[m].data_path}/wal"))
    assert [r.version for r in recs] == list(range(1, 51))
    assert {r.payload for r in recs[30:]} == {b"h"}


def test_forward_many_when_not_running_raises(tmp_path):
    cfgs = make_group(tmp_path, n=1)
    inst = SyncInstance(cfgs[0], SyncCallbacks())
    with pytest.raises(NotRunningError):
        inst.forward_many(1, [b"a"])
    # forward() is the intake's own method (bound per instance): it refuses until start()...
    with pytest.raises(NotRunningError, match=r"forward\(\) while new"):
        inst.forward(1, b"a")
    inst.start()
    inst.stop()
    with pytest.raises(NotRunningError):
        inst.forward_many(1, [b"a"])
    # ...and again once stopped, with nothing queued.
    with pytest.raises(NotRunningError, match=r"forward\(\) while stopped"):
        inst.forward(1, b"a")
    assert inst._intake.queued == 0
