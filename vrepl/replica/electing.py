"""Driving the election of one replica: the views it decides on, and carrying out each
decision (docs/design.md §2).

Owns: `Elector`: this node's view of every other replica (the last status or heartbeat of
each, which of them it heard since they connected, which replicas each peer reported it
hears), the Status this node broadcasts, the input of `election.decide` and the loop that
applies its decisions through the Replica's role transitions (`_promise`, `_become_*`,
`_step_down`) until they are stable, and the bounded deferral of §2.4.
Must not: decide anything itself (the rules are election.py's pure functions), change the
role but through the Replica's transitions, or do I/O.
"""

from __future__ import annotations

import dataclasses

from vrepl.replica import election
from vrepl.replica.actions import LogLevel
from vrepl.replica.follower import Follower
from vrepl.replica.host import ReplicaHost
from vrepl.replica.messages import NO_NODE, Heartbeat, PeerView, Role, Status


class Elector:
    """What one replica knows of the others' views, and its election decisions."""

    __slots__ = ("r", "views", "heard", "reports", "defer_since_tick", "last_decision")

    def __init__(self, r: ReplicaHost) -> None:
        self.r = r
        blank = PeerView(Role.OFFLINE, 0, 0, 0, NO_NODE)
        self.views: list[PeerView] = [blank] * r.n  # index = position in the replica list
        # A connected peer counts as online only once its status arrived: deciding on a view
        # we have not heard yet is how the seed's "decide only when views agree" is kept.
        self.heard = [False] * r.n
        # The views each peer sent in its last status: which replicas it hears (§2.4).
        self.reports: list[tuple[PeerView, ...] | None] = [None] * r.n
        self.defer_since_tick: int | None = None  # when the current deferral began
        self.last_decision = ""  # logged when it changes

    # ------------------------------------------------------------------ views

    def peer_connected(self, i: int) -> None:
        self.heard[i] = False
        self.reports[i] = None
        # Unknown until its status arrives; a stale MASTER here could make us follow a ghost.
        self.views[i] = dataclasses.replace(self.views[i], role=Role.UNSYNCED)

    def peer_offline(self, i: int) -> None:
        self.views[i] = dataclasses.replace(self.views[i], role=Role.OFFLINE)

    def on_status(self, i: int, msg: Status) -> None:
        r = self.r
        if msg.sender != r.nodes[i] or len(msg.views) != r.n:
            r._log(
                LogLevel.WARNING,
                f"ignored status from n{r.nodes[i]}: sender n{msg.sender}, {len(msg.views)} views for {r.n} replicas",
            )
            return
        self.views[i] = msg.views[i]
        self.reports[i] = msg.views
        self.heard[i] = True
        r._election_dirty = True

    def on_heartbeat(self, i: int, msg: Heartbeat) -> None:
        self.views[i] = msg.view
        self.heard[i] = True
        self.r._election_dirty = True

    def status(self) -> Status:
        """The status this node broadcasts: its own view, and OFFLINE for peers it does not hear."""
        r = self.r
        views, connected = self.views, r.connected
        return Status(
            r.node,
            tuple(
                r.view()
                if i == r.me
                else (views[i] if connected[i] else dataclasses.replace(views[i], role=Role.OFFLINE))
                for i in range(r.n)
            ),
        )

    # ------------------------------------------------------------------ decisions

    def input(self) -> election.ElectionInput:
        r = self.r
        views = tuple(r.view() if i == r.me else self.views[i] for i in range(r.n))
        online = tuple(i == r.me or (r.connected[i] and self.heard[i]) for i in range(r.n))
        deferred_ticks = 0 if self.defer_since_tick is None else r.now_tick - self.defer_since_tick
        lease = r.arbitrator_lease
        return election.ElectionInput(
            nodes=r.nodes,
            self_index=r.me,
            views=views,
            online=online,
            arbitrator_used=r.cfg.arbitrator_used,
            arbitrator_connected=lease.connected,
            grant_epoch=lease.live_grant_epoch(),
            own_promise_reusable=not r._own_promise_from_disk,
            asked_epoch=lease.asked_epoch(),
            reports=tuple(self.reports),
            defer_allowed=deferred_ticks < r.cfg.heartbeat_timeout_ticks,
            contest_allowed=deferred_ticks < r.cfg.heartbeat_interval_ticks,
            unheard=tuple(i != r.me and r.connected[i] and not self.heard[i] for i in range(r.n)),
        )

    def evaluate(self) -> None:
        # Each applied decision changes the inputs (a promise, a role); re-decide until stable.
        # Four rounds cover the longest chain: announce -> request grant / become master.
        r = self.r
        for _ in range(4):
            inp = self.input()
            decision = election.decide(inp)
            text = decision.describe()
            if text != self.last_decision:
                self.last_decision = text
                views = ", ".join(f"n{node}={v.describe()}" for node, v in zip(r.nodes, inp.views))
                r._log(LogLevel.INFO, f"election {text} views [{views}]")
            if not self.apply(decision):
                return

    def apply(self, d: election.Decision) -> bool:
        """Carry out a decision; True when it changed state the next decision depends on."""
        V = election.Verdict
        r = self.r
        state = r._state
        following = type(state) is Follower
        if d.verdict is not V.DEFER:
            self.defer_since_tick = None
        elif self.defer_since_tick is None:
            # Bounded: after heartbeat_timeout_ticks of deferring, announce anyway (§2.4).
            self.defer_since_tick = r.now_tick
        if r.truncating_to is not None and d.verdict in (V.ANNOUNCE, V.BECOME_MASTER, V.REQUEST_GRANT):
            # Its log end still counts the records it is discarding, and the TruncateDone to
            # come would rewind a master's log: no candidacy until the cut is done
            # (found by the simulator, seed 36 --profile harsh).
            if following:
                r._become_unsynced(f"no online master: {d.reason}")
            return False
        if d.verdict is V.STAY_MASTER:
            return False
        if d.verdict is V.STEP_DOWN:
            r._step_down(d.reason)
            return True
        if d.verdict is V.BECOME_MASTER:
            if d.epoch > r.promised_epoch:  # single replica: promise its own new epoch
                r._promise(d.epoch, r.node)
            r._become_master()
            return True
        if d.verdict is V.FOLLOW:
            if type(state) is Follower and state.master_node == d.master and r.promised_epoch == d.epoch:
                return False
            if d.epoch > r.promised_epoch:
                r._promise(d.epoch, d.master)
            r._become_follower(d.master)
            return True
        if following:
            r._become_unsynced(f"no online master: {d.reason}")
        if d.verdict is V.ANNOUNCE:
            r._promise(d.epoch, r.node)
            return True
        if d.verdict is V.ADOPT:
            r._promise(d.epoch, d.master)
            return True
        if d.verdict is V.REQUEST_GRANT:
            r.arbitrator_lease.ask(d.epoch)
            return False
        # UNSYNCED, WAIT, DEFER
        return following
