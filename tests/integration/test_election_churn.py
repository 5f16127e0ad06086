"""Election churn and the arbitrator lease margin with real processes (docs/design.md §2.4
and §5, docs/operations.md §Elections): `vrepl node` processes on 127.0.0.1, the real
`vrepl-arbitrator`, and a LinkProxy the test cuts between two nodes.

Counts what an operator sees: role changes and epochs in the nodes' logs and status.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from vrepl.client import Client
from vrepl.child import free_ports, node_argv, python_argv, start_node, wait_for
from vrepl.node.local import LocalCluster, render_toml
from vrepl.testing.arbitrator_proc import ArbitratorProcess
from vrepl.testing.proxy import LinkProxy

pytestmark = pytest.mark.timeout(120)
SECRET = "churn-secret"
# The sync layer's role_change line: "vg1 n2 e1: role unsynced -> syncing, epoch 1, master n1 (...)".
ROLE_LINE = re.compile(r"vg1 n(\d+) e\d+: role \w+ -> (\w+), epoch (\d+)")


def role_lines(log_text: str) -> list[tuple[str, int]]:
    """(role, epoch) of every role change a node logged (ROLE_LINE)."""
    return [(m.group(2), int(m.group(3))) for m in ROLE_LINE.finditer(log_text)]


def read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


# ---------------------------------------------------------------------- churn (a): start-up


def test_fresh_three_replica_groups_settle_at_epoch_1_without_a_step_down(tmp_path):
    """Churn (a): a node that reached one peer before the other used to announce e2 over the
    election that peer took part in, and the first master stepped down ~100 ms after start
    (e1 -> e2, sometimes e3). Several fresh groups, each must settle at e1: one master that
    never steps down, every replica's only epoch 1."""
    for run in range(4):
        # A heartbeat timeout of 10 s (not 2): a machine loaded enough to starve a node for
        # 2 s would cause a legitimate re-election, which is not the churn this test is about.
        c = LocalCluster(str(tmp_path / f"c{run}"), 3, vgroup=1, quorum=2, secret=SECRET,
                         sync={"heartbeat_timeout_ticks": 100})
        try:
            c.start()
            c.wait_ready()
            master = c.wait_master(slaves=2)
            # Longer than the reconnect interval (1 s): the late connections of the start-up
            # race have happened, and any churn they cause is in the logs.
            time.sleep(1.5)
            assert c.master() == master
            logs = {nid: read(os.path.join(n.dir, "node.log")) for nid, n in c.nodes.items()}
            for nid, text in logs.items():
                assert "steps down" not in text, (run, nid, role_lines(text))
                assert {e for _, e in role_lines(text)} == {1}, (run, nid, role_lines(text))
                assert c.vgroup_status(nid)["epoch"] == 1
            assert role_lines(logs[master]) == [("master", 1)]
            for nid in set(c.nodes) - {master}:
                assert role_lines(logs[nid]) == [("syncing", 1), ("slave", 1)], (run, nid)
        finally:
            c.close()


# ---------------------------------------------------------------------- 2 replicas + arbitrator


