"""Restore sessions run by a sync instance (docs/restore.md §In a sync instance).

Owns: `SenderSession` — on the master, one thread per session that waits for a slot of the
node's RestoreLimiter, opens the sync connection to the follower (kind SYNC, authenticated
like a peer connection; seed: master以client的身份, 向vnode B主动建立一新的专用于同步的TCP连接), or
takes a detached BACKUP connection a `vrepl restore` tool opened, and runs a Sender; and
`ReceiverSession` — on the follower, the thread that runs a Receiver over the sync connection
the master opened, feeding restored records into the replica on the I/O thread
(`LiveSink`). Everything that touches the replica goes through the instance's I/O thread
(`io.call` / `call_soon_threadsafe`), so the replica stays single-threaded.
Must not: block the I/O thread; hold the replica's state across calls.
"""
from __future__ import annotations

import logging
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

from vrepl._core import wire as _wire
from vrepl.errors import FrameError
from vrepl.replica import (
    ForwardBatch,
    LogRebased,
    PeerRestoreCaughtUp,
    PeerRestoreFailed,
    RestoreBegun,
    RestoredRecords,
    RestoreEnded,
    Role,
)
from vrepl.restore import protocol as P
from vrepl.restore.errors import BadData, PeerError, RestoreError
from vrepl.restore.receiver import Receiver
from vrepl.restore.sender import Sender, SenderOptions
from vrepl.restore.stream import SyncStream, connect_sync
from vrepl.transport.codec import ConnKind

if TYPE_CHECKING:
    from vrepl.sync import SyncInstance

log = logging.getLogger("vrepl.restore")
_U64 = struct.Struct("<Q")


def _file_info(inst: "SyncInstance", index: int, name: str | None = None) -> tuple[str, int, int] | None:
    fn = inst.cb.get_file_info
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


# =============================================================================================
# The side that has the data


def _ms_since(t0: float) -> int:
    return round((time.monotonic() - t0) * 1000)


def _end_event(side: str, result: str, took_ms: int) -> dict:
    """The log fields of a restore's end (docs/operations.md §Logs)."""
    return {"event": "restore_end", "side": side, "result": result, "duration_ms": took_ms}


