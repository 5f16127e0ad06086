"""Election rules as pure functions: views in, a decision out (docs/design.md §2).

Owns: who may be master, when a node adopts a candidate's epoch, when a master steps down.
As in the seed (选主流程) there is no voting round: every node broadcasts its view of every
replica and decides alone from it. Unlike the seed:
  * the candidate is the online node with the highest (last_epoch, last_version), ties by
    list order — never "a slave" or "the first in the list" over a better log;
  * a majority online is enough even when every node is unsynced;
  * views agree once no online peer still reports following a master;
  * agreement includes the new epoch: the candidate announces promised_epoch = max + 1, a
    peer whose own view picks the same candidate adopts it (persisted) and then refuses older
    epochs, and the candidate becomes master only when a majority of replicas (plus the
    arbitrator's grant for even replica counts) shows that promise.
Must not: do I/O, keep state, or look at anything but its arguments.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from vrepl.replica.messages import NO_NODE, PeerView, Role


class Verdict(enum.Enum):
    STAY_MASTER = "stay_master"
    STEP_DOWN = "step_down"  # a master lost its majority or saw a newer promise
    BECOME_MASTER = "become_master"
    UNSYNCED = "unsynced"  # fewer than a majority online
    FOLLOW = "follow"  # an online master of an epoch >= mine exists
    ANNOUNCE = "announce"  # I am the candidate: promise (epoch, me) and broadcast it
    DEFER = "defer"  # I would announce, but an election under way may have won already (bounded)
    ADOPT = "adopt"  # the candidate my view picks announced a newer epoch: promise it
    REQUEST_GRANT = "request_grant"  # even replica count: ask the arbitrator for my epoch
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    epoch: int = 0
    master: int = NO_NODE  # node id of the master to follow / candidate to adopt
    reason: str = ""

    def describe(self) -> str:
        who = "" if self.master == NO_NODE else f" n{self.master}"
        return f"{self.verdict.value} e{self.epoch}{who}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ElectionInput:
    """Everything one node's decision depends on.

    views[i] is this node's view of replica i (views[self_index] is its own, current);
    online[i] is whether replica i is reachable now (online[self_index] is True).
    `arbitrator_used`: the replica count is even and an arbitrator is configured, so the
    arbitrator is one more member (majorities are of n + 1). `arbitrator_connected` counts it
    as online; `grant_epoch` is the epoch of a live arbitrator grant/lease held by this node
    (0 when none), which counts it as a promise/vote.
    `own_promise_reusable` is False for a promise to itself read back from disk at start-up
    (§2.3: a restarted master always takes a new epoch).
    `asked_epoch` is an epoch above this node's promise that it asked the arbitrator for and
    has no answer yet (0 when none): if granted, this node's own promise for that epoch goes
    to itself, so it must not promise that epoch to another candidate meanwhile (§2.4).
    `reports[i]` is the views replica i sent in its last status (None when none arrived):
    which replicas *it* hears, for the deferral rule (§2.4). `defer_allowed` is False once
    this node has deferred for `heartbeat_timeout_ticks`: it then announces anyway.
    `contest_allowed` is True while it has deferred for less than `heartbeat_interval_ticks`:
    the shorter wait for a rival that announced itself for the same newest epoch, or for the
    first status of a peer that just connected (§2.4).
    `unheard[i]` is True for a replica that is connected but whose first status has not
    arrived yet (None: no such knowledge, as for a caller that only has views).
    """

    nodes: tuple[int, ...]
    self_index: int
    views: tuple[PeerView, ...]
    online: tuple[bool, ...]
    arbitrator_used: bool = False
    arbitrator_connected: bool = False
    grant_epoch: int = 0
    asked_epoch: int = 0
    own_promise_reusable: bool = True
    reports: tuple[tuple[PeerView, ...] | None, ...] | None = None
    defer_allowed: bool = True
    contest_allowed: bool = False
    unheard: tuple[bool, ...] | None = None


def is_majority(votes: int, replica_count: int, arbitrator_used: bool) -> bool:
    """More than half of the members: the replicas, plus the arbitrator when it is used."""
    members = replica_count + (1 if arbitrator_used else 0)
    return votes * 2 > members


def pick_candidate(
    views: tuple[PeerView, ...], online: tuple[bool, ...], nodes: tuple[int, ...] | None = None
) -> int | None:
    """Index of the online replica with the highest (last_epoch, last_version). Never prefer a
    role over a better log (docs/design.md §2.2). Equal logs go to the replica that announced
    itself for the newest epoch (its promise to itself: an election already under way, which
    a later node winning the tie would only restart, §2.4), then to the earlier index.
    `nodes` are the replicas' node ids (default: their indices)."""
    ids = nodes if nodes is not None else tuple(range(len(views)))
    best = None
    best_key = None
    for i, (view, up) in enumerate(zip(views, online)):
        if not up:
            continue
        own = view.promised_epoch if view.promised_master == ids[i] else 0
        key = (view.last_epoch, view.last_version, own)
        if best_key is None or key > best_key:
            best, best_key = i, key
    return best


