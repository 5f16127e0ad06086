"""Scenario tests: replicas, each driven by the production Driver (vrepl/driver/), stepped
through the scripted network of vrepl/testing/scripted.py.

Each test chooses the message interleaving, then checks exact actions through their
describe() strings, or end states (roles, logs, confirmations). Regression tests named in
issue 3 cite the docs/design.md section they check.
"""

from __future__ import annotations

import pytest
from vrepl.testing.scripted import Net

from vrepl.replica import (
    AppAcked,
    AppForward,
    ConfirmStatus,
    Config,
    Forward,
    ForwardAck,
    Log,
    PeerConnected,
    Received,
    Replica,
    Role,
    WalPersisted,
)


def no_logs(actions) -> list[str]:
    return [a.describe() for a in actions if not isinstance(a, Log)]


def elect(n: int = 3, **cfg) -> Net:
    net = Net(n, **cfg)
    net.start()
    assert net.masters() == [0]
    return net


def assert_one_master_at_most(net: Net) -> None:
    # Two masters may coexist only in different epochs, and the older one can then confirm
    # nothing; the same epoch never has two masters (docs/design.md §2.3).
    epochs = [net.nodes[m].replica.promised_epoch for m in net.masters()]
    assert len(epochs) == len(set(epochs)), net.masters()


# ---------------------------------------------------------------------- election


def test_cold_start_three_replicas_exact_election_trace():
    net = Net(3)
    net.start(connect=False)
    net.take_trace()
    net.connect(0, 1)
    # Each side sends its status; nobody decides on a view it has not heard yet.
    assert net.take_trace() == [
        "n0: send n1 status from n0 [unsynced e0v0 p0@-, unsynced e0v0 p0@-, offline e0v0 p0@-]",
        "n1: send n0 status from n1 [unsynced e0v0 p0@-, unsynced e0v0 p0@-, offline e0v0 p0@-]",
    ]
    net.deliver(0, 1)  # n1's view picks n0, which has not announced: wait
    assert net.take_trace() == []
    net.deliver(1, 0)  # n0: two of three online, best log (tie, first in list): announce
    assert net.take_trace() == [
        "n0: persist_promised_epoch e1 for n0",
        "n0: send n1 status from n0 [unsynced e0v0 p1@n0, unsynced e0v0 p0@-, offline e0v0 p0@-]",
    ]
    net.deliver(0, 1)  # n1 adopts; the promise is durable BEFORE the status is sent
    assert net.take_trace() == [
        "n1: persist_promised_epoch e1 for n0",
        "n1: send n0 status from n1 [unsynced e0v0 p1@n0, unsynced e0v0 p1@n0, offline e0v0 p0@-]",
    ]
    net.deliver(1, 0)  # two promises of three: master of epoch 1
    assert net.take_trace() == [
        "n0: notify_role master e1 master n0",
        "n0: send n1 status from n0 [master e0v0 p1@n0, unsynced e0v0 p1@n0, offline e0v0 p0@-]",
    ]
    net.deliver(0, 1)
    assert net.take_trace() == [
        "n1: notify_role syncing e1 master n0",
        "n1: send n0 sync_request e1 have e0v0",
        "n1: send n0 status from n1 [master e0v0 p1@n0, syncing e0v0 p1@n0, offline e0v0 p0@-]",
    ]
    net.deliver(1, 0)
    assert net.take_trace() == ["n0: send n1 sync_start e1 stream v1..v0"]
    net.deliver(0, 1)
    assert net.take_trace() == [
        "n1: notify_role slave e1 master n0",
        "n1: send n0 status from n1 [master e0v0 p1@n0, slave e0v0 p1@n0, offline e0v0 p0@-]",
    ]


def test_single_replica_is_always_master():
    r = Replica(Config(vgroup_id=1, replicas=(5,), self_index=0, last_version=3, last_epoch=2, epoch_history=((2, 1),),
                       promised_epoch=2, promised_master=5))
    assert no_logs(r.start()) == ["persist_promised_epoch e3 for n5", "notify_role master e3 master n5"]
    assert no_logs(r.step(AppForward(4, b"abcd"))) == ["persist_records e3v4 4B"]
    assert no_logs(r.step(WalPersisted(4))) == ["confirm_forward v4 ok", "commit_advanced v4"]


def test_all_unsynced_majority_elects():
    """docs/design.md §2.2: every replica restarted unsynced; two of three come back and elect
    a master without waiting for the third (TDengine issues 3352, 9167 needed all of them)."""
    logs = {0: [(1, 1), (1, 2)], 1: [(1, 1), (1, 2), (1, 3)], 2: [(1, 1), (1, 2), (1, 3), (1, 4)]}
    net = Net(3, logs=logs, promises={0: (1, 0), 1: (1, 0), 2: (1, 0)})
    net.nodes[2].up = False  # the replica with the longest log stays down
    net.start()
    assert net.masters() == [1]
    assert net.nodes[1].replica.promised_epoch == 2
    assert net.nodes[0].role == Role.SLAVE
    assert net.nodes[0].versions() == [(1, 1), (1, 2), (1, 3)]  # streamed the missing record


