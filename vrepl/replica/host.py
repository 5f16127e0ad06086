"""What a role object may use of the Replica that holds it: the `ReplicaHost` protocol.

Owns: the contract between `Replica` (replica.py) and the objects it creates and drops, the role
states (role.py, master.py, follower.py), the `Elector` (electing.py) and the `ArbitratorLease`
(arbitration.py). Those modules are typed against this protocol, so they need no import of
replica.py, which imports them: the package's imports stay a tree (tests/unit/test_layering.py
counts annotation-only imports too). `Replica` satisfies it structurally; mypy checks that
where the Replica passes itself to them.
Must not: import replica.py or the modules it describes, hold state, or do anything at run time.
"""

from __future__ import annotations

from typing import Protocol

from vrepl.replica.actions import Action, LogLevel
from vrepl.replica.config import Config
from vrepl.replica.history import EpochHistory
from vrepl.replica.messages import ForwardBatch, PeerView, Role


class LeaseView(Protocol):
    """The arbitrator lease as the election sees it (arbitration.ArbitratorLease)."""

    connected: bool

    def live_grant_epoch(self) -> int: ...

    def asked_epoch(self) -> int: ...

    def ask(self, epoch: int) -> None: ...


class ReplicaHost(Protocol):
    """The Replica's state and transitions its role objects read and call."""

    cfg: Config
    nodes: tuple[int, ...]
    n: int
    me: int
    node: int
    now_tick: int
    promised_epoch: int
    last_epoch: int
    last_version: int
    durable_version: int
    app_acked_version: int
    commit_version: int
    truncating_to: int | None
    history: EpochHistory
    connected: list[bool]
    counters: dict[str, int]
    _index: dict[int, int]
    _election_dirty: bool
    _status_dirty: bool
    _own_promise_from_disk: bool

    @property
    def role(self) -> Role: ...

    @property
    def arbitrator_lease(self) -> LeaseView: ...

    @property
    def _state(self) -> object:
        """The role object: callers compare its type and never reach through it."""
        ...

    def view(self) -> PeerView: ...

    def forward_refusal(self, version: int, payload: bytes) -> str | None: ...

    def forward_batch_refusal(
        self, first_version: int, payloads: tuple[bytes, ...], size_bytes: int | None = None
    ) -> str | None: ...

    def on_forward_batch(self, i: int, batch: ForwardBatch) -> None: ...

    def _emit(self, action: Action) -> None: ...

    def _log(self, level: LogLevel, text: str) -> None: ...

    def _promise(self, epoch: int, master: int) -> None: ...

    def _advance_commit(self, version: int) -> None: ...

    def _mark_offline(self, i: int, why: str) -> None: ...

    def _step_down(self, reason: str) -> None: ...

    def _become_master(self) -> None: ...

    def _become_follower(self, master_node: int) -> None: ...

    def _become_syncing(self) -> None: ...

    def _become_slave(self) -> None: ...

    def _become_unsynced(self, reason: str) -> None: ...
