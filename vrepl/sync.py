"""The embedding API: one `SyncInstance` per vgroup on a node (docs/embedding.md).

Owns: the sync instance a vnode starts for each vgroup: its life (start, stop, a fatal WAL
error), the app-facing calls of the seed (syncForwardToPeer, syncAckForward, recover,
reconfig, status) and the wiring of the pieces: a `Driver` (vrepl/driver/, the one place
where the replica's actions run) over the production ports — the peer and arbitrator links
(vrepl/transport/peers.py), the WAL store and promise file (vrepl/transport/storage.py, its
jobs on the process's WAL thread, vrepl/transport/walflush.py),
the app's callbacks (vrepl/instance/app.py), the restore sessions (vrepl/restore/sessions.py)
and the tick clock (vrepl/transport/loop.py) — on the process's shared I/O thread.

Threads: everything that touches the driver runs on the I/O thread. `forward()`,
`forward_many()` and `ack_forward()` may be called from any thread: they append to the
intake's queue (vrepl/instance/intake.py), which wakes the I/O thread when it goes
non-empty. Completions from the WAL thread and the restore threads are posted to the I/O
thread (`_post`). Callbacks are called on the I/O thread and must not block.
Must not: execute an action (the driver does), block the I/O thread on the network, or
call the app while holding a lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import Any, Callable, cast

from vrepl.config import SyncConfig, sync_config_invalid
from vrepl.driver import Driver, DriverOptions, batch_bounds
from vrepl.errors import ConfigError, FlowControlError, InvariantViolation, NotRunningError, ReconfigError
from vrepl.instance.app import CallbackApp, SyncCallbacks, SyncObservers
from vrepl.instance.corelog import core_event, log_line
from vrepl.instance.intake import AppIntake
from vrepl.replica import NO_NODE, AckStatus, AppRecover, ConfirmStatus, Replica, Role
from vrepl.restore.config import RestoreConfig, restore_config_invalid
from vrepl.restore.errors import RestoreError
from vrepl.restore.limiter import RestoreLimiter
from vrepl.restore.sessions import RestoreSessions
from vrepl.transport import walflush
from vrepl.transport.loop import IoLoop, TickTimer
from vrepl.transport.peers import PeerLinks
from vrepl.transport.storage import DiskState, LoopStorage

log = logging.getLogger("vrepl.sync")

ForwardStatus = ConfirmStatus  # ok / failed / timed_out / not_master, as confirm_forward reports
_monotonic = time.monotonic
__all__ = [
    "SyncInstance",
    "SyncCallbacks",
    "SyncObservers",
    "FlowControlError",
    "NotRunningError",
    "ReconfigError",
    "ForwardStatus",
    "batch_bounds",
    "core_event",
]


class SyncInstance:
    """Replication of one vgroup on this node. start(), then forward()/ack_forward(), stop()."""

    def __init__(
        self,
        config: SyncConfig,
        callbacks: SyncCallbacks | None = None,
        *,
        restore: RestoreConfig | None = None,
        observers: SyncObservers | None = None,
        **callback_kwargs: Any,
    ) -> None:
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
        self._state = "new"  # new -> running -> stopping -> stopped | failed (only _set_state writes it)
        self._failure = ""
        self.io: IoLoop | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.driver: Driver | None = None
        self._storage: LoopStorage | None = None
        self._links: PeerLinks | None = None
        self._app: CallbackApp | None = None
        self._restores: RestoreSessions | None = None
        self._clock: TickTimer | None = None
        self._intake = AppIntake(config.vgroup_id, config.max_inflight_forwards, self._signal, self._not_running)
        # forward() is the intake's own bound method: the app's per-record call goes straight
        # to the queue, one Python call instead of two (the facade's layer cost the library
        # pipeline ~2%, docs/benchmarks.md §One driver). The intake refuses it unless running.
        self.forward = self._intake.forward  # type: ignore[method-assign]

    # ================================================================== app thread API

    def start(self) -> "SyncInstance":
        """Open the WAL, read the promise, listen (shared per node), connect, start ticking."""
        if self._state != "new":
            raise NotRunningError(f"vg{self.cfg.vgroup_id}: start() called in state {self._state}")
        cfg = self.cfg
        self.io = IoLoop.shared()
        self.loop = self.io.loop
        storage = self._storage = LoopStorage(
            cfg.data_path,
            post=self._post,
            fail=self._fail,
            # self.loop was set just above and is never cleared
            run_in_executor=lambda fn, *args: self.loop.run_in_executor(None, fn, *args),  # type: ignore[union-attr]
            inline_sync_max_bytes=cfg.max_wal_inline_sync_bytes,
            inline_commit_max_us=cfg.max_wal_inline_commit_us,
            max_record_bytes=cfg.max_record_bytes,
            max_file_bytes=cfg.max_wal_file_bytes,
            on_group_commit=self.observers.wal_fsync_s,
        )
        os.makedirs(cfg.data_path, exist_ok=True)
        try:
            disk = storage.store.open()
            if disk.repaired_tail:
                log.warning("%s: WAL had a torn tail, truncated: %s", self._prefix_static(), disk.repaired_tail)
            replica = Replica(self._replica_config(disk))
            if self.cb.get_version is not None:
                app_version = self.cb.get_version()
                if app_version > disk.last_version:
                    log.warning(
                        "%s: the app reports v%d but the WAL ends at v%d: the app holds records the WAL lacks",
                        self._prefix_static(),
                        app_version,
                        disk.last_version,
                    )
            self._wire(replica)
            self.io.run(self._start_in_loop(), timeout_s=30)
        except BaseException:
            storage.store.close()
            self.io.release()
            self.io = None  # released: a later stop() must not release it again
            self._set_state("failed")
            raise
        return self

    def forward(self, version: int, payload: bytes) -> None:  # bound per instance in __init__
        """Write and replicate record `version` (the next version, strictly in order; any
        thread; never blocks). The outcome comes later through confirm_forward.
        (Each instance answers this through its intake's forward, bound in __init__; this
        definition is the documented signature and the same code path.)"""
        self._intake.forward(version, payload)

    def _set_state(self, state: str) -> None:
        self._state = state
        self._intake.open = state == "running"

    def _not_running(self, call: str) -> NotRunningError:
        return NotRunningError(f"vg{self.cfg.vgroup_id}: {call} while {self._state} {self._failure}".rstrip())

    def forward_many(self, first_version: int, payloads: "list[bytes] | tuple[bytes, ...]") -> None:
        """forward() for a run of records: records first_version, first_version + 1, ... in
        one call and under one lock (any thread; never blocks). The same as calling forward()
        for each in order, except that flow control takes all or none: FlowControlError when
        max_inflight_forwards would be exceeded, and then no version was taken. A run longer
        than max_inflight_forwards can never be taken (ValueError). Each record is confirmed
        through confirm_forward as usual (a range callback gets the run in one call)."""
        if self._state != "running":
            raise self._not_running("forward_many()")
        if payloads:
            self._intake.forward_many(first_version, payloads)

    def ack_forward(self, version: int, status: int = AckStatus.OK) -> None:
        """A slave's app applied and persisted every record up to `version` (cumulative), or
        failed to apply `version` (status FAILED: replication with the master is reset)."""
        if self._state == "running":
            self._intake.ack_forward(version, status)

    def roles(self) -> dict[str, Any]:
        """This node's role, epoch and master, and its view of every replica's role."""
        # _call runs it only while running, when the driver exists
        return self._call(lambda: self.driver.roles())  # type: ignore[union-attr]

    def stats(self) -> dict[str, Any]:
        """Counters (forwards, acks, timeouts, bytes) and per-peer lag and traffic."""
        return self._call(self._stats_now)

    def recover(self) -> None:
        """Force this follower to match its log with the master again (truncate/stream, or
        the restore flow when it is too far behind); a master ignores this (logged)."""
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
            self.cfg = config
            # _call runs it only on a running instance, which has its driver
            self.driver.set_quorum(config.quorum)  # type: ignore[union-attr]
            self.driver.end_batch()  # type: ignore[union-attr]

        self._call(apply)

    def recycle_wal(self, before_version: int) -> None:
        """Delete sealed WAL files whose records are all below `before_version` (the app
        archived them; docs/vnode.md §5). Queued to the WAL thread; a follower that needs
        them later is restored from the archived files (docs/restore.md)."""
        if self._storage is not None and self._state == "running":
            self._storage.store.recycle(before_version)

    def restore_status(self) -> dict[str, Any]:
        """Restore sessions running on this node for this vgroup, counters, last error."""
        if self._restores is None:
            return {
                "sending_to": [],
                "backups": 0,
                "receiving_from": None,
                "limiter": {},
                "counters": {},
                "last_error": "",
            }
        return self._restores.status()

    def stop(self) -> None:
        """Close connections, fail what is queued or unconfirmed, close the WAL."""
        if self._state not in ("running", "failed") or self.io is None:
            return
        io = self.io
        try:
            io.call(self._stop_in_loop, timeout_s=30)
            if self._restores is not None:
                self._restores.join(5.0)
        finally:
            self._set_state("stopped")
            if self._storage is not None:
                self._storage.store.close()
            io.release()

    @property
    def committed_version(self) -> int:
        """The commit version (docs/embedding.md §Commit index): every record up to it is
        in the log of every future master and is never truncated, so the app may archive
        it; records above it may still be cut. 0 after start(); never decreases in a run."""
        return self.driver.committed_version if self.driver is not None else 0

    @property
    def wal_dir(self) -> str:
        return f"{self.cfg.data_path}/wal"

    # -- what an embedding reads on the I/O thread (its callbacks run there) -----------------------

    def role_now(self) -> tuple[str, int | None] | None:
        """This node's role and master as the replica has them at this moment (I/O thread;
        None before start). The core reports a step-down's outcomes (FAILED) before it
        notifies the new role, so this may differ from the last notify_role."""
        if self.driver is None:
            return None
        role, master = self.driver.role_now()
        return role.describe(), master

    def last_version(self) -> int:
        """The last version of this replica's log (I/O thread): a new master's next write
        continues it."""
        return self.driver.log_end()[1] if self.driver is not None else 0

    def record_epoch(self, version: int) -> int:
        """The epoch of record `version` of this replica's log (I/O thread)."""
        if self.driver is None:
            raise NotRunningError(f"vg{self.cfg.vgroup_id}: not running")
        return self.driver.record_epoch(version)

    def connection_refusals(self) -> dict[str, int]:
        """Connections the node's replication server closed for what the other side sent, by
        reason code (shared by every vgroup of the node; docs/operations.md §Metrics)."""
        nt = self._links.nt if self._links is not None else None
        return dict(nt.refusals) if nt is not None else {}

    def wal_first_version(self) -> int:
        """The first version the WAL still holds (0: none), from any thread."""
        return self._storage.first_version() if self._storage is not None else 0

    # ================================================================== wiring

    def _wire(self, replica: Replica) -> None:
        """Build the driver over the production ports (docs/design.md §9)."""
        cfg = self.cfg
        self._app = CallbackApp(
            self.cb,
            self.observers,
            log_prefix=self.log_prefix,
            ack=self.ack_forward,
            app_ack_required=replica.cfg.app_ack_required_effective,
        )
        self._links = PeerLinks(cfg, log_prefix=self.log_prefix, restore_cfg=self.restore_cfg)
        options = DriverOptions(
            max_batch_records=cfg.max_batch_records,
            max_batch_bytes=cfg.max_batch_bytes,
            stream_chunk_bytes=cfg.stream_chunk_bytes,
            restore_min_lag_versions=self.restore_cfg.min_lag_versions,
        )
        if self._storage is None:
            raise InvariantViolation("self._storage is not None")
        driver = self.driver = Driver(replica, self._links, self._storage, self._app, options=options, on_log=log_line)
        self._storage.target = driver
        self._links.events = driver
        driver.before_flush = self._drain
        self._intake.replica = replica

    def _wire_restores(self) -> None:
        """The restore sessions need the node's limiter, known once the node server is."""
        if self._links is None or self._links.nt is None or self.driver is None:
            raise InvariantViolation(
                "self._links is not None and self._links.nt is not None and self.driver is not None"
            )
        nt = self._links.nt
        if nt.restore_limiter is None:
            nt.restore_limiter = RestoreLimiter(self.restore_cfg.max_concurrent_restores)
        store = self._storage.store  # type: ignore[union-attr]  # start() built it before the loop ran
        self._restores = RestoreSessions(
            self.cfg,
            self.restore_cfg,
            self.cb,
            host=self.driver.restore,
            call=self._call_for_restore,
            post=lambda fn: self._post(fn, quiet=False),
            running=lambda: self._state == "running",
            wal_first_version=store.first_version_or,
            durable_version=lambda: store.durable_version,
            limiter=nt.restore_limiter,
            log_prefix=self.log_prefix,
            notify=self._app.call,  # type: ignore[union-attr]  # _wire set it in start()
        )
        if self.restore_cfg.enabled:
            self.driver.restorer = self._restores
        self._links.sync_handler = self._restores

    def _replica_config(self, disk: DiskState) -> Any:
        cfg = self.cfg
        if cfg.initial_version and (cfg.initial_version, cfg.initial_epoch) != (disk.last_version, disk.last_epoch):
            raise ConfigError(
                f"vg{cfg.vgroup_id}: initial version/epoch e{cfg.initial_epoch}v{cfg.initial_version} do not match"
                f" the WAL (e{disk.last_epoch}v{disk.last_version}); the WAL is authoritative, and starting from"
                " state without a WAL needs the restore flow (a later issue)"
            )
        promised_epoch = disk.promised_epoch
        promised_master = disk.promised_master if disk.promised_master is not None else NO_NODE
        nodes = {r.node for r in cfg.replicas}
        if promised_epoch < disk.last_epoch or (promised_epoch and promised_master not in nodes):
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
        if self.loop is None or self.driver is None or self._links is None:
            raise InvariantViolation("self.loop is not None and self.driver is not None and self._links is not None")
        await self._links.start(self.loop)
        self._wire_restores()
        self._set_state("running")
        self.driver.start()
        self._clock = TickTimer(self.loop, self.cfg.tick_ms)
        self._clock.start(self._on_tick)
        self.driver.end_batch()
        me = self.cfg.me
        log.info(
            "%s: started, listening on %s, replicas %s",
            self.log_prefix(),
            me.endpoint(),
            " ".join(f"n{r.node}@{r.endpoint()}" for r in self.cfg.replicas),
        )

    def _stop_in_loop(self) -> None:
        if self._state == "running":
            self._set_state("stopping")
        self._shutdown_replication("stopping")
        if self._links is not None:
            self._links.release()
        log.info("%s: stopped", self.log_prefix())

    def _shutdown_replication(self, reason: str) -> None:
        if self._restores is not None:
            self._restores.cancel_all(reason)
        if self._clock is not None:
            self._clock.stop()
        if self._links is not None:
            self._links.close(reason)
        # Nothing queued or pending will be confirmed now: say so.
        if self._app is not None:
            for first, payloads in self._intake.take_all():
                self._app.confirm_forward(first, first + len(payloads) - 1, ConfirmStatus.FAILED)
        if self.driver is not None:
            self.driver.abandon()

    def _fail(self, reason: str) -> None:
        """A fatal local error (the WAL failed): stop replicating, keep the reason."""
        if self._state != "running":
            return
        log.critical("%s: replication stopped: %s", self.log_prefix(), reason)
        self._set_state("failed")
        self._failure = reason
        if self._links is not None:
            self._links.state = "failed"
        self._shutdown_replication(f"failed: {reason}")
        if self._app is not None and self.driver is not None:
            self._app.stepped_down(self.driver.replica.promised_epoch)

    # ================================================================== the I/O thread

    def _call(self, fn: Callable[[], Any]) -> Any:
        if self._state != "running" or self.io is None:
            raise NotRunningError(f"vg{self.cfg.vgroup_id}: not running ({self._state}) {self._failure}".rstrip())
        return self.io.call(fn)

    def _call_for_restore(self, fn: Callable[[], Any]) -> Any:
        """A restore thread's question to the replica, answered on the I/O thread."""
        io = self.io
        if io is None:
            raise RestoreError(f"the sync instance is {self._state}")
        return io.call(fn)

    def _post(self, fn: Callable[[], Any], always: bool = False, quiet: bool = True) -> None:
        """Run fn on the I/O thread while the instance runs (`always`: in any state), then end
        the driver's batch. From the I/O thread itself it runs at the next turn of the loop.
        `quiet` False: a closed loop raises RuntimeError."""
        loop = self.loop
        if loop is None:
            return

        def run() -> None:
            if self._state != "running" and not always:
                return
            fn()
            if self._state == "running" and self.driver is not None:
                self.driver.end_batch()

        if self.io is not None and self.io.in_loop():
            loop.call_soon(run)
            return
        if walflush.collect(loop, run):  # the WAL thread: one hand-off per round, in order
            return
        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop closed under us (stopping)
            if not quiet:
                raise

    def _signal(self) -> None:
        """The intake went non-empty: drain it on the I/O thread."""
        self._post(lambda: None)  # the drain runs as the batch ends (Driver.before_flush)

    def _drain(self) -> None:
        if self._intake.signalled and self.driver is not None and self._state == "running":
            master = self._app is not None and self._app.role == Role.MASTER
            note = self._note_run if master else None
            self._intake.drain(self.driver, note)

    def _note_run(self, first: int, count: int, began: float) -> None:
        # _drain hands this over only with a driver and the app in the master role
        self._app.note_run(first, count, began, self.driver.lowest_acked)  # type: ignore[union-attr]

    def _step(self, event: object) -> None:
        if self.driver is None:
            raise InvariantViolation("self.driver is not None")
        self.driver.step(event)
        self.driver.end_batch()

    def _on_tick(self, count: int) -> None:
        if self._state != "running" or self.driver is None:
            return
        self.driver.tick(count)
        if self._app is not None and self._app.sent_runs() > 1:
            self._app.prune_sent(self.driver.lowest_acked())
        self.driver.end_batch()

    # ================================================================== logging and introspection

    def _prefix_static(self) -> str:
        return f"vg{self.cfg.vgroup_id} n{self.node} e-"

    def log_prefix(self) -> str:
        return self.driver.log_prefix() if self.driver is not None else f"vg{self.cfg.vgroup_id} n{self.node} e-"

    def _stats_now(self) -> dict[str, Any]:
        d, links, app, storage = self.driver, self._links, self._app, self._storage
        if d is None or links is None or app is None or storage is None:
            raise InvariantViolation("d is not None and links is not None and app is not None and storage is not None")
        core = d.replica.stats()
        peers = cast(dict[int, dict[str, Any]], core["peers"])  # Replica.stats(): node -> its view
        for node, link in links.link_stats().items():
            peers.setdefault(node, {}).update(link)
        now = _monotonic()
        master = d.replica.role == Role.MASTER
        last = d.replica.last_version
        for node in d.replica.nodes:
            if node == self.node:
                continue
            p = peers.setdefault(node, {})
            heard = links.last_heard.get(node)
            # docs/client-api.md §Status: ms since a frame last came from the peer (None:
            # never, since start), and on the master the age of its oldest unacked record.
            p["last_heard_ms"] = None if heard is None else round((now - heard) * 1000)
            p["lag_ms"] = app.lag_ms(p.get("acked_version", 0), last, now) if master else None
        counters = {
            **d.counters,
            **app.counters,
            **links.counters,
            "forwards_refused_flow_control": self._intake.refused,
        }
        sync = {k: counters[k] for k in _SYNC_COUNTERS}
        restore = dict(self._restores.counters) if self._restores is not None else {}
        restore["streamed_in_band"] = d.counters["streamed_in_band"]
        return {
            **core,
            "role_ms": app.role_ms(now),
            "role_changes": dict(app.role_changes),
            "epochs_promised": d.counters["epochs_promised"],
            "arbitrator_lease": d.lease(self.cfg.tick_ms),
            "sync": sync,
            "queued_forwards": self._intake.queued,
            "committed_version": d.committed_version,
            "flow_control": d.flow_level,
            "wal": {
                "durable_version": storage.store.durable_version,
                "appended_bytes": storage.store.appended_bytes,
                "group_commits": storage.store.fsyncs,
            },
            "arbitrator_connected": links.arb_conn is not None,
            "restore": restore,
        }


# stats()["sync"], in this order (docs/embedding.md §Observability).
_SYNC_COUNTERS = (
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
)
