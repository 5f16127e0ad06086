"""Pure election rules as tables (docs/design.md §2): views in, decision out.

Each row: replica count via the views, this node's index, views as compact strings
"<role> e<last_epoch>v<last_version> p<promised_epoch>@<promised_master>", which replicas are
online, arbitrator inputs -> expected verdict, epoch and master.
"""

from __future__ import annotations

import re

import pytest

from vrepl.replica.election import (
    Decision,
    ElectionInput,
    Verdict,
    decide,
    is_majority,
    next_epoch,
    pick_candidate,
)
from vrepl.replica.messages import NO_NODE, PeerView, Role

ROLES = {"M": Role.MASTER, "S": Role.SLAVE, "U": Role.UNSYNCED, "Y": Role.SYNCING, "O": Role.OFFLINE}
VIEW = re.compile(r"^([MSUYO]) e(\d+)v(\d+) p(\d+)@(-|\d+)$")


def view(text: str) -> PeerView:
    m = VIEW.match(text)
    assert m, text
    role, le, lv, pe, pm = m.groups()
    return PeerView(ROLES[role], int(le), int(lv), int(pe), NO_NODE if pm == "-" else int(pm))


def inp(me: int, views: list[str], online: str, arb: str = "") -> ElectionInput:
    """online: one char per replica, '1' online; arb: '' none, 'c' connected, 'cN' connected
    with a live grant for epoch N, 'gN' grant without connection."""
    grant = int(re.sub(r"\D", "", arb) or 0)
    return ElectionInput(
        nodes=tuple(range(len(views))),
        self_index=me,
        views=tuple(view(v) for v in views),
        online=tuple(c == "1" for c in online),
        arbitrator_used=bool(arb),
        arbitrator_connected="c" in arb,
        grant_epoch=grant,
    )


