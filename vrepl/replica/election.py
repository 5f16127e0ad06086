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
    """

    nodes: tuple[int, ...]
    self_index: int
    views: tuple[PeerView, ...]
    online: tuple[bool, ...]
    arbitrator_used: bool = False
    arbitrator_connected: bool = False
    grant_epoch: int = 0


def is_majority(votes: int, replica_count: int, arbitrator_used: bool) -> bool:
    """More than half of the members: the replicas, plus the arbitrator when it is used."""
    members = replica_count + (1 if arbitrator_used else 0)
    return votes * 2 > members


def pick_candidate(views: tuple[PeerView, ...], online: tuple[bool, ...]) -> int | None:
    """Index of the online replica with the highest (last_epoch, last_version); ties go to
    the earlier index. Never prefer a role over a better log (docs/design.md §2.2)."""
    best = None
    for i, (view, up) in enumerate(zip(views, online)):
        if not up:
            continue
        if best is None or (view.last_epoch, view.last_version) > (views[best].last_epoch, views[best].last_version):
            best = i
    return best


def next_epoch(views: tuple[PeerView, ...]) -> int:
    """The epoch a candidate announces: one above every promise it has seen."""
    return max(v.promised_epoch for v in views) + 1


def promises_for(views: tuple[PeerView, ...], online: tuple[bool, ...], epoch: int, candidate: int) -> int:
    """How many online replicas show (epoch, candidate) as their promise."""
    return sum(
        1 for v, up in zip(views, online) if up and v.promised_epoch == epoch and v.promised_master == candidate
    )


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
            return Decision(Verdict.STEP_DOWN, promised, NO_NODE, f"hears {online_count} of {n} replicas, lease {lease}")
        for i, (v, up) in enumerate(zip(inp.views, inp.online)):
            if up and i != me and v.promised_epoch > promised:
                return Decision(Verdict.STEP_DOWN, promised, NO_NODE, f"n{inp.nodes[i]} promised newer e{v.promised_epoch}")
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

    cand = pick_candidate(inp.views, inp.online)
    if cand is None:  # cannot happen: this node itself is online
        return Decision(Verdict.WAIT, promised, NO_NODE, "no online replica")

    if cand == me:
        others_below = all(
            v.promised_epoch < promised or (v.promised_epoch == promised and v.promised_master == my_node)
            for i, v in enumerate(inp.views)
            if i != me
        )
        # A promise can be reused only while no record carries it: a master that wrote in
        # epoch P and lost some of it in a crash must never write a different record at the
        # same (P, version) again, so it takes a new epoch.
        if mine.promised_master != my_node or not others_below or promised <= mine.last_epoch:
            return Decision(Verdict.ANNOUNCE, next_epoch(inp.views), my_node, "highest (epoch, version) online")
        votes = promises_for(inp.views, inp.online, promised, my_node)
        grant = 1 if inp.arbitrator_used and inp.grant_epoch == promised else 0
        if is_majority(votes + grant, n, inp.arbitrator_used):
            return Decision(Verdict.BECOME_MASTER, promised, my_node, f"{votes} promises, arbitrator grant {grant}")
        if inp.arbitrator_used and not grant:
            return Decision(Verdict.REQUEST_GRANT, promised, my_node, f"{votes} promises, need the arbitrator")
        return Decision(Verdict.WAIT, promised, my_node, f"{votes} promises so far")

    cv = inp.views[cand]
    cand_node = inp.nodes[cand]
    if cv.promised_master == cand_node and cv.promised_epoch > promised:
        return Decision(Verdict.ADOPT, cv.promised_epoch, cand_node, "my view picks the same candidate")
    if cv.promised_master == cand_node and cv.promised_epoch == promised and mine.promised_master == cand_node:
        return Decision(Verdict.WAIT, promised, cand_node, "adopted, waiting for the candidate")
    return Decision(Verdict.WAIT, promised, cand_node, "waiting for the candidate to announce")
