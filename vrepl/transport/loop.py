"""The I/O thread: one asyncio event loop per process, shared by every sync instance in it.

Owns: starting and stopping the background thread ("vrepl-io") that runs the loop, the two
ways the app's threads reach it: `call(fn)` (run a function on the loop thread and wait for
its result) and `run(coro)` (the same for a coroutine), both run directly when the caller
already is the loop thread, so callbacks may call the sync instance's API; and `TickTimer`,
the tick clock of a sync instance's driver.
Must not: hold replication state; everything it runs belongs to the transport.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Coroutine, TypeVar

from vrepl.errors import VreplError

T = TypeVar("T")

_lock = threading.Lock()
_shared: "IoLoop | None" = None


class IoLoop:
    """A running event loop on its own daemon thread."""

    def __init__(self, name: str = "vrepl-io") -> None:
        self.loop = asyncio.new_event_loop()
        self._users = 0
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            try:
                # As asyncio.run does: let tasks cancelled by the last stop() finish (a
                # reconnect loop in wait_for, say), or asyncio logs "Task was destroyed but
                # it is pending!" at ERROR when the loop closes under them.
                pending = asyncio.all_tasks(self.loop)
                for task in pending:
                    task.cancel()
                if pending:
                    self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    @staticmethod
    def shared() -> "IoLoop":
        """The process's shared loop, started on first use; pair with release()."""
        global _shared
        with _lock:
            if _shared is None or not _shared.thread.is_alive():
                _shared = IoLoop()
            _shared._users += 1
            return _shared

    def release(self) -> None:
        """One user fewer; the last one stops the thread."""
        global _shared
        with _lock:
            self._users -= 1
            if self._users > 0:
                return
            if _shared is self:
                _shared = None
        if threading.current_thread() is self.thread:
            self.loop.call_soon(self.loop.stop)
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def in_loop(self) -> bool:
        return threading.current_thread() is self.thread

    def call(self, fn: Callable[..., T], *args: Any, timeout_s: float = 30.0) -> T:
        """Run fn(*args) on the loop thread and return its result (re-raising its error)."""
        if self.in_loop():
            return fn(*args)
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def runner() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)

        self.loop.call_soon_threadsafe(runner)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            raise VreplError(f"the I/O thread did not answer within {timeout_s} s") from None

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        """Run a coroutine on the loop and wait for it (not callable from the loop thread)."""
        if self.in_loop():
            raise VreplError("IoLoop.run() would deadlock on the I/O thread; use call() or a task")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise VreplError(f"the I/O thread did not finish within {timeout_s} s") from None


class TickTimer:
    """The production clock of a driver (vrepl/driver/ports.py `Clock`): calls
    `tick(count)` every `tick_ms` on the loop, counted from the start so ticks do not drift;
    after a stall (SIGSTOP, a long GC) it replays the ticks it missed, at most
    `max_catch_up_ticks` (enough to expire every timeout)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick_ms: int, max_catch_up_ticks: int = 10_000) -> None:
        self.loop = loop
        self.tick_s = tick_ms / 1000.0
        self.max_catch_up_ticks = max_catch_up_ticks
        self._handle: asyncio.TimerHandle | None = None
        self._tick: Callable[[int], Any] | None = None
        self._t0 = 0.0
        self._ticks = 0

    def start(self, tick: Callable[[int], Any]) -> None:
        self._tick = tick
        self._t0 = self.loop.time()
        self._ticks = 0
        self._handle = self.loop.call_at(self._t0 + self.tick_s, self._on_timer)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._tick = None

    def _on_timer(self) -> None:
        if self._tick is None:
            return
        due = int((self.loop.time() - self._t0) / self.tick_s) - self._ticks
        if due > self.max_catch_up_ticks:
            # A stall longer than every timeout: replay enough ticks to expire them all.
            self._t0 += (due - self.max_catch_up_ticks) * self.tick_s
            due = self.max_catch_up_ticks
        due = max(due, 1)
        self._ticks += due
        self._handle = self.loop.call_at(self._t0 + (self._ticks + 1) * self.tick_s, self._on_timer)
        self._tick(due)
