"""The embedding API (vrepl/sync.py) with several instances in this process on 127.0.0.1:
forwarding, confirmations, restart from disk, reconfig, flow control, the arbitrator side,
and WAL truncation (vrepl/transport/storage.py)."""

from __future__ import annotations

import threading
import time

import pytest

from vrepl.config import ReplicaAddress, SyncConfig
from vrepl.errors import ConfigError
from vrepl.replica import ConfirmStatus
from vrepl.sync import FlowControlError, ReconfigError, SyncCallbacks, SyncInstance
from vrepl.testing.arbitrator_proc import ArbitratorProcess
from vrepl.child import free_ports
from vrepl.transport.storage import epoch_history
from vrepl.wal import WalOptions, WalWriter, read_records

pytestmark = pytest.mark.timeout(30)
SECRET = b"unit-secret"


class App:
    """A minimal vnode: applies forwarded records by keeping them, acks at once."""

    def __init__(self) -> None:
        self.inst: SyncInstance | None = None
        self.applied: dict[int, bytes] = {}
        self.confirms: dict[int, ConfirmStatus] = {}
        self.roles: list[tuple[str, int, int | None]] = []
        self.flow: list[int] = []
        self.cond = threading.Condition()

    def callbacks(self) -> SyncCallbacks:
        return SyncCallbacks(
            write_to_cache=self.write_to_cache,
            confirm_forward=self.confirm_forward,
            notify_role=lambda r, e, m: self.roles.append((r, e, m)),
            notify_flow_control=self.flow.append,
        )

    def write_to_cache(self, version: int, payload: bytes) -> None:
        self.applied[version] = payload
        assert self.inst is not None
        self.inst.ack_forward(version)

    def confirm_forward(self, version: int, status: ConfirmStatus) -> None:
        with self.cond:
            self.confirms[version] = status
            self.cond.notify_all()

    def wait_confirm(self, version: int, timeout_s: float = 10) -> ConfirmStatus:
        with self.cond:
            assert self.cond.wait_for(lambda: version in self.confirms, timeout_s), f"no confirm for v{version}"
            return self.confirms[version]


def make_group(tmp_path, n=3, **opts):
    ports = sorted(free_ports(n))
    replicas = tuple(ReplicaAddress(i + 1, "127.0.0.1", p) for i, p in enumerate(ports))
    cfgs = [
        SyncConfig(vgroup_id=11, replicas=replicas, self_index=i, data_path=str(tmp_path / f"n{i + 1}"), secret=SECRET, **opts)
        for i in range(n)
    ]
    return cfgs


def start(cfgs, indexes=None, app_cls=None):
    apps, insts = {}, {}
    for i in indexes if indexes is not None else range(len(cfgs)):
        app = (app_cls or App)()
        inst = SyncInstance(cfgs[i], app.callbacks())
        app.inst = inst
        inst.start()
        apps[i], insts[i] = app, inst
    return apps, insts


def wait_master(insts, timeout_s=10.0, slaves=None):
    deadline = time.monotonic() + timeout_s
    slaves = len(insts) - 1 if slaves is None else slaves
    while time.monotonic() < deadline:
        roles = {i: x.roles()["role"] for i, x in insts.items()}
        masters = [i for i, r in roles.items() if r == "master"]
        if len(masters) == 1 and sum(r == "slave" for r in roles.values()) >= slaves:
            return masters[0]
        time.sleep(0.02)
    raise TimeoutError(f"no master: {roles}")


def stop_all(insts):
    for x in insts.values():
        x.stop()


def test_forward_confirm_and_identical_wals(tmp_path):
    cfgs = make_group(tmp_path)
    apps, insts = start(cfgs)
    try:
        m = wait_master(insts)
        for v in range(1, 501):
            insts[m].forward(v, b"rec%d" % v)
        assert apps[m].wait_confirm(500) == ConfirmStatus.OK
        assert all(apps[m].confirms[v] == ConfirmStatus.OK for v in range(1, 501))
        stats = insts[m].stats()
        assert stats["sync"]["forwards"] == 500 and stats["sync"]["confirmed_ok"] == 500
        assert set(stats["peers"]) == {r.node for r in cfgs[0].replicas} - {cfgs[m].me.node}
        slave = next(i for i in insts if i != m)
        deadline = time.monotonic() + 5
        while len(apps[slave].applied) < 500 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert apps[slave].applied[500] == b"rec500"
        assert insts[slave].roles()["master"] == cfgs[m].me.node
    finally:
        stop_all(insts)
    wals = [[(r.epoch, r.version, r.payload) for r in read_records(f"{c.data_path}/wal")] for c in cfgs]
    assert len(wals[0]) == 500 and wals[0] == wals[1] == wals[2]