def next_epoch(views: tuple[PeerView, ...]) -> int:
    """The epoch a candidate announces: one above every promise it has seen."""
    return max(v.promised_epoch for v in views) + 1


def promises_for(views: tuple[PeerView, ...], online: tuple[bool, ...], epoch: int, candidate: int) -> int:
    """How many online replicas show (epoch, candidate) as their promise."""
    return sum(1 for v, up in zip(views, online) if up and v.promised_epoch == epoch and v.promised_master == candidate)


def election_in_progress(inp: ElectionInput, newest: int) -> tuple[int, int] | None:
    """(peer index, candidate index) when an online peer promised the newest epoch to another
    candidate that this node cannot hear but the peer can (docs/design.md §2.4), else None.

    That candidate may already hold a majority (the peer's promise and its own): announcing
    `newest + 1` over it would only make it step down once the two meet."""
    if inp.reports is None:
        return None
    index = {node: i for i, node in enumerate(inp.nodes)}
    for p, (v, up) in enumerate(zip(inp.views, inp.online)):
        if p == inp.self_index or not up or v.promised_epoch != newest:
            continue
        x = index.get(v.promised_master)
        if x is None or x in (p, inp.self_index) or inp.online[x]:
            continue
        report = inp.reports[p]
        if report is not None and len(report) == len(inp.nodes) and report[x].role != Role.OFFLINE:
            return p, x
    return None


def before_announcing(inp: ElectionInput, epoch: int, online_count: int) -> Decision | None:
    """What the candidate does instead of announcing `epoch`, or None to announce it
    (docs/design.md §2.4: no announcement that can only depose)."""
    me, mine, my_node = inp.self_index, inp.views[inp.self_index], inp.nodes[inp.self_index]
    promised = mine.promised_epoch
    busy = election_in_progress(inp, epoch - 1) if inp.defer_allowed else None
    if busy is not None:
        p, x = busy
        return Decision(
            Verdict.DEFER,
            promised,
            inp.nodes[x],
            f"n{inp.nodes[p]} promised e{epoch - 1} to n{inp.nodes[x]}, which it hears and I do not",
        )
    if inp.contest_allowed and inp.unheard is not None:
        for x, waiting in enumerate(inp.unheard):
            if waiting and x != me:
                # Its status is a round trip away (a node broadcasts one as a peer connects)
                # and may show a promise of its own: announcing before it arrives is how two
                # nodes that started together both announce e1 and one deposes the other.
                return Decision(
                    Verdict.DEFER,
                    promised,
                    inp.nodes[x],
                    f"n{inp.nodes[x]} connected, its first status not here yet",
                )
    if inp.contest_allowed:
        for x, (v, up) in enumerate(zip(inp.views, inp.online)):
            if (
                x != me
                and up
                and v.promised_master == inp.nodes[x]
                and v.promised_epoch == epoch - 1
                and (v.last_epoch, v.last_version) == (mine.last_epoch, mine.last_version)
            ):
                # A rival with my log announced itself for the newest epoch before it heard
                # me (I win the tie only by list order) and may have won it already; its
                # master status is a round trip away.
                return Decision(
                    Verdict.DEFER,
                    promised,
                    inp.nodes[x],
                    f"n{inp.nodes[x]} announced itself for e{epoch - 1} too: a moment for its result",
                )
    if inp.arbitrator_used and not is_majority(online_count, len(inp.nodes), True) and inp.grant_epoch != epoch:
        # The replicas I hear cannot win without the arbitrator: ask it first. A refusal
        # (another node's lease is live) then leaves no promise that would depose that master
        # as soon as the link heals.
        return Decision(
            Verdict.REQUEST_GRANT,
            epoch,
            my_node,
            f"{online_count} of {len(inp.nodes)} replicas online: the arbitrator's vote first",
        )
    return None


