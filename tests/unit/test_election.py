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
    # The arbitrator connection counts as online (no UNSYNCED); a candidate that cannot win
    # without the arbitrator asks for its vote BEFORE it promises itself a new epoch, so a
    # refusal (the master's lease is live across a cut link) leaves no promise that would
    # depose that master when the link heals (docs/design.md §2.4, churn b).
    ("two_replicas_arbitrator_connection_counts_online", 1, ["O e1v3 p1@0", "U e1v3 p1@0"], "01", "c", V.REQUEST_GRANT, 2, 1),
    ("two_replicas_grant_first_then_announce", 1, ["O e1v3 p1@0", "U e1v3 p1@0"], "01", "c2", V.ANNOUNCE, 2, 1),
    ("two_replicas_grant_for_an_older_epoch_is_no_vote", 1, ["O e1v3 p2@0", "U e1v3 p1@0"], "01", "c2", V.REQUEST_GRANT, 3, 1),
    ("two_replicas_both_online_announce_without_arbitrator", 0, ["U e1v3 p1@0", "U e1v3 p1@0"], "11", "c", V.ANNOUNCE, 2, 0),
    ("two_replicas_candidate_asks_arbitrator", 1, ["O e1v3 p1@0", "U e1v3 p2@1"], "01", "c", V.REQUEST_GRANT, 2, 1),
    ("two_replicas_candidate_with_grant_becomes_master", 1, ["O e1v3 p1@0", "U e1v3 p2@1"], "01", "c2", V.BECOME_MASTER, 2, 1),
    ("two_replicas_both_promise_without_arbitrator_grant", 0, ["U e1v3 p2@0", "U e1v3 p2@0"], "11", "c", V.BECOME_MASTER, 2, 0),
    ("two_replicas_no_arbitrator_connection_unsynced", 1, ["O e1v3 p1@0", "U e1v3 p1@0"], "01", "g1", V.UNSYNCED, 1, NO_NODE),
    # Rule 6 (§2.4): a node holding the arbitrator's grant for its own promise, with a log
    # equal to the tie winner's, takes that epoch; with a better log on the winner it waits.
    ("two_replicas_granted_tie_loser_becomes_master", 1, ["U e0v0 p1@0", "U e0v0 p1@1"], "11", "c1", V.BECOME_MASTER, 1, 1),
    ("two_replicas_granted_node_with_older_log_waits", 1, ["U e1v4 p2@0", "U e1v3 p2@1"], "11", "c2", V.WAIT, 2, 0),
    ("two_replicas_granted_node_seeing_newer_promise_waits", 1, ["U e0v0 p2@0", "U e0v0 p1@1"], "11", "c1", V.ADOPT, 2, 0),
    # Rule 7 (§2.4): a candidate whose own promise a majority holds becomes master although
    # another node promised that epoch to itself (it can never win it); not past a newer
    # promise. Rule 6 without an arbitrator: the tie loser holding a majority takes it.
    ("candidate_with_majority_despite_a_rival_own_promise", 0, ["U e0v0 p1@0", "U e0v0 p1@0", "U e0v0 p1@2"], "111", "", V.BECOME_MASTER, 1, 0),
    ("majority_of_an_older_epoch_adopts_a_newer_announcement", 0, ["U e0v0 p1@0", "U e0v0 p1@0", "U e0v0 p2@2"], "111", "", V.ADOPT, 2, 2),
    ("four_replicas_majority_with_a_rival_own_promise", 0, ["U e0v0 p1@0", "U e0v0 p1@1", "U e0v0 p1@0", "U e0v0 p1@0"], "1111", "c", V.BECOME_MASTER, 1, 0),
    ("tie_loser_holding_a_majority_becomes_master", 1, ["U e0v0 p1@0", "U e0v0 p1@1", "U e0v0 p1@1"], "111", "", V.BECOME_MASTER, 1, 1),
    ("tie_loser_with_own_promise_only_waits", 1, ["U e0v0 p1@0", "U e0v0 p1@1", "U e0v0 p0@-"], "111", "", V.WAIT, 1, 0),
    ("four_replicas_two_plus_arbitrator_is_majority", 1, ["O e1v3 p1@0", "U e1v3 p1@0", "U e1v2 p1@0", "O e1v3 p1@0"], "0110", "c", V.REQUEST_GRANT, 2, 1),
    ("four_replicas_two_plus_grant_announce", 1, ["O e1v3 p1@0", "U e1v3 p1@0", "U e1v2 p1@0", "O e1v3 p1@0"], "0110", "c2", V.ANNOUNCE, 2, 1),
    ("four_replicas_three_online_announce_first", 1, ["O e1v3 p1@0", "U e1v3 p1@0", "U e1v2 p1@0", "U e1v3 p1@0"], "0111", "c", V.ANNOUNCE, 2, 1),
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
        (["U e2v9 p2@1", "U e2v9 p3@1", "U e2v9 p4@2"], "111", 2),  # tie: announced itself (§2.4)
        (["U e2v9 p2@1", "U e2v9 p3@1", "U e2v9 p3@2"], "111", 1),  # ... same epoch: list order
        (["U e2v9 p4@0", "U e2v9 p3@1", "U e2v9 p3@2"], "111", 0),  # ... for the newest epoch
        (["U e2v9 p2@1", "U e2v9 p5@2", "U e2v9 p3@2"], "111", 2),  # a promise to another is no claim
        (["U e2v9 p2@1", "U e2v8 p9@1", "U e2v9 p0@-"], "111", 0),  # never over a better log
    ],
)
def test_pick_candidate(views, online, expected):
    assert pick_candidate(tuple(view(v) for v in views), tuple(c == "1" for c in online)) == expected


