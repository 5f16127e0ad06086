"""Scenario tests of the commit index (docs/design.md §4.4): replicas, each driven by the
production Driver, stepped through the scripted network (vrepl/testing/scripted.py), checking
exact actions by their describe() strings.

The commit version says which records the app may archive: on a master, the highest version
confirmed ok in its own epoch; on a follower, the master's Commit as far as its own log is
durable and known to match; never below a WAL truncation (project issue 13).
"""

from __future__ import annotations

from test_replica_scenarios import elect, no_logs

from vrepl.replica import (
    AckStatus,
    AppRecover,
    Commit,
    ForwardAck,
    Log,
    Received,
    Role,
    TruncateRequest,
    WalPersisted,
)
from vrepl.testing.scripted import Net


def commit_then_cut_master(versions: int) -> Net:
    """n0 writes and commits v1..versions (every follower told so on a tick), then loses
    both links: n1 and n2 elect a new master."""
    net = elect(3)
    for v in range(1, versions + 1):
        net.forward(0, v)
    net.run()
    net.tick(1)
    assert all(net.nodes[n].replica.commit_version == versions for n in (1, 2))
    net.cut(0, 1)
    net.cut(0, 2)
    return net


def commit_lines(trace: list[str]) -> list[str]:
    return [t for t in trace if "commit" in t]


def test_master_commit_version_is_its_highest_confirmed_version():
    net = elect(3)
    net.nodes[1].auto_persist = False
    net.nodes[2].auto_persist = False
    for v in (1, 2, 3):
        net.forward(0, v)
    net.run()
    assert net.nodes[0].replica.commit_version == 0  # own WAL durable, no follower ack yet
    net.take_trace()
    net.persist(1, up_to=2)
    net.run()
    assert net.take_trace(0) == ["n0: confirm_forward v1..v2 ok", "n0: commit_advanced v2"]
    assert net.nodes[0].replica.commit_version == 2
    net.persist(2)
    net.run()
    assert net.take_trace(0) == ["n0: confirm_forward v3 ok", "n0: commit_advanced v3"]
    assert net.nodes[0].commits == [2, 3]


def test_commit_advanced_is_emitted_once_per_increase():
    net = elect(3)
    net.nodes[2].auto_persist = False
    net.forward(0, 1)
    net.run()
    assert net.nodes[0].commits == [1]
    r = net.nodes[0].replica
    # A repeated durability report and a repeated ack change nothing: no second action.
    assert no_logs(r.step(WalPersisted(1))) == []
    assert no_logs(r.step(Received(1, ForwardAck(1, 1, AckStatus.OK)))) == []
    # The second follower's ack confirms nothing new (quorum met already): no action.
    net.persist(2)
    net.run()
    assert net.nodes[0].commits == [1]
    for v in (2, 3, 4):
        net.forward(0, v)
    net.run()
    assert net.nodes[0].commits == [1, 2, 3, 4]
    assert r.commit_version == 4


def test_master_sends_commit_on_a_tick_only_when_it_advanced():
    net = elect(3)
    for v in (1, 2):
        net.forward(0, v)
    net.run()
    net.take_trace()
    net.tick(1, run=False)
    assert commit_lines(net.take_trace(0)) == ["n0: send n1 commit e1 v2", "n0: send n2 commit e1 v2"]
    net.run()
    net.tick(1, run=False)
    assert commit_lines(net.take_trace(0)) == []  # nothing new: no frame
    net.run()
    net.forward(0, 3)
    net.run()
    net.take_trace()
    net.tick(1, run=False)
    assert commit_lines(net.take_trace(0)) == ["n0: send n1 commit e1 v3", "n0: send n2 commit e1 v3"]
    net.run()


def test_a_resyncing_follower_is_told_the_commit_again():
    net = elect(3)
    net.forward(0, 1)
    net.run()
    net.tick(1)
    net.take_trace()
    net.step(1, AppRecover())  # n1 matches its log again: a new SyncRequest
    net.run()
    net.take_trace()
    net.tick(1, run=False)
    assert commit_lines(net.take_trace(0)) == ["n0: send n1 commit e1 v1"]