V = Verdict
ROWS = [
    # --- seed rule 1: one replica is always master
    ("single_unsynced_becomes_master", 0, ["U e0v0 p0@-"], "1", "", V.BECOME_MASTER, 1, 0),
    ("single_restart_takes_new_epoch", 0, ["U e3v9 p3@0"], "1", "", V.BECOME_MASTER, 4, 0),
    ("single_master_stays", 0, ["M e3v9 p4@0"], "1", "", V.STAY_MASTER, 4, 0),
    # --- fewer than a majority online -> unsynced
    ("alone_of_three_unsynced", 0, ["U e1v5 p1@0", "O e1v5 p1@0", "O e1v5 p1@0"], "100", "", V.UNSYNCED, 1, NO_NODE),
    ("two_of_two_needed_without_arbitrator", 0, ["U e1v5 p1@0", "O e1v5 p1@0"], "10", "", V.UNSYNCED, 1, NO_NODE),
    ("half_of_four_is_not_a_majority", 0, ["U e1v5 p1@0", "U e1v5 p1@0", "O e0v0 p0@-", "O e0v0 p0@-"], "1100", "", V.UNSYNCED, 1, NO_NODE),
    # --- a majority is enough even when every replica is unsynced (TDengine needed all)
    ("all_unsynced_majority_announces", 0, ["U e1v5 p1@0", "U e1v4 p1@0", "O e1v9 p1@0"], "110", "", V.ANNOUNCE, 2, 0),
    ("all_unsynced_majority_waits_for_better", 1, ["U e1v5 p1@0", "U e1v4 p1@0", "O e1v9 p1@0"], "110", "", V.WAIT, 1, 0),
    # --- the candidate: highest (epoch, version), ties by list order, never role or position first
    ("epoch_beats_version_and_slave_role", 0, ["S e1v10 p1@0", "U e2v4 p2@1", "O e0v0 p0@-"], "110", "", V.ADOPT, 2, 1),
    ("epoch_beats_version_candidate_announces", 1, ["U e1v10 p1@0", "U e2v4 p2@1", "O e0v0 p0@-"], "110", "", V.ANNOUNCE, 3, 1),
    ("tie_goes_to_list_order", 1, ["U e2v7 p2@0", "U e2v7 p2@0", "U e1v1 p2@0"], "111", "", V.WAIT, 2, 0),
    ("offline_better_log_is_ignored", 1, ["O e9v99 p9@0", "U e2v7 p9@0", "U e2v6 p9@0"], "011", "", V.ANNOUNCE, 10, 1),
    # --- adopting the candidate's epoch
    ("adopt_when_my_view_picks_the_candidate", 1, ["U e2v7 p5@0", "U e2v6 p2@0", "U e2v6 p2@0"], "111", "", V.ADOPT, 5, 0),
    ("no_adopt_when_my_log_is_better", 1, ["U e2v7 p5@0", "U e2v8 p2@0", "U e2v6 p2@0"], "111", "", V.ANNOUNCE, 6, 1),
    ("no_adopt_of_an_epoch_not_newer_than_my_promise", 1, ["U e2v7 p5@0", "U e2v6 p5@2", "U e2v6 p5@2"], "111", "", V.WAIT, 5, 0),
    ("adopted_waits_for_candidate", 1, ["U e2v7 p5@0", "U e2v6 p5@0", "U e2v6 p2@0"], "111", "", V.WAIT, 5, 0),
    # --- the candidate counts promises for its epoch
    ("candidate_with_majority_of_promises_becomes_master", 0, ["U e2v7 p5@0", "U e2v6 p5@0", "U e2v6 p2@0"], "111", "", V.BECOME_MASTER, 5, 0),
    ("candidate_with_own_promise_only_waits", 0, ["U e2v7 p5@0", "U e2v6 p2@0", "U e2v6 p2@0"], "111", "", V.WAIT, 5, 0),
    ("offline_promise_does_not_count", 0, ["U e2v7 p5@0", "O e2v6 p5@0", "U e2v6 p2@0"], "101", "", V.WAIT, 5, 0),
    ("same_epoch_promised_elsewhere_forces_a_new_epoch", 0, ["U e2v7 p5@0", "U e2v6 p5@2", "U e2v6 p2@0"], "111", "", V.ANNOUNCE, 6, 0),
    ("newer_promise_seen_forces_a_new_epoch", 0, ["U e2v7 p5@0", "U e2v6 p7@2", "U e2v6 p2@0"], "111", "", V.ANNOUNCE, 8, 0),
    ("epoch_already_used_by_records_is_not_reused", 0, ["U e5v7 p5@0", "U e2v6 p5@0", "U e2v6 p5@0"], "111", "", V.ANNOUNCE, 6, 0),
    # --- following an online master
    ("follow_online_master", 1, ["M e2v7 p5@0", "U e2v6 p5@0", "U e2v6 p5@0"], "111", "", V.FOLLOW, 5, 0),
    ("follow_master_of_newer_epoch", 1, ["M e2v7 p5@0", "U e2v9 p3@1", "U e2v6 p5@0"], "111", "", V.FOLLOW, 5, 0),
    ("no_follow_of_master_older_than_my_promise", 1, ["M e2v7 p5@0", "U e2v6 p6@2", "U e2v8 p6@2"], "111", "", V.WAIT, 6, NO_NODE),
    ("offline_master_is_not_followed", 1, ["M e2v7 p5@0", "S e2v7 p5@0", "U e2v6 p5@0"], "011", "", V.ANNOUNCE, 6, 1),
    # --- seed "decide only when views agree": a peer still reporting slave has a stale log end
    ("peer_still_slave_means_wait", 1, ["M e2v7 p5@0", "U e2v7 p5@0", "S e2v6 p5@0"], "011", "", V.WAIT, 5, NO_NODE),
    ("peer_still_syncing_means_no_adopt", 2, ["O e2v7 p5@0", "U e2v9 p6@1", "U e2v6 p5@0", "Y e2v6 p5@0"], "0111", "", V.WAIT, 5, NO_NODE),
    # --- a master keeps its role only with a majority and no newer promise
    ("master_with_majority_stays", 0, ["M e5v7 p5@0", "S e5v7 p5@0", "O e5v7 p5@0"], "110", "", V.STAY_MASTER, 5, 0),
    ("master_without_majority_steps_down", 0, ["M e5v7 p5@0", "O e5v7 p5@0", "O e5v7 p5@0"], "100", "", V.STEP_DOWN, 5, NO_NODE),
    ("master_seeing_newer_promise_steps_down", 0, ["M e5v7 p5@0", "U e5v7 p6@2", "S e5v7 p5@0"], "111", "", V.STEP_DOWN, 5, NO_NODE),
    # --- even replica counts with an arbitrator (majority of n + 1)
    ("two_replicas_master_with_lease_stays", 0, ["M e1v3 p1@0", "O e1v3 p1@0"], "10", "c1", V.STAY_MASTER, 1, 0),
    ("two_replicas_master_connection_without_lease_steps_down", 0, ["M e1v3 p1@0", "O e1v3 p1@0"], "10", "c", V.STEP_DOWN, 1, NO_NODE),
    ("two_replicas_lease_of_old_epoch_does_not_count", 0, ["M e1v3 p2@0", "O e1v3 p1@0"], "10", "c1", V.STEP_DOWN, 2, NO_NODE),
    ("two_replicas_arbitrator_connection_counts_online", 1, ["O e1v3 p1@0", "U e1v3 p1@0"], "01", "c", V.ANNOUNCE, 2, 1),
    ("two_replicas_candidate_asks_arbitrator", 1, ["O e1v3 p1@0", "U e1v3 p2@1"], "01", "c", V.REQUEST_GRANT, 2, 1),
    ("two_replicas_candidate_with_grant_becomes_master", 1, ["O e1v3 p1@0", "U e1v3 p2@1"], "01", "c2", V.BECOME_MASTER, 2, 1),
    ("two_replicas_both_promise_without_arbitrator_grant", 0, ["U e1v3 p2@0", "U e1v3 p2@0"], "11", "c", V.BECOME_MASTER, 2, 0),
    ("two_replicas_no_arbitrator_connection_unsynced", 1, ["O e1v3 p1@0", "U e1v3 p1@0"], "01", "g1", V.UNSYNCED, 1, NO_NODE),
    ("four_replicas_two_plus_arbitrator_is_majority", 1, ["O e1v3 p1@0", "U e1v3 p1@0", "U e1v2 p1@0", "O e1v3 p1@0"], "0110", "c", V.ANNOUNCE, 2, 1),
]


