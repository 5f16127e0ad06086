"""Restore sessions run by a sync instance, each on its own thread (docs/restore.md).

Owns: `RestoreHost`, the interface a session needs from the replica's side (the driver's
`ReplicaRestore`, vrepl/driver/restoring.py: checks and events, answered on the I/O thread);
`SessionOwner`, what a session needs from its registry (vrepl/restore/sessions.py);
`SenderSession` — on the master, one thread per session that waits for a slot of the node's
RestoreLimiter, opens the sync connection to the follower (kind SYNC, authenticated like a
peer connection; seed: master以client的身份, 向vnode B主动建立一新的专用于同步的TCP连接), or takes a
detached BACKUP connection a `vrepl restore` tool opened, and runs a Sender; and
`ReceiverSession` — on the follower, the thread that runs a Receiver over the sync connection
the master opened, feeding restored records to the replica on the I/O thread. Everything
that touches the replica goes through the host on the I/O thread (`owner.call` /
`owner.post`), so the replica stays single-threaded.
Must not: block the I/O thread; hold the replica's state across calls.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Protocol

from vrepl.config import ReplicaAddress, SyncConfig
from vrepl.errors import FrameError
from vrepl.restore import protocol as P
from vrepl.restore.config import RestoreConfig
from vrepl.restore.errors import BadData, FilesChanged, PeerError, RestoreError
from vrepl.restore.receiver import Receiver
from vrepl.restore.sender import Sender, SenderOptions
from vrepl.restore.stream import SyncStream, connect_sync
from vrepl.transport.codec import ConnKind

log = logging.getLogger("vrepl.restore")
WAIT = "wait"  # RestoreHost.begin_refusal: no SyncStart yet, ask again


class RestoreHost(Protocol):
    """The replica's side of a restore (vrepl/driver/restoring.py), on the I/O thread.
    Validation returns a reason (None: done)."""

    def log_end(self) -> tuple[int, int]: ...
    def last_version(self) -> int: ...
    def stop_reason(self, node: int | None, epoch: int) -> str | None: ...
    def history_upto(self, version: int) -> "tuple[int, tuple[tuple[int, int], ...]] | str": ...
    def caught_up(self, node: int) -> int: ...
    def sender_failed(self, node: int, reason: str) -> None: ...
    def begin_refusal(self, node: int, epoch: int) -> str | None: ...
    def restoring_refusal(self, node: int) -> str | None: ...
    def wal_from(self, app_version: int) -> int: ...
    def rebase_refusal(self, base: int, prev_epoch: int) -> str | None: ...
    def rebase(self, node: int, base: int, prev_epoch: int, history: tuple[tuple[int, int], ...]) -> str | None: ...
    def feed(self, node: int, block: bytes, scan: Any, prev_epoch: int) -> str | None: ...
    def end(self, node: int, last_version: int) -> "int | str": ...
    def receiver_failed(self, node: int, reason: str) -> None: ...


class SessionOwner(Protocol):
    """What a session needs from its registry (vrepl/restore/sessions.py)."""

    cfg: SyncConfig
    restore_cfg: RestoreConfig
    cb: Any  # SyncCallbacks: get_file_info, notify_file_synced, get_version, file_magic, notify_restore
    host: RestoreHost
    node: int
    addr_by_node: dict[int, ReplicaAddress]
    limiter: Any
    counters: dict[str, int]
    last_error: str

    def call(self, fn: Callable[[], Any]) -> Any: ...
    def post(self, fn: Callable[[], Any]) -> None: ...
    def running(self) -> bool: ...
    def wal_first_version(self, default: int) -> int: ...
    def durable_version(self) -> int: ...
    def log_prefix(self) -> str: ...
    def notify(self, fn: Any, *args: Any) -> None: ...
    def is_current_sender(self, session: "SenderSession") -> bool: ...
    def is_current_receiver(self, session: "ReceiverSession") -> bool: ...
    def ended(self, session: Any) -> None: ...


def file_info(cb: Any, index: int, name: str | None = None) -> tuple[str, int, int] | None:
    """The app's getFileInfo as (name, size, magic), None when magic is 0 (no more files)."""
    fn = cb.get_file_info
    if fn is None:
        return None
    try:
        info = fn(index, name) if name else fn(index)
    except Exception as exc:  # the seed's -1: stop the restore, report
        raise RestoreError(f"getFileInfo({index}{', ' + repr(name) if name else ''}) failed: {exc}") from None
    magic = int(getattr(info, "magic", 0))
    if not magic:
        return None
    return str(info.name), int(info.size), magic