def test_master_is_highest_epoch_version_not_first_slave():
    """docs/design.md §2.2: n0 is first in the list and has the most versions, but n1 has a
    newer epoch; the master must be n1, and n0's old-epoch suffix is truncated."""
    logs = {
        0: [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6)],
        1: [(1, 1), (1, 2), (1, 3), (2, 4)],
        2: [(1, 1), (1, 2), (1, 3)],
    }
    net = Net(3, logs=logs, promises={0: (1, 0), 1: (2, 1), 2: (2, 1)})
    net.start()
    assert net.masters() == [1]
    want = [(1, 1), (1, 2), (1, 3), (2, 4)]
    assert [net.nodes[n].versions() for n in (0, 1, 2)] == [want, want, want]
    assert "n0: truncate_wal_after v3" in net.trace


def test_confirmed_write_survives_master_failure():
    """The seed's "first slave in the list" rule would make n1 master and lose v3, confirmed
    by n0 with n2's ack (quorum 2 of 3)."""
    net = elect(3)
    for v in (1, 2):
        net.forward(0, v)
    net.run()
    net.forward(0, 3)
    net.deliver(0, 2)  # only n2 gets v3
    net.settle()
    net.deliver(2, 0)  # n2's ack
    net.settle()
    assert net.confirmed_ok(0) == [1, 2, 3]
    assert net.nodes[1].versions() == [(1, 1), (1, 2)]
    net.crash(0)
    net.run()
    assert net.masters() == [2]
    assert net.nodes[2].versions()[-1] == (1, 3)
    assert net.nodes[1].versions() == [(1, 1), (1, 2), (1, 3)]


def test_deposed_master_suffix_truncated():
    """docs/design.md §4.3: a deposed master with unconfirmed records rejoins; its log ends
    at the same version as the new master's but in an older epoch, so comparing versions
    alone would keep it. It truncates after the common point and streams the rest."""
    net = elect(3)
    net.forward(0, 1)
    net.run()
    net.forward(0, 2)
    net.forward(0, 3)  # never delivered: the links break first
    net.cut(0, 1)
    net.cut(0, 2)
    assert net.nodes[0].role == Role.UNSYNCED  # lost its majority at once
    assert net.nodes[0].confirms[2] == ConfirmStatus.FAILED
    net.run()
    assert net.masters() == [1]
    for v in (2, 3):
        net.forward(1, v)
    net.run()
    assert net.nodes[1].versions() == [(1, 1), (2, 2), (2, 3)]
    assert net.nodes[0].versions() == [(1, 1), (1, 2), (1, 3)]
    net.take_trace()
    net.heal(0, 1)
    net.run()
    trace = net.take_trace()
    assert "n0: send n1 sync_request e2 have e1v3" in trace
    assert "n1: send n0 truncate_request e2 keep <=e1 <=v1" in trace
    assert "n0: truncate_wal_after v1" in trace
    assert "n0: send n1 sync_request e2 have e1v1" in trace
    assert "n1: send n0 sync_start e2 stream v2..v3" in trace
    assert "n1: stream_wal_from n0 e2 v2..v3 prev e1" in trace
    assert net.nodes[0].versions() == net.nodes[1].versions()
    assert net.nodes[0].role == Role.SLAVE


def test_truncation_uses_the_followers_own_epoch_history():
    """The master never had the follower's last epoch: the follower cuts where its own
    epochs end, not at the master's version (Kafka leader-epoch rule, docs/design.md §4.3)."""
    logs = {
        0: [(1, 1), (1, 2), (1, 3), (3, 4), (3, 5), (4, 6)],  # master of e4 (promised e5 below)
        1: [(1, 1), (2, 2), (2, 3), (2, 4), (2, 5), (2, 6), (2, 7)],  # never reached n0 or n2
        2: [(1, 1), (1, 2), (1, 3), (3, 4)],
    }
    net = Net(3, logs=logs, promises={0: (4, 0), 1: (2, 1), 2: (4, 0)})
    net.start()
    assert net.masters() == [0]
    assert "n1: truncate_wal_after v1" in net.trace  # its epoch 2 is not on the master at all
    want = net.nodes[0].versions()
    assert net.nodes[1].versions() == want and net.nodes[2].versions() == want


