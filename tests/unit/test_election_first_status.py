"""The start-up race of docs/design.md §2.4 rule 5, scripted on real `Replica` objects.

Seen live once in about 100 fresh 3-replica groups of `vrepl node` processes: n1 and n2
announced e1 within the same millisecond. n2 had n1's connection but not yet its first
status, so it counted n1 as offline, saw itself and n3 (a majority), won the tie by list
order against n3 and announced; n1 did the same with n3. n1 then won at e2 and the group's
first master stepped down. With the rule, n2 holds its announcement (for at most
`heartbeat_interval_ticks`) until a connected peer's first status is in.
"""

from __future__ import annotations

from vrepl.replica import Config, PeerConnected, PersistPromisedEpoch, Received, Replica, Role


def fresh(node: int) -> Replica:
    r = Replica(Config(vgroup_id=1, replicas=(1, 2, 3), self_index=node - 1))
    r.start()
    return r


def promises(actions) -> list[tuple[int, int]]:
    return [(a.epoch, a.master) for a in actions if isinstance(a, PersistPromisedEpoch)]


def test_a_connected_peer_whose_status_is_not_in_holds_the_announcement():
    n1, n2, n3 = fresh(1), fresh(2), fresh(3)
    # n1 reached n3 first and announced e1 for itself.
    n1.step(PeerConnected(3))
    n3.step(PeerConnected(1))
    n3.step(Received(1, n1.elector.status()))
    acts = n1.step(Received(3, n3.elector.status()))
    assert promises(acts) == [(1, 1)]
    # n2's connection to n1 came up, then n3's status (sent before n3 heard n1's announcement).
    n2.step(PeerConnected(1))
    n2.step(PeerConnected(3))
    stale = fresh(3)
    stale.step(PeerConnected(2))
    acts = n2.step(Received(3, stale.elector.status()))
    # Two of three heard (n2, n3), logs equal, n2 first in the list: it used to announce e1 here.
    assert promises(acts) == []
    assert n2.promised_epoch == 0
    assert "n1 connected, its first status not here yet" in n2.elector.last_decision
    # n1's status arrives: n2 adopts n1's e1 instead of contesting it.
    acts = n2.step(Received(1, n1.elector.status()))
    assert promises(acts) == [(1, 1)]
    # n1 counts n2's promise and its own: master at e1, n2 follows it there.
    n1.step(PeerConnected(2))
    n1.step(Received(2, n2.elector.status()))
    assert (n1.role, n1.promised_epoch) == (Role.MASTER, 1)
    n2.step(Received(1, n1.elector.status()))
    assert (n2.role, n2.master, n2.promised_epoch) == (Role.SYNCING, 1, 1)


def test_the_hold_ends_after_a_heartbeat_interval_without_the_status():
    n2, n3 = fresh(2), fresh(3)
    n2.step(PeerConnected(1))  # connected, then silent (a paused process)
    n2.step(PeerConnected(3))
    n3.step(PeerConnected(2))
    n2.step(Received(3, n3.elector.status()))
    assert n2.promised_epoch == 0
    announced_at = None
    for tick in range(1, 3 * n2.cfg.heartbeat_interval_ticks):
        n2.step(Received(3, n3.elector.status()))  # n3 stays heard
        if promises(n2.tick()) and announced_at is None:
            announced_at = tick
    # Bounded: it announces e1 once the hold has lasted heartbeat_interval_ticks.
    assert announced_at == n2.cfg.heartbeat_interval_ticks, announced_at
    assert (n2.promised_epoch, n2.promised_master) == (1, 2)
