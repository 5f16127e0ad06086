"""The side of a restore that has the data (the master, or any replica a tool pulls from).

Owns: `Sender.run(stream)`, the seed's retrieve flow over one sync connection
(docs/restore.md §Protocol): the files phase (walk the archived files with getFileInfo,
send each one the receiver lacks with os.sendfile, watch every processed file with inotify
and restart if one changes, re-walk before FILES_END so the receiver never commits a file
set that was never whole), then the WAL phase (sealed WAL files sent with os.sendfile, the
last WAL tailed record by record while it grows, every last-WAL case of the seed), then the
switch to live forwarding (SYNC_CACHE) and WAL_END.
`Source` is what the sender needs from the node: the app's getFileInfo, the WAL directory,
and three calls answered on the I/O thread (begin, epoch history, switch).
Must not: touch the replica directly (the Source does, on the I/O thread), or send a file
name it has not confined to the data path.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Protocol

from vrepl import wal as _wal
from vrepl._core import record as _rec
from vrepl.restore import protocol as P
from vrepl.restore.errors import FilesChanged, PeerError, RestoreError
from vrepl.restore.paths import confined
from vrepl.restore.stream import SyncStream
from vrepl.restore.watch import Watcher

log = logging.getLogger("vrepl.restore")

READ_CHUNK_BYTES = 4 * 1024 * 1024


class Source(Protocol):
    data_path: str
    wal_dir: str
    max_record_bytes: int

    def file_info(self, index: int) -> tuple[str, int, int] | None:
        """(name, size, magic) of the archived file at `index`, None when magic is 0 (no
        more files); raises RestoreError when the app fails (the seed's -1)."""

    def begin(self) -> tuple[int, int]:
        """(epoch, last_version) now (I/O thread)."""

    def history_upto(self, version: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        """(epoch of record `version`, epoch history pairs up to it) (I/O thread)."""

    def switch_to_live(self) -> int:
        """Start forwarding live records to the receiver (live restore) and return the
        version they start after; a backup returns the log end now (I/O thread)."""

    def last_version(self) -> int:
        """The log end now (any thread; may be slightly stale)."""

    def stop_reason(self) -> str | None:
        """Why the session must stop (master stepped down, stopping), or None."""


@dataclass
class SenderOptions:
    live: bool = True  # the receiver follows us: switch to live forwards at the end (SYNC_CACHE)
    files: bool = True  # run the files phase
    switch_lag_versions: int = 1000  # switch to live forwards once the WAL stream is this close
    wal_wait_s: float = 10.0  # longest wait for records that should be in the WAL (not yet readable)
    poll: bool = False  # force polling instead of inotify
    poll_interval_s: float = 0.05


@dataclass
class SenderStats:
    files_checked: int = 0
    files_sent: int = 0
    file_bytes_sent: int = 0
    wal_files_sent: int = 0
    wal_bytes_sent: int = 0
    wal_records_sent: int = 0
    first_version: int = 0
    last_version: int = 0
    switched_at: int = 0
    events: list[str] = field(default_factory=list)  # last-WAL cases met, for tests and logs

    def note(self, event: str) -> None:
        if event not in self.events:
            self.events.append(event)


class Sender:
    """One retrieve session (see the module doc)."""

    def __init__(self, source: Source, options: SenderOptions | None = None, *, name: str = "restore") -> None:
        self.src = source
        self.opt = options or SenderOptions()
        self.name = name
        self.stats = SenderStats()
        self.watcher = Watcher(poll=self.opt.poll, poll_interval_s=self.opt.poll_interval_s)

    def close(self) -> None:
        self.watcher.close()

    def _check_alive(self) -> None:
        why = self.src.stop_reason()
        if why:
            raise RestoreError(f"stopped: {why}")

    # ------------------------------------------------------------------------------ session

    def run(self, stream: SyncStream) -> int:
        """The whole session; returns the last version the receiver reported applied."""
        epoch, last = self.src.begin()
        files, file_bytes = 0, 0
        if self.opt.files:
            while True:
                info = self.src.file_info(files)
                if info is None:
                    break
                files += 1
                file_bytes += info[1]
        flags = (P.FLAG_FILES if self.opt.files else 0) | (P.FLAG_LIVE if self.opt.live else 0)
        stream.send(P.SyncBegin(epoch, last, flags, files, file_bytes, 0))
        if self.opt.files:
            self._files_phase(stream)
        req = stream.recv()
        if type(req) is not P.WalRequest:
            raise PeerError(f"expected wal_request, got {req.describe()}")
        self._wal_phase(stream, req.from_version)
        done = stream.recv()
        if type(done) is not P.Done:
            raise PeerError(f"expected done, got {done.describe()}")
        return done.last_version

    # ------------------------------------------------------------------------------ files

    def _files_phase(self, stream: SyncStream) -> None:
        processed: list[tuple[str, int, int]] = []
        index = 0
        while True:
            self._check_alive()
            info = self.src.file_info(index)
            if info is None:
                break
            name, size, magic = info
            path = confined(self.src.data_path, name)
            # Watch first, then check the file still is what getFileInfo described: a change
            # after this point is seen by the watch, one before it by the size check.
            self.watcher.add_file(path)
            try:
                st = os.stat(path)
            except OSError as exc:
                raise FilesChanged(f"{name} is gone on the source ({exc.strerror})") from None
            if st.st_size != size:
                raise FilesChanged(f"{name} is {st.st_size} bytes on the source, getFileInfo said {size}")
            stream.send(P.FileInfo(index, size, magic, name))
            ack = stream.recv()
            if type(ack) is not P.FileAck or ack.index != index:
                raise PeerError(f"expected file_ack #{index}, got {ack.describe()}")
            self.stats.files_checked += 1
            if ack.need:
                self._send_file(stream, index, path, name, size)
            why = self.watcher.changed()
            if why:
                raise FilesChanged(why)
            processed.append(info)
            index += 1
        # The file set must have stayed one version of the data while we walked it (a flush
        # may add files, or commit a new manifest, without touching a processed file).
        for i, info in enumerate(processed):
            if self.src.file_info(i) != info:
                raise FilesChanged(f"file #{i} ({info[0]}) is not the same on the source any more")
        if self.src.file_info(len(processed)) is not None:
            raise FilesChanged(f"a file #{len(processed)} appeared on the source during the restore")
        why = self.watcher.changed()
        if why:
            raise FilesChanged(why)
        stream.send(P.FilesEnd(len(processed)))
        # The receiver now holds one consistent file set; later flushes on this side are
        # covered by the WAL phase, so the processed files need no more watching.
        self.watcher.forget_files()

    def _send_file(self, stream: SyncStream, index: int, path: str, name: str, size: int) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise FilesChanged(f"{name} cannot be opened on the source ({exc.strerror})") from None
        try:
            if os.fstat(fd).st_size != size:
                raise FilesChanged(f"{name} changed size on the source")
            stream.send(P.FileData(index, size))
            stream.sendfile(fd, 0, size)
        finally:
            os.close(fd)
        self.stats.files_sent += 1
        self.stats.file_bytes_sent += size

    # ------------------------------------------------------------------------------ WAL

    def _wal_phase(self, stream: SyncStream, from_version: int) -> None:
        prev_epoch, history = self.src.history_upto(from_version - 1)
        stream.send(P.WalBegin(from_version, prev_epoch, history))
        self.stats.first_version = from_version
        tail = _WalTail(self, stream, from_version)
        tail.run()
        stream.send(P.WalEnd(tail.sent_version))
        self.stats.last_version = tail.sent_version


class _WalTail:
    """Sends WAL records from_version.. : sealed files with sendfile, the last file tailed."""

    def __init__(self, sender: Sender, stream: SyncStream, from_version: int) -> None:
        self.s = sender
        self.stream = stream
        self.wal_dir = sender.src.wal_dir
        self.max_record = sender.src.max_record_bytes
        self.sent_version = from_version - 1  # records up to here are with the receiver or skipped
        self.target: int | None = None  # after the switch: stream up to here, then WAL_END
        self.waiting_since: float | None = None

    # -- helpers -------------------------------------------------------------------------------

    def _list(self) -> list[_wal.WalFile]:
        try:
            return _wal.list_wal_files(self.wal_dir)
        except _wal.WalError as exc:
            raise RestoreError(f"cannot list the WAL: {exc}") from None

    def _gap(self, first: int) -> RestoreError:
        return RestoreError(f"gap: the WAL now starts at v{first} but the receiver needs"
                            f" v{self.sent_version + 1} (recycled after a flush); restarting")

    def _maybe_switch(self, at_end: bool) -> None:
        """SYNC_CACHE: once the stream is near the log end, live forwards start (seed: 在确认
        已经尽可能读完LastWal的数据后, 会将对方同步状态设置为SYNC_CACHE)."""
        if self.target is not None:
            return
        if not at_end and self.s.src.last_version() - self.sent_version > self.s.opt.switch_lag_versions:
            return
        self.target = self.s.src.switch_to_live()
        self.s.stats.switched_at = self.target
        log.info("%s: WAL stream at v%d, live forwards start after v%d (sync cache)", self.s.name,
                 self.sent_version, self.target)

    def _send_records(self, data: bytes | memoryview, scan) -> None:
        """Send the whole records of `scan` (over `data`) that the receiver lacks."""
        versions = scan.versions
        n = scan.count
        if not n:
            return
        lo = 0
        first = int(versions[0])
        if first > self.sent_version + 1:
            raise self._gap(first)
        if first <= self.sent_version:
            lo = min(self.sent_version - first + 1, n)
        hi = n
        if self.target is not None and int(versions[-1]) > self.target:
            hi = max(lo, self.target - first + 1)
        if hi <= lo:
            return
        start = int(scan.offsets[lo])
        end = int(scan.offsets[hi - 1]) + HEADER + int(scan.lengths[hi - 1])
        self.stream.send(P.WalData(end - start))
        self.stream.send_bytes(data[start:end])
        self.sent_version = first + hi - 1
        self.s.stats.wal_records_sent += hi - lo
        self.s.stats.wal_bytes_sent += end - start

    def _done(self) -> bool:
        return self.target is not None and self.sent_version >= self.target

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        s = self.s
        s.watcher.add_dir(self.wal_dir)
        index = None  # the WAL file index being read
        while not self._done():
            s._check_alive()
            files = self._list()
            if not files:
                s.stats.note("no WAL file")
                self._idle(at_end=True)
                continue
            if index is None or index < files[0].index:
                if index is not None:
                    raise self._gap(files[0].first_version or 0)
                index = files[0].index
            pos = next((k for k, f in enumerate(files) if f.index == index), None)
            if pos is None:  # our file vanished and nothing newer exists: impossible for a WAL
                raise RestoreError(f"WAL file {index} vanished during the restore")
            wf = files[pos]
            if pos < len(files) - 1:
                self._send_sealed(wf)
                index += 1
                continue
            if self._tail(wf):  # the file was closed and a newer one appeared
                s.stats.note("last WAL closed and replaced")
                index += 1

    def _idle(self, at_end: bool) -> None:
        """Nothing new to read now."""
        self._maybe_switch(at_end)
        if self._done():
            return
        if self.target is not None and self.sent_version < self.target:
            # Records the master has appended but that are not readable yet (queued for the
            # WAL thread, or written in pieces): wait, but not forever.
            now = time.monotonic()
            self.waiting_since = self.waiting_since or now
            if now - self.waiting_since > self.s.opt.wal_wait_s:
                raise RestoreError(f"v{self.sent_version + 1}..v{self.target} did not appear in the WAL"
                                   f" within {self.s.opt.wal_wait_s:g} s")
            self.s.stats.note("records not yet readable")
        self.s.watcher.wait(0.2 if self.target is None else 0.05)

    def _send_sealed(self, wf: _wal.WalFile) -> None:
        """A WAL file that will not change any more: sent whole (from the index entry at or
        before the first version needed) with sendfile, or scanned when it has no index."""
        idx = _wal._read_index(self.wal_dir, wf)
        if idx is None or not idx[1]:
            self._scan_file(wf, sealed=True)
            return
        first, count, sample = idx
        last = first + count - 1
        if last <= self.sent_version:
            return
        if first > self.sent_version + 1:
            raise self._gap(first)
        if self.target is not None and first > self.target:
            return
        offset = 0
        if self.sent_version + 1 > first:
            k = min((self.sent_version + 1 - first) // _wal.INDEX_STRIDE_RECORDS, len(sample) - 1)
            offset = int(sample[k])
        if self.target is not None and last > self.target:
            self._scan_file(wf, sealed=True)  # only part of it is wanted: read it
            return
        try:
            fd = _wal.open_regular(wf.path)  # never a FIFO put there since it was listed
        except FileNotFoundError:
            raise self._gap(last + 1) from None
        try:
            size = os.fstat(fd).st_size
            self.stream.send(P.WalData(size - offset))
            self.stream.sendfile(fd, offset, size - offset)
        finally:
            os.close(fd)
        skipped = self.sent_version + 1 - first if self.sent_version >= first else 0
        self.s.stats.wal_records_sent += count - skipped
        self.s.stats.wal_bytes_sent += size - offset
        self.s.stats.wal_files_sent += 1
        self.sent_version = last
        self._maybe_switch(at_end=False)

    def _scan_file(self, wf: _wal.WalFile, sealed: bool) -> None:
        try:
            fh = open(_wal.open_regular(wf.path), "rb")
        except FileNotFoundError:
            raise self._gap(self.sent_version + 1) from None
        with fh:
            carry = b""
            while not self._done():
                chunk = fh.read(READ_CHUNK_BYTES)
                if not chunk:
                    break
                data = carry + chunk if carry else chunk
                scan = _rec.scan(data, max_payload_len=self.max_record, contiguous=True)
                self._send_records(data, scan)
                if not scan.ok and scan.status != _rec.STATUS_INCOMPLETE:
                    raise RestoreError(f"{wf.path}: {scan.reason} at offset {fh.tell() - len(data) + scan.end}")
                carry = data[scan.end:]
            if carry and sealed and not self._done():
                raise RestoreError(f"{wf.path}: sealed WAL file ends in a partial record")

    def _tail(self, wf: _wal.WalFile) -> bool:
        """Read the last WAL record by record while it may grow (the seed's LastWal cases).
        True when it was closed and a newer file exists (read to its end first)."""
        s = self.s
        try:
            fh = open(_wal.open_regular(wf.path), "rb")
        except FileNotFoundError:
            return False  # truncated away or renamed: list again
        with fh:
            pos, carry = 0, b""
            while not self._done():
                s._check_alive()
                chunk = fh.read(READ_CHUNK_BYTES)
                if chunk:
                    self.waiting_since = None
                    if pos or carry:
                        s.stats.note("last WAL growing")
                    data = carry + chunk if carry else chunk
                    scan = _rec.scan(data, max_payload_len=self.max_record, contiguous=True)
                    if not scan.ok and scan.status not in (_rec.STATUS_INCOMPLETE, _rec.STATUS_ZERO):
                        raise RestoreError(f"{wf.path}: {scan.reason} at offset {pos + scan.end}")
                    self._send_records(data, scan)
                    pos += scan.end
                    carry = data[scan.end:]
                    if scan.status == _rec.STATUS_ZERO:
                        # Zeros where the next record goes: space the writer has not filled
                        # yet. Read that spot again once something happens.
                        carry = b""
                        fh.seek(pos)
                        self._idle(at_end=True)
                        continue
                    if len(chunk) == READ_CHUNK_BYTES:
                        continue  # more is probably there already
                    if not self._done():
                        self._maybe_switch(at_end=False)
                    continue
                # End of what is readable now.
                if carry:
                    s.stats.note("partial record at the end")
                elif pos == 0:
                    s.stats.note("last WAL open but empty")
                files = self._list()
                if files and files[-1].index > wf.index:
                    # Closed and replaced: whatever it holds is written; read it to the end.
                    rest = fh.read()
                    if rest:
                        fh.seek(fh.tell() - len(rest))
                        continue
                    if carry:
                        raise RestoreError(f"{wf.path}: closed WAL file ends in a partial record")
                    return True
                self._idle(at_end=True)
        return False


HEADER = _rec.HEADER_SIZE_BYTES