class Pair:
    """Two `vrepl node` processes hosting vgroup 1 (2 replicas, quorum 1) with an arbitrator.
    Node 1 (the lower address) dials node 2 through a LinkProxy, so cutting the proxy cuts
    the only link between them while both still reach the arbitrator."""

    def __init__(self, base: str, arbitrator: str, sync: dict | None = None):
        p1, p_proxy, p2 = sorted(free_ports(3))
        h1, h2 = free_ports(2)
        self.proxy = LinkProxy(target_port=p2, listen_port=p_proxy)
        self.http = {1: f"127.0.0.1:{h1}", 2: f"127.0.0.1:{h2}"}
        self.dirs = {}
        self.procs: dict[int, subprocess.Popen] = {}
        for nid in (1, 2):
            d = os.path.join(base, f"n{nid}")
            os.makedirs(d, exist_ok=True)
            self.dirs[nid] = d
            rep2 = p_proxy if nid == 1 else p2
            doc = {"node_id": nid, "data_dir": os.path.join(d, "data"), "secret": SECRET,
                   "log_file": os.path.join(d, "node.log"),
                   "nodes": [{"id": 1, "replication": f"127.0.0.1:{p1}", "http": self.http[1]},
                             {"id": 2, "replication": f"127.0.0.1:{rep2}", "http": self.http[2]}],
                   "vgroups": [{"id": 1, "replicas": [1, 2], "quorum": 1, "arbitrator": arbitrator}]}
            if sync:
                doc["sync"] = sync
            with open(os.path.join(d, "node.toml"), "w") as fh:
                fh.write(render_toml(doc))

    def start(self) -> None:
        for nid, d in self.dirs.items():
            self.procs[nid] = start_node(os.path.join(d, "node.toml"),
                                         stderr_path=os.path.join(d, "stderr.log"))

    def vgroup(self, nid: int) -> dict | None:
        c = Client([self.http[nid]], request_timeout_s=1)
        try:
            return c.status(self.http[nid])["vgroups"][0]
        except Exception:
            return None
        finally:
            c.close()

    def roles(self) -> dict[int, tuple[str, int] | None]:
        out = {}
        for nid in (1, 2):
            vg = self.vgroup(nid)
            out[nid] = (vg["role"], vg["epoch"]) if vg else None
        return out

    def log(self, nid: int) -> str:
        return read(os.path.join(self.dirs[nid], "node.log"))

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
        self.proxy.close()


@pytest.fixture
def pair_with(tmp_path):
    made: list[tuple[Pair, ArbitratorProcess]] = []

    def make(lease_ms: int | None = None, sync: dict | None = None) -> tuple[Pair, ArbitratorProcess]:
        arb = ArbitratorProcess(str(tmp_path / f"arb{len(made)}"), SECRET.encode(), lease_ms=lease_ms)
        pair = Pair(str(tmp_path / f"pair{len(made)}"), arb.address, sync)
        made.append((pair, arb))
        pair.start()
        return pair, arb

    yield make
    for pair, arb in made:
        pair.close()
        arb.stop(signal.SIGKILL)


def test_healed_link_cut_keeps_the_master_and_its_epoch(pair_with):
    """Churn (b): with the direct link cut, the cut-off replica used to promise itself e2, be
    refused by the arbitrator (the master's lease is live), and on heal the master saw the
    newer promise and stepped down, then re-elected itself at e3. Now: one master, epoch 1,
    before, during and after the cut; the cut-off side only asks the arbitrator."""
    pair, arb = pair_with()
    def settled():
        roles = pair.roles()
        return roles if sorted(map(str, roles.values())) == ["('master', 1)", "('slave', 1)"] else None

    roles = wait_for("one master and one slave", settled)
    master = next(n for n, r in roles.items() if r[0] == "master")
    other = 3 - master
    time.sleep(1.0)  # the master holds and renews its lease
    pair.proxy.cut()
    # Longer than the heartbeat timeout (2 s) plus a full arbitrator lease (2.5 s).
    time.sleep(5.5)
    assert pair.roles() == {master: ("master", 1), other: ("unsynced", 1)}
    pair.proxy.heal()
    wait_for("the other replica to rejoin as slave", lambda: pair.roles()[other] == ("slave", 1))
    time.sleep(1.0)
    assert pair.roles() == {master: ("master", 1), other: ("slave", 1)}
    assert "steps down" not in pair.log(master)
    assert role_lines(pair.log(master)) == [("master", 1)]
    assert role_lines(pair.log(other)) == [("syncing", 1), ("slave", 1), ("unsynced", 1), ("syncing", 1), ("slave", 1)]
    # What the cut-off side did instead of promising: asked the arbitrator for e2, refused.
    assert "election announce e2" not in pair.log(other)
    assert re.search(rf"vg1 n{other} e1: election request_grant e2 n{other}: 1 of 2 replicas online", pair.log(other))
    assert re.search(rf"vg1 n{other} e2: refused: vg1 lease held by n{master} for e1 for another \d+ ms",
                     arb.stop())