def _ms_since(t0: float) -> int:
    return round((time.monotonic() - t0) * 1000)


def _end_event(side: str, result: str, took_ms: int) -> dict:
    """The log fields of a restore's end (docs/operations.md §Logs)."""
    return {"event": "restore_end", "side": side, "result": result, "duration_ms": took_ms}


def _answer(result: Any) -> Any:
    """A host answer that is a reason (str) becomes a RestoreError."""
    if isinstance(result, str):
        raise RestoreError(result)
    return result


# =============================================================================================
# The side that has the data


class SenderSession:
    """A retrieve session on this node: to a follower (SYNC) or for a tool (BACKUP). It is
    the Sender's Source (vrepl/restore/sender.py)."""

    def __init__(self, owner: SessionOwner, node: int | None, *, first_version: int = 0,
                 stream: SyncStream | None = None) -> None:
        self.owner = owner
        self.host = owner.host
        self.node = node  # the follower (SYNC); None for a tool (BACKUP)
        self.kind = ConnKind.SYNC if stream is None else ConnKind.BACKUP
        self.first_version = first_version
        self.stream = stream
        self.epoch = 0
        self.cancelled = False
        self.cancel_reason = ""
        self.sender: Sender | None = None
        self.error = ""
        self.done = threading.Event()
        who = f"n{node}" if node is not None else f"tool {stream.peer if stream else '?'}"
        self.name = f"{owner.log_prefix()}: restore of {who}"
        self.thread = threading.Thread(target=self._main, name=f"vrepl-restore-vg{owner.cfg.vgroup_id}-{who}",
                                       daemon=True)
        self.data_path = owner.cfg.data_path
        self.wal_dir = f"{owner.cfg.data_path}/wal"
        self.max_record_bytes = owner.cfg.max_record_bytes

    # -- Source (see vrepl/restore/sender.py) -----------------------------------------------------

    def file_info(self, index: int) -> tuple[str, int, int] | None:
        return file_info(self.owner.cb, index)

    def begin(self) -> tuple[int, int]:
        def now() -> tuple[int, int]:
            _answer(self.host.stop_reason(self.node, 0))
            return self.host.log_end()
        self.epoch, last = self.owner.call(now)
        return self.epoch, last

    def history_upto(self, version: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        answer = self.owner.call(lambda: self.host.history_upto(version))
        if isinstance(answer, str):
            raise RestoreError(answer, restart=False)
        epoch, pairs = answer
        return epoch, pairs[-P.MAX_HISTORY_PAIRS:]

    def switch_to_live(self) -> int:
        if self.node is None:
            return self.owner.call(self.host.last_version)

        def now() -> int:
            _answer(self.stop_reason())
            return self.host.caught_up(self.node)  # type: ignore[arg-type]
        return self.owner.call(now)

    def last_version(self) -> int:
        return self.host.last_version()  # a plain read: may be slightly stale

    def stop_reason(self) -> str | None:
        if self.cancelled:
            return self.cancel_reason or "cancelled"
        if not self.owner.running():
            return "the sync instance is not running"
        return self.host.stop_reason(self.node, self.epoch)

    # -- the thread -------------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def cancel(self, reason: str) -> None:
        self.cancelled = True
        self.cancel_reason = reason
        if self.stream is not None:
            self.stream.close()

    def _main(self) -> None:
        owner = self.owner
        rc = owner.restore_cfg
        limiter = owner.limiter
        acquired = False
        t0 = time.monotonic()
        try:
            if limiter is not None:
                acquired = limiter.acquire(self, self.name, lambda: self.stop_reason() is not None)
                if not acquired:
                    return
            if self.stop_reason():
                return
            files = True
            if self.kind == ConnKind.SYNC:
                addr = owner.addr_by_node[self.node]  # type: ignore[index]
                self.stream = connect_sync(addr.host, addr.port, secret=owner.cfg.secret, kind=ConnKind.SYNC,
                                           vgroup_id=owner.cfg.vgroup_id, node=owner.node, target_node=self.node,  # type: ignore[arg-type]
                                           timeout_s=rc.connect_timeout_s, io_timeout_s=rc.io_timeout_s)
                if self.cancelled:
                    return
                # Files only when the WAL no longer holds what the follower lacks (recycled
                # after a flush): otherwise the WAL alone is the cheaper and exact way.
                files = owner.wal_first_version(self.last_version() + 1) > self.first_version
            opts = SenderOptions(live=self.kind == ConnKind.SYNC, files=files,
                                 switch_lag_versions=rc.switch_lag_versions, wal_wait_s=rc.wal_wait_s,
                                 poll=rc.poll, poll_interval_s=rc.poll_interval_s)
            self.sender = Sender(self, opts, name=self.name)
            log.info("%s: begins (%s)", self.name, "files + WAL" if files else "WAL",
                     extra={"event": "restore_start", "side": "sender"})
            owner.counters["sender_sessions"] += 1
            last = self.sender.run(self.stream)
            st = self.sender.stats
            owner.counters["sender_ok"] += 1
            owner.counters["files_sent"] += st.files_sent
            owner.counters["file_bytes_sent"] += st.file_bytes_sent
            owner.counters["wal_records_sent"] += st.wal_records_sent
            took_ms = _ms_since(t0)
            log.info("%s: done in %d ms: %d/%d files sent (%d bytes), %d WAL records (%d bytes), receiver at v%d",
                     self.name, took_ms, st.files_sent, st.files_checked, st.file_bytes_sent,
                     st.wal_records_sent, st.wal_bytes_sent, last,
                     extra=_end_event("sender", "ok", took_ms))
        except (RestoreError, OSError, FrameError) as exc:
            self.error = str(exc)
            if self.cancelled:
                log.info("%s: cancelled after %d ms: %s", self.name, _ms_since(t0), self.cancel_reason,
                         extra=_end_event("sender", "cancelled", _ms_since(t0)))
                return
            owner.counters["sender_failed"] += 1
            log.warning("%s: failed after %d ms: %s", self.name, _ms_since(t0), exc,
                        extra=_end_event("sender", "failed", _ms_since(t0)))
            if self.stream is not None and not isinstance(exc, PeerError):
                changed = isinstance(exc, FilesChanged)
                self.stream.send_error(str(exc), P.ERROR_SOURCE_CHANGED if changed else P.ERROR_OTHER)
            if self.kind == ConnKind.SYNC and owner.running():
                node = self.node
                reason = str(exc)[:200]

                def failed() -> None:
                    if owner.is_current_sender(self):
                        self.host.sender_failed(node, reason)  # type: ignore[arg-type]
                try:
                    owner.call(failed)
                except Exception:
                    pass
        except Exception:
            log.exception("%s: failed", self.name)
        finally:
            if acquired and limiter is not None:
                limiter.release(self)
            if self.sender is not None:
                self.sender.close()
            if self.stream is not None:
                self.stream.close()
            owner.ended(self)
            self.done.set()


# =============================================================================================
# The side that is behind


class ReceiverSession:
    """The restore the master opened to this follower; it is the Receiver's Sink
    (vrepl/restore/receiver.py), feeding the replica on the I/O thread."""

    def __init__(self, owner: SessionOwner, node: int, stream: SyncStream) -> None:
        self.owner = owner
        self.host = owner.host
        self.node = node
        self.stream = stream
        self.cancelled = False
        self.cancel_reason = ""
        self.receiver: Receiver | None = None
        self.done = threading.Event()
        self.name = f"{owner.log_prefix()}: restore from n{node}"
        self.data_path = owner.cfg.data_path
        self.epoch = 0
        self.prev_epoch = 0
        self.error: str | None = None
        self.fed_version = 0
        self._inflight = threading.BoundedSemaphore(owner.restore_cfg.max_inflight_feeds)
        self.thread = threading.Thread(target=self._main,
                                       name=f"vrepl-restore-vg{owner.cfg.vgroup_id}-from-n{node}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def cancel(self, reason: str) -> None:
        self.cancelled = True
        self.cancel_reason = reason
        self.stream.close()

    # -- Sink (see vrepl/restore/receiver.py) -----------------------------------------------------

    def _current(self) -> None:
        if not self.owner.is_current_receiver(self):
            raise RestoreError("replaced by a newer restore session")

    def on_begin(self, begin: P.SyncBegin) -> None:
        self.epoch = begin.epoch
        deadline = time.monotonic() + self.owner.restore_cfg.begin_wait_s

        def try_begin() -> str | None:
            if not self.owner.is_current_receiver(self):
                return "replaced by a newer session"
            return self.host.begin_refusal(self.node, begin.epoch)

        while True:
            why = self.owner.call(try_begin)
            if why is None:
                return
            if why != WAIT or time.monotonic() > deadline:
                raise RestoreError(f"cannot restore from n{self.node}: {why if why != WAIT else 'no SyncStart arrived'}")
            time.sleep(0.01)

    def own_file(self, index: int, name: str) -> tuple[int, int] | None:
        info = file_info(self.owner.cb, index, name)
        return None if info is None else (info[1], info[2])

    def own_files(self) -> list[str]:
        names, i = [], 0
        while True:
            info = file_info(self.owner.cb, i)
            if info is None:
                return names
            names.append(info[0])
            i += 1

    def files_synced(self) -> None:
        fn = self.owner.cb.notify_file_synced
        if fn is not None:
            try:
                fn()
            except Exception as exc:
                raise RestoreError(f"notify_file_synced failed: {exc}", restart=False) from None

    def wal_from_version(self) -> int:
        get_version = self.owner.cb.get_version
        app = int(get_version()) if get_version is not None else 0
        return self.owner.call(lambda: self.host.wal_from(app))

    def on_wal_begin(self, msg: P.WalBegin) -> None:
        base = msg.first_version - 1
        self.prev_epoch = msg.prev_epoch

        def rebase() -> int:
            self._current()
            _answer(self.host.restoring_refusal(self.node))
            bad = self.host.rebase_refusal(base, msg.prev_epoch)
            if bad:
                raise BadData(bad, restart=False)
            _answer(self.host.rebase(self.node, base, msg.prev_epoch, msg.history))
            return self.host.last_version()
        self.fed_version = self.owner.call(rebase)

    def feed(self, block: bytes, scan: Any) -> None:
        if self.error:
            raise RestoreError(self.error)
        if self.cancelled:
            raise RestoreError(self.cancel_reason or "cancelled")
        # Back-pressure: chunks queued for the I/O thread, and records not yet durable.
        rc = self.owner.restore_cfg
        while self.fed_version - self.owner.durable_version() > rc.max_undurable_versions:
            if self.error or self.cancelled:
                raise RestoreError(self.error or self.cancel_reason)
            time.sleep(0.001)
        if not self._inflight.acquire(timeout=rc.io_timeout_s):
            raise RestoreError(f"the I/O thread took no restored records for {rc.io_timeout_s:g} s")
        prev_epoch = self.prev_epoch
        self.prev_epoch = int(scan.epochs[-1])
        self.fed_version = int(scan.versions[-1])
        try:
            self.owner.post(lambda: self._feed_on_loop(block, scan, prev_epoch))
        except RuntimeError:
            self._inflight.release()
            raise RestoreError("the sync instance stopped") from None

    def _feed_on_loop(self, block: bytes, scan: Any, prev_epoch: int) -> None:
        try:
            if self.error:
                return
            if not self.owner.is_current_receiver(self):
                self.error = "replaced by a newer restore session"
                return
            why = self.host.feed(self.node, block, scan, prev_epoch)
            if why:
                self.error = self.error or why
        finally:
            self._inflight.release()

    def on_wal_end(self, last_version: int) -> int:
        rc = self.owner.restore_cfg
        for _ in range(rc.max_inflight_feeds):  # every queued chunk was handled
            if not self._inflight.acquire(timeout=rc.io_timeout_s):
                raise RestoreError("the I/O thread did not finish the restored records")
        for _ in range(rc.max_inflight_feeds):
            self._inflight.release()
        if self.error:
            raise RestoreError(self.error)

        def end() -> int:
            self._current()
            return _answer(self.host.end(self.node, last_version))
        return self.owner.call(end)

    # -- the thread -------------------------------------------------------------------------------

    def _main(self) -> None:
        owner = self.owner
        rc = owner.restore_cfg
        t0 = time.monotonic()
        try:
            owner.counters["receiver_sessions"] += 1
            log.info("%s: begins", self.name, extra={"event": "restore_start", "side": "receiver"})
            self.receiver = Receiver(self, magic_of=owner.cb.file_magic, fsync=rc.fsync, max_file_bytes=rc.max_file_bytes,
                                     max_record_bytes=owner.cfg.max_record_bytes, name=self.name)
            last = self.receiver.run(self.stream)
            st = self.receiver.stats
            owner.counters["receiver_ok"] += 1
            owner.counters["files_received"] += st.files_received
            owner.counters["file_bytes_received"] += st.file_bytes_received
            owner.counters["wal_records_received"] += st.wal_records_received
            took_ms = _ms_since(t0)
            log.info("%s: done in %d ms at v%d: %d files received (%d bytes, %d same, %d resumed, %d removed),"
                     " %d WAL records", self.name, took_ms, last, st.files_received,
                     st.file_bytes_received, st.files_same, st.files_resumed, st.files_removed, st.wal_records_received,
                     extra=_end_event("receiver", "ok", took_ms))
            owner.notify(owner.cb.notify_restore, "ok", "")
        except (RestoreError, OSError, FrameError) as exc:
            if self.cancelled:
                log.info("%s: cancelled after %d ms: %s", self.name, _ms_since(t0), self.cancel_reason,
                         extra=_end_event("receiver", "cancelled", _ms_since(t0)))
                return
            reason = str(exc)
            owner.counters["receiver_failed"] += 1
            owner.last_error = reason
            log.error("%s: failed after %d ms: %s", self.name, _ms_since(t0), reason,
                      extra=_end_event("receiver", "failed", _ms_since(t0)))
            if not isinstance(exc, (PeerError, FilesChanged)):  # a FilesChanged here came from the peer
                self.stream.send_error(reason)
            owner.notify(owner.cb.notify_restore, "failed", reason)
            # Retry with a fresh SyncRequest after a pause (a full disk must not spin).
            time.sleep(rc.retry_interval_ms / 1000.0)

            def failed() -> None:
                if owner.is_current_receiver(self):
                    self.host.receiver_failed(self.node, reason[:200])
            try:
                owner.call(failed)
            except Exception:
                pass
        except Exception:
            log.exception("%s: failed", self.name)
        finally:
            self.stream.close()
            owner.ended(self)
            self.done.set()