def test_old_epoch_forward_refused():
    """docs/design.md §2.3: after a promise of epoch 2, a forward of epoch 1 is refused."""
    r = Replica(Config(vgroup_id=1, replicas=(0, 1, 2), self_index=1, promised_epoch=2, promised_master=2))
    r.start()
    r.step(PeerConnected(0))
    out = no_logs(r.step(Received(0, Forward(1, 1, 0, 1, b"late"))))
    assert out == ["send n0 forward_ack e2 v0 stale_epoch"]
    assert r.last_version == 0 and r.stats()["counters"]["stale_forwards_refused"] == 1


def test_old_epoch_forward_refused_in_a_group():
    """The old master's pipeline reaches a slave that already adopted a newer epoch: the
    write is refused and the old master cannot confirm it."""
    net = elect(3)
    net.forward(0, 1)
    net.run()
    net.forward(0, 2)  # queued to n1 and n2, not delivered yet
    # n1 and n2 stop hearing n0 (a half-open connection): they elect n1 in epoch 2.
    net.half_close(0, 1)
    net.half_close(0, 2)
    while net.deliver(1, 2) or net.deliver(2, 1) or net.local:
        net.settle()
    assert net.nodes[1].role == Role.MASTER and net.nodes[1].replica.promised_epoch == 2
    net.take_trace()
    # n2 hears n0 again and the old pipeline arrives.
    net.half_reopen(0, 2)
    net.take_trace()
    net.deliver(0, 2, count=10)
    assert net.take_trace() == ["n2: send n0 forward_ack e2 v0 stale_epoch"]
    assert net.nodes[2].versions() == [(1, 1)]
    assert 2 not in net.nodes[0].confirms


@pytest.mark.parametrize("order", ["forward_before_announce", "announce_before_forward"])
def test_slave_ack_after_status_cannot_lose_write(order):
    """docs/design.md §2.3, the race: slave B (n2) stops hearing old master A (n0) and reports
    its status (e1v1, unsynced); candidate C (n1), cut from A, decides on it and announces.
    Then B hears A again and acks A's forward v2, which A confirms. Had C become master on
    B's reported status alone (no epoch in the agreed view), v2 would be lost. C needs B's
    promise: B either promised first (and refuses A's forward) or follows A (and never
    promises C)."""
    net = elect(3)
    net.forward(0, 1)
    net.run()
    net.cut(0, 1)  # A and C lose each other; A keeps its majority through B
    assert net.masters() == [0]
    net.half_close(0, 2)  # B stops hearing A; A notices nothing
    assert net.nodes[2].role == Role.UNSYNCED
    net.deliver(2, 1, count=10)  # C hears B's status: e1v1, unsynced
    assert net.nodes[1].replica.promised_epoch == 2  # C announced epoch 2 on B's status
    assert net.pending(1, 2)[-1] == "status from n1 [offline e0v0 p1@n0, unsynced e1v1 p2@n1, unsynced e1v1 p1@n0]"

    def b_hears_a_again():
        net.half_reopen(0, 2)
        net.tick(5, run=False)  # A's heartbeat is queued for B
        while net.deliver(0, 2, count=100) or net.deliver(2, 0, count=100) or net.local:
            net.settle()

    def a_forwards_v2():
        net.forward(0, 2)
        net.deliver(0, 2)
        net.settle()
        net.deliver(2, 0, count=10)
        net.settle()

    if order == "forward_before_announce":
        b_hears_a_again()
        assert net.nodes[2].role == Role.SLAVE
        a_forwards_v2()
        assert net.confirmed_ok(0) == [1, 2]  # B acked after reporting the status C used
        net.run()  # now B hears C's announcement: it follows A and does not promise
        assert net.nodes[2].replica.promised_epoch == 1
        assert net.masters() == [0]
        net.crash(0)
        net.run()
        assert net.masters() == [2]  # B holds v2, so B wins, not C
        assert net.nodes[1].versions() == net.nodes[2].versions() == [(1, 1), (1, 2)]
    else:
        net.deliver(1, 2, count=10)  # B adopts C's epoch 2 first
        assert net.nodes[2].replica.promised_epoch == 2
        net.half_reopen(0, 2)
        net.take_trace()
        net.forward(0, 2)  # A has not heard of the promise yet
        net.deliver(0, 2, count=10)
        assert net.take_trace() == [
            "n0: persist_records e1v2 1B",
            "n0: send n2 forward e1 v2 prev e1 rec e1 1B",
            "n2: send n0 forward_ack e2 v0 stale_epoch",
        ]
        assert net.nodes[2].versions() == [(1, 1)]
        net.deliver(2, 0, count=10)  # the refusal, then B's status with its promise
        assert net.nodes[0].role == Role.UNSYNCED
        assert net.nodes[0].confirms[2] == ConfirmStatus.FAILED  # never confirmed ok
        # Either A (better log, epoch 3) or C (epoch 2) may win now; v2 was never confirmed,
        # so keeping or dropping it is allowed. What must hold: one master, v1 everywhere.
        net.run()
        assert len(net.masters()) == 1
        net.heal(0, 1)
        net.run()
        assert len(net.masters()) == 1
        logs = [net.nodes[n].versions() for n in (0, 1, 2)]
        assert logs[0] == logs[1] == logs[2] and logs[0][0] == (1, 1)