@pytest.mark.parametrize(
    "me,views,online,arb,verdict,epoch,master",
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_decide(me, views, online, arb, verdict, epoch, master):
    d = decide(inp(me, views, online, arb))
    assert (d.verdict, d.epoch, d.master) == (verdict, epoch, master), d.describe()


@pytest.mark.parametrize(
    "votes,n,arbitrator,expected",
    [(1, 1, False, True), (1, 2, False, False), (2, 2, False, True), (2, 2, True, True), (1, 2, True, False),
     (2, 3, False, True), (1, 3, False, False), (2, 4, False, False), (3, 4, True, True), (2, 4, True, False),
     (3, 5, False, True), (2, 5, False, False)],
)
def test_is_majority(votes, n, arbitrator, expected):
    assert is_majority(votes, n, arbitrator) is expected


@pytest.mark.parametrize(
    "views,online,expected",
    [
        (["U e1v9 p1@0", "U e2v1 p2@1"], "11", 1),  # epoch first
        (["U e2v9 p2@0", "U e2v9 p2@1"], "11", 0),  # tie: list order
        (["U e2v9 p2@0", "U e2v1 p2@1"], "01", 1),  # offline never picked
        (["S e1v3 p1@0", "U e1v4 p1@1", "M e1v2 p1@1"], "111", 1),  # role never counts
    ],
)
def test_pick_candidate(views, online, expected):
    assert pick_candidate(tuple(view(v) for v in views), tuple(c == "1" for c in online)) == expected


def test_next_epoch_is_above_every_promise_seen_even_offline():
    assert next_epoch((view("U e1v1 p3@0"), view("O e1v1 p7@1"), view("U e0v0 p0@-"))) == 8


def test_decision_describe_is_one_line():
    d = Decision(Verdict.FOLLOW, 4, 2, "online master")
    assert d.describe() == "follow e4 n2: online master"
