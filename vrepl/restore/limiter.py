"""At most `max_concurrent_restores` restore sessions per node; the rest wait in a queue.

Owns: `RestoreLimiter` (seed 虚拟节点之间的网络连接: 系统只容许一定数量(tsMaxSyncNum)的数据恢复的socket
存在; 如果超过这个数字, 系统会将新的数据恢复请求延后处理). Waiters are served first come first
served; every wait is logged with the queue length.
Must not: know what a session does.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Callable

log = logging.getLogger("vrepl.restore")


class RestoreLimiter:
    def __init__(self, max_concurrent: int) -> None:
        self.max_concurrent = max_concurrent
        self._cond = threading.Condition()
        self._active: set[object] = set()
        self._queue: deque[object] = deque()
        self.waited = 0  # sessions that had to queue

    def acquire(self, ticket: object, what: str, cancelled: Callable[[], bool]) -> bool:
        """Block until `ticket` may run (True) or `cancelled()` (False)."""
        with self._cond:
            if len(self._active) < self.max_concurrent and not self._queue:
                self._active.add(ticket)
                return True
            self._queue.append(ticket)
            self.waited += 1
            log.info("%s: queued behind %d running restores (max_concurrent_restores %d), %d waiting",
                     what, len(self._active), self.max_concurrent, len(self._queue),
                     extra={"event": "restore_queued"})
            try:
                while not (self._queue[0] is ticket and len(self._active) < self.max_concurrent):
                    if cancelled():
                        return False
                    self._cond.wait(0.1)
                self._queue.popleft()
                self._active.add(ticket)
                log.info("%s: leaves the restore queue", what)
                return True
            finally:
                if ticket in self._queue:
                    self._queue.remove(ticket)
                self._cond.notify_all()

    def release(self, ticket: object) -> None:
        with self._cond:
            self._active.discard(ticket)
            self._cond.notify_all()

    def snapshot(self) -> dict[str, int]:
        with self._cond:
            return {"running": len(self._active), "waiting": len(self._queue), "waited": self.waited,
                    "max_concurrent_restores": self.max_concurrent}