def test_restarted_master_takes_a_new_epoch():
    """A master that crashed with records its WAL never made durable must not reuse its
    epoch: a slave may hold a record at (epoch, version) the master lost."""
    net = elect(3)
    net.nodes[0].auto_persist = False
    net.forward(0, 1)
    net.run()  # slaves persist and ack v1; n0's own WAL never does
    assert net.confirmed_ok(0) == []
    net.crash(0)
    net.run()
    assert net.masters() == [1]
    net.restart(0)
    net.run()
    assert net.nodes[0].role == Role.SLAVE
    assert net.nodes[0].versions() == [(1, 1)]
    assert net.nodes[1].replica.promised_epoch == 2


# ---------------------------------------------------------------------- failure detection


def test_master_without_majority_steps_down():
    net = elect(3, forward_timeout_ticks=100)
    net.forward(0, 1)
    net.run()
    net.nodes[1].paused = net.nodes[2].paused = True
    net.forward(0, 2)
    net.take_trace()
    net.tick(19)
    assert net.nodes[0].role == Role.MASTER
    net.take_trace()
    net.tick(1)
    trace = [t for t in net.take_trace(0) if "heartbeat" not in t]
    assert trace == [
        "n0: reset_connection n1 (silent for 2000 ms)",
        "n0: reset_connection n2 (silent for 2000 ms)",
        "n0: confirm_forward v2 failed",
        "n0: notify_role unsynced e1 master -",
    ]
    assert net.nodes[0].confirms == {1: ConfirmStatus.OK, 2: ConfirmStatus.FAILED}
    net.forward(0, 3)
    assert net.nodes[0].confirms[3] == ConfirmStatus.NOT_MASTER


def test_heartbeats_every_interval_keep_peers_online():
    net = elect(3)
    net.take_trace()
    net.tick(4)
    assert not [t for t in net.take_trace() if "heartbeat" in t]
    net.tick(1)
    beats = [t for t in net.take_trace() if "heartbeat" in t]
    assert beats[:2] == [
        "n0: send n1 heartbeat master e0v0 p1@n0",
        "n0: send n2 heartbeat master e0v0 p1@n0",
    ]
    assert len(beats) == 6
    net.tick(200)
    assert net.masters() == [0] and not [t for t in net.trace if "reset_connection" in t]


def test_paused_slave_is_reset_after_heartbeat_timeout_and_rejoins():
    net = elect(3)
    net.nodes[2].paused = True
    net.tick(20)
    assert "n0: reset_connection n2 (silent for 2000 ms)" in net.trace
    assert net.masters() == [0]
    net.nodes[2].paused = False
    net.forward(0, 1)
    net.tick(1)
    assert net.nodes[2].versions() == [(1, 1)] and net.nodes[2].role == Role.SLAVE


def test_minority_write_resets_replication():
    """seed 少数虚拟节点写入成功的问题: quorum 3, only n1 acks v1 before the timeout. The
    master resets every connection and steps down; the group re-elects and every log ends
    up equal."""
    net = elect(3, quorum=3)
    net.nodes[2].auto_persist = False  # n2 receives v1 but its WAL never becomes durable
    net.forward(0, 1)
    net.run()
    net.take_trace()
    net.tick(19)
    assert 1 not in net.nodes[0].confirms
    net.tick(1, run=False)
    assert [t for t in net.take_trace(0) if "heartbeat" not in t][:4] == [
        "n0: confirm_forward v1 timed_out",
        "n0: reset_connection n1 (minority write v1)",
        "n0: reset_connection n2 (minority write v1)",
        "n0: notify_role unsynced e1 master -",
    ]
    assert net.nodes[0].replica.stats()["counters"]["minority_resets"] == 1
    net.nodes[2].auto_persist = True
    net.persist(2)
    net.tick(1)
    assert len(net.masters()) == 1
    master = net.masters()[0]
    assert net.nodes[master].replica.promised_epoch == 2
    net.forward(master, 2)
    net.run()
    assert net.confirmed_ok(master) == [2]
    assert net.nodes[0].versions() == net.nodes[1].versions() == net.nodes[2].versions()


