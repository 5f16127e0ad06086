"""The 2-replica start-up race of docs/design.md §2.4 rule 6, scripted on real `Replica`
objects (the form seen live in `test_election_churn.py`: the group's first master elected at
e2 instead of e1).

n2 started, heard no peer and asked the arbitrator for e1 (rule 4). Before the answer its
link to n1 came up; n1, hearing both replicas and no arbitrator needed, promised e1 to
itself. The grant then gave n2 e1 as well. n1 wins the tie by list order but can never win
e1 (n2's promise and the arbitrator's vote are taken): it used to announce e2 over it.
"""

from __future__ import annotations

from vrepl.replica import Config, PeerConnected, PersistPromisedEpoch, Received, Replica, Role
from vrepl.replica.actions import RequestArbitratorGrant
from vrepl.replica.events import ArbitratorConnected, ArbitratorGranted, ArbitratorRefused


def fresh(node: int) -> Replica:
    r = Replica(Config(vgroup_id=1, replicas=(1, 2), self_index=node - 1, arbitrator=True))
    r.start()
    return r


def promises(actions) -> list[tuple[int, int]]:
    return [(a.epoch, a.master) for a in actions if isinstance(a, PersistPromisedEpoch)]


def race() -> tuple[Replica, Replica]:
    """The race up to n2's grant; returns (n1, n2) after it."""
    n1, n2 = fresh(1), fresh(2)
    acts = n2.step(ArbitratorConnected())
    assert [a.epoch for a in acts if isinstance(a, RequestArbitratorGrant)] == [1]
    n1.step(PeerConnected(2))
    n2.step(PeerConnected(1))
    acts = n1.step(Received(2, n2.elector.status()))
    assert promises(acts) == [(1, 1)]                        # n1 hears both: it announces e1
    acts = n2.step(Received(1, n1.elector.status()))
    assert promises(acts) == []                              # n2 waits for its answer
    assert "asked the arbitrator for e1: its answer first" in n2.elector.last_decision
    acts = n2.step(ArbitratorGranted(1))
    assert promises(acts) == [(1, 2)]                        # the grant's vote and its own
    return n1, n2


def test_the_granted_node_takes_e1_and_the_tie_winner_follows_it():
    n1, n2 = race()
    assert (n2.role, n2.promised_epoch) == (Role.MASTER, 1)
    n1.step(ArbitratorConnected())
    acts = n1.step(Received(2, n2.elector.status()))
    assert promises(acts) == []                              # no e2 over the master
    assert (n1.role, n1.master, n1.promised_epoch) == (Role.SYNCING, 2, 1)
    n2.step(Received(1, n1.elector.status()))
    for _ in range(3 * n1.cfg.heartbeat_interval_ticks):     # statuses keep flowing
        assert promises(n1.tick()) == [] and promises(n2.tick()) == []
        n1.step(Received(2, n2.elector.status()))
        n2.step(Received(1, n1.elector.status()))
    assert (n2.role, n2.promised_epoch) == (Role.MASTER, 1)
    assert (n1.master, n1.promised_epoch) == (2, 1)


def test_a_refused_node_takes_nothing():
    n1, n2 = fresh(1), fresh(2)
    n2.step(ArbitratorConnected())
    n1.step(PeerConnected(2))
    n2.step(PeerConnected(1))
    n1.step(Received(2, n2.elector.status()))
    n2.step(Received(1, n1.elector.status()))
    acts = n2.step(ArbitratorRefused(1))
    assert promises(acts) == [(1, 1)]                        # it adopts n1's e1 after the refusal
    assert n2.role != Role.MASTER