def test_follower_commit_is_min_of_received_and_durable_matched():
    net = elect(3)
    net.nodes[1].auto_persist = False
    for v in (1, 2, 3):
        net.forward(0, v)
    net.run()  # n2 acks, so the master commits v3; n1 holds v1..v3 but nothing durable
    assert net.nodes[0].replica.commit_version == 3
    net.take_trace()
    net.tick(1)
    # n2: durable and matched up to v3, so it takes the master's v3 at once.
    assert commit_lines(net.take_trace(2)) == ["n2: commit_advanced v3"]
    # n1 got Commit v3 but nothing of its own log is durable: its commit stays 0.
    assert net.nodes[1].replica.commit_version == 0
    net.persist(1, up_to=2)
    net.run()
    assert commit_lines(net.take_trace(1)) == ["n1: commit_advanced v2"]
    net.persist(1)
    net.run()
    assert commit_lines(net.take_trace(1)) == ["n1: commit_advanced v3"]
    # Durable and matched beyond what the master committed: the master's number bounds it.
    net.nodes[2].auto_persist = False  # v4 has only n0 and n1, n1's ack has not come yet
    net.nodes[1].auto_persist = False
    net.forward(0, 4)
    net.run()
    net.persist(1)
    net.settle()  # n1's ack of v4 is queued, not delivered
    net.tick(1, run=False)
    net.deliver(0, 1, count=10)
    assert net.nodes[1].replica.durable_version == 4
    assert net.nodes[1].replica.commit_version == 3


def test_follower_commit_ignores_a_commit_of_another_epoch():
    net = elect(3)
    net.forward(0, 1)
    net.run()
    r = net.nodes[1].replica
    assert r.role == Role.SLAVE and r.promised_epoch == 1
    for stale in (Commit(0, 1), Commit(2, 1)):
        actions = r.step(Received(0, stale))
        assert no_logs(actions) == []
        assert any(isinstance(a, Log) and f"ignored {stale.describe()} from n0" in a.text for a in actions)
    assert r.commit_version == 0
    # From a node it does not follow, even in its own epoch.
    actions = r.step(Received(2, Commit(1, 1)))
    assert no_logs(actions) == [] and r.commit_version == 0
    assert no_logs(r.step(Received(0, Commit(1, 1)))) == ["commit_advanced v1"]


def test_commit_never_goes_back_across_a_new_master():
    """A follower's commit version stays when it follows a new master (whose log holds every
    committed record, §2.3); the new master's own commit starts from its follower days."""
    net = commit_then_cut_master(2)
    net.run()
    assert net.masters() == [1]
    assert net.nodes[1].replica.commit_version == 2
    assert net.nodes[2].replica.commit_version == 2
    net.forward(1, 3)
    net.run()
    assert net.nodes[1].commits == [2, 3]


def test_new_master_commits_inherited_records_only_with_its_first_own_record():
    """Raft's rule (design §4.4): a new master does not count inherited records as committed,
    even when every replica holds them; its first own-epoch record commits them."""
    logs = {n: [(1, 1), (1, 2)] for n in (0, 1, 2)}
    net = Net(3, logs=logs, promises={n: (1, 0) for n in (0, 1, 2)})
    net.start()
    (m,) = net.masters()
    net.tick(3)
    assert all(sn.replica.commit_version == 0 for sn in net.nodes.values())
    net.forward(m, 3)
    net.run()
    assert net.nodes[m].commits == [3]


def test_no_truncation_below_the_commit_version():
    """A TruncateRequest that would cut committed records (a master bug) is refused instead of
    losing them (design §4.3, §4.4): logged at ERROR, the connection reset, the follower
    unsynced with its log and commit version kept. (It was an invariant; a peer's message
    must never trip one, project issue 15.)"""
    net = commit_then_cut_master(3)
    r = net.nodes[2].replica
    # Step the election one message at a time until n2 follows n1 and has asked to match
    # (SyncRequest sent, its log not yet matched in the new epoch).
    for _ in range(100):
        if r.role == Role.SYNCING and r.master == 1:
            break
        net.settle()
        for (src, dst), q in sorted(net.queues.items()):
            if q:
                net.deliver(src, dst)
                break
    assert r.role == Role.SYNCING and r.promised_epoch == 2 and r.matched_version == 0
    actions = r.step(Received(1, TruncateRequest(2, 1, 1)))
    why = "refused truncate_request e2 keep <=e1 <=v1: it cuts committed records v2..v3"
    assert [a.describe() for a in actions][:2] == [f"log error vg7 n2 e2: {why}", f"reset_connection n1 ({why})"]
    assert not any(a.describe().startswith("truncate_wal_after") for a in actions)
    assert (r.role, r.last_version, r.commit_version) == (Role.UNSYNCED, 3, 3)


def test_quorum_below_majority_commits_on_a_majority():
    """quorum 1 of 3: the master confirms on its own WAL, but commits only what a majority
    holds (a confirmation there may be lost on failover, design §2.2)."""
    net = elect(3, quorum=1)
    net.nodes[1].auto_persist = False
    net.nodes[2].auto_persist = False
    net.take_trace()
    net.forward(0, 1)
    net.run()
    assert net.confirmed_ok(0) == [1]
    assert net.nodes[0].replica.commit_version == 0
    net.persist(2)
    net.run()
    assert commit_lines(net.take_trace(0)) == ["n0: commit_advanced v1"]
