"""The app's calls into a sync instance from any thread: forwards and acks, queued.

Owns: `AppIntake`, the queue behind `SyncInstance.forward()`, `forward_many()` and
`ack_forward()` (docs/embedding.md §Calls; `forward` is `SyncInstance.forward` itself, bound
per instance, so it refuses calls unless `open`): any thread appends under one lock and wakes the
I/O thread only when the queue goes non-empty (`signal`); flow control
(`max_inflight_forwards` over queued plus unconfirmed forwards, all or none for a run); and
`drain()`, which the I/O thread calls to hand the queue to the driver: app acks first, then
each run of consecutive versions as one `Driver.forward()` (cut into batches there).
Threads: `forward*`/`ack_forward` from any thread; `drain`/`take_all` on the I/O thread.
Must not: call the driver or the app while holding the lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from vrepl.errors import FlowControlError
from vrepl.replica import AckStatus

_monotonic = time.monotonic


class AppIntake:
    """The queue of one sync instance (see the module doc). Forwards taken and not yet
    confirmed are the length of `replica.window` (the master's pending window; None outside
    mastership, or before the instance built its replica), read without the I/O thread."""

    def __init__(
        self,
        vgroup_id: int,
        max_inflight: int,
        signal: Callable[[], None],
        not_running: Callable[[str], Exception],
    ) -> None:
        self.vgroup_id = vgroup_id
        # True only while the instance runs (SyncInstance._set_state): forward() is the app's
        # entry itself, so it checks this rather than the instance's state.
        self.open = False
        self.not_running = not_running  # the error forward() raises when not open
        self.max_inflight = max_inflight  # reconfig() cannot change it
        # The replica itself, not a callable: forward() reads its window once per record,
        # and each call layer there cost the library pipeline ~3% (docs/benchmarks.md §One driver).
        self.replica: Any = None
        self.signal = signal
        self.refused = 0  # forwards refused by flow control (stats()["sync"])
        self._lock = threading.Lock()
        self._runs: list[tuple[int, list[bytes]]] = []
        self._run_times: list[float] = []  # monotonic time each run of _runs began (forward())
        self._run_next: int | None = None  # the version that extends the last run in _runs
        self._queued = 0
        self._signalled = False
        self._app_acked = 0
        self._app_acked_fed = 0
        self._ack_failures: list[int] = []

    @property
    def queued(self) -> int:
        with self._lock:
            return self._queued

    @property
    def signalled(self) -> bool:
        return self._signalled

    def forward(self, version: int, payload: bytes) -> None:
        if not self.open:
            raise self.not_running("forward()")
        with self._lock:
            # The per-record path of every app: kept to a few attribute reads.
            queued = self._queued
            replica = self.replica
            window = replica.window if replica is not None else None
            inflight = queued + len(window) if window is not None else queued
            if inflight >= self.max_inflight:
                self.refused += 1
                raise FlowControlError(
                    f"vg{self.vgroup_id}: {inflight} forwards queued or unconfirmed (max_inflight_forwards)")
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
        self.signal()

    def forward_many(self, first_version: int, payloads: "list[bytes] | tuple[bytes, ...]") -> None:
        n = len(payloads)
        if n > self.max_inflight:
            raise ValueError(f"vg{self.vgroup_id}: {n} records in one forward_many() exceed max_inflight_forwards"
                             f" {self.max_inflight}")
        with self._lock:
            replica = self.replica
            window = replica.window if replica is not None else None
            inflight = self._queued + (len(window) if window is not None else 0)
            if inflight + n > self.max_inflight:
                self.refused += n
                raise FlowControlError(
                    f"vg{self.vgroup_id}: {inflight} forwards queued or unconfirmed, {n} more exceed"
                    " max_inflight_forwards")
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
        self.signal()

    def ack_forward(self, version: int, status: int = AckStatus.OK) -> None:
        with self._lock:
            if status == AckStatus.OK:
                if version > self._app_acked:
                    self._app_acked = version
            else:
                self._ack_failures.append(version)
            if self._signalled:
                return
            self._signalled = True
        self.signal()

    def drain(self, driver: Any, note_run: Callable[[int, int, float], Any] | None) -> None:
        """Hand the queue to the driver (I/O thread): failed acks, the cumulative ack, then
        each run of forwards; `note_run(first, count, began)` for each run (a master's)."""
        with self._lock:
            if not self._signalled:
                return
            runs, self._runs = self._runs, []
            run_times, self._run_times = self._run_times, []
            self._run_next = None
            self._queued = 0
            self._signalled = False
            acked = self._app_acked
            failures, self._ack_failures = self._ack_failures, []
        for version in failures:
            driver.app_acked(version, AckStatus.FAILED)
        if acked > self._app_acked_fed:
            self._app_acked_fed = acked
            driver.app_acked(acked)
        for (first, payloads), began in zip(runs, run_times):
            if note_run is not None:
                note_run(first, len(payloads), began)
            driver.forward(first, payloads)

    def take_all(self) -> list[tuple[int, list[bytes]]]:
        """Empty the queue (stopping): the runs nothing will confirm now."""
        with self._lock:
            runs, self._runs, self._queued, self._run_next = self._runs, [], 0, None
            self._run_times = []
        return runs
