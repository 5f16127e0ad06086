"""The WAL thread of a process: one thread runs the queued WAL work of every sync instance.

Owns: the thread ("vrepl-wal") that executes the jobs `WalStore`s queue (vrepl/transport/
storage.py: appends with their group commit, truncations, resets, recycling), shared by
every store of the process the way the I/O thread is (`WalFlusher.shared()` / `release()`),
and the batching of what a round reports back: while a round runs, the completions the
stores post to an event loop are collected (`collect`) and handed to each loop in ONE
`call_soon_threadsafe`, in the order they were posted.

Why one thread and not one per vgroup (docs/perf.md §Many vgroups): with a thread per
vgroup, 16 vgroups under load meant 16 threads waking for the GIL at once, each with its
own wake-up of the I/O thread per group commit; one thread takes every store that has work
in one wake-up, runs them one after the other (each store's jobs in the order queued: a
store's durable reports still precede its later truncation report), and wakes the I/O
thread once per round.
Must not: reorder the jobs of one store, run one store on two threads at once (a store's
`take_jobs` / `jobs_done` pair guards that, with its inline runs on the I/O thread), or call
a store's callbacks itself (the store does, from `run_jobs`), or release a store
(`jobs_done`) before the round's completions are handed to the loop (an inline run on the
loop could then report before them: the comment in `run_round`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import Any, Callable, Protocol

log = logging.getLogger("vrepl.storage")

_lock = threading.Lock()
_shared: "WalFlusher | None" = None
# The round being run by the current thread (a flusher's), or None: loop -> callbacks.
_round = threading.local()


class FlushableStore(Protocol):
    """What the flusher needs from a store (WalStore)."""

    def take_jobs(self) -> list[tuple] | None: ...

    def run_jobs(self, jobs: list[tuple]) -> None: ...

    def jobs_done(self) -> None: ...


class WalFlusher:
    """One daemon thread running the queued jobs of the stores that `schedule()` themselves."""

    def __init__(self, name: str = "vrepl-wal") -> None:
        self._users = 0
        self._ready: deque[FlushableStore] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self.rounds = 0  # rounds run (each: one wake-up, every ready store)
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    @staticmethod
    def shared() -> "WalFlusher":
        """The process's flusher, started on first use; pair with release()."""
        global _shared
        with _lock:
            if _shared is None or not _shared.thread.is_alive():
                _shared = WalFlusher()
            _shared._users += 1
            return _shared

    def release(self) -> None:
        """One user fewer; the last one stops the thread once the queued work is done."""
        global _shared
        with _lock:
            self._users -= 1
            if self._users > 0:
                return
            if _shared is self:
                _shared = None
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=10)

    def in_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def schedule(self, store: FlushableStore) -> None:
        """The store has jobs (its own flag keeps it in the queue at most once)."""
        with self._cond:
            self._ready.append(store)
            if len(self._ready) == 1:
                self._cond.notify()

    def _main(self) -> None:
        while True:
            with self._cond:
                while not self._ready and not self._stopping:
                    self._cond.wait()
                if not self._ready:
                    return
                stores = list(self._ready)
                self._ready.clear()
            self.run_round(stores)

    def run_round(self, stores: list[FlushableStore]) -> None:
        """Run each store's queued jobs; deliver the completions they posted, per loop in
        one hand-off. A store that is busy elsewhere (an inline run) is skipped: it
        schedules itself again when that run ends."""
        posted: dict[asyncio.AbstractEventLoop, list[Callable[[], Any]]] = {}
        ran: list[FlushableStore] = []
        _round.posted = posted
        try:
            for store in stores:
                jobs = store.take_jobs()
                if jobs is None:
                    continue
                ran.append(store)
                store.run_jobs(jobs)
        finally:
            _round.posted = None
            self.rounds += 1
            for loop, callbacks in posted.items():
                try:
                    loop.call_soon_threadsafe(_run_all, loop, callbacks)
                except RuntimeError:  # that loop closed (its instances are stopping)
                    pass
            # Only now may the loop run these stores inline: its inline completions are
            # call_soon'd, so before the hand-off above they could overtake this round's.
            # A stale "durable up to v" delivered after an inline truncation and new
            # appends would mark a record durable before its fdatasync.
            for store in ran:
                store.jobs_done()


def collect(loop: asyncio.AbstractEventLoop, callback: Callable[[], Any]) -> bool:
    """On a flusher thread inside a round: queue `callback` for `loop` (delivered at the end
    of the round, in order) and return True. Anywhere else: False (the caller hands it to
    the loop itself)."""
    posted = getattr(_round, "posted", None)
    if posted is None:
        return False
    posted.setdefault(loop, []).append(callback)
    return True


def _run_all(loop: asyncio.AbstractEventLoop, callbacks: list[Callable[[], Any]]) -> None:
    """On the loop: each callback as if it had been scheduled alone (an error is reported
    through the loop's exception handler and the others still run)."""
    for cb in callbacks:
        try:
            cb()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            loop.call_exception_handler({"message": "Exception in a WAL completion callback", "exception": exc})