def test_next_epoch_is_above_every_promise_seen_even_offline():
    assert next_epoch((view("U e1v1 p3@0"), view("O e1v1 p7@1"), view("U e0v0 p0@-"))) == 8


def test_decision_describe_is_one_line():
    d = Decision(Verdict.FOLLOW, 4, 2, "online master")
    assert d.describe() == "follow e4 n2: online master"


# --- §2.4: a candidate defers to a peer's promise for a candidate that peer still hears
# (churn a: at start-up n0 heard n2's status "promised e1 to n1" before it could reach n1,
# announced e2 and deposed n1, the master of e1, as soon as the two met).
DEFER_ROWS = [
    # name, my views, online, the report of replica 2 (its status views), defer_allowed -> verdict, epoch, master
    ("startup_peer_promised_to_a_candidate_it_hears",
     ["U e0v0 p0@-", "O e0v0 p0@-", "U e0v0 p1@1"], "101", ["U e0v0 p0@-", "U e0v0 p1@1", "U e0v0 p1@1"], True,
     V.DEFER, 0, 1),
    ("the_peer_reports_the_candidate_offline",
     ["U e0v0 p0@-", "O e0v0 p0@-", "U e0v0 p1@1"], "101", ["U e0v0 p0@-", "O e0v0 p1@1", "U e0v0 p1@1"], True,
     V.ANNOUNCE, 2, 0),
    ("deferred_for_a_heartbeat_timeout_announces",
     ["U e0v0 p0@-", "O e0v0 p0@-", "U e0v0 p1@1"], "101", ["U e0v0 p0@-", "U e0v0 p1@1", "U e0v0 p1@1"], False,
     V.ANNOUNCE, 2, 0),
    ("no_status_from_the_peer_yet",
     ["U e0v0 p0@-", "O e0v0 p0@-", "U e0v0 p1@1"], "101", None, True,
     V.ANNOUNCE, 2, 0),
    ("a_newer_promise_was_seen_elsewhere",
     ["U e3v5 p3@1", "O e3v5 p4@1", "U e3v5 p3@1"], "101", ["U e3v5 p3@1", "U e3v5 p3@1", "U e3v5 p3@1"], True,
     V.ANNOUNCE, 5, 0),
    # A candidate I hear is judged by the usual rules: on equal logs the one that announced
    # itself first wins the tie (pick_candidate), so I adopt its epoch instead of deposing it.
    ("a_candidate_I_hear_who_announced_wins_the_tie",
     ["U e0v0 p0@-", "U e0v0 p1@1", "U e0v0 p1@1"], "111", ["U e0v0 p0@-", "U e0v0 p1@1", "U e0v0 p1@1"], True,
     V.ADOPT, 1, 1),
    ("a_peer_announced_for_itself",
     ["U e0v0 p0@-", "O e0v0 p0@-", "U e0v0 p1@2"], "101", ["U e0v0 p0@-", "U e0v0 p0@-", "U e0v0 p1@2"], True,
     V.ADOPT, 1, 2),
    ("a_better_log_still_beats_an_announced_candidate",
     ["U e0v1 p0@-", "O e0v0 p0@-", "U e0v0 p1@2"], "101", ["U e0v0 p0@-", "U e0v0 p0@-", "U e0v0 p1@2"], True,
     V.ANNOUNCE, 2, 0),
    ("a_promise_to_me_is_mine_to_use",
     ["U e2v0 p3@0", "O e0v0 p0@-", "U e0v0 p3@0"], "101", ["U e2v0 p3@0", "U e0v0 p0@-", "U e0v0 p3@0"], True,
     V.BECOME_MASTER, 3, 0),
]


