"""The app port of a sync instance: the embedding's callbacks behind the driver's `App`.

Owns: `SyncCallbacks` and `SyncObservers` (the embedding API's callback records,
docs/embedding.md §Callbacks and threads), and `CallbackApp`, which implements the driver's
App port (vrepl/driver/ports.py) over them: dispatch to the single-record or range form of a
callback, an app's exception logged and never let through (the app's bug must not stop
replication), the counters of stats()["sync"] that belong to the app side, the role a node
holds and since when (the role_change log line), and the per-run forward times behind a
master's lag in ms and the confirm latency (docs/operations.md §Metrics).
Threads: everything but `note_run` (called by the intake under no lock, on the I/O thread
too) runs on the I/O thread.
Must not: call the replica or the driver; step anything.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from vrepl.replica import ConfirmStatus, Role

log = logging.getLogger("vrepl.sync")

# Forward times kept for the per-peer lag in ms (one per run of forwards; halved when full).
SENT_TIMES_MAX = 4096
CONFIRM_TIMES_MAX = 1 << 17
_monotonic = time.monotonic


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


class CallbackApp:
    """The driver's App port over SyncCallbacks (see the module doc). `ack(version)` acks for
    an app without a write_to_cache callback when the replica waits for the app."""

    def __init__(self, callbacks: SyncCallbacks, observers: SyncObservers, *, log_prefix: Callable[[], str],
                 ack: Callable[[int], Any], app_ack_required: bool) -> None:
        self.cb = callbacks
        self.observers = observers
        self.log_prefix = log_prefix
        self.ack = ack
        self.app_ack_required = app_ack_required
        self.role = Role.UNSYNCED
        self.epoch = 0
        self.master: int | None = None
        self.role_since = _monotonic()
        self.role_changes: dict[str, int] = {}  # role entered -> times
        self.counters: dict[str, int] = dict.fromkeys(
            ("confirmed_ok", "confirmed_failed", "confirmed_timed_out", "confirmed_not_master",
             "records_written_to_cache"), 0)
        # _sent_first[i] is the first version of a run of forwards taken at _sent_at[i] (a
        # master's; the first entry, version 0, is when it became master): a peer that acked up
        # to v has waited since the entry holding v + 1. _confirm_times: (last version of a
        # run, time its first forward() was called), popped as the runs are confirmed.
        self._sent_first: list[int] = []
        self._sent_at: list[float] = []
        self._confirm_times: deque[tuple[int, float]] = deque(maxlen=CONFIRM_TIMES_MAX)

    # -- the App port (I/O thread) ---------------------------------------------------------------

    def write_to_cache(self, first_version: int, record_epochs: tuple[int, ...], payloads: tuple[bytes, ...]) -> None:
        self.counters["records_written_to_cache"] += len(payloads)
        cb = self.cb
        if cb.write_to_cache_batch is not None:
            self.call(cb.write_to_cache_batch, first_version, payloads)
        elif cb.write_to_cache is not None:
            fn = cb.write_to_cache
            try:
                for i, payload in enumerate(payloads):
                    fn(first_version + i, payload)
            except Exception:
                log.exception("%s: callback write_to_cache failed", self.log_prefix())
        elif self.app_ack_required:
            # No app to apply records: nothing will ever ack them, so ack for it.
            self.ack(first_version + len(payloads) - 1)

    def confirm_forward(self, first: int, last: int, status: ConfirmStatus) -> None:
        self.counters["confirmed_" + status.describe()] += last - first + 1
        times = self._confirm_times
        if times and times[0][0] < first:
            # A run refused out of turn (its version was not the next one: FAILED at once,
            # while earlier runs still wait): only its own entry goes; the earlier runs keep
            # theirs for their own confirmation.
            kept = [entry for entry in times if not first <= entry[0] <= last]
            times.clear()
            times.extend(kept)
        elif times and times[0][0] <= last:
            # Runs confirmed: one latency per run whose last record is now decided.
            observe = self.observers.confirm_latency_s if status == ConfirmStatus.OK else None
            now = _monotonic()
            while times and times[0][0] <= last:
                began = times.popleft()[1]
                if observe is not None:
                    observe(now - began)
        cb = self.cb
        if cb.confirm_forward_range is not None:
            self.call(cb.confirm_forward_range, first, last, status)
        elif cb.confirm_forward is not None:
            fn = cb.confirm_forward
            try:
                for version in range(first, last + 1):
                    fn(version, status)
            except Exception:
                log.exception("%s: callback confirm_forward failed", self.log_prefix())

    def notify_role(self, role: Role, epoch: int, master: int | None) -> None:
        before, now = self.role, _monotonic()
        in_role_ms = round((now - self.role_since) * 1000)
        self.role_since = now
        self.role, self.epoch, self.master = role, epoch, master
        name = role.describe()
        self.role_changes[name] = self.role_changes.get(name, 0) + 1
        self._sent_first.clear()
        self._sent_at.clear()
        self._confirm_times.clear()
        if role == Role.MASTER:
            # Whatever a peer lacks from before this node's first forward, it has lacked
            # since this node became master.
            self._sent_first.append(0)
            self._sent_at.append(now)
        log.info("%s: role %s -> %s, epoch %d, master %s (%d ms as %s)", self.log_prefix(), before.describe(),
                 name, epoch, f"n{master}" if master is not None else "none", in_role_ms,
                 before.describe(), extra={"event": "role_change", "role": name, "previous_role": before.describe(),
                                           "master": master, "previous_role_ms": in_role_ms})
        self.call(self.cb.notify_role, name, epoch, master)

    def notify_flow_control(self, level: int) -> None:
        self.call(self.cb.notify_flow_control, level)

    def notify_commit(self, version: int) -> None:
        self.call(self.cb.notify_commit, version)

    def notify_wal_truncated(self, version: int) -> None:
        self.call(self.cb.notify_wal_truncated, version)

    # -- the embedding's side ----------------------------------------------------------------------

    def call(self, fn: Callable | None, *args: Any) -> None:
        """Call an app callback; its exception is logged, never raised (the app's bug must not
        stop replication)."""
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:
            log.exception("%s: callback %s failed", self.log_prefix(), getattr(fn, "__name__", fn))

    def stepped_down(self, epoch: int) -> None:
        """Replication stopped on a fatal error: the app hears the node is unsynced."""
        self.role = Role.UNSYNCED
        self.call(self.cb.notify_role, Role.UNSYNCED.describe(), epoch, None)

    def note_run(self, first: int, count: int, began: float, peers_acked: Callable[[], int | None]) -> None:
        """A master took a run of forwards queued at `began` (the lag in ms and the confirm
        latency, docs/operations.md §Metrics)."""
        self._sent_first.append(first)
        self._sent_at.append(began)
        self._confirm_times.append((first + count - 1, began))
        if len(self._sent_first) > SENT_TIMES_MAX:
            self.prune_sent(peers_acked())

    def prune_sent(self, lowest_acked: int | None) -> None:
        """Forget the forward times of runs every peer has acked (`lowest_acked`); if a peer
        stays far behind, keep every other one."""
        first, at = self._sent_first, self._sent_at
        if lowest_acked is not None:
            i = bisect_right(first, lowest_acked + 1) - 1
            if i > 0:
                del first[:i]
                del at[:i]
        if len(first) > SENT_TIMES_MAX:
            # A dropped run's records count from the run before it: the lag in ms of a peer
            # that far behind is over-estimated by at most the gap between two kept runs.
            self._sent_first, self._sent_at = first[::2], at[::2]

    def sent_runs(self) -> int:
        return len(self._sent_first)

    def lag_ms(self, acked: int, last: int, now: float) -> int:
        """How long the oldest record `acked` lacks (this master's log ends at `last`) has
        waited since its forward(), in ms; 0 when nothing is missing."""
        if acked >= last or not self._sent_first:
            return 0
        i = max(0, bisect_right(self._sent_first, acked + 1) - 1)
        return round((now - self._sent_at[i]) * 1000)

    def role_ms(self, now: float) -> int:
        return round((now - self.role_since) * 1000)