def test_two_replicas_arbitrator_one_master_when_link_cut():
    """docs/design.md §5: 2 replicas, both reach the arbitrator, the link between them is cut.
    TDengine's arbitrator (it only holds connections) lets both become master; here only the
    lease holder stays master, and the other takes over only after the lease expires."""
    net = Net(2, arbitrator=True)
    net.start(connect=False)
    net.arbitrator_connect(0)
    net.arbitrator_connect(1)
    net.connect_all()
    net.run()
    assert net.masters() == [0]
    net.tick(6)  # the master has asked for and holds a lease
    assert net.lease.holder(7, net.now_tick) == (0, 1)
    net.cut(0, 1)
    for _ in range(100):
        net.tick(1)
        assert net.masters() == [0]
        assert net.nodes[1].role == Role.UNSYNCED
    assert "n1: request_arbitrator_grant e2" in net.trace
    net.crash(0)
    for _ in range(60):
        net.tick(1)
        assert net.masters() in ([], [1])
    assert net.masters() == [1]
    assert net.nodes[1].replica.promised_epoch == 2


def test_two_replicas_master_without_lease_or_peer_steps_down():
    net = Net(2, arbitrator=True)
    net.start(connect=False)
    net.arbitrator_connect(0)
    net.arbitrator_connect(1)
    net.connect_all()
    net.tick(6)
    net.arbitrator_disconnect(0)  # no more renewals
    net.cut(0, 1)
    assert net.masters() == [0]  # the lease is still live
    net.tick(25)
    assert net.masters() in ([], [1]) and net.nodes[0].role == Role.UNSYNCED


# ---------------------------------------------------------------------- churn (docs/design.md §2.4)


def test_start_up_defers_to_an_election_a_peer_takes_part_in():
    """Churn (a): at start-up n1 and n2 elect n1 (n2 adopts e1@n1); n0 reaches n2 before it
    can reach n1 (its first connection attempt failed). n2's status says "promised e1 to n1,
    which I hear". n0 wins every tie by list order and used to announce e2 at once, deposing
    n1 as soon as the two met (e1 -> e2, a step-down ~100 ms after start). Now it defers."""
    net = Net(3)
    net.start(connect=False)
    net.connect(1, 2)
    net.deliver(1, 2)
    net.deliver(2, 1)  # n1 announces e1 (tie, earlier in the list)
    net.deliver(1, 2)  # n2 adopts e1 for n1
    assert net.nodes[2].promise == (1, 1)
    net.take_trace()
    net.connect(0, 2)
    net.deliver(0, 2)
    assert net.pending(2, 0)[-1] == (
        "status from n2 [unsynced e0v0 p0@-, unsynced e0v0 p1@n1, unsynced e0v0 p1@n1]"
    )
    net.take_trace()
    net.deliver(2, 0)  # n0: 2 of 3 online, best log by the tie-break... but n1's election is on
    assert net.take_trace() == []  # no persist_promised_epoch e2: nothing that could depose n1
    assert net.nodes[0].promise == (0, -1)
    assert "vg7 n0 e0: election defer e0 n1: n2 promised e1 to n1, which it hears and I do not" in " ".join(
        net.logs[-3:]
    )
    net.deliver(2, 1)  # n1 gets the promise: master of e1
    net.run()
    assert net.masters() == [1]
    net.connect(0, 1)  # the retry a second later
    net.run()
    assert net.masters() == [1]
    assert [net.nodes[n].replica.promised_epoch for n in (0, 1, 2)] == [1, 1, 1]
    assert [net.nodes[n].roles for n in (0, 1, 2)] == [["syncing", "slave"], ["master"], ["syncing", "slave"]]


def test_start_up_tie_goes_to_the_candidate_that_announced_first():
    """Churn (a), second form: n0 hears n1 itself while n1's election is on (n1 announced e1,
    n2 adopted it). On equal logs the announced candidate wins the tie, so n0 adopts e1
    instead of announcing e2 over it."""
    net = Net(3)
    net.start(connect=False)
    net.connect(1, 2)
    net.deliver(1, 2)
    net.deliver(2, 1)  # n1 announces e1
    net.connect(0, 1)
    net.deliver(1, 0)  # n0 hears n1's status on connect: p1@n1
    net.take_trace()
    net.deliver(1, 0)
    net.deliver(0, 1)
    net.run()
    assert net.masters() == [1]
    assert [net.nodes[n].replica.promised_epoch for n in (0, 1, 2)] == [1, 1, 1]
    assert "persist_promised_epoch e2" not in " ".join(net.trace)
    assert net.nodes[1].roles == ["master"]