# ---------------------------------------------------------------------- the lease margin


def test_unsafe_arbitrator_lease_is_refused_with_one_clear_line_each_side(pair_with):
    """§5: an arbitrator whose lease_ms (2000, the old default) equals the replicas' lease
    (20 ticks x 100 ms) cannot back it with the margin. It says so at start-up, refuses every
    request with one warning per node, and each node logs why it was refused, once."""
    pair, arb = pair_with(lease_ms=2000)
    wait_for("a master", lambda: any(r and r[0] == "master" for r in pair.roles().values()))
    master = next(n for n, r in pair.roles().items() if r[0] == "master")
    time.sleep(2.0)  # several renewals, all refused
    assert wait_for("the master's refusal line",
                    lambda: "arbitrator refused e1: an arbitrator lease" in pair.log(master))
    err = arb.stop()
    start_line = ("arbitrator: lease_ms 2000 backs replica leases up to 1584 ms: replicas with the"
                  " default lease (2000 ms) will be refused")
    assert err.count(start_line) == 1
    refusal = re.compile(r"WARNING vrepl.arbitrator arbitrator: vg1 n(\d) e\d+: refused: lease of 2000 ms asked: an arbitrator"
                         r" lease of 2000 ms cannot back a replica lease of 2000 ms: it must be at least 2420 ms"
                         r" \(2000 ms x \(1 \+ clock_drift_ratio 0.01\) \+ lease_allowance_ms 400\) \(raise lease_ms\)")
    assert sorted(int(m.group(1)) for m in refusal.finditer(err)) == [1, 2]  # one line per node
    assert "granted" not in err
    node_line = re.compile(rf"WARNING vrepl.replica vg1 n{master} e\d: arbitrator refused e\d: an arbitrator lease of"
                           r" 2000 ms cannot back a replica lease of 2000 ms: it must be at least 2420 ms \(2000 ms x"
                           r" \(1 \+ clock_drift_ratio 0.01\) \+ lease_allowance_ms 400\)\n")
    assert len(node_line.findall(pair.log(master))) == 1, pair.log(master)[-3000:]  # once, though renewals repeat
    # Without a lease the master holds only while it hears the other replica: a cut now
    # leaves no master at all rather than risking two.
    pair.proxy.cut()
    wait_for("the master to step down without a lease", lambda: pair.roles()[master][0] == "unsynced", 10)


def test_arbitrator_start_up_refuses_a_lease_that_backs_nothing(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    p = subprocess.run(python_argv("-m", "arbitrator.main", "--port", "0", "--secret-file", str(secret),
                                   "--state-dir", str(tmp_path / "s"), "--lease-ms", "400"),
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "vrepl-arbitrator: error: lease_ms 400 backs no replica lease: it must exceed lease_allowance_ms 400"
        " (plus the clock drift margin of the replica lease)"
    ]


def test_node_start_up_refuses_a_lease_that_lapses_between_renewals(tmp_path):
    h1, h2, r1, r2 = free_ports(4)
    path = tmp_path / "node.toml"
    path.write_text(render_toml({
        "node_id": 1, "data_dir": str(tmp_path / "data"), "secret": SECRET,
        "nodes": [{"id": 1, "replication": f"127.0.0.1:{r1}", "http": f"127.0.0.1:{h1}"},
                  {"id": 2, "replication": f"127.0.0.1:{r2}", "http": f"127.0.0.1:{h2}"}],
        "vgroups": [{"id": 1, "replicas": [1, 2], "arbitrator": "127.0.0.1:6042"}],
        "sync": {"arbitrator_lease_ticks": 8}}))
    p = subprocess.run(node_argv(str(path)),
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"vrepl: error: {path}: vgroup 1: arbitrator_lease_ticks 8 x tick_ms 100 = 800 ms must exceed"
        " heartbeat_interval_ticks 5 x tick_ms 100 + lease_allowance_ms 400 = 900 ms (the renewal period"
        " plus the allowance)"
    ]
    assert not (tmp_path / "data").exists()
