"""The embedding API: one `SyncInstance` per vgroup on a node (docs/embedding.md).

Owns: the sync instance a vnode starts for each vgroup — its replica (vrepl.replica, the pure
state machine), its WAL and promise (vrepl.transport.storage, a WAL thread with group
commit), its peer and arbitrator connections (vrepl.transport.node), its tick timer — and the
app-facing calls and callbacks of the seed (syncForwardToPeer, syncAckForward, writeToCache,
confirmForward, notifyRole, notifyFlowControl, ...).

Threads: everything that touches the replica runs on the I/O thread (vrepl.transport.loop,
one per process). `forward()`, `forward_many()` and `ack_forward()` may be called from any
thread: they append to a queue under a lock and wake the I/O thread only when the queue goes
non-empty; the I/O thread drains the queue into ONE AppForwardBatch event per run of
consecutive versions (cut at max_batch_records / max_batch_bytes, `batch_bounds`), which
gives ONE WAL append and ONE ForwardBatch frame per follower. Callbacks are called on the I/O
thread (docs/embedding.md §Callbacks and threads) and must not block.

Actions are executed IN ORDER (vrepl/replica/actions.py): PersistPromisedEpoch is written
and fsynced before the next action runs; PersistRecords/PersistBatch are queued to the WAL
thread before any later action (the WAL reports durability back as WalPersisted, which is
what lets a slave ack and a master confirm); frames queued by one batch of events leave in
one write per connection when the batch ends.
Must not: block the I/O thread on the network, or call the app while holding a lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Callable

from vrepl import wal as _wal
from vrepl._core import wire as _wire
from vrepl.config import ReplicaAddress, SyncConfig, parse_endpoint, sync_config_invalid
from vrepl.errors import ConfigError, FrameError, VreplError
from vrepl.replica import (
    NO_NODE,
    AckStatus,
    AppAcked,
    AppForwardBatch,
    AppRecover,
    ArbitratorConnected,
    ArbitratorGrant,
    ArbitratorGranted,
    ArbitratorLost,
    ArbitratorRefused,
    ArbitratorRequest,
    Commit,
    CommitAdvanced,
    ConfirmForward,
    ConfirmStatus,
    FlowControl,
    Forward,
    ForwardAck,
    ForwardBatch,
    Heartbeat,
    Log,
    NotifyRole,
    PeerConnected,
    PeerDisconnected,
    PersistBatch,
    PersistPromisedEpoch,
    PersistRecords,
    PeerRestoring,
    Received,
    Replica,
    RequestArbitratorGrant,
    ResetConnection,
    Role,
    Send,
    Status,
    StreamWalFrom,
    SyncRequest,
    SyncStart,
    TruncateDone,
    TruncateRequest,
    TruncateWalAfter,
    WalPersisted,
    WriteToCache,
    WriteToCacheBatch,
)
from vrepl.restore.config import RestoreConfig, restore_config_invalid
from vrepl.transport import codec
from vrepl.transport.codec import ConnKind
from vrepl.transport.loop import IoLoop
from vrepl.transport.node import Connection, NodeTransport
from vrepl.transport.storage import WalStore

log = logging.getLogger("vrepl.sync")
core_log = logging.getLogger("vrepl.replica")

ForwardStatus = ConfirmStatus  # ok / failed / timed_out / not_master, as confirm_forward reports
PEER_MESSAGE_TYPES = (Status, Heartbeat, Forward, ForwardBatch, ForwardAck, SyncRequest, TruncateRequest, SyncStart, Commit)
MAX_CATCH_UP_TICKS = 10_000  # after a long stall (SIGSTOP), ticks are replayed up to this many
# Forward times kept for the per-peer lag in ms (one per run of forwards; halved when full).
SENT_TIMES_MAX = 4096
CONFIRM_TIMES_MAX = 1 << 17
_monotonic = time.monotonic
# Replica log lines (Log actions) that carry an event name in JSON logs (vrepl/logsetup.py):
# the first words of the text after the "vgX nY eZ: " prefix.
_CORE_EVENTS = (("election ", "election"), ("became master", "election_won"),
                ("master steps down", "step_down"), ("unsynced", "unsynced"),
                ("arbitrator refused", "arbitrator_refused"), ("arbitrator lease expired", "lease_expired"),
                ("peer n", "peer"), ("restore", "restore"), ("truncating", "truncation"),
                ("sync request", "resync"))


def batch_bounds(payloads: "list[bytes] | tuple[bytes, ...]", max_records: int, max_bytes: int) -> list[tuple[int, int]]:
    """Split a run of records into batches (one WAL append and one frame each): (start, end)
    index pairs, in order, covering the run. Each batch takes records while it has fewer than
    max_records and its payload bytes stay <= max_bytes; a batch always takes at least one
    record (a record larger than max_bytes goes alone). The per-record work is C (a run from
    forward_many() can hold 100,000 records): a full batch of max_records is taken when its
    byte sum fits, otherwise the cut is found by bisection over cumulative sums."""
    n = len(payloads)
    out = []
    start = 0
    while start < n:
        stop = min(n, start + max_records)
        if sum(map(len, payloads[start:stop])) <= max_bytes:
            end = stop
        else:
            cum = list(accumulate(map(len, payloads[start:stop])))
            end = start + bisect_right(cum, max_bytes)
            if end == start:
                end = start + 1  # one record above max_bytes: alone
        out.append((start, end))
        start = end
    return out


def core_event(text: str) -> str:
    """The event name of a replica log line (docs/operations.md §Logs), "replica" if none."""
    body = text.split(": ", 1)[-1]
    for start, event in _CORE_EVENTS:
        if body.startswith(start):
            return event
    return "replica"


class NotRunningError(VreplError, RuntimeError):
    """The sync instance is not started, was stopped, or failed (see the message)."""


class FlowControlError(VreplError, BufferError):
    """forward() refused: max_inflight_forwards forwards are queued or unconfirmed. The
    version was not taken; forward it again later (notify_flow_control said so first)."""


class ReconfigError(VreplError, NotImplementedError):
    """reconfig() was asked for a change this version cannot make (it names which)."""


@dataclass
class SyncCallbacks:
    """The app's callbacks (docs/embedding.md §Callbacks and threads). All optional.

    I/O thread: write_to_cache(version, payload) or write_to_cache_batch(first_version,
    payloads); confirm_forward(version, status) or confirm_forward_range(first, last, status);
    notify_role(role, epoch, master); notify_flow_control(level); notify_wal_truncated(version);
    notify_commit(version) (the commit version rose: the app may archive records up to it).
    The thread calling start(): get_version().
    Restore threads (docs/restore.md): get_file_info(index[, name]) (seed getFileInfo),
    notify_file_synced(), get_version() after a files phase, file_magic(path) (the magic of a
    staged file; default CRC-32C, 1 if 0, the reference vnode's rule), notify_restore(status,
    reason) with status "ok" / "failed". get_wal_info is accepted; the instance owns the WAL
    and lists it itself.
    Ingested rounds (docs/vnode.md §9): serve_fetch(stream, node) on a thread of its own, for a
    FETCH connection from another replica (the app answers its requests; the instance closes
    the stream after); get_acked_version() once at start: the highest version the app may
    acknowledge (what it persisted as acks promise), or None (default): the WAL's end.
    """

    write_to_cache: Callable[[int, bytes], Any] | None = None
    write_to_cache_batch: Callable[[int, tuple[bytes, ...]], Any] | None = None
    confirm_forward: Callable[[int, ConfirmStatus], Any] | None = None
    confirm_forward_range: Callable[[int, int, ConfirmStatus], Any] | None = None
    notify_role: Callable[[str, int, int | None], Any] | None = None
    notify_flow_control: Callable[[int], Any] | None = None
    notify_wal_truncated: Callable[[int], Any] | None = None
    notify_commit: Callable[[int], Any] | None = None
    get_version: Callable[[], int] | None = None
    get_wal_info: Callable[..., Any] | None = None
    get_file_info: Callable[..., Any] | None = None
    notify_file_synced: Callable[..., Any] | None = None
    file_magic: Callable[[str], int] | None = None
    notify_restore: Callable[[str, str], Any] | None = None
    serve_fetch: Callable[[Any, int], Any] | None = None
    get_acked_version: Callable[[], int | None] | None = None


@dataclass
class SyncObservers:
    """Per-event measurements an embedding app may collect (the node feeds Prometheus
    histograms with them, docs/operations.md §Metrics). Each is called once per batch, never
    per record: `confirm_latency_s(seconds)` on the I/O thread for each run of forwards
    confirmed OK (from the forward() call that started the run to its confirmation);
    `wal_fsync_s(seconds)` on the WAL thread for each group commit (write + fdatasync)."""

    confirm_latency_s: Callable[[float], Any] | None = None
    wal_fsync_s: Callable[[float], Any] | None = None


class SyncInstance:
    """Replication of one vgroup on this node. start(), then forward()/ack_forward(), stop()."""

    def __init__(self, config: SyncConfig, callbacks: SyncCallbacks | None = None, *,
                 restore: RestoreConfig | None = None, observers: SyncObservers | None = None,
                 **callback_kwargs: Any) -> None:
        reason = sync_config_invalid(config)
        if reason:
            raise ConfigError(f"vg{config.vgroup_id}: {reason}")
        self.restore_cfg = restore or RestoreConfig()
        reason = restore_config_invalid(self.restore_cfg)
        if reason:
            raise ConfigError(f"vg{config.vgroup_id}: {reason}")
        if callbacks is not None and callback_kwargs:
            raise TypeError("pass callbacks either as a SyncCallbacks or as keywords, not both")
        self.cfg = config
        self.cb = callbacks or SyncCallbacks(**callback_kwargs)
        self.observers = observers or SyncObservers()
        self.node = config.me.node
        self._addr_by_node: dict[int, ReplicaAddress] = {r.node: r for r in config.replicas}
        self.replica: Replica | None = None
        self.io: IoLoop | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.nt: NodeTransport | None = None
        self.store: WalStore | None = None
        self._state = "new"  # new -> running -> stopped | failed
        self._failure = ""
        self._conns: dict[int, Connection] = {}
        self._arb_conn: Connection | None = None
        self._tasks: set[asyncio.Task] = set()
        self._tick_handle: asyncio.TimerHandle | None = None
        self._deferred: list[object] = []
        self._executing = False
        self._batch_block: tuple[tuple[bytes, ...], bytes] | None = None
        self._durable_waiters: list[tuple[int, asyncio.Future]] = []
        self._core_flow = 0
        self._flow_level = 0
        self._role = Role.UNSYNCED
        self._committed = 0  # the replica's commit version (CommitAdvanced), read by any thread
        self._epoch = 0
        self._master: int | None = None
        # The app-facing queue (any thread, under _qlock).
        self._qlock = threading.Lock()
        self._runs: list[tuple[int, list[bytes]]] = []
        self._run_times: list[float] = []  # monotonic time each run of _runs began (forward())
        self._run_next: int | None = None  # the version that extends the last run in _runs
        self._queued = 0
        self._max_inflight = config.max_inflight_forwards  # reconfig() cannot change it
        self._signalled = False
        self._app_acked = 0
        self._app_acked_fed = 0
        self._ack_failures: list[int] = []
        # Restore sessions (docs/restore.md), touched from restore threads under the lock.
        self._sessions_lock = threading.Lock()
        self._sender_sessions: dict[int, Any] = {}  # follower node -> SenderSession
        self._backup_sessions: set[Any] = set()
        self._receiver_session: Any = None
        self.last_restore_error = ""
        # Observability (docs/operations.md §Metrics), all on the I/O thread. _sent_first[i]
        # is the first version of a run of forwards taken at _sent_at[i] (a master's; the
        # first entry, version 0, is when it became master): a peer that acked up to v has
        # waited since the entry holding v + 1. _confirm_times: (last version of a run, time
        # its first forward() was called), popped as the runs are confirmed.
        self._sent_first: list[int] = []
        self._sent_at: list[float] = []
        self._confirm_times: deque[tuple[int, float]] = deque(maxlen=CONFIRM_TIMES_MAX)
        self._last_heard: dict[int, float] = {}  # peer node -> monotonic time of its last frame
        self._role_since = _monotonic()
        self.role_changes: dict[str, int] = {}  # role entered -> times
        self.epochs_promised = 0  # PersistPromisedEpoch: each epoch this replica took part in
        self.restore_counters: dict[str, int] = dict.fromkeys(
            ("sender_sessions", "sender_ok", "sender_failed", "receiver_sessions", "receiver_ok", "receiver_failed",
             "files_sent", "file_bytes_sent", "wal_records_sent", "files_received", "file_bytes_received",
             "wal_records_received", "streamed_in_band"),
            0,
        )
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "forwards",
                "forward_bytes",
                "forwards_refused_flow_control",
                "confirmed_ok",
                "confirmed_failed",
                "confirmed_timed_out",
                "confirmed_not_master",
                "app_acks",
                "records_written_to_cache",
                "connections_refused",
                "connections_opened",
                "connections_closed",
                "streams",
                "streamed_records",
            ),
            0,
        )

    # ================================================================== app thread API

    def start(self) -> "SyncInstance":
        """Open the WAL, read the promise, listen (shared per node), connect, start ticking."""
        if self._state != "new":
            raise NotRunningError(f"vg{self.cfg.vgroup_id}: start() called in state {self._state}")
        cfg = self.cfg
        self.store = WalStore(
            cfg.data_path,
            max_record_bytes=cfg.record_max_bytes,
            max_file_bytes=cfg.wal_max_file_bytes,
            on_durable=self._wal_durable_threadsafe,
            on_truncated=self._wal_truncated_threadsafe,
            on_error=self._wal_error_threadsafe,
            on_group_commit=self.observers.wal_fsync_s,
            name=f"vrepl-wal-vg{cfg.vgroup_id}",
        )
        os.makedirs(cfg.data_path, exist_ok=True)
        self.io = IoLoop.shared()
        self.loop = self.io.loop
        try:
            disk = self.store.open()
            if disk.repaired_tail:
                log.warning("%s: WAL had a torn tail, truncated: %s", self._prefix_static(), disk.repaired_tail)
            self.replica = Replica(self._replica_config(disk))
            if self.cb.get_version is not None:
                app_version = self.cb.get_version()
                if app_version > disk.last_version:
                    log.warning(
                        "%s: the app reports v%d but the WAL ends at v%d: the app holds records the WAL lacks",
                        self._prefix_static(), app_version, disk.last_version,
                    )
            self.io.run(self._start_in_loop(), timeout_s=30)
        except BaseException:
            self.store.close()
            self.io.release()
            self.io = None      # released: a later stop() must not release it again
            self._state = "failed"
            raise
        return self

    def forward(self, version: int, payload: bytes) -> None:
        """Write and replicate record `version` (the next version, strictly in order; any
        thread; never blocks). The outcome comes later through confirm_forward."""
        if self._state != "running":
            raise NotRunningError(f"vg{self.cfg.vgroup_id}: forward() while {self._state} {self._failure}".rstrip())
        with self._qlock:
            # The per-record path of every app: kept to a few attribute reads.
            replica = self.replica
            window = replica.window if replica is not None else None
            queued = self._queued
            inflight = queued + len(window) if window is not None else queued
            if inflight >= self._max_inflight:
                self.counters["forwards_refused_flow_control"] += 1
                raise FlowControlError(
                    f"vg{self.cfg.vgroup_id}: {inflight} forwards queued or unconfirmed (max_inflight_forwards)"
                )
            if version == self._run_next:
                self._runs[-1][1].append(payload)
            else:
                self._runs.append((version, [payload]))
                self._run_times.append(_monotonic())  # once per run, not per record
            self._run_next = version + 1
            self._queued = queued + 1
            if self._signalled:
                return
            self._signalled = True
        self._signal()

    def forward_many(self, first_version: int, payloads: "list[bytes] | tuple[bytes, ...]") -> None:
        """forward() for a run of records: records first_version, first_version + 1, ... in
        one call and under one lock (any thread; never blocks). The same as calling forward()
        for each in order, except that flow control takes all or none: FlowControlError when
        max_inflight_forwards would be exceeded, and then no version was taken. A run longer
        than max_inflight_forwards can never be taken (ValueError). Each record is confirmed
        through confirm_forward as usual (a range callback gets the run in one call)."""
        if self._state != "running":
            raise NotRunningError(f"vg{self.cfg.vgroup_id}: forward_many() while {self._state} {self._failure}".rstrip())
        n = len(payloads)
        if n == 0:
            return
        if n > self._max_inflight:
            raise ValueError(f"vg{self.cfg.vgroup_id}: {n} records in one forward_many() exceed max_inflight_forwards"
                             f" {self.cfg.max_inflight_forwards}")
        with self._qlock:
            window = self.replica.window if self.replica is not None else None
            inflight = self._queued + (len(window) if window is not None else 0)
            if inflight + n > self._max_inflight:
                self.counters["forwards_refused_flow_control"] += n
                raise FlowControlError(
                    f"vg{self.cfg.vgroup_id}: {inflight} forwards queued or unconfirmed, {n} more exceed"
                    " max_inflight_forwards"
                )
            if first_version == self._run_next:
                self._runs[-1][1].extend(payloads)
            else:
                self._runs.append((first_version, list(payloads)))
                self._run_times.append(_monotonic())
            self._run_next = first_version + n
            self._queued += n
            if self._signalled:
                return
            self._signalled = True
        self._signal()

    def ack_forward(self, version: int, status: int = AckStatus.OK) -> None:
        """A slave's app applied and persisted every record up to `version` (cumulative), or
        failed to apply `version` (status FAILED: replication with the master is reset)."""
        if self._state != "running":
            return
        with self._qlock:
            if status == AckStatus.OK:
                if version > self._app_acked:
                    self._app_acked = version
            else:
                self._ack_failures.append(version)
            if self._signalled:
                return
            self._signalled = True
        self._signal()

    def roles(self) -> dict[str, Any]:
        """This node's role, epoch and master, and its view of every replica's role."""
        return self._call(self._roles_now)

    def stats(self) -> dict[str, Any]:
        """Counters (forwards, acks, timeouts, bytes) and per-peer lag and traffic."""
        return self._call(self._stats_now)

    def recover(self) -> None:
        """Force this follower to match its log with the master again (truncate/stream).
        File-level restore is a later issue; a master ignores this (logged)."""
        self._call(lambda: self._step(AppRecover()))

    def reconfig(self, config: SyncConfig) -> None:
        """Apply a changed configuration. Supported: quorum. Anything else raises
        ReconfigError naming the fields (membership changes need the restore flow)."""
        changed = [
            f.name for f in dataclasses.fields(SyncConfig) if getattr(config, f.name) != getattr(self.cfg, f.name)
        ]
        unsupported = [name for name in changed if name != "quorum"]
        if unsupported:
            raise ReconfigError(
                f"vg{self.cfg.vgroup_id}: reconfig can change only quorum for now; {', '.join(unsupported)}"
                " cannot change on a running instance (replica membership changes need the restore flow,"
                " a later issue): stop and start the instance instead"
            )
        reason = sync_config_invalid(config)
        if reason:
            raise ConfigError(f"vg{config.vgroup_id}: {reason}")
        if not changed:
            return

        def apply() -> None:
            assert self.replica is not None
            self.cfg = config
            self._execute(self.replica.set_quorum(config.quorum))
            self._after()

        self._call(apply)

    def recycle_wal(self, before_version: int) -> None:
        """Delete sealed WAL files whose records are all below `before_version` (the app
        archived them; docs/vnode.md §5). Queued to the WAL thread; a follower that needs
        them later is restored from the archived files (docs/restore.md)."""
        if self.store is not None and self._state == "running":
            self.store.recycle(before_version)

    def restore_status(self) -> dict[str, Any]:
        """Restore sessions running on this node for this vgroup, counters, last error."""
        with self._sessions_lock:
            sending = sorted(self._sender_sessions)
            backups = len(self._backup_sessions)
            receiving = self._receiver_session.node if self._receiver_session is not None else None
        limiter = self.nt.restore_limiter.snapshot() if self.nt is not None and self.nt.restore_limiter else {}
        return {"sending_to": sending, "backups": backups, "receiving_from": receiving, "limiter": limiter,
                "counters": dict(self.restore_counters), "last_error": self.last_restore_error}

    def stop(self) -> None:
        """Close connections, fail what is queued or unconfirmed, close the WAL."""
        if self._state not in ("running", "failed") or self.io is None:
            return
        io = self.io
        try:
            io.call(self._stop_in_loop, timeout_s=30)
            self._join_sessions(5.0)
        finally:
            self._state = "stopped"
            if self.store is not None:
                self.store.close()
            io.release()

    @property
    def committed_version(self) -> int:
        """The commit version (docs/embedding.md §Commit index): every record up to it is
        in the log of every future master and is never truncated, so the app may archive
        it; records above it may still be cut. 0 after start(); never decreases in a run."""
        return self._committed

    @property
    def wal_dir(self) -> str:
        return f"{self.cfg.data_path}/wal"

    def _call(self, fn: Callable[[], Any]) -> Any:
        if self._state != "running" or self.io is None:
            raise NotRunningError(f"vg{self.cfg.vgroup_id}: not running ({self._state}) {self._failure}".rstrip())
        return self.io.call(fn)

    def _signal(self) -> None:
        loop = self.loop
        assert loop is not None and self.io is not None
        if self.io.in_loop():
            loop.call_soon(self._run_queue)
        else:
            try:
                loop.call_soon_threadsafe(self._run_queue)
            except RuntimeError:  # the loop closed under us (stopping)
                pass

    # ================================================================== start / stop (I/O thread)

    def _replica_config(self, disk) -> Any:
        cfg = self.cfg
        if cfg.initial_version and (cfg.initial_version, cfg.initial_epoch) != (disk.last_version, disk.last_epoch):
            raise ConfigError(
                f"vg{cfg.vgroup_id}: initial version/epoch e{cfg.initial_epoch}v{cfg.initial_version} do not match"
                f" the WAL (e{disk.last_epoch}v{disk.last_version}); the WAL is authoritative, and starting from"
                " state without a WAL needs the restore flow (a later issue)"
            )
        promised_epoch = disk.promised_epoch
        promised_master = disk.promised_master if disk.promised_master is not None else NO_NODE
        if promised_epoch < disk.last_epoch or (promised_epoch and promised_master not in self._addr_by_node):
            # No (or an older) promise file: claim the log's own epoch, as its writer did.
            promised_epoch, promised_master = disk.last_epoch, (self.node if disk.last_epoch else NO_NODE)
        # An app that persisted less than the WAL holds (a round whose files are not staged
        # yet, docs/vnode.md §9.3) must not have the records above it acked for it.
        acked = self.cb.get_acked_version() if self.cb.get_acked_version is not None else None
        return cfg.replica_config(
            app_acked_version=acked,
            last_epoch=disk.last_epoch,
            last_version=disk.last_version,
            epoch_history=disk.epoch_history,
            promised_epoch=promised_epoch,
            promised_master=promised_master,
        )

    async def _start_in_loop(self) -> None:
        assert self.loop is not None and self.replica is not None
        self.nt = await NodeTransport.acquire(self.loop, self)
        self._state = "running"
        me = self.cfg.me
        self._execute(self.replica.start())
        self._tick_s = self.cfg.tick_ms / 1000.0
        self._t0 = self.loop.time()
        self._ticks = 0
        self._tick_handle = self.loop.call_at(self._t0 + self._tick_s, self._on_tick)
        for addr in self.cfg.replicas:
            if addr.node != self.node and me.order_key() < addr.order_key():
                self._spawn(self._connect_loop(addr.node, addr.host, addr.port, ConnKind.PEER))
        if self.cfg.arbitrator_used:
            host, port = parse_endpoint(self.cfg.arbitrator or "")
            self._spawn(self._connect_loop(None, host, port, ConnKind.ARBITRATOR))
        self._after()
        log.info("%s: started, listening on %s, replicas %s", self.log_prefix(), me.endpoint(),
                 " ".join(f"n{r.node}@{r.endpoint()}" for r in self.cfg.replicas))

    def _stop_in_loop(self) -> None:
        if self._state == "running":
            self._state = "stopping"
        self._shutdown_replication("stopping")
        if self.nt is not None:
            self.nt.release(self)
        log.info("%s: stopped", self.log_prefix())

    def _shutdown_replication(self, reason: str) -> None:
        self._cancel_sessions(reason)
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        for task in list(self._tasks):
            task.cancel()
        for conn in list(self._conns.values()):
            conn.abort(reason)
        self._conns.clear()
        if self._arb_conn is not None:
            self._arb_conn.abort(reason)
            self._arb_conn = None
        # Nothing queued or pending will be confirmed now: say so.
        with self._qlock:
            runs, self._runs, self._queued, self._run_next = self._runs, [], 0, None
            self._run_times = []
        for first, payloads in runs:
            self._confirm(first, first + len(payloads) - 1, ConfirmStatus.FAILED)
        if self.replica is not None and self.replica.window is not None:
            span = self.replica.window.clear()
            if span is not None:
                self._confirm(span[0], span[1], ConfirmStatus.FAILED)
        for _, fut in self._durable_waiters:
            if not fut.done():
                fut.cancel()
        self._durable_waiters.clear()

    def _fail(self, reason: str) -> None:
        """A fatal local error (the WAL failed): stop replicating, keep the reason."""
        if self._state != "running":
            return
        log.critical("%s: replication stopped: %s", self.log_prefix(), reason)
        self._state = "failed"
        self._failure = reason
        self._shutdown_replication(f"failed: {reason}")
        self._role = Role.UNSYNCED
        self._callback(self.cb.notify_role, Role.UNSYNCED.describe(), self._epoch, None)

    def _spawn(self, coro) -> None:
        assert self.loop is not None
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("%s: task failed: %r", self.log_prefix(), exc, exc_info=exc)

    # ================================================================== logging helpers

    def _prefix_static(self) -> str:
        return f"vg{self.cfg.vgroup_id} n{self.node} e-"

    def log_prefix(self) -> str:
        epoch = self.replica.promised_epoch if self.replica is not None else "-"
        return f"vg{self.cfg.vgroup_id} n{self.node} e{epoch}"

    # ================================================================== connections (I/O thread)

    def peer_hello_refusal(self, node: int) -> str | None:
        """Why a peer connection from `node` is refused by this instance's server side."""
        if self._state != "running":
            return f"vg{self.cfg.vgroup_id} is {self._state}"
        addr = self._addr_by_node.get(node)
        if addr is None:
            return f"unknown node n{node}: not a replica of vg{self.cfg.vgroup_id}"
        if node == self.node:
            return f"hello from n{node}, which is this node"
        if not addr.order_key() < self.cfg.me.order_key():
            return f"n{node} at {addr.endpoint()} has the higher address: this node opens that connection"
        return None

    async def _connect_loop(self, node: int | None, host: str, port: int, kind: int) -> None:
        """Client side: connect, wait until the connection ends, retry every reconnect interval."""
        assert self.loop is not None and self.nt is not None
        pause_s = self.cfg.reconnect_interval_ms / 1000.0
        what = "arbitrator" if kind == ConnKind.ARBITRATOR else f"n{node}"
        failures = 0
        while self._state == "running":
            conn = Connection(self.nt, instance=self, peer_node=node, kind=kind)
            try:
                await asyncio.wait_for(self.loop.create_connection(lambda: conn, host, port), timeout=max(pause_s, 1.0))
            except (OSError, asyncio.TimeoutError) as exc:
                failures += 1
                level = logging.INFO if failures == 1 else logging.DEBUG
                log.log(level, "%s: cannot connect to %s at %s:%d: %s", self.log_prefix(), what, host, port, exc or "timeout")
                await asyncio.sleep(pause_s)
                continue
            failures = 0
            self.counters["connections_opened"] += 1
            await asyncio.shield(conn.done)
            await asyncio.sleep(pause_s)

    def on_connection_ready(self, conn: Connection) -> None:
        """A connection finished its handshake (either side)."""
        if self._state != "running":
            conn.abort(f"vg{self.cfg.vgroup_id} is {self._state}")
            return
        if conn.kind == ConnKind.ARBITRATOR:
            self._arb_conn = conn
            log.info("%s: %s ready", self.log_prefix(), conn.describe())
            self._step(ArbitratorConnected())
            self._after()
            return
        node = conn.peer_node
        assert node is not None
        old = self._conns.get(node)
        if old is not None and old is not conn:
            old.abort("replaced by a newer connection from the same peer")
            del self._conns[node]
            self._step(PeerDisconnected(node))
        self._conns[node] = conn
        log.info("%s: %s ready", self.log_prefix(), conn.describe())
        self._step(PeerConnected(node))
        self._after()

    def on_connection_lost(self, conn: Connection) -> None:
        if self._state != "running":
            return
        self.counters["connections_closed"] += 1
        if conn.kind == ConnKind.ARBITRATOR:
            if self._arb_conn is conn:
                self._arb_conn = None
                log.info("%s: %s lost: %s", self.log_prefix(), conn.describe(), conn.close_reason)
                self._step(ArbitratorLost())
        elif self._conns.get(conn.peer_node) is conn:  # type: ignore[arg-type]
            del self._conns[conn.peer_node]  # type: ignore[arg-type]
            log.info("%s: %s lost: %s", self.log_prefix(), conn.describe(), conn.close_reason)
            self._step(PeerDisconnected(conn.peer_node))  # type: ignore[arg-type]
        self._update_flow()
        self._after()

    def on_send_queue(self, conn: Connection, paused: bool) -> None:
        """A connection's send queue went above (paused) or back below its high-water mark."""
        if paused:
            log.info("%s: %s send queue above %d bytes", self.log_prefix(), conn.describe(), self.cfg.send_queue_high_bytes)
        self._update_flow()

    def on_messages(self, conn: Connection, msgs: list) -> None:
        """Decoded frames from one read of one authenticated connection."""
        if self._state != "running":
            return
        if conn.kind == ConnKind.ARBITRATOR:
            for msg in msgs:
                self._on_arbitrator_message(conn, msg)
            self._after()
            return
        node = conn.peer_node
        if self._conns.get(node) is not conn:  # type: ignore[arg-type]
            return  # a replaced connection still draining
        self._last_heard[node] = _monotonic()  # type: ignore[index]  # once per read, not per frame
        replica = self.replica
        assert replica is not None
        for msg in msgs:
            if type(msg) not in PEER_MESSAGE_TYPES:
                self._drop_conn(conn, f"{msg.describe()} is not a peer message")
                break
            self._execute(replica.step(Received(node, msg)))  # type: ignore[arg-type]
            if conn.closed:
                break
        self._after()

    def _on_arbitrator_message(self, conn: Connection, msg: object) -> None:
        if type(msg) is not ArbitratorGrant:
            self._drop_conn(conn, f"{getattr(msg, 'describe', lambda: type(msg).__name__)()} from the arbitrator")
            return
        if msg.vgroup_id != self.cfg.vgroup_id or msg.node != self.node:
            self._drop_conn(conn, f"{msg.describe()} is not for vg{self.cfg.vgroup_id} n{self.node}")
            return
        event = ArbitratorGranted if msg.granted else ArbitratorRefused
        self._step(event(msg.epoch, msg.lease_ms))

    def _drop_conn(self, conn: Connection, reason: str) -> None:
        conn.abort(reason, logging.WARNING)
        if conn.kind == ConnKind.ARBITRATOR:
            if self._arb_conn is conn:
                self._arb_conn = None
                self._step(ArbitratorLost())
        elif self._conns.get(conn.peer_node) is conn:  # type: ignore[arg-type]
            del self._conns[conn.peer_node]  # type: ignore[arg-type]
            self._step(PeerDisconnected(conn.peer_node))  # type: ignore[arg-type]

    # ================================================================== events in (I/O thread)

    def _step(self, event: object) -> None:
        if self._executing:
            # An event raised while executing a list (a connection closed by an action):
            # handled once the list is done, so the list keeps its order.
            self._deferred.append(event)
            return
        assert self.replica is not None
        self._execute(self.replica.step(event))  # type: ignore[arg-type]

    def _run_queue(self) -> None:
        """Drain the app's queue: app acks, then forwards as batched events."""
        if self._state != "running":
            return
        with self._qlock:
            if not self._signalled:
                return
            runs, self._runs = self._runs, []
            run_times, self._run_times = self._run_times, []
            self._run_next = None
            self._queued = 0
            self._signalled = False
            acked = self._app_acked
            failures, self._ack_failures = self._ack_failures, []
        replica = self.replica
        assert replica is not None
        for version in failures:
            self._execute(replica.step(AppAcked(version, AckStatus.FAILED)))
        if acked > self._app_acked_fed:
            self._app_acked_fed = acked
            self.counters["app_acks"] += 1
            self._execute(replica.step(AppAcked(acked)))
        max_records = self.cfg.max_batch_records
        max_bytes = self.cfg.max_batch_bytes
        master = self._role == Role.MASTER
        for (first, payloads), began in zip(runs, run_times):
            if master:  # per run: the lag in ms and the confirm latency (§Metrics)
                self._sent_first.append(first)
                self._sent_at.append(began)
                self._confirm_times.append((first + len(payloads) - 1, began))
                if len(self._sent_first) > SENT_TIMES_MAX:
                    self._prune_sent()
            self.counters["forwards"] += len(payloads)
            total = sum(map(len, payloads))
            self.counters["forward_bytes"] += total
            if len(payloads) <= max_records and total <= max_bytes:
                self._execute(replica.step(AppForwardBatch(first, tuple(payloads))))
                continue
            for start, end in batch_bounds(payloads, max_records, max_bytes):
                self._execute(replica.step(AppForwardBatch(first + start, tuple(payloads[start:end]))))
        self._flush()

    def _after(self) -> None:
        """End of a batch of events: drain what the app queued meanwhile, then write, then
        (light load) make the WAL appends of this batch durable right here: the frames are
        already on their way, so this fdatasync overlaps the followers' work."""
        if self._signalled:
            self._run_queue()
        self._flush()
        if self.cfg.wal_inline_sync_max_bytes and self.store is not None and self._state == "running":
            self.store.run_inline(self.cfg.wal_inline_sync_max_bytes)

    def _flush(self) -> None:
        if self.nt is not None:
            self.nt.flush()

    def _on_tick(self) -> None:
        if self._state != "running":
            return
        assert self.loop is not None and self.replica is not None
        now = self.loop.time()
        due = int((now - self._t0) / self._tick_s) - self._ticks
        if due > MAX_CATCH_UP_TICKS:
            # A stall longer than every timeout: replay enough ticks to expire them all.
            self._t0 += (due - MAX_CATCH_UP_TICKS) * self._tick_s
            due = MAX_CATCH_UP_TICKS
        for _ in range(max(due, 1)):
            self._ticks += 1
            self._execute(self.replica.tick())
        if len(self._sent_first) > 1:
            self._prune_sent()
        self._tick_handle = self.loop.call_at(self._t0 + (self._ticks + 1) * self._tick_s, self._on_tick)
        self._after()

    def _prune_sent(self) -> None:
        """Forget the forward times of runs every peer has acked (docs/operations.md
        §Metrics, lag in ms); if a peer stays far behind, keep every other one."""
        first, at = self._sent_first, self._sent_at
        peers = self.replica.peers if self.replica is not None else None
        if peers:
            lowest = min(p.acked_version for p in peers.values())
            i = bisect_right(first, lowest + 1) - 1
            if i > 0:
                del first[:i]
                del at[:i]
        if len(first) > SENT_TIMES_MAX:
            # A dropped run's records count from the run before it: the lag in ms of a peer
            # that far behind is over-estimated by at most the gap between two kept runs.
            self._sent_first, self._sent_at = first[::2], at[::2]

    def _lag_ms(self, acked: int, last: int, now: float) -> int:
        """How long the oldest record `acked` lacks (this master's log ends at `last`) has
        waited since its forward(), in ms; 0 when nothing is missing."""
        if acked >= last or not self._sent_first:
            return 0
        i = max(0, bisect_right(self._sent_first, acked + 1) - 1)
        return round((now - self._sent_at[i]) * 1000)

    # -- from the WAL thread ---------------------------------------------------------------------

    def _wal_durable_threadsafe(self, version: int) -> None:
        if self.io is not None and self.io.in_loop() and self.loop is not None:
            self.loop.call_soon(self._on_wal_durable, version)  # run_inline: already here
            return
        self._threadsafe(self._on_wal_durable, version)

    def _wal_truncated_threadsafe(self, last_epoch: int, last_version: int) -> None:
        if self.io is not None and self.io.in_loop() and self.loop is not None:
            self.loop.call_soon(self._on_wal_truncated, last_epoch, last_version)
            return
        self._threadsafe(self._on_wal_truncated, last_epoch, last_version)

    def _wal_error_threadsafe(self, exc: BaseException) -> None:
        self._threadsafe(self._fail, f"WAL failed: {exc}")

    def _threadsafe(self, fn: Callable, *args: Any) -> None:
        loop = self.loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # loop closed: stopping

    def _on_wal_durable(self, version: int) -> None:
        if self._state != "running" or self.replica is None:
            return
        if version > self.replica.durable_version and version <= self.replica.last_version:
            self._execute(self.replica.step(WalPersisted(version)))
        waiters = [w for w in self._durable_waiters if w[0] <= version]
        if waiters:
            self._durable_waiters = [w for w in self._durable_waiters if w[0] > version]
            for _, fut in waiters:
                if not fut.done():
                    fut.set_result(version)
        self._after()

    def _on_wal_truncated(self, last_epoch: int, last_version: int) -> None:
        if self._state != "running":
            return
        self._callback(self.cb.notify_wal_truncated, last_version)
        self._step(TruncateDone(last_epoch, last_version))
        self._after()

    # ================================================================== actions out (I/O thread)

    def _execute(self, actions: list) -> None:
        """Execute one action list IN ORDER (vrepl/replica/actions.py ORDERING CONTRACT)."""
        self._executing = True
        try:
            frames: dict[int, bytes] = {}
            for action in actions:
                t = type(action)
                if t is Send:
                    conn = self._conns.get(action.node)
                    if conn is None:
                        continue
                    msg = action.message
                    frame = frames.get(id(msg))
                    if frame is None:
                        block = None
                        if type(msg) is ForwardBatch and self._batch_block is not None and self._batch_block[0] is msg.payloads:
                            block = self._batch_block[1]  # the WAL block of this batch: encoded once
                        frame = codec.encode(msg, block)
                        frames[id(msg)] = frame
                    conn.send_frame(frame)
                elif t is PersistBatch:
                    block = action.block or codec._encode_records(action.first_version, action.record_epochs, action.payloads)
                    self._batch_block = (action.payloads, block)
                    self.store.append(action.first_version, action.last_version, block)  # type: ignore[union-attr]
                elif t is ConfirmForward:
                    self._confirm(action.first_version, action.last_version, action.status)
                elif t is WriteToCacheBatch:
                    self._write_to_cache(action.first_version, action.payloads)
                elif t is Log:
                    level = int(action.level)
                    if core_log.isEnabledFor(level):
                        core_log.log(level, action.text, extra={"event": core_event(action.text)})
                elif t is PersistRecords:
                    recs = action.records
                    block = _wire.encode_records(recs[0].version, [r.epoch for r in recs], [r.payload for r in recs])
                    self.store.append(recs[0].version, recs[-1].version, block)  # type: ignore[union-attr]
                elif t is WriteToCache:
                    self._write_to_cache(action.record.version, (action.record.payload,))
                elif t is NotifyRole:
                    self._on_notify_role(action)
                elif t is PersistPromisedEpoch:
                    # Durable before any later Send of this list is written (ordering contract):
                    # sends are only queued until the batch ends, and this returns after fsync.
                    self.store.persist_promise(action.epoch, action.master)  # type: ignore[union-attr]
                    self.epochs_promised += 1
                elif t is TruncateWalAfter:
                    self.store.truncate_after(action.version)  # type: ignore[union-attr]
                elif t is StreamWalFrom:
                    self._on_stream_wal_from(action)
                elif t is ResetConnection:
                    conn = self._conns.pop(action.node, None)
                    if conn is not None:
                        conn.abort(f"reset: {action.reason}", logging.WARNING)
                        self._deferred.append(PeerDisconnected(action.node))
                elif t is RequestArbitratorGrant:
                    self._request_grant(action.epoch)
                elif t is FlowControl:
                    self._core_flow = action.level
                    self._update_flow()
                elif t is CommitAdvanced:
                    self._committed = action.version
                    self._callback(self.cb.notify_commit, action.version)
                else:
                    raise VreplError(f"no executor for action {t.__name__}")
        finally:
            self._executing = False
            self._batch_block = None
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            for event in deferred:
                self._step(event)

    def _callback(self, fn: Callable | None, *args: Any) -> None:
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:  # the app's bug must not stop replication
            log.exception("%s: callback %s failed", self.log_prefix(), getattr(fn, "__name__", fn))

    def _confirm(self, first: int, last: int, status: ConfirmStatus) -> None:
        self.counters["confirmed_" + status.describe()] += last - first + 1
        times = self._confirm_times
        if times and times[0][0] <= last:
            # Runs confirmed: one latency per run whose last record is now decided.
            observe = self.observers.confirm_latency_s if status == ConfirmStatus.OK else None
            now = _monotonic()
            while times and times[0][0] <= last:
                began = times.popleft()[1]
                if observe is not None:
                    observe(now - began)
        cb = self.cb
        if cb.confirm_forward_range is not None:
            self._callback(cb.confirm_forward_range, first, last, status)
        elif cb.confirm_forward is not None:
            fn = cb.confirm_forward
            try:
                for version in range(first, last + 1):
                    fn(version, status)
            except Exception:
                log.exception("%s: callback confirm_forward failed", self.log_prefix())

    def _write_to_cache(self, first: int, payloads: tuple[bytes, ...]) -> None:
        self.counters["records_written_to_cache"] += len(payloads)
        cb = self.cb
        if cb.write_to_cache_batch is not None:
            self._callback(cb.write_to_cache_batch, first, payloads)
        elif cb.write_to_cache is not None:
            fn = cb.write_to_cache
            try:
                for i, payload in enumerate(payloads):
                    fn(first + i, payload)
            except Exception:
                log.exception("%s: callback write_to_cache failed", self.log_prefix())
        elif self.replica is not None and self.replica.cfg.app_ack_required_effective:
            # No app to apply records: nothing will ever ack them, so ack for it.
            self.ack_forward(first + len(payloads) - 1)

    def _on_notify_role(self, action: NotifyRole) -> None:
        before, now = self._role, _monotonic()
        in_role_ms = round((now - self._role_since) * 1000)
        self._role_since = now
        self._role = action.role
        self._epoch = action.epoch
        self._master = None if action.master == NO_NODE else action.master
        role = action.role.describe()
        self.role_changes[role] = self.role_changes.get(role, 0) + 1
        self._sent_first.clear()
        self._sent_at.clear()
        self._confirm_times.clear()
        if action.role == Role.MASTER:
            # Whatever a peer lacks from before this node's first forward, it has lacked
            # since this node became master.
            self._sent_first.append(0)
            self._sent_at.append(now)
        log.info("%s: role %s -> %s, epoch %d, master %s (%d ms as %s)", self.log_prefix(), before.describe(),
                 role, action.epoch, f"n{self._master}" if self._master is not None else "none", in_role_ms,
                 before.describe(), extra={"event": "role_change", "role": role, "previous_role": before.describe(),
                                           "master": self._master, "previous_role_ms": in_role_ms})
        self._callback(self.cb.notify_role, action.role.describe(), action.epoch, self._master)

    def _update_flow(self) -> None:
        level = 1 if self._core_flow or any(c.paused for c in self._conns.values()) else 0
        if level != self._flow_level:
            self._flow_level = level
            log.info("%s: flow control %s", self.log_prefix(), "on" if level else "off")
            self._callback(self.cb.notify_flow_control, level)

    def _request_grant(self, epoch: int) -> None:
        conn = self._arb_conn
        if conn is None:
            return
        lease_ms = self.cfg.arbitrator_lease_ticks * self.cfg.tick_ms
        conn.send_frame(codec.encode(ArbitratorRequest(self.cfg.vgroup_id, self.node, epoch, lease_ms)))

    # -- restore sessions (docs/restore.md) ----------------------------------------------------

    def _on_stream_wal_from(self, action: StreamWalFrom) -> None:
        """The core asks to bring a follower up to date: a small lag the WAL still holds is
        streamed in-band (design §4.3); otherwise the restore flow runs over a sync
        connection (seed 数据恢复流程): files if the WAL was recycled, then the WAL."""
        if action.node not in self._conns:
            return
        rc = self.restore_cfg
        assert self.store is not None
        wal_first = self.store.first_version_or(action.last_version + 1)
        lag = action.last_version - action.first_version + 1
        if not rc.enabled or (wal_first <= action.first_version and lag < rc.min_lag_versions):
            self.restore_counters["streamed_in_band"] += 1
            self._start_stream(action)
            return
        from vrepl.restore.live import SenderSession

        with self._sessions_lock:
            old = self._sender_sessions.pop(action.node, None)
        if old is not None:
            old.cancel("the follower asked again (a new SyncRequest)")
        self._step(PeerRestoring(action.node))
        session = SenderSession(self, action.node, first_version=action.first_version)
        with self._sessions_lock:
            self._sender_sessions[action.node] = session
        log.info("%s: restore of n%d from v%d (log end v%d, WAL from v%d)", self.log_prefix(), action.node,
                 action.first_version, action.last_version, wal_first)
        session.start()

    def sync_hello_refusal(self, node: int) -> str | None:
        """Why a sync connection (kind SYNC) from `node` is refused, or None."""
        if self._state != "running":
            return f"vg{self.cfg.vgroup_id} is {self._state}"
        if node not in self._addr_by_node or node == self.node:
            return f"sync connection from n{node}: not another replica of vg{self.cfg.vgroup_id}"
        if not self.restore_cfg.enabled:
            return f"vg{self.cfg.vgroup_id} takes no restore (restore disabled)"
        return None

    def backup_hello_refusal(self) -> str | None:
        """Why a restore tool's connection (kind BACKUP) is refused, or None."""
        if self._state != "running":
            return f"vg{self.cfg.vgroup_id} is {self._state}"
        if not self.restore_cfg.allow_backup:
            return f"vg{self.cfg.vgroup_id} serves no backups (restore.allow_backup is off)"
        return None

    def fetch_hello_refusal(self, node: int) -> str | None:
        """Why a FETCH connection (files of an ingested round) from `node` is refused."""
        if self._state != "running":
            return f"vg{self.cfg.vgroup_id} is {self._state}"
        if node not in self._addr_by_node or node == self.node:
            return f"fetch connection from n{node}: not another replica of vg{self.cfg.vgroup_id}"
        if self.cb.serve_fetch is None:
            return f"vg{self.cfg.vgroup_id} serves no fetches (the app has no rounds of files)"
        return None

    def _serve_fetch(self, stream: Any, node: int) -> None:
        """A FETCH connection: the app answers it on a thread of its own (bulk file reads)."""
        def run() -> None:
            try:
                self.cb.serve_fetch(stream, node)  # type: ignore[misc]
            except Exception:
                log.exception("%s: serving a fetch of n%d failed", self.log_prefix(), node)
            finally:
                stream.close()
        threading.Thread(target=run, name=f"vrepl-fetch-vg{self.cfg.vgroup_id}-n{node}",
                         daemon=True).start()

    def on_sync_connection(self, sock: Any, hello: codec.Hello) -> None:
        """A sync/backup connection finished its handshake on this node's server (I/O thread)."""
        from vrepl.restore.live import ReceiverSession, SenderSession
        from vrepl.restore.stream import SyncStream

        rc = self.restore_cfg
        stream = SyncStream(sock, io_timeout_s=rc.io_timeout_s)
        if self._state != "running":
            stream.close()
            return
        if hello.kind == ConnKind.FETCH:
            self._serve_fetch(stream, hello.node)
            return
        if hello.kind == ConnKind.BACKUP:
            session = SenderSession(self, None, stream=stream)
            with self._sessions_lock:
                self._backup_sessions.add(session)
            log.info("%s: backup requested by a restore tool at %s", self.log_prefix(), stream.peer)
            session.start()
            return
        with self._sessions_lock:
            old = self._receiver_session
            session = ReceiverSession(self, hello.node, stream)
            self._receiver_session = session
        if old is not None:
            old.cancel("replaced by a newer restore session")
        log.info("%s: restore session from n%d (%s)", self.log_prefix(), hello.node, stream.peer)
        session.start()

    def _session_ended(self, session: Any) -> None:
        with self._sessions_lock:
            if self._sender_sessions.get(getattr(session, "node", None)) is session:
                del self._sender_sessions[session.node]
            self._backup_sessions.discard(session)
            if self._receiver_session is session:
                self._receiver_session = None

    def _cancel_sessions(self, reason: str) -> None:
        with self._sessions_lock:
            sessions = list(self._sender_sessions.values()) + list(self._backup_sessions)
            if self._receiver_session is not None:
                sessions.append(self._receiver_session)
        for s in sessions:
            s.cancel(reason)

    def _join_sessions(self, timeout_s: float) -> None:
        with self._sessions_lock:
            sessions = list(self._sender_sessions.values()) + list(self._backup_sessions)
            if self._receiver_session is not None:
                sessions.append(self._receiver_session)
        deadline = time.monotonic() + timeout_s
        for s in sessions:
            s.done.wait(max(0.0, deadline - time.monotonic()))

    # -- streaming the WAL to a follower (small lags; design §4.3) -------------------------------

    def _start_stream(self, action: StreamWalFrom) -> None:
        conn = self._conns.get(action.node)
        if conn is None:
            return
        self.counters["streams"] += 1
        self._spawn(self._stream(conn, action))

    def _stream_alive(self, conn: Connection, action: StreamWalFrom) -> bool:
        r = self.replica
        return (
            self._state == "running"
            and not conn.closed
            and self._conns.get(action.node) is conn
            and r is not None
            and r.role == Role.MASTER
            and r.promised_epoch == action.epoch
        )

    async def _wait_durable(self, version: int) -> None:
        assert self.loop is not None and self.store is not None
        if self.store.durable_version >= version:
            return
        fut = self.loop.create_future()
        self._durable_waiters.append((version, fut))
        await fut

    async def _stream(self, conn: Connection, action: StreamWalFrom) -> None:
        """Send records first..last from the WAL to a follower as ForwardBatch frames, with
        back-pressure (docs/design.md §4.3; the file restore flow replaces it later)."""
        assert self.loop is not None and self.store is not None
        log.info("%s: streaming v%d..v%d to n%d", self.log_prefix(), action.first_version, action.last_version, action.node)
        await self._wait_durable(action.last_version)
        reader = _wal.WalReader(self.store.wal_dir, self.cfg.record_max_bytes)
        blocks = reader.iter_blocks(action.first_version)
        prev_epoch = action.prev_epoch
        sent = action.first_version - 1
        chunk_bytes = self.cfg.stream_chunk_bytes
        try:
            while sent < action.last_version:
                blk = await self.loop.run_in_executor(None, next, blocks, None)
                if blk is None:
                    break
                scan = blk.scan
                versions, offsets, lengths, epochs = scan.versions, scan.offsets, scan.lengths, scan.epochs
                i = 0
                n = scan.count
                while i < n and int(versions[i]) <= sent:
                    i += 1
                while i < n and sent < action.last_version:
                    if not self._stream_alive(conn, action):
                        return
                    j, size = i, 0
                    while j < n and int(versions[j]) <= action.last_version and (j == i or size + int(lengths[j]) + 36 <= chunk_bytes):
                        size += int(lengths[j]) + 36
                        j += 1
                    start = int(offsets[i])
                    data = blk.data[start:start + size]
                    frame = _wire.encode_forward_frame(codec.MsgType.FORWARD_BATCH, int(versions[i]), action.epoch, prev_epoch, data)
                    conn.send_frame(frame)
                    conn.flush()
                    self.counters["streamed_records"] += j - i
                    prev_epoch = int(epochs[j - 1])
                    sent = int(versions[j - 1])
                    i = j
                    if conn.paused:
                        await conn.writable()
        except (_wal.WalError, FrameError) as exc:
            log.error("%s: streaming to n%d failed: %s", self.log_prefix(), action.node, exc)
            self._drop_conn(conn, f"stream failed: {exc}")
            self._after()
            return
        if sent < action.last_version and self._stream_alive(conn, action):
            log.error("%s: WAL ended at v%d while streaming up to v%d to n%d", self.log_prefix(), sent,
                      action.last_version, action.node)
            self._drop_conn(conn, "the WAL lacks records to stream")
            self._after()
            return
        log.info("%s: streamed up to v%d to n%d", self.log_prefix(), sent, action.node)

    # ================================================================== introspection

    def _roles_now(self) -> dict[str, Any]:
        r = self.replica
        assert r is not None
        views = {}
        for i, node in enumerate(r.nodes):
            if i == r.me:
                views[node] = r.role.describe()
            else:
                views[node] = Role(r.views[i].role).describe() if r.connected[i] else "offline"
        return {
            "vgroup_id": self.cfg.vgroup_id,
            "node": self.node,
            "role": r.role.describe(),
            "epoch": r.promised_epoch,
            "master": None if r.master == NO_NODE else r.master,
            "last_version": r.last_version,
            "last_epoch": r.last_epoch,
            "replicas": views,
        }

    def _stats_now(self) -> dict[str, Any]:
        r = self.replica
        assert r is not None and self.store is not None
        core = r.stats()
        peers = core["peers"]
        for node, conn in self._conns.items():
            p = peers.setdefault(node, {})
            p.update(
                bytes_sent=conn.bytes_sent,
                bytes_received=conn.bytes_received,
                frames_sent=conn.frames_sent,
                frames_received=conn.frames_received,
                send_queue_bytes=conn.transport.get_write_buffer_size() if conn.transport else 0,
            )
        now = _monotonic()
        master = r.role == Role.MASTER
        for i, node in enumerate(r.nodes):
            if i == r.me:
                continue
            p = peers.setdefault(node, {})
            heard = self._last_heard.get(node)
            # docs/client-api.md §Status: ms since a frame last came from the peer (None:
            # never, since start), and on the master the age of its oldest unacked record.
            p["last_heard_ms"] = None if heard is None else round((now - heard) * 1000)
            p["lag_ms"] = self._lag_ms(p.get("acked_version", 0), r.last_version, now) if master else None
        lease = None
        if r.grant_epoch and r.lease_until_tick > r.now_tick:
            lease = {"epoch": r.grant_epoch, "remaining_ms": (r.lease_until_tick - r.now_tick) * self.cfg.tick_ms}
        with self._qlock:
            queued = self._queued
        return {
            **core,
            "role_ms": round((now - self._role_since) * 1000),
            "role_changes": dict(self.role_changes),
            "epochs_promised": self.epochs_promised,
            "arbitrator_lease": lease,
            "sync": dict(self.counters),
            "queued_forwards": queued,
            "committed_version": self._committed,
            "flow_control": self._flow_level,
            "wal": {
                "durable_version": self.store.durable_version,
                "appended_bytes": self.store.appended_bytes,
                "group_commits": self.store.fsyncs,
            },
            "arbitrator_connected": self._arb_conn is not None,
            "restore": dict(self.restore_counters),
        }