def test_start_up_rival_candidates_of_one_epoch_the_tie_winner_waits_a_moment():
    """Churn (a), third form: n0 and n1 each announced e1 before hearing each other (n0 with
    n2's stale status, n1 with n2's adoption on its way). n0 wins the tie by list order only;
    it used to announce e2 at once and depose n1, master of e1 a moment later. It now waits
    up to heartbeat_interval_ticks for n1's result and follows it."""
    net = Net(3)
    net.start(connect=False)
    net.connect(1, 2)
    net.deliver(1, 2)
    net.deliver(2, 1)  # n1 announces e1 (its status to n2 is queued)
    net.connect(0, 2)
    net.deliver(2, 0)  # n0 hears n2 (p0, n1 unsynced p0): n0 announces e1 too
    assert net.nodes[0].promise == (1, 0)
    net.deliver(1, 2)  # n2 adopts e1 for n1 (n0's statuses still queued)
    assert net.nodes[2].promise == (1, 1)
    net.connect(0, 1)
    net.take_trace()
    net.deliver(1, 0)  # n0 hears n1: a rival for e1 with the same log
    net.deliver(1, 0)
    assert net.take_trace(0) == []  # no persist_promised_epoch e2
    assert "election defer e1 n1: n1 announced itself for e1 too: a moment for its result" in " ".join(net.logs[-3:])
    net.deliver(2, 1, count=5)  # n1 gets n2's promise: master of e1
    net.run()
    assert net.masters() == [1]
    assert [net.nodes[n].replica.promised_epoch for n in (0, 1, 2)] == [1, 1, 1]
    assert net.nodes[1].roles == ["master"]


def test_deferring_is_bounded_by_the_heartbeat_timeout():
    """§2.4: the deferral lasts at most heartbeat_timeout_ticks; if the peer's candidate does
    not show up as master by then, n0 announces as before (liveness)."""
    from vrepl.replica import Heartbeat, PeerView, Status

    r = Replica(Config(vgroup_id=7, replicas=(0, 1, 2), self_index=0))
    r.start()
    r.step(PeerConnected(2))
    blank = PeerView(Role.UNSYNCED, 0, 0, 0, -1)
    mine = PeerView(Role.UNSYNCED, 0, 0, 1, 1)
    out = r.step(Received(2, Status(2, (blank, mine, mine))))
    assert no_logs(out) == [] and r.promised_epoch == 0
    for tick in range(1, 20):
        out = r.tick()
        r.step(Received(2, Heartbeat(mine)))  # n2 stays online and keeps its promise
        assert "persist_promised_epoch" not in " ".join(no_logs(out)), tick
    out = r.tick()  # tick 20: deferred since tick 0 for heartbeat_timeout_ticks
    assert no_logs(out)[:3] == [
        "send n2 heartbeat unsynced e0v0 p0@-",
        "persist_promised_epoch e2 for n0",
        "send n2 status from n0 [unsynced e0v0 p2@n0, offline e0v0 p0@-, unsynced e0v0 p1@n1]",
    ]


def test_two_replicas_healed_cut_keeps_the_master_and_its_epoch():
    """Churn (b): 2 replicas + arbitrator, link cut then healed. The cut-off replica used to
    promise itself e2 before asking the arbitrator (refused: the master's lease is live); on
    heal the master saw that newer promise and stepped down, then re-elected itself at e3.
    Now it asks the arbitrator first and promises nothing when refused."""
    net = Net(2, arbitrator=True)
    net.start(connect=False)
    net.arbitrator_connect(0)
    net.arbitrator_connect(1)
    net.connect_all()
    net.run()
    net.tick(6)  # the master holds a lease
    assert net.masters() == [0] and net.lease.holder(7, net.now_tick) == (0, 1)
    net.take_trace()
    net.cut(0, 1)
    net.tick(40)
    trace = net.take_trace(1)
    assert "n1: request_arbitrator_grant e2" in trace
    assert not [t for t in trace if "persist_promised_epoch" in t]
    assert net.nodes[1].promise == (1, 0) and net.nodes[1].role == Role.UNSYNCED
    net.heal(0, 1)
    net.run()
    assert net.masters() == [0] and net.nodes[1].role == Role.SLAVE
    assert [net.nodes[n].replica.promised_epoch for n in (0, 1)] == [1, 1]
    assert net.nodes[0].roles == ["master"]  # never stepped down


