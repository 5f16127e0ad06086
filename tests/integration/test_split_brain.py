"""2 replicas + the real arbitrator process: the direct link between the replicas is cut
while both still reach the arbitrator (the partition that gave TDengine two masters).

The replicas are SyncInstances in this process with real sockets; the arbitrator is a real
process; the peer link runs through a LinkProxy the test cuts. docs/arbitrator.md.
"""
import threading
import time

import pytest

from vrepl.config import ReplicaAddress, SyncConfig
from vrepl.replica import ConfirmStatus
from vrepl.sync import SyncCallbacks, SyncInstance
from vrepl.testing.arbitrator_proc import ArbitratorProcess
from vrepl.child import free_ports, wait_for
from vrepl.testing.proxy import LinkProxy
from vrepl.wal import read_records

pytestmark = pytest.mark.timeout(90)
SECRET = b"split-brain-secret"


class App:
    def __init__(self, name):
        self.name = name
        self.inst = None
        self.roles = []          # (monotonic time, role, epoch)
        self.confirms = {}
        self.cond = threading.Condition()

    def callbacks(self):
        return SyncCallbacks(write_to_cache=self.write_to_cache,
                             confirm_forward=self.confirm_forward,
                             notify_role=self.notify_role)

    def write_to_cache(self, version, payload):
        self.inst.ack_forward(version)

    def confirm_forward(self, version, status):
        with self.cond:
            self.confirms[version] = status
            self.cond.notify_all()

    def notify_role(self, role, epoch, master):
        self.roles.append((time.monotonic(), str(role), epoch))

    def wait_confirm(self, version, timeout_s=10):
        with self.cond:
            assert self.cond.wait_for(lambda: version in self.confirms, timeout_s)
            return self.confirms[version]


def role(inst):
    return inst.roles()["role"]


@pytest.fixture()
def group(tmp_path):
    """Node 1 (lowest port) dials node 2 through the proxy; both reach the arbitrator."""
    arb = ArbitratorProcess(str(tmp_path / "arb"), SECRET)  # default lease: backs the replicas' with the margin
    # Both nodes must agree that node 1 has the lower address (the lower side dials), so
    # node 1 gets the lowest of the three ports.
    p1, p_proxy, p2 = sorted(free_ports(3))
    proxy = LinkProxy(target_port=p2, listen_port=p_proxy)
    a1 = ReplicaAddress(1, "127.0.0.1", p1)
    cfg1 = SyncConfig(vgroup_id=5, replicas=(a1, ReplicaAddress(2, "127.0.0.1", proxy.port)),
                      self_index=0, quorum=1, data_path=str(tmp_path / "n1"), secret=SECRET,
                      arbitrator=arb.address)
    cfg2 = SyncConfig(vgroup_id=5, replicas=(a1, ReplicaAddress(2, "127.0.0.1", p2)),
                      self_index=1, quorum=1, data_path=str(tmp_path / "n2"), secret=SECRET,
                      arbitrator=arb.address)
    apps, insts = {}, {}
    for i, cfg in ((0, cfg1), (1, cfg2)):
        app = App(f"n{i + 1}")
        inst = SyncInstance(cfg, app.callbacks())
        app.inst = inst
        inst.start()
        apps[i], insts[i] = app, inst
    try:
        yield apps, insts, proxy, arb
    finally:
        for inst in insts.values():
            inst.stop()
        proxy.close()
        arb.stop()


def _elect(insts):
    wait_for("one master and one slave",
             lambda: sorted(role(x) for x in insts.values()) == ["master", "slave"], 15)
    return next(i for i, x in insts.items() if role(x) == "master")


def test_direct_link_cut_keeps_exactly_one_master(group):
    apps, insts, proxy, _arb = group
    m = _elect(insts)
    s = 1 - m
    for v in range(1, 11):
        insts[m].forward(v, f"before-{v}".encode())
    assert apps[m].wait_confirm(10) == ConfirmStatus.OK
    epoch = insts[m].roles()["epoch"]
    cut_at = time.monotonic()
    proxy.cut()
    # Longer than the heartbeat timeout (2 s) plus a full lease (2 s): the other replica sees
    # the master offline and asks the arbitrator for a newer epoch; it must be refused.
    version = 10
    while time.monotonic() - cut_at < 6.0:
        version += 1
        insts[m].forward(version, f"during-{version}".encode())
        assert apps[m].wait_confirm(version) == ConfirmStatus.OK
        assert role(insts[s]) != "master"
        time.sleep(0.05)
    assert role(insts[m]) == "master" and insts[m].roles()["epoch"] == epoch
    assert all(r != "master" for t, r, _e in apps[s].roles if t >= cut_at), apps[s].roles
    assert all(r == "master" for t, r, _e in apps[m].roles if t >= cut_at), apps[m].roles
    # Heal: the other replica catches up and becomes slave again; logs converge.
    proxy.heal()
    wait_for("the other replica to rejoin as slave", lambda: role(insts[s]) == "slave", 15)
    version += 1
    insts[m].forward(version, b"after")
    assert apps[m].wait_confirm(version) == ConfirmStatus.OK
    for inst in insts.values():
        inst.stop()
    logs = [[(r.version, r.epoch, r.payload) for r in read_records(inst.wal_dir)]
            for inst in insts.values()]
    assert logs[0] == logs[1] and len(logs[0]) == version


def test_master_lost_with_link_cut_the_other_takes_over_after_the_lease(group):
    apps, insts, proxy, _arb = group
    m = _elect(insts)
    s = 1 - m
    insts[m].forward(1, b"one")
    assert apps[m].wait_confirm(1) == ConfirmStatus.OK
    proxy.cut()
    t0 = time.monotonic()
    insts.pop(m).stop()  # the master is gone too: its lease runs out, the survivor takes over
    wait_for("the survivor to become master", lambda: role(insts[s]) == "master", 15)
    took_s = time.monotonic() - t0
    assert took_s < 2.0 + 2.0 + 2.0, took_s  # heartbeat timeout + lease + slack
    insts[s].forward(2, b"two")
    assert apps[s].wait_confirm(2) == ConfirmStatus.OK
    assert [r.payload for r in read_records(insts[s].wal_dir)] == [b"one", b"two"]
