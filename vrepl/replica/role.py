"""The role of a replica as an object: its role's state, and how it answers input that is
meant for a role (docs/design.md §2, §4).

Owns: `RoleState`, the base of the role objects, and `Unsynced`, the role with no state of
its own. The base's handlers are what a replica answers to input for a role it is not in: a
forward ack or a sync request to a node that is not the master of that epoch; forwards, a
truncate request, a sync start or a commit from a node it does not follow in that epoch; an
app forward to a node that is not master; a restore event with no restore running. Each is
ignored with a logged reason or refused (`not_master`), never an error. `master.Master` and
`follower.Follower` hold the master's and the follower's state and override these handlers
(etcd raft's per-role step functions, stepLeader and stepFollower); when the input is not
theirs either (another epoch, another master) they fall back to the base's answer.
Must not: change the role. Only the Replica's `_become_*` transitions create role objects and
drop them; a dropped one is marked `left` and is not used again.
"""

from __future__ import annotations

from vrepl.replica.actions import ConfirmForward, ConfirmStatus, LogLevel
from vrepl.replica.events import (
    AppForward,
    AppForwardBatch,
    AppRecover,
    LogRebased,
    PeerRestoreCaughtUp,
    PeerRestoreFailed,
    PeerRestoring,
    RestoreBegun,
    RestoredRecords,
    RestoreEnded,
)
from vrepl.replica.host import ReplicaHost
from vrepl.replica.messages import (
    Commit,
    Forward,
    ForwardAck,
    ForwardBatch,
    Role,
    SyncRequest,
    SyncStart,
    TruncateRequest,
)


class RoleState:
    """What a replica answers to role-specific input while it is not in that role."""

    __slots__ = ("r", "left")

    ROLES: tuple[Role, ...] = ()  # the values of Replica.role this object goes with

    def __init__(self, r: ReplicaHost) -> None:
        self.r = r
        self.left = False  # set when a transition drops this object

    # ------------------------------------------------------------------ hooks from common input

    def on_peer_reset(self, i: int) -> None:
        """Replica i connected or went offline: what this role knew of its log is void."""

    def on_durable(self, version: int) -> None:
        """The local WAL became durable up to `version`."""

    def maybe_ack(self) -> None:
        """Durable, matched or applied records may have grown: a follower acks them."""

    def on_quorum_changed(self) -> None:
        """Replica.cfg has a new quorum."""

    def on_app_failed(self, version: int) -> None:
        """The app could not apply record `version` (already logged)."""

    # ------------------------------------------------------------------ input for a master

    def on_app_forward(self, ev: AppForward) -> None:
        self.r._emit(ConfirmForward(ev.version, ev.version, ConfirmStatus.NOT_MASTER))

    def on_app_forward_batch(self, ev: AppForwardBatch) -> None:
        self.r._emit(
            ConfirmForward(ev.first_version, ev.first_version + len(ev.payloads) - 1, ConfirmStatus.NOT_MASTER)
        )

    def on_forward_ack(self, i: int, ack: ForwardAck) -> None:
        self.r._log(LogLevel.DEBUG, f"ignored {ack.describe()} from n{self.r.nodes[i]}: not master of that epoch")

    def on_sync_request(self, i: int, req: SyncRequest) -> None:
        self.r._log(LogLevel.DEBUG, f"ignored {req.describe()} from n{self.r.nodes[i]}: not master of that epoch")

    def on_peer_restoring(self, i: int, ev: PeerRestoring) -> None:
        self.r._log(LogLevel.DEBUG, f"ignored {ev.describe()}: not master, or n{ev.node} not connected")

    def on_peer_restore_caught_up(self, i: int, ev: PeerRestoreCaughtUp) -> None:
        self.r._log(LogLevel.DEBUG, f"ignored {ev.describe()}: n{ev.node} is not being restored")

    def on_peer_restore_failed(self, i: int, ev: PeerRestoreFailed) -> None:
        self.r._log(LogLevel.DEBUG, f"ignored {ev.describe()}")

    # ------------------------------------------------------------------ input for a follower

    def fast_append(self, i: int, batch: ForwardBatch) -> bool:
        """Append a whole batch that extends the log as it is; False: take the per-record path."""
        return False

    def on_forwards(self, i: int, epoch: int, fwds: tuple[Forward, ...]) -> None:
        """Forwards of the master of `epoch` (not older than the promise: Replica checked)."""
        self.r._log(
            LogLevel.DEBUG, f"ignored {fwds[0].describe()} from n{self.r.nodes[i]}: not following it in e{epoch}"
        )

    def on_truncate_request(self, i: int, req: TruncateRequest) -> None:
        self.r._log(LogLevel.DEBUG, f"ignored {req.describe()} from n{self.r.nodes[i]}")

    def on_sync_start(self, i: int, msg: SyncStart) -> None:
        self.r._log(LogLevel.DEBUG, f"ignored {msg.describe()} from n{self.r.nodes[i]}")

    def on_commit(self, i: int, msg: Commit) -> None:
        self.r._log(
            LogLevel.DEBUG, f"ignored {msg.describe()} from n{self.r.nodes[i]}: not following it in e{msg.epoch}"
        )

    def on_app_recover(self, ev: AppRecover) -> None:
        self.r._log(LogLevel.INFO, f"ignored app recover: role {self.r.role.describe()}, nothing to resync from")

    def on_restore_begun(self, i: int, ev: RestoreBegun) -> None:
        self.r._log(
            LogLevel.INFO, f"refused {ev.describe()}: not following n{ev.node} in e{ev.epoch} with a matched log"
        )

    def on_log_rebased(self, ev: LogRebased) -> None:
        self._rebase_ignored(ev, restoring=False)

    def _rebase_ignored(self, ev: LogRebased, restoring: bool) -> None:
        self.r._log(
            LogLevel.WARNING, f"ignored {ev.describe()}: restoring {restoring}, log ends at v{self.r.last_version}"
        )

    def on_restored_records(self, i: int, ev: RestoredRecords) -> None:
        self.r._log(LogLevel.DEBUG, f"ignored {ev.describe()}: no restore running")

    def on_restore_ended(self, ev: RestoreEnded) -> None:
        """No restore runs: nothing to end."""


class Unsynced(RoleState):
    """Neither master nor following one (also the role at start-up); no state of its own."""

    __slots__ = ()

    ROLES = (Role.UNSYNCED,)