def test_grant_first_candidate_claims_the_epoch_it_was_granted():
    """§2.4: a candidate that asked the arbitrator for e1 before promising must not promise e1
    to another candidate while it waits, and promises e1 to itself when granted, so no other
    node can be elected in e1 and be refused a lease for ever ("e1 was granted to n1"); the
    granted node then takes e1 (rule 6) rather than the group moving to e2."""
    net = Net(2, arbitrator=True)
    net.start(connect=False)
    net.arbitrator_connect(1)  # n1 alone: asks for e1 first
    assert net.take_trace(1)[-1] == "n1: request_arbitrator_grant e1"
    answer = net.local.popleft()  # the arbitrator's answer is on its way
    net.arbitrator_connect(0)
    net.connect(0, 1)
    net.deliver(1, 0)
    net.deliver(0, 1)  # n1 hears n0 (the tie-break winner), then n0 announces e1
    net.deliver(0, 1)
    net.take_trace()
    net.deliver(1, 0)
    net.deliver(0, 1)
    assert net.nodes[1].promise == (0, -1)  # waits for the arbitrator's answer
    assert net.logs[-1].startswith("vg7 n1 e0: election wait e0 n0: asked the arbitrator for e1: its answer first")
    net.step(*answer)  # granted: e1 is n1's own
    assert net.nodes[1].promise == (1, 1)
    net.run()
    net.tick(6)
    # Rule 6: n1's promise and the grant are a majority for e1 and the logs are equal, so
    # n1 takes e1 (n0, which wins the tie by list order, could never win e1: it used to
    # announce e2 over it); n0 follows the master of its promised epoch.
    assert net.masters() == [1]
    assert [net.nodes[i].replica.promised_epoch for i in (0, 1)] == [1, 1]
    assert net.nodes[0].role in (Role.SYNCING, Role.SLAVE)
    net.tick(30)
    assert net.masters() == [1] and net.lease.holder(7, net.now_tick) == (1, 1)  # renewed


# ---------------------------------------------------------------------- forwarding


def test_forward_timeout_confirms_timed_out():
    net = elect(3)
    net.nodes[1].auto_persist = net.nodes[2].auto_persist = False  # no slave ever acks
    net.forward(0, 1)
    net.run()
    net.take_trace()
    net.tick(19)
    assert 1 not in net.nodes[0].confirms
    net.tick(1)
    assert [t for t in net.take_trace(0) if "confirm" in t or "notify" in t] == ["n0: confirm_forward v1 timed_out"]
    assert net.nodes[0].role == Role.MASTER  # nobody acked: not a minority write
    assert net.nodes[0].replica.stats()["counters"]["confirmed_timed_out"] == 1


def test_pipelined_cumulative_acks():
    net = elect(3)
    net.nodes[1].auto_persist = False
    net.nodes[2].auto_persist = False
    net.take_trace()
    for v in range(1, 6):
        net.forward(0, v, b"p%d" % v)
    # Five forwards in flight to each slave before any ack.
    assert net.pending(0, 1) == [f"forward e1 v{v} prev e{1 if v > 1 else 0} rec e1 2B" for v in range(1, 6)]
    net.deliver(0, 1, count=5)
    net.take_trace()
    net.persist(1, up_to=3)
    net.settle()
    assert net.take_trace(1) == ["n1: send n0 forward_ack e1 v3 ok"]
    net.deliver(1, 0)
    assert net.take_trace(0) == ["n0: confirm_forward v1..v3 ok", "n0: commit_advanced v3"]
    net.persist(1)
    net.settle()
    net.deliver(1, 0)
    assert net.take_trace(0) == ["n0: confirm_forward v4..v5 ok", "n0: commit_advanced v5"]
    stats = net.nodes[0].replica.stats()
    assert stats["peers"][1]["acked_version"] == 5 and stats["peers"][1]["lag_versions"] == 0
    assert stats["peers"][2]["lag_versions"] == 5


def test_master_waits_for_its_own_wal_before_confirming():
    net = elect(3)
    net.nodes[0].auto_persist = False
    net.forward(0, 1)
    net.run()
    assert net.confirmed_ok(0) == []
    net.take_trace()
    net.persist(0)
    net.run()
    assert net.take_trace(0) == ["n0: confirm_forward v1 ok", "n0: commit_advanced v1"]


def test_slave_acks_only_after_wal_and_app():
    cfg = Config(vgroup_id=1, replicas=(0, 1, 2), self_index=1, promised_epoch=1, promised_master=0)
    from vrepl.replica import PeerView, Status, SyncStart

    r = Replica(cfg)
    r.start()
    r.step(PeerConnected(0))
    master_view = PeerView(Role.MASTER, 0, 0, 1, 0)
    out = no_logs(r.step(Received(0, Status(0, (master_view, r.view(), PeerView(Role.OFFLINE, 0, 0, 0, -1))))))
    assert out[:2] == ["notify_role syncing e1 master n0", "send n0 sync_request e1 have e0v0"]
    assert no_logs(r.step(Received(0, SyncStart(1, 1, 0)))) == [
        "notify_role slave e1 master n0",
        "send n0 status from n1 [master e0v0 p1@n0, slave e0v0 p1@n0, offline e0v0 p0@-]",
    ]
    assert no_logs(r.step(Received(0, Forward(1, 1, 0, 1, b"abc")))) == [
        "persist_records e1v1 3B",
        "write_to_cache e1v1 3B",
    ]
    assert no_logs(r.step(WalPersisted(1))) == []  # quorum 2 > 1: the app must ack too
    assert no_logs(r.step(AppAcked(1))) == ["send n0 forward_ack e1 v1 ok"]
    assert no_logs(r.step(Received(0, Forward(1, 1, 0, 1, b"abc")))) == []  # duplicate