def own_promise_fresh(inp: ElectionInput) -> bool:
    """This node's promise is to itself and can be used to become master: not read back
    from disk at start-up, and above the last epoch its log holds records of (a master that
    wrote in epoch P and lost some of it in a crash must never write a different record at
    the same (P, version) again, so it takes a new epoch)."""
    mine = inp.views[inp.self_index]
    return (
        inp.own_promise_reusable
        and mine.promised_master == inp.nodes[inp.self_index]
        and mine.promised_epoch > mine.last_epoch
    )


def own_votes(inp: ElectionInput) -> tuple[int, int]:
    """(online replicas showing this node's promised epoch promised to it, 1 if the
    arbitrator's live grant is for that epoch else 0)."""
    me = inp.self_index
    promised = inp.views[me].promised_epoch
    votes = promises_for(inp.views, inp.online, promised, inp.nodes[me])
    return votes, 1 if inp.arbitrator_used and inp.grant_epoch == promised else 0


def holds_majority(inp: ElectionInput) -> bool:
    """This node's own promise is held by a majority of the members (`own_votes`), and no
    replica shows a newer promise (a master elected now would only be deposed by it)."""
    promised = inp.views[inp.self_index].promised_epoch
    if any(v.promised_epoch > promised for v in inp.views):
        return False
    votes, grant = own_votes(inp)
    return is_majority(votes + grant, len(inp.nodes), inp.arbitrator_used)


def won_in_a_tie(inp: ElectionInput, cand: int) -> bool:
    """True when this node, which is not the candidate only by list order (its log equals
    the candidate's), already holds a majority for its own fresh promise (docs/design.md
    §2.4 rule 6).

    The start-up race it settles (2 replicas): n2 saw n1 offline and asked the arbitrator
    for e1; n1's link came up before the answer, and n1, hearing both replicas, promised e1
    to itself. The grant then gave n2 e1 too (its own promise goes with the grant). n1 wins
    the tie by list order, but it can never win e1 (n2's promise and the arbitrator's vote
    are taken) and used to announce e2 over it: the group's first master was elected at
    e2. n2 becomes master at e1 instead, which is safe (a majority of the members promised
    e1 to it) and loses nothing (the logs are equal); n1 follows a master of its promised
    epoch. With a better log on the candidate this does not apply: the better log must win,
    at a new epoch."""
    mine, cv = inp.views[inp.self_index], inp.views[cand]
    same_log = (cv.last_epoch, cv.last_version) == (mine.last_epoch, mine.last_version)
    return same_log and own_promise_fresh(inp) and holds_majority(inp)


