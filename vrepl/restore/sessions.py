"""The restore sessions of one sync instance (docs/restore.md §1).

Owns: `RestoreSessions`: the registry of one instance's sessions (a sender per follower, the
backups for tools, at most one receiver), which is the driver's `Restorer` port (start a
sender for a follower too far behind) and takes the sync and backup connections the node's
server hands over (`sync_hello_refusal`, `backup_hello_refusal`, `on_sync_connection`),
and the FETCH connections of ingested rounds (docs/vnode.md §9.4: `fetch_hello_refusal`; the
app's `serve_fetch` answers them on a thread of their own);
cancel, join and status; the counters of stats()["restore"].
Threads: `start_sender` and `on_sync_connection` on the I/O thread; sessions end on their
own threads (vrepl/restore/live.py).
Must not: touch the replica but through its RestoreHost on the I/O thread.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from vrepl.config import SyncConfig
from vrepl.restore.config import RestoreConfig
from vrepl.restore.live import ReceiverSession, RestoreHost, SenderSession
from vrepl.restore.stream import SyncStream
from vrepl.transport.codec import ConnKind, Hello

log = logging.getLogger("vrepl.restore")


class RestoreSessions:
    """One instance's restore sessions (see the module doc).

    `call(fn)` runs fn on the I/O thread and returns its result; `post(fn)` queues it there;
    `running()` says whether the instance runs; `wal_first_version()` and
    `durable_version()` read the WAL store from any thread; `limiter` is the node's
    RestoreLimiter (max_concurrent_restores).
    """

    def __init__(self, cfg: SyncConfig, restore_cfg: RestoreConfig, callbacks: Any, *, host: RestoreHost,
                 call: Callable[[Callable[[], Any]], Any], post: Callable[[Callable[[], Any]], None],
                 running: Callable[[], bool], wal_first_version: Callable[[int], int],
                 durable_version: Callable[[], int], limiter: Any, log_prefix: Callable[[], str],
                 notify: Callable[..., None]) -> None:
        self.cfg = cfg
        self.restore_cfg = restore_cfg
        self.cb = callbacks
        self.host = host
        self.call = call
        self.post = post
        self.running = running
        self.wal_first_version = wal_first_version
        self.durable_version = durable_version
        self.limiter = limiter
        self.log_prefix = log_prefix
        self.notify = notify  # notify(callback, *args): call an app callback, its failure logged
        self.node = cfg.me.node
        self.addr_by_node = {r.node: r for r in cfg.replicas}
        self._lock = threading.Lock()
        self._senders: dict[int, SenderSession] = {}  # follower node -> session
        self._backups: set[SenderSession] = set()
        self._receiver: ReceiverSession | None = None
        self.last_error = ""
        self.counters: dict[str, int] = dict.fromkeys(
            ("sender_sessions", "sender_ok", "sender_failed", "receiver_sessions", "receiver_ok", "receiver_failed",
             "files_sent", "file_bytes_sent", "wal_records_sent", "files_received", "file_bytes_received",
             "wal_records_received", "streamed_in_band"),
            0,
        )

    # -- the driver's Restorer port (I/O thread) -------------------------------------------------

    def start_sender(self, node: int, first_version: int, last_version: int) -> None:
        with self._lock:
            old = self._senders.pop(node, None)
        if old is not None:
            old.cancel("the follower asked again (a new SyncRequest)")
        session = SenderSession(self, node, first_version=first_version)
        with self._lock:
            self._senders[node] = session
        session.start()

    # -- the node server's sync connections (I/O thread) -------------------------------------------

    def sync_hello_refusal(self, node: int) -> str | None:
        """Why a sync connection (kind SYNC) from `node` is refused, or None."""
        if node not in self.addr_by_node or node == self.node:
            return f"sync connection from n{node}: not another replica of vg{self.cfg.vgroup_id}"
        if not self.restore_cfg.enabled:
            return f"vg{self.cfg.vgroup_id} takes no restore (restore disabled)"
        return None

    def backup_hello_refusal(self) -> str | None:
        """Why a restore tool's connection (kind BACKUP) is refused, or None."""
        if not self.restore_cfg.allow_backup:
            return f"vg{self.cfg.vgroup_id} serves no backups (restore.allow_backup is off)"
        return None

    def fetch_hello_refusal(self, node: int) -> str | None:
        """Why a FETCH connection (files of an ingested round) from `node` is refused, or None."""
        if node not in self.addr_by_node or node == self.node:
            return f"fetch connection from n{node}: not another replica of vg{self.cfg.vgroup_id}"
        if getattr(self.cb, "serve_fetch", None) is None:
            return f"vg{self.cfg.vgroup_id} serves no fetches (the app has no rounds of files)"
        return None

    def on_sync_connection(self, sock: Any, hello: Hello) -> None:
        """A sync/backup/fetch connection finished its handshake on this node's server."""
        stream = SyncStream(sock, io_timeout_s=self.restore_cfg.io_timeout_s)
        if not self.running():
            stream.close()
            return
        if hello.kind == ConnKind.FETCH:
            self._serve_fetch(stream, hello.node)
            return
        if hello.kind == ConnKind.BACKUP:
            session = SenderSession(self, None, stream=stream)
            with self._lock:
                self._backups.add(session)
            log.info("%s: backup requested by a restore tool at %s", self.log_prefix(), stream.peer)
            session.start()
            return
        with self._lock:
            old = self._receiver
            receiver = ReceiverSession(self, hello.node, stream)
            self._receiver = receiver
        if old is not None:
            old.cancel("replaced by a newer restore session")
        log.info("%s: restore session from n%d (%s)", self.log_prefix(), hello.node, stream.peer)
        receiver.start()

    def _serve_fetch(self, stream: SyncStream, node: int) -> None:
        """A FETCH connection: the app answers it on a thread of its own (bulk file reads)."""

        def run() -> None:
            try:
                self.cb.serve_fetch(stream, node)
            except Exception:
                log.exception("%s: serving a fetch of n%d failed", self.log_prefix(), node)
            finally:
                stream.close()

        threading.Thread(target=run, name=f"vrepl-fetch-vg{self.cfg.vgroup_id}-n{node}", daemon=True).start()

    # -- the sessions' side --------------------------------------------------------------------------

    def is_current_sender(self, session: SenderSession) -> bool:
        with self._lock:
            return session.node is not None and self._senders.get(session.node) is session

    def is_current_receiver(self, session: ReceiverSession) -> bool:
        return self._receiver is session

    def ended(self, session: Any) -> None:
        with self._lock:
            if self._senders.get(getattr(session, "node", None)) is session:
                del self._senders[session.node]
            self._backups.discard(session)
            if self._receiver is session:
                self._receiver = None

    def _all(self) -> list[Any]:
        with self._lock:
            sessions: list[Any] = list(self._senders.values()) + list(self._backups)
            if self._receiver is not None:
                sessions.append(self._receiver)
        return sessions

    def cancel_all(self, reason: str) -> None:
        for s in self._all():
            s.cancel(reason)

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for s in self._all():
            s.done.wait(max(0.0, deadline - time.monotonic()))

    def status(self) -> dict[str, Any]:
        with self._lock:
            sending = sorted(self._senders)
            backups = len(self._backups)
            receiving = self._receiver.node if self._receiver is not None else None
        limiter = self.limiter.snapshot() if self.limiter is not None else {}
        return {"sending_to": sending, "backups": backups, "receiving_from": receiving, "limiter": limiter,
                "counters": dict(self.counters), "last_error": self.last_error}