def test_slave_rejects_a_forward_that_does_not_extend_its_log():
    """The prev_epoch check keeps a slave's log a prefix of the master's (docs/design.md §4.2)."""
    net = elect(3)
    net.forward(0, 1)
    net.run()
    r = net.nodes[1].replica
    net.take_trace()
    net.execute(1, r.step(Received(0, Forward(1, 2, 7, 1, b"bad"))))  # claims v1 was epoch 7
    assert net.take_trace(1)[:2] == ["n1: notify_role syncing e1 master n0", "n1: send n0 sync_request e1 have e1v1"]
    assert r.last_version == 1


def test_out_of_order_forwards_are_cached_until_the_gap_fills():
    net = elect(3)
    r = net.nodes[1].replica
    net.take_trace()
    net.execute(1, r.step(Received(0, Forward(1, 2, 1, 1, b"b"))))
    assert net.take_trace(1) == [
        "n1: notify_role syncing e1 master n0",
        "n1: send n0 status from n1 [master e0v0 p1@n0, syncing e0v0 p1@n0, slave e0v0 p1@n0]",
        "n1: send n2 status from n1 [master e0v0 p1@n0, syncing e0v0 p1@n0, slave e0v0 p1@n0]",
    ]
    net.execute(1, r.step(Received(0, Forward(1, 1, 0, 1, b"a"))))
    assert net.take_trace(1)[:3] == [
        "n1: persist_records e1v1..e1v2 (2 records)",
        "n1: write_to_cache e1v1 1B",
        "n1: write_to_cache e1v2 1B",
    ]
    assert r.role == Role.SLAVE


def test_sync_cache_limit_forces_a_resync():
    net = elect(3, sync_cache_max_records=2)
    r = net.nodes[1].replica
    for v in (3, 4):
        net.execute(1, r.step(Received(0, Forward(1, v, 1, 1, b"x"))))
    net.take_trace()
    net.execute(1, r.step(Received(0, Forward(1, 5, 1, 1, b"x"))))
    assert "n1: send n0 sync_request e1 have e0v0" in net.take_trace(1)
    assert r.stats()["sync_cache_records"] == 0


def test_flow_control_when_a_slave_lags():
    net = elect(3, flow_control_lag_versions=4, forward_timeout_ticks=1000)
    net.nodes[2].paused = True
    net.take_trace()
    for v in range(1, 6):
        net.forward(0, v)
        net.run()
    assert "n0: flow_control 1" in net.take_trace(0)
    net.nodes[2].paused = False
    net.run()
    assert "n0: flow_control 0" in net.take_trace(0)


def test_inflight_limit_refuses_without_consuming_the_version():
    net = elect(3, max_inflight_forwards=2)
    net.nodes[1].auto_persist = net.nodes[2].auto_persist = False
    net.forward(0, 1)
    net.forward(0, 2)
    net.forward(0, 3)
    assert net.nodes[0].confirms == {3: ConfirmStatus.FAILED}
    assert net.nodes[0].replica.last_version == 2
    net.forward(0, 4)  # out of order: refused too
    assert net.nodes[0].confirms[4] == ConfirmStatus.FAILED


def test_not_master_forward_is_refused():
    net = elect(3)
    net.forward(1, 1)
    assert net.nodes[1].confirms == {1: ConfirmStatus.NOT_MASTER}


def test_stale_ack_from_old_epoch_is_ignored():
    net = elect(3)
    r = net.nodes[0].replica
    net.forward(0, 1)
    net.take_trace()
    net.execute(0, r.step(Received(1, ForwardAck(0, 1, 0))))
    assert net.take_trace(0) == []


def test_replica_describe_and_stats():
    net = elect(3)
    net.forward(0, 1)
    net.run()
    assert net.nodes[0].replica.describe() == "vg7 n0 master e1 log e1v1 durable v1 n1:slave n2:slave"
    stats = net.nodes[0].replica.stats()
    assert stats["counters"]["forwards_sent"] == 2 and stats["counters"]["confirmed_ok"] == 1
    assert stats["peers"][1]["forwards"] == 1 and stats["peers"][1]["forward_bytes"] == 1


def test_every_log_line_names_vgroup_node_and_epoch():
    net = elect(3)
    net.forward(0, 1)
    net.run()
    assert net.logs and all(line.startswith("vg7 n") and " e" in line.split(":")[0] for line in net.logs)