def decide(inp: ElectionInput) -> Decision:
    """One node's election decision from its own views (docs/design.md §2)."""
    n = len(inp.nodes)
    me = inp.self_index
    mine = inp.views[me]
    my_node = inp.nodes[me]
    promised = mine.promised_epoch

    if n == 1:
        # seed rule 1: a single replica is always master; a new epoch per mastership keeps
        # (epoch, version) unique even for a group that later grows.
        if mine.role == Role.MASTER:
            return Decision(Verdict.STAY_MASTER, promised, my_node, "single replica")
        return Decision(Verdict.BECOME_MASTER, promised + 1, my_node, "single replica is always master")

    online_count = sum(1 for up in inp.online if up)

    if mine.role == Role.MASTER:
        # A master counts the arbitrator only through a live lease for its own epoch: a mere
        # connection would let both sides of a cut 2-replica group stay master.
        lease = 1 if inp.arbitrator_used and inp.grant_epoch == promised else 0
        if not is_majority(online_count + lease, n, inp.arbitrator_used):
            return Decision(
                Verdict.STEP_DOWN, promised, NO_NODE, f"hears {online_count} of {n} replicas, lease {lease}"
            )
        for i, (v, up) in enumerate(zip(inp.views, inp.online)):
            if up and i != me and v.promised_epoch > promised:
                return Decision(
                    Verdict.STEP_DOWN, promised, NO_NODE, f"n{inp.nodes[i]} promised newer e{v.promised_epoch}"
                )
        return Decision(Verdict.STAY_MASTER, promised, my_node, "majority reachable")

    arbitrator = 1 if inp.arbitrator_used and inp.arbitrator_connected else 0
    if not is_majority(online_count + arbitrator, n, inp.arbitrator_used):
        return Decision(Verdict.UNSYNCED, promised, NO_NODE, f"{online_count} of {n} online, arbitrator {arbitrator}")

    # An online master of an epoch at least as new as my promise: follow it. At most one
    # master holds a given epoch, so following it never needs a new promise for that epoch.
    master = None
    for i, (v, up) in enumerate(zip(inp.views, inp.online)):
        if up and i != me and v.role == Role.MASTER and v.promised_epoch >= promised:
            if master is None or v.promised_epoch > inp.views[master].promised_epoch:
                master = i
    if master is not None:
        epoch = inp.views[master].promised_epoch
        return Decision(Verdict.FOLLOW, epoch, inp.nodes[master], "online master")

    # seed 选主流程 rule 3, "decide only when views agree": a peer that still reports itself
    # following a master has not yet told us its final log end (statuses are sent on role
    # changes, versions in between may be stale); its next status will.
    for i, (v, up) in enumerate(zip(inp.views, inp.online)):
        if up and i != me and v.role in (Role.SLAVE, Role.SYNCING, Role.MASTER):
            return Decision(Verdict.WAIT, promised, NO_NODE, f"n{inp.nodes[i]} still reports {Role(v.role).describe()}")

    cand = pick_candidate(inp.views, inp.online, inp.nodes)
    if cand is None:  # cannot happen: this node itself is online
        return Decision(Verdict.WAIT, promised, NO_NODE, "no online replica")

    if cand != me and won_in_a_tie(inp, cand):
        with_grant = " with the arbitrator's grant" if own_votes(inp)[1] else ""
        return Decision(
            Verdict.BECOME_MASTER,
            promised,
            my_node,
            f"a majority promised e{promised} to me{with_grant}; my log equals n{inp.nodes[cand]}'s",
        )

    if cand == me:
        others_below = all(
            v.promised_epoch < promised or (v.promised_epoch == promised and v.promised_master == my_node)
            for i, v in enumerate(inp.views)
            if i != me
        )
        fresh = own_promise_fresh(inp)
        votes, grant = own_votes(inp)
        if fresh and holds_majority(inp):
            # With others_below, the count the candidate always made. Without it (§2.4 rule
            # 7): another node promised my epoch to itself, but a majority promised it to
            # me; that node can never win it, and a new epoch would only restart an
            # election this node has won.
            reason = (
                f"{votes} promises, arbitrator grant {grant}"
                if others_below
                else f"a majority promised e{promised} to me; another node's own promise of it cannot win"
            )
            return Decision(Verdict.BECOME_MASTER, promised, my_node, reason)
        if not fresh or not others_below:
            epoch = next_epoch(inp.views)
            held = before_announcing(inp, epoch, online_count)
            if held is not None:
                return held
            return Decision(Verdict.ANNOUNCE, epoch, my_node, "highest (epoch, version) online")
        if inp.arbitrator_used and not grant:
            return Decision(Verdict.REQUEST_GRANT, promised, my_node, f"{votes} promises, need the arbitrator")
        return Decision(Verdict.WAIT, promised, my_node, f"{votes} promises so far")

    cv = inp.views[cand]
    cand_node = inp.nodes[cand]
    if cv.promised_master == cand_node and cv.promised_epoch > promised:
        if cv.promised_epoch == inp.asked_epoch:
            return Decision(
                Verdict.WAIT, promised, cand_node, f"asked the arbitrator for e{inp.asked_epoch}: its answer first"
            )
        return Decision(Verdict.ADOPT, cv.promised_epoch, cand_node, "my view picks the same candidate")
    if cv.promised_master == cand_node and cv.promised_epoch == promised and mine.promised_master == cand_node:
        return Decision(Verdict.WAIT, promised, cand_node, "adopted, waiting for the candidate")
    return Decision(Verdict.WAIT, promised, cand_node, "waiting for the candidate to announce")
