"""vrepl.replica: the replication state machine in plain Python (docs/design.md).

Owns the protocol: election with epochs (election.py: the pure rules; electing.py: applying
them), forwarding and acks (forward.py), log matching (history.py), the arbitrator lease
rules (lease.py; a replica's own side: arbitration.py), and `Replica` (replica.py), which
turns events into actions. The role's state and handlers are role objects: the master's
(master.py), the follower's (follower.py), none (role.py); `Config` is config.py's.
Must not import asyncio, socket, time, random, threading, select or selectors
(tests/unit/test_replica_imports.py checks).
"""

from vrepl.replica.actions import (
    Action,
    CommitAdvanced,
    ConfirmForward,
    ConfirmStatus,
    FlowControl,
    Log,
    LogLevel,
    NotifyRole,
    PersistBatch,
    PersistPromisedEpoch,
    PersistRecords,
    RequestArbitratorGrant,
    ResetConnection,
    Send,
    StreamWalFrom,
    TruncateWalAfter,
    WriteToCache,
    WriteToCacheBatch,
)
from vrepl.replica.events import (
    AppAcked,
    AppForward,
    AppForwardBatch,
    AppRecover,
    ArbitratorConnected,
    ArbitratorGranted,
    ArbitratorLost,
    ArbitratorRefused,
    Event,
    LogRebased,
    PeerConnected,
    PeerDisconnected,
    PeerRestoreCaughtUp,
    PeerRestoreFailed,
    PeerRestoring,
    Received,
    RestoreBegun,
    RestoredRecords,
    RestoreEnded,
    RestoreFinished,
    TruncateDone,
    WalPersisted,
)
from vrepl.replica.follower import CUTS_COMMITTED_RECORDS
from vrepl.replica.invariant import InvariantViolation, invariant
from vrepl.replica.lease import LeaseTable
from vrepl.replica.messages import (
    NO_NODE,
    AckStatus,
    ArbitratorGrant,
    ArbitratorRequest,
    Commit,
    Forward,
    ForwardAck,
    ForwardBatch,
    Heartbeat,
    PeerMessage,
    PeerView,
    Record,
    Role,
    Status,
    SyncRequest,
    SyncStart,
    TruncateRequest,
)
from vrepl.replica.replica import Config, Replica, config_invalid

__all__ = [name for name in dir() if not name.startswith("_")]