class SenderSession:
    """A retrieve session on this node: to a follower (SYNC) or for a tool (BACKUP)."""

    def __init__(self, inst: "SyncInstance", node: int | None, *, first_version: int = 0,
                 stream: SyncStream | None = None) -> None:
        self.inst = inst
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
        self.name = f"{inst.log_prefix()}: restore of {who}"
        self.thread = threading.Thread(target=self._main, name=f"vrepl-restore-vg{inst.cfg.vgroup_id}-{who}",
                                       daemon=True)

    # -- Source (see vrepl/restore/sender.py) -----------------------------------------------------

    @property
    def data_path(self) -> str:
        return self.inst.cfg.data_path

    @property
    def wal_dir(self) -> str:
        return self.inst.wal_dir

    @property
    def max_record_bytes(self) -> int:
        return self.inst.cfg.record_max_bytes

    def file_info(self, index: int) -> tuple[str, int, int] | None:
        return _file_info(self.inst, index)

    def begin(self) -> tuple[int, int]:
        def now() -> tuple[int, int]:
            r = self.inst.replica
            assert r is not None
            if self.kind == ConnKind.SYNC and r.role != Role.MASTER:
                raise RestoreError("this node is no longer master")
            return r.promised_epoch, r.last_version
        self.epoch, last = self.inst.io.call(now)
        return self.epoch, last

    def history_upto(self, version: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        def now() -> tuple[int, tuple[tuple[int, int], ...]]:
            r = self.inst.replica
            assert r is not None
            if version > r.last_version:
                raise RestoreError(f"the receiver asks for v{version + 1}, beyond this log's end v{r.last_version}",
                                   restart=False)
            pairs = tuple(p for p in r.history.pairs() if p[1] <= version)[-P.MAX_HISTORY_PAIRS:]
            return r.history.epoch_at(version), pairs
        return self.inst.io.call(now)

    def switch_to_live(self) -> int:
        if self.kind == ConnKind.BACKUP:
            return self.inst.io.call(lambda: self.inst.replica.last_version)

        def now() -> int:
            r = self.inst.replica
            assert r is not None and self.node is not None
            reason = self.stop_reason()
            if reason:
                raise RestoreError(reason)
            self.inst._step(PeerRestoreCaughtUp(self.node))
            # Forwards of later versions go live; read the end before the queued ones run.
            switched_at = r.last_version
            self.inst._after()
            return switched_at
        return self.inst.io.call(now)

    def last_version(self) -> int:
        r = self.inst.replica
        return r.last_version if r is not None else 0

    def stop_reason(self) -> str | None:
        if self.cancelled:
            return self.cancel_reason or "cancelled"
        if self.inst._state != "running":
            return f"the sync instance is {self.inst._state}"
        if self.kind == ConnKind.SYNC:
            r = self.inst.replica
            if r is None or r.role != Role.MASTER or (self.epoch and r.promised_epoch != self.epoch):
                return "this node is no longer master of that epoch"
            if self.node not in self.inst._conns:
                return f"n{self.node} is not connected any more"
        return None

    # -- the thread -------------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def cancel(self, reason: str) -> None:
        self.cancelled = True
        self.cancel_reason = reason
        if self.stream is not None:
            self.stream.close()

    def _main(self) -> None:
        inst = self.inst
        rc = inst.restore_cfg
        limiter = inst.nt.restore_limiter if inst.nt is not None else None
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
                addr = inst._addr_by_node[self.node]  # type: ignore[index]
                self.stream = connect_sync(addr.host, addr.port, secret=inst.cfg.secret, kind=ConnKind.SYNC,
                                           vgroup_id=inst.cfg.vgroup_id, node=inst.node, target_node=self.node,  # type: ignore[arg-type]
                                           timeout_s=rc.connect_timeout_s, io_timeout_s=rc.io_timeout_s)
                if self.cancelled:
                    return
                # Files only when the WAL no longer holds what the follower lacks (recycled
                # after a flush): otherwise the WAL alone is the cheaper and exact way.
                files = inst.store.first_version_or(self.last_version() + 1) > self.first_version  # type: ignore[union-attr]
            opts = SenderOptions(live=self.kind == ConnKind.SYNC, files=files,
                                 switch_lag_versions=rc.switch_lag_versions, wal_wait_s=rc.wal_wait_s,
                                 poll=rc.poll, poll_interval_s=rc.poll_interval_s)
            self.sender = Sender(self, opts, name=self.name)
            log.info("%s: begins (%s)", self.name, "files + WAL" if files else "WAL",
                     extra={"event": "restore_start", "side": "sender"})
            inst.restore_counters["sender_sessions"] += 1
            last = self.sender.run(self.stream)
            st = self.sender.stats
            inst.restore_counters["sender_ok"] += 1
            inst.restore_counters["files_sent"] += st.files_sent
            inst.restore_counters["file_bytes_sent"] += st.file_bytes_sent
            inst.restore_counters["wal_records_sent"] += st.wal_records_sent
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
            inst.restore_counters["sender_failed"] += 1
            log.warning("%s: failed after %d ms: %s", self.name, _ms_since(t0), exc,
                        extra=_end_event("sender", "failed", _ms_since(t0)))
            if self.stream is not None and not isinstance(exc, PeerError):
                self.stream.send_error(str(exc))
            if self.kind == ConnKind.SYNC and inst._state == "running":
                node = self.node
                reason = str(exc)[:200]

                def failed() -> None:
                    if inst._sender_sessions.get(node) is self:  # type: ignore[arg-type]
                        inst._step(PeerRestoreFailed(node, reason))  # type: ignore[arg-type]
                        inst._after()
                try:
                    inst.io.call(failed)
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
            inst._session_ended(self)
            self.done.set()


# =============================================================================================
# The side that is behind


class ReceiverSession:
    """The restore the master opened to this follower; `LiveSink` feeds the replica."""

    def __init__(self, inst: "SyncInstance", node: int, stream: SyncStream) -> None:
        self.inst = inst
        self.node = node
        self.stream = stream
        self.cancelled = False
        self.cancel_reason = ""
        self.receiver: Receiver | None = None
        self.done = threading.Event()
        self.name = f"{inst.log_prefix()}: restore from n{node}"
        # LiveSink state
        self.data_path = inst.cfg.data_path
        self.epoch = 0
        self.files_synced_flag = False
        self.prev_epoch = 0
        self.error: str | None = None
        self.fed_version = 0
        self._inflight = threading.BoundedSemaphore(inst.restore_cfg.max_inflight_feeds)
        self.thread = threading.Thread(target=self._main, name=f"vrepl-restore-vg{inst.cfg.vgroup_id}-from-n{node}",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def cancel(self, reason: str) -> None:
        self.cancelled = True
        self.cancel_reason = reason
        self.stream.close()

    # -- Sink (see vrepl/restore/receiver.py) -----------------------------------------------------

    def _on_loop(self, fn):
        return self.inst.io.call(fn)

    def on_begin(self, begin: P.SyncBegin) -> None:
        rc = self.inst.restore_cfg
        self.epoch = begin.epoch
        deadline = time.monotonic() + rc.begin_wait_s

        def try_begin() -> str | None:
            r = self.inst.replica
            assert r is not None
            if self.inst._receiver_session is not self:
                return "replaced by a newer session"
            following = r.role in (Role.SLAVE, Role.SYNCING) and r.master == self.node and r.promised_epoch == begin.epoch
            if not following:
                return f"not following n{self.node} in e{begin.epoch} (role {r.role.describe()}, e{r.promised_epoch})"
            if not r.sync_started:
                return "wait"
            self.inst._step(RestoreBegun(self.node, begin.epoch))
            self.inst._after()
            return None if r.restoring else "the replica refused the restore"

        while True:
            why = self._on_loop(try_begin)
            if why is None:
                return
            if why != "wait" or time.monotonic() > deadline:
                raise RestoreError(f"cannot restore from n{self.node}: {why if why != 'wait' else 'no SyncStart arrived'}")
            time.sleep(0.01)

    def own_file(self, index: int, name: str) -> tuple[int, int] | None:
        info = _file_info(self.inst, index, name)
        return None if info is None else (info[1], info[2])

    def own_files(self) -> list[str]:
        names, i = [], 0
        while True:
            info = _file_info(self.inst, i)
            if info is None:
                return names
            names.append(info[0])
            i += 1

    def files_synced(self) -> None:
        self.files_synced_flag = True
        fn = self.inst.cb.notify_file_synced
        if fn is not None:
            try:
                fn()
            except Exception as exc:
                raise RestoreError(f"notify_file_synced failed: {exc}", restart=False) from None

    def wal_from_version(self) -> int:
        # The app's version may be beyond the WAL's end: the restored files (or files a
        # crash left installed before the WAL was reset) hold those versions.
        app = int(self.inst.cb.get_version()) if self.inst.cb.get_version is not None else 0
        return self._on_loop(lambda: max(self.inst.replica.last_version, app)) + 1

    def on_wal_begin(self, msg: P.WalBegin) -> None:
        base = msg.first_version - 1
        self.prev_epoch = msg.prev_epoch

        def rebase() -> None:
            r = self.inst.replica
            assert r is not None
            self._check_restoring()
            if base > r.last_version:
                if not 1 <= msg.prev_epoch <= r.promised_epoch:
                    # Checked before the WAL is reset: the replica would refuse this rebase.
                    raise BadData(f"wal_begin at v{msg.first_version} with prev epoch e{msg.prev_epoch},"
                                  f" outside e1..e{r.promised_epoch}", restart=False)
                # The files hold every version up to base; the WAL starts after it.
                self.inst.store.reset(base, msg.prev_epoch)  # type: ignore[union-attr]
                self.inst._step(LogRebased(msg.prev_epoch, base, msg.history))
                self.inst._after()
                if r.last_version != base:
                    raise RestoreError(f"the replica refused to rebase at v{base}")
            self.fed_version = r.last_version
        self._on_loop(rebase)

    def _check_restoring(self) -> None:
        r = self.inst.replica
        if self.inst._receiver_session is not self:
            raise RestoreError("replaced by a newer restore session")
        if r is None or not r.restoring or r.master != self.node:
            raise RestoreError("the replica left the restore (it resynced: sync cache overflow or a gap)")

    def feed(self, block: bytes, scan: Any) -> None:
        if self.error:
            raise RestoreError(self.error)
        if self.cancelled:
            raise RestoreError(self.cancel_reason or "cancelled")
        # Back-pressure: chunks queued for the I/O thread, and records not yet durable.
        rc = self.inst.restore_cfg
        store = self.inst.store
        while self.fed_version - store.durable_version > rc.max_undurable_versions:  # type: ignore[union-attr]
            if self.error or self.cancelled:
                raise RestoreError(self.error or self.cancel_reason)
            time.sleep(0.001)
        if not self._inflight.acquire(timeout=rc.io_timeout_s):
            raise RestoreError(f"the I/O thread took no restored records for {rc.io_timeout_s:g} s")
        prev_epoch = self.prev_epoch
        self.prev_epoch = int(scan.epochs[-1])
        self.fed_version = int(scan.versions[-1])
        loop = self.inst.loop
        try:
            loop.call_soon_threadsafe(self._feed_on_loop, block, scan, prev_epoch)  # type: ignore[union-attr]
        except RuntimeError:
            self._inflight.release()
            raise RestoreError("the sync instance stopped") from None

    def _feed_on_loop(self, block: bytes, scan: Any, prev_epoch: int) -> None:
        try:
            if self.error:
                return
            self._check_restoring()
            r = self.inst.replica
            versions = scan.versions
            first, last = int(versions[0]), int(versions[-1])
            if last <= r.last_version:
                return  # the follower has all of them (seed: 如果小, 直接扔掉)
            if first > r.last_version + 1:
                raise RestoreError(f"gap: restored records start at v{first}, the log ends at v{r.last_version}")
            k = r.last_version + 1 - first
            if k:
                prev_epoch = int(scan.epochs[k - 1])
                block = block[int(scan.offsets[k]):]
            body = _U64.pack(prev_epoch) + block
            prev, epochs, payloads, blk = _wire.decode_forward_body(body, first + k, self.inst.cfg.record_max_bytes)
            batch = ForwardBatch(r.promised_epoch, first + k, prev, epochs, payloads, blk)
            self.inst._step(RestoredRecords(self.node, batch))
            self.inst._after()
            if r.last_version < last:
                raise RestoreError(f"the replica did not take restored v{first + k}..v{last} (log at v{r.last_version})")
        except (RestoreError, FrameError) as exc:
            self.error = self.error or str(exc)
        finally:
            self._inflight.release()

    def on_wal_end(self, last_version: int) -> int:
        rc = self.inst.restore_cfg
        for _ in range(rc.max_inflight_feeds):  # every queued chunk was handled
            if not self._inflight.acquire(timeout=rc.io_timeout_s):
                raise RestoreError("the I/O thread did not finish the restored records")
        for _ in range(rc.max_inflight_feeds):
            self._inflight.release()
        if self.error:
            raise RestoreError(self.error)

        def end() -> int:
            r = self.inst.replica
            self._check_restoring()
            if r.last_version < last_version:
                raise RestoreError(f"the WAL stream ended at v{last_version} but the log is at v{r.last_version}")
            self.inst._step(RestoreEnded(self.node, True))
            self.inst._after()
            return r.last_version
        return self._on_loop(end)

    # -- the thread -------------------------------------------------------------------------------

    def _main(self) -> None:
        inst = self.inst
        rc = inst.restore_cfg
        t0 = time.monotonic()
        try:
            inst.restore_counters["receiver_sessions"] += 1
            log.info("%s: begins", self.name, extra={"event": "restore_start", "side": "receiver"})
            self.receiver = Receiver(self, magic_of=inst.cb.file_magic, fsync=rc.fsync, max_file_bytes=rc.max_file_bytes,
                                     max_record_bytes=inst.cfg.record_max_bytes, name=self.name)
            last = self.receiver.run(self.stream)
            st = self.receiver.stats
            inst.restore_counters["receiver_ok"] += 1
            inst.restore_counters["files_received"] += st.files_received
            inst.restore_counters["file_bytes_received"] += st.file_bytes_received
            inst.restore_counters["wal_records_received"] += st.wal_records_received
            took_ms = _ms_since(t0)
            log.info("%s: done in %d ms at v%d: %d files received (%d bytes, %d same, %d resumed, %d removed),"
                     " %d WAL records", self.name, took_ms, last, st.files_received,
                     st.file_bytes_received, st.files_same, st.files_resumed, st.files_removed, st.wal_records_received,
                     extra=_end_event("receiver", "ok", took_ms))
            inst._callback(inst.cb.notify_restore, "ok", "")
        except (RestoreError, OSError, FrameError) as exc:
            if self.cancelled:
                log.info("%s: cancelled after %d ms: %s", self.name, _ms_since(t0), self.cancel_reason,
                         extra=_end_event("receiver", "cancelled", _ms_since(t0)))
                return
            reason = str(exc)
            inst.restore_counters["receiver_failed"] += 1
            inst.last_restore_error = reason
            log.error("%s: failed after %d ms: %s", self.name, _ms_since(t0), reason,
                      extra=_end_event("receiver", "failed", _ms_since(t0)))
            if not isinstance(exc, PeerError):
                self.stream.send_error(reason)
            inst._callback(inst.cb.notify_restore, "failed", reason)
            # Retry with a fresh SyncRequest after a pause (a full disk must not spin).
            time.sleep(rc.retry_interval_ms / 1000.0)

            def failed() -> None:
                if inst._receiver_session is self and inst.replica is not None and inst.replica.restoring:
                    inst._step(RestoreEnded(self.node, False, reason[:200]))
                    inst._after()
            try:
                inst.io.call(failed)
            except Exception:
                pass
        except Exception:
            log.exception("%s: failed", self.name)
        finally:
            self.stream.close()
            inst._session_ended(self)
            self.done.set()