def test_forward_on_a_slave_is_not_master_and_out_of_order_fails(tmp_path):
    cfgs = make_group(tmp_path)
    apps, insts = start(cfgs)
    try:
        m = wait_master(insts)
        slave = next(i for i in insts if i != m)
        insts[slave].forward(1, b"x")
        assert apps[slave].wait_confirm(1) == ConfirmStatus.NOT_MASTER
        insts[m].forward(5, b"x")  # not the next version
        assert apps[m].wait_confirm(5) == ConfirmStatus.FAILED
    finally:
        stop_all(insts)


@pytest.mark.slow  # seconds: outside the `-m "not slow"` loop
def test_restart_from_disk_keeps_the_log_and_takes_a_new_epoch(tmp_path):
    cfgs = make_group(tmp_path)
    apps, insts = start(cfgs)
    m = wait_master(insts)
    for v in range(1, 101):
        insts[m].forward(v, b"a%d" % v)
    apps[m].wait_confirm(100)
    epoch1 = insts[m].roles()["epoch"]
    time.sleep(0.2)  # let the slaves' WALs catch up
    stop_all(insts)
    apps, insts = start(cfgs)
    try:
        m = wait_master(insts)
        r = insts[m].roles()
        assert r["last_version"] == 100 and r["epoch"] > epoch1
        insts[m].forward(101, b"b101")
        assert apps[m].wait_confirm(101) == ConfirmStatus.OK
    finally:
        stop_all(insts)
    hist = epoch_history(f"{cfgs[0].data_path}/wal", 1 << 20)
    assert hist[0] == (epoch1, 1) and hist[-1][1] == 101


def test_reconfig_changes_quorum_and_refuses_membership_changes(tmp_path):
    cfgs = make_group(tmp_path)
    apps, insts = start(cfgs)
    try:
        m = wait_master(insts)
        insts[m].reconfig(cfgs[m].replace(quorum=3))
        assert insts[m].stats()["counters"]["elections_won"] >= 1
        with pytest.raises(ReconfigError, match="vgroup_id, replicas cannot change"):
            insts[m].reconfig(cfgs[m].replace(replicas=cfgs[m].replicas[:2], self_index=0, vgroup_id=12))
        with pytest.raises(ConfigError, match="quorum 4"):
            insts[m].reconfig(cfgs[m].replace(quorum=4))
        for v in range(1, 11):
            insts[m].forward(v, b"q")
        assert apps[m].wait_confirm(10) == ConfirmStatus.OK
    finally:
        stop_all(insts)


@pytest.mark.slow  # seconds: outside the `-m "not slow"` loop
def test_quorum_all_with_a_slave_down_times_out_then_lowering_the_quorum_helps(tmp_path):
    cfgs = make_group(tmp_path, quorum=3, forward_timeout_ticks=10, tick_ms=50)
    apps, insts = start(cfgs)
    try:
        m = wait_master(insts)
        down = next(i for i in insts if i != m)
        insts.pop(down).stop()
        insts[m].forward(1, b"a")
        assert apps[m].wait_confirm(1) == ConfirmStatus.TIMED_OUT
        assert insts[m].stats()["sync"]["confirmed_timed_out"] == 1
    finally:
        stop_all(insts)


def test_flow_control_refuses_forwards_beyond_max_inflight(tmp_path):
    cfgs = make_group(tmp_path, quorum=3, max_inflight_forwards=50, forward_timeout_ticks=100)
    apps, insts = start(cfgs)
    try:
        m = wait_master(insts)
        down = next(i for i in insts if i != m)
        insts.pop(down).stop()
        with pytest.raises(FlowControlError, match="max_inflight_forwards"):
            for v in range(1, 200):
                insts[m].forward(v, b"f")
        assert insts[m].stats()["sync"]["forwards_refused_flow_control"] >= 1
    finally:
        stop_all(insts)