@pytest.mark.parametrize(
    "views,online,report,allowed,verdict,epoch,master",
    [row[1:] for row in DEFER_ROWS],
    ids=[row[0] for row in DEFER_ROWS],
)
def test_decide_defers_to_an_election_in_progress(views, online, report, allowed, verdict, epoch, master):
    base = inp(0, views, online)
    reports = (None, None, None if report is None else tuple(view(v) for v in report))
    d = decide(ElectionInput(**{**{f: getattr(base, f) for f in base.__dataclass_fields__},
                                "reports": reports, "defer_allowed": allowed}))
    assert (d.verdict, d.epoch, d.master) == (verdict, epoch, master), d.describe()
    if verdict is V.DEFER:
        assert d.describe() == "defer e0 n1: n2 promised e1 to n1, which it hears and I do not"


# --- §2.4: a rival with my log announced itself for the same newest epoch (both before
# hearing each other; I win the tie by list order only): a short wait for its result.
@pytest.mark.parametrize(
    "views,allowed,verdict,epoch,master",
    [
        (["U e0v0 p1@0", "U e0v0 p1@1", "U e0v0 p0@-"], True, V.DEFER, 1, 1),
        (["U e0v0 p1@0", "U e0v0 p1@1", "U e0v0 p0@-"], False, V.ANNOUNCE, 2, 0),  # waited long enough
        (["U e0v1 p1@0", "U e0v0 p1@1", "U e0v0 p0@-"], True, V.ANNOUNCE, 2, 0),  # my log is better
        (["U e0v0 p1@0", "U e0v0 p1@2", "U e0v0 p0@-"], True, V.ANNOUNCE, 2, 0),  # a promise to another is no rival
    ],
)
def test_decide_gives_a_rival_candidate_a_moment(views, allowed, verdict, epoch, master):
    base = inp(0, views, "111")
    d = decide(ElectionInput(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, "contest_allowed": allowed}))
    assert (d.verdict, d.epoch, d.master) == (verdict, epoch, master), d.describe()
    if verdict is V.DEFER:
        assert d.describe() == "defer e1 n1: n1 announced itself for e1 too: a moment for its result"


# --- §2.4 rule 5: a peer that connected and whose first status has not arrived may have
# announced itself already (fresh groups: n0 and n1 started together, n1 connected to n0 but
# heard only n2, and both announced e1). Views as node 1 sees them, n0 connected, unheard.
@pytest.mark.parametrize(
    "views,online,unheard,allowed,verdict,epoch,master",
    [
        (["U e0v0 p0@-", "U e0v0 p0@-", "U e0v0 p0@-"], "011", "100", True, V.DEFER, 0, 0),
        (["U e0v0 p0@-", "U e0v0 p0@-", "U e0v0 p0@-"], "011", "100", False, V.ANNOUNCE, 1, 1),  # waited long enough
        (["U e0v0 p0@-", "U e0v0 p0@-", "U e0v0 p0@-"], "011", "000", True, V.ANNOUNCE, 1, 1),  # nobody unheard
        (["U e0v0 p0@-", "U e0v0 p0@-", "U e0v0 p0@-"], "011", None, True, V.ANNOUNCE, 1, 1),  # caller without the knowledge
        # the hold is for announcing only: an online master is followed, a candidate's epoch adopted
        (["U e0v0 p0@-", "U e0v0 p0@-", "M e0v0 p1@2"], "011", "100", True, V.FOLLOW, 1, 2),
        (["U e0v0 p0@-", "U e0v0 p0@-", "U e0v1 p1@2"], "011", "100", True, V.ADOPT, 1, 2),
        # fewer than a majority heard: unsynced, as before
        (["U e0v0 p0@-", "U e0v0 p0@-", "U e0v0 p0@-"], "010", "101", True, V.UNSYNCED, 0, NO_NODE),
    ],
)
def test_decide_waits_for_the_first_status_of_a_connected_peer(views, online, unheard, allowed, verdict, epoch, master):
    base = inp(1, views, online)
    d = decide(ElectionInput(**{**{f: getattr(base, f) for f in base.__dataclass_fields__},
                                "contest_allowed": allowed,
                                "unheard": None if unheard is None else tuple(c == "1" for c in unheard)}))
    assert (d.verdict, d.epoch, d.master) == (verdict, epoch, master), d.describe()
    if verdict is V.DEFER:
        assert d.describe() == "defer e0 n0: n0 connected, its first status not here yet"