def test_recover_resyncs_a_slave(tmp_path):
    cfgs = make_group(tmp_path)
    apps, insts = start(cfgs)
    try:
        m = wait_master(insts)
        for v in range(1, 21):
            insts[m].forward(v, b"r")
        apps[m].wait_confirm(20)
        slave = next(i for i in insts if i != m)
        before = insts[slave].stats()["counters"]["resyncs"]
        insts[slave].recover()
        deadline = time.monotonic() + 5
        while insts[slave].roles()["role"] != "slave" or insts[slave].stats()["counters"]["resyncs"] == before:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        insts[m].forward(21, b"r")
        assert apps[m].wait_confirm(21) == ConfirmStatus.OK
    finally:
        stop_all(insts)


@pytest.mark.slow  # seconds: outside the `-m "not slow"` loop
def test_two_replicas_with_an_arbitrator_elect_one_master(tmp_path):
    arb = ArbitratorProcess(str(tmp_path / "arb"), SECRET)
    try:
        # quorum 1: with the slave gone the master must still confirm alone.
        cfgs = make_group(tmp_path, n=2, quorum=1, arbitrator=f"127.0.0.1:{arb.port}")
        apps, insts = start(cfgs)
        try:
            m = wait_master(insts)
            assert insts[m].stats()["arbitrator_connected"]
            insts[m].forward(1, b"a")
            assert apps[m].wait_confirm(1) == ConfirmStatus.OK
            # The slave dies: with the arbitrator's lease the master keeps a majority (2 of 3).
            other = 1 - m
            insts.pop(other).stop()
            time.sleep(0.5)
            assert insts[m].roles()["role"] == "master"
            insts[m].forward(2, b"b")
            assert apps[m].wait_confirm(2) == ConfirmStatus.OK
        finally:
            stop_all(insts)
    finally:
        arb.stop()


def test_epoch_history_after_truncation_across_rotated_files(tmp_path):
    d = str(tmp_path / "wal")
    opts = WalOptions(max_file_bytes=2000, durability="none")
    with WalWriter(d, opts) as w:
        for v in range(1, 101):
            w.append(b"p" * 40, epoch=1 if v <= 60 else 2)
        assert len(__import__("os").listdir(d)) > 4
        assert epoch_history(d, 1 << 20) == ((1, 1), (2, 61))
        w.truncate_after(70)
    assert [r.version for r in read_records(d)] == list(range(1, 71))
    assert epoch_history(d, 1 << 20) == ((1, 1), (2, 61))
    with WalWriter(d, opts) as w:  # the WAL stays appendable after the cut
        assert w.last_version == 70 and w.last_epoch == 2
        w.append(b"q", epoch=3)
        assert epoch_history(d, 1 << 20) == ((1, 1), (2, 61), (3, 71))
        w.truncate_after(0)
    assert read_records(d) == []
    assert epoch_history(d, 1 << 20) == ()


def test_a_forward_refused_out_of_turn_leaves_the_pending_runs_latency(tmp_path):
    """docs/embedding.md: a forward whose version is not the next one is confirmed FAILED at
    once, ahead of an earlier forward still waiting; that earlier run is still measured by
    `confirm_latency_s` when it is confirmed OK (the refusal used to take its entry)."""
    from vrepl.sync import SyncObservers

    (port,) = free_ports(1)
    confirms: list[tuple[int, int, ConfirmStatus]] = []
    latencies: list[float] = []
    done = threading.Event()

    def confirmed(first: int, last: int, status: ConfirmStatus) -> None:
        confirms.append((first, last, status))
        if len(confirms) == 2:
            done.set()

    cfg = SyncConfig(vgroup_id=1, replicas=((1, f"127.0.0.1:{port}"),), self_index=0,
                     data_path=str(tmp_path), secret=b"s" * 16)
    inst = SyncInstance(cfg, SyncCallbacks(confirm_forward_range=confirmed),
                        observers=SyncObservers(confirm_latency_s=latencies.append)).start()
    try:
        deadline = time.monotonic() + 10
        while inst.roles()["role"] != "master":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        v = inst.roles()["last_version"]

        def both() -> None:   # on the I/O thread: v + 1 cannot be durable before v + 5 is refused
            inst.forward(v + 1, b"next")
            inst.forward(v + 5, b"out of turn")

        inst.loop.call_soon_threadsafe(both)
        assert done.wait(10)
        assert confirms == [(v + 5, v + 5, ConfirmStatus.FAILED), (v + 1, v + 1, ConfirmStatus.OK)]
        assert len(latencies) == 1
    finally:
        inst.stop()
