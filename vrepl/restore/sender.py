"""The side of a restore that has the data (the master, or any replica a tool pulls from).

Owns: `Sender.session(io)`, the seed's retrieve flow over one sync connection, step by step
(docs/restore.md §Protocol): the files phase (walk the archived files with getFileInfo, send
each one the receiver lacks, watch every processed file and restart if one changes, re-walk
before FILES_END so the receiver never commits a file set that was never whole), then the
WAL phase (every record from the receiver's version on: sealed WAL files whole, the last
one tailed record by record while it grows, every last-WAL case of the seed), then the
switch to live forwarding (SYNC_CACHE) and WAL_END. `Sender.run(stream)` runs it on the
calling thread over a blocking SyncStream.
Its ports: `Source` (what the node answers: getFileInfo, its log end and epoch history,
the switch, whether to stop), `SessionIO` (vrepl/restore/session_io.py) and `SourceStore`,
the files and WAL as the sender reads them: `DiskSource` here (the data path and WAL
directory on disk, os.sendfile, inotify), the simulator's in memory
(vrepl/testing/sim/restore.py).
Must not: touch the replica directly (the Source does), or send a file name it has not
confined to the data path.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Generator, Protocol

from vrepl import wal as _wal
from vrepl._core import record as _rec
from vrepl.restore import protocol as P
from vrepl.restore.errors import FilesChanged, PeerError, RestoreError
from vrepl.restore.paths import confined
from vrepl.restore.session_io import BlockingIO, Session, SessionIO, run_blocking
from vrepl.restore.stream import SyncStream
from vrepl.restore.watch import Watcher

log = logging.getLogger("vrepl.restore")

READ_CHUNK_BYTES = 4 * 1024 * 1024
HEADER = _rec.HEADER_SIZE_BYTES


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


class SourceStore(Protocol):
    """The files and the WAL of the source, as the sender reads them."""

    def watch_file(self, name: str, size: int) -> None:
        """Watch a processed file, then check it is still `size` bytes (FilesChanged if not):
        a change after this is seen by the watch, one before it by the size check."""

    def changed(self) -> str | None:
        """Why a watched file is stale, or None."""

    def forget_files(self) -> None: ...

    def send_file(self, io: SessionIO, index: int, name: str, size: int) -> None:
        """FILE_DATA then the file's `size` bytes (FilesChanged when it cannot be sent as is)."""

    def pump_wal(self, tail: "WalTail") -> bool:
        """Send what the WAL holds now after `tail.sent_version` (through `tail.send_records`,
        or `tail.sent_whole` for bytes sent as they are); False when nothing more is
        readable now. Raises `tail.gap()` when the WAL no longer holds what is needed."""

    def wait_wal(self, timeout_s: float) -> Generator[Any, None, None]:
        """Until the WAL changes (or the timeout passes)."""

    def close(self) -> None: ...


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

    def __init__(self, source: Source, options: SenderOptions | None = None, *, name: str = "restore",
                 store: SourceStore | None = None) -> None:
        self.src = source
        self.opt = options or SenderOptions()
        self.name = name
        self.stats = SenderStats()
        self.store = store or DiskSource(source.data_path, source.wal_dir, source.max_record_bytes,
                                         poll=self.opt.poll, poll_interval_s=self.opt.poll_interval_s)

    def close(self) -> None:
        self.store.close()

    def _check_alive(self) -> None:
        why = self.src.stop_reason()
        if why:
            raise RestoreError(f"stopped: {why}")

    # ------------------------------------------------------------------------------ session

    def run(self, stream: SyncStream) -> int:
        """The whole session on this thread; returns the last version the receiver applied."""
        return run_blocking(self.session(BlockingIO(stream)))

    def session(self, io: SessionIO) -> Session:
        """The session step by step; returns the last version the receiver applied."""
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
        io.send(P.SyncBegin(epoch, last, flags, files, file_bytes, 0))
        if self.opt.files:
            yield from self._files_phase(io)
        req = yield from io.recv()
        if type(req) is not P.WalRequest:
            raise PeerError(f"expected wal_request, got {req.describe()}")
        yield from self._wal_phase(io, req.from_version)
        done = yield from io.recv()
        if type(done) is not P.Done:
            raise PeerError(f"expected done, got {done.describe()}")
        return done.last_version

    # ------------------------------------------------------------------------------ files

    def _files_phase(self, io: SessionIO) -> Session:
        store = self.store
        processed: list[tuple[str, int, int]] = []
        index = 0
        while True:
            self._check_alive()
            info = self.src.file_info(index)
            if info is None:
                break
            name, size, magic = info
            store.watch_file(name, size)
            io.send(P.FileInfo(index, size, magic, name))
            ack = yield from io.recv()
            if type(ack) is not P.FileAck or ack.index != index:
                raise PeerError(f"expected file_ack #{index}, got {ack.describe()}")
            self.stats.files_checked += 1
            if ack.need:
                store.send_file(io, index, name, size)
                self.stats.files_sent += 1
                self.stats.file_bytes_sent += size
            why = store.changed()
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
        why = store.changed()
        if why:
            raise FilesChanged(why)
        io.send(P.FilesEnd(len(processed)))
        # The receiver now holds one consistent file set; later flushes on this side are
        # covered by the WAL phase, so the processed files need no more watching.
        store.forget_files()

    # ------------------------------------------------------------------------------ WAL

    def _wal_phase(self, io: SessionIO, from_version: int) -> Session:
        prev_epoch, history = self.src.history_upto(from_version - 1)
        io.send(P.WalBegin(from_version, prev_epoch, history))
        self.stats.first_version = from_version
        tail = WalTail(self, io, from_version)
        yield from tail.run()
        io.send(P.WalEnd(tail.sent_version))
        self.stats.last_version = tail.sent_version


class WalTail:
    """Sends WAL records from_version.. until the switch target (the seed's WAL steps 1-5):
    what to send and when to stop is here; reading the WAL is the store's (`pump_wal`)."""

    def __init__(self, sender: Sender, io: SessionIO, from_version: int) -> None:
        self.s = sender
        self.io = io
        self.stats = sender.stats
        self.max_record = sender.src.max_record_bytes
        self.sent_version = from_version - 1  # records up to here are with the receiver or skipped
        self.target: int | None = None  # after the switch: stream up to here, then WAL_END
        self.waiting_since: float | None = None

    def gap(self, first: int) -> RestoreError:
        return RestoreError(f"gap: the WAL now starts at v{first} but the receiver needs"
                            f" v{self.sent_version + 1} (recycled after a flush); restarting")

    def done(self) -> bool:
        return self.target is not None and self.sent_version >= self.target

    def maybe_switch(self, at_end: bool) -> None:
        """SYNC_CACHE: once the stream is near the log end, live forwards start (seed: 在确认
        已经尽可能读完LastWal的数据后, 会将对方同步状态设置为SYNC_CACHE)."""
        if self.target is not None:
            return
        if not at_end and self.s.src.last_version() - self.sent_version > self.s.opt.switch_lag_versions:
            return
        self.target = self.s.src.switch_to_live()
        self.stats.switched_at = self.target
        log.info("%s: WAL stream at v%d, live forwards start after v%d (sync cache)", self.s.name,
                 self.sent_version, self.target)

    def send_records(self, data: bytes | memoryview, scan: Any) -> None:
        """Send the whole records of `scan` (over `data`) that the receiver lacks, up to the
        target."""
        versions = scan.versions
        n = scan.count
        if not n:
            return
        lo = 0
        first = int(versions[0])
        if first > self.sent_version + 1:
            raise self.gap(first)
        if first <= self.sent_version:
            lo = min(self.sent_version - first + 1, n)
        hi = n
        if self.target is not None and int(versions[-1]) > self.target:
            hi = max(lo, self.target - first + 1)
        if hi <= lo:
            return
        self.waiting_since = None
        start = int(scan.offsets[lo])
        end = int(scan.offsets[hi - 1]) + HEADER + int(scan.lengths[hi - 1])
        self.io.send(P.WalData(end - start))
        self.io.send_bytes(data[start:end])
        self.sent_version = first + hi - 1
        self.stats.wal_records_sent += hi - lo
        self.stats.wal_bytes_sent += end - start

    def sent_whole(self, last: int, records: int, nbytes: int) -> None:
        """The store sent a whole sealed file's records up to `last` as they are."""
        self.waiting_since = None
        self.stats.wal_records_sent += records
        self.stats.wal_bytes_sent += nbytes
        self.stats.wal_files_sent += 1
        self.sent_version = last

    def run(self) -> Session:
        store = self.s.store
        while not self.done():
            self.s._check_alive()
            if store.pump_wal(self):
                self.maybe_switch(at_end=False)
                yield from self.io.pace()
                continue
            yield from self._idle()

    def _idle(self) -> Session:
        """Nothing new to read now."""
        self.maybe_switch(at_end=True)
        if self.done():
            return
        if self.target is not None and self.sent_version < self.target:
            # Records the master has appended but that are not readable yet (queued for the
            # WAL thread, or written in pieces): wait, but not forever.
            now = self.io.now()
            self.waiting_since = self.waiting_since or now
            if now - self.waiting_since > self.s.opt.wal_wait_s:
                raise RestoreError(f"v{self.sent_version + 1}..v{self.target} did not appear in the WAL"
                                   f" within {self.s.opt.wal_wait_s:g} s")
            self.stats.note("records not yet readable")
        yield from self.s.store.wait_wal(0.2 if self.target is None else 0.05)


# =============================================================================================
# The store on disk (production)


class DiskSource:
    """The source's data path and WAL directory on disk: files sent with os.sendfile, the last
    WAL tailed (every LastWal case of the seed), changes seen with inotify (or polling)."""

    def __init__(self, data_path: str, wal_dir: str, max_record_bytes: int, *, poll: bool = False,
                 poll_interval_s: float = 0.05) -> None:
        self.data_path = data_path
        self.wal_dir = wal_dir
        self.max_record = max_record_bytes
        self.watcher = Watcher(poll=poll, poll_interval_s=poll_interval_s)
        self._wal_watched = False
        self.index: int | None = None  # the WAL file index being read
        self._fh: Any = None  # the last WAL file, open while it is tailed
        self._pos = 0
        self._carry = b""

    def close(self) -> None:
        self._close_tail()
        self.watcher.close()

    # -- files ------------------------------------------------------------------------------------

    def watch_file(self, name: str, size: int) -> None:
        path = confined(self.data_path, name)
        self.watcher.add_file(path)
        try:
            st = os.stat(path)
        except OSError as exc:
            raise FilesChanged(f"{name} is gone on the source ({exc.strerror})") from None
        if st.st_size != size:
            raise FilesChanged(f"{name} is {st.st_size} bytes on the source, getFileInfo said {size}")

    def changed(self) -> str | None:
        return self.watcher.changed()

    def forget_files(self) -> None:
        self.watcher.forget_files()

    def send_file(self, io: SessionIO, index: int, name: str, size: int) -> None:
        path = confined(self.data_path, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise FilesChanged(f"{name} cannot be opened on the source ({exc.strerror})") from None
        try:
            if os.fstat(fd).st_size != size:
                raise FilesChanged(f"{name} changed size on the source")
            io.send(P.FileData(index, size))
            _stream_of(io).sendfile(fd, 0, size)
        finally:
            os.close(fd)

    # -- the WAL ----------------------------------------------------------------------------------

    def wait_wal(self, timeout_s: float) -> Generator[Any, None, None]:
        self.watcher.wait(timeout_s)
        return
        yield

    def _list(self) -> list[_wal.WalFile]:
        try:
            return _wal.list_wal_files(self.wal_dir)
        except _wal.WalError as exc:
            raise RestoreError(f"cannot list the WAL: {exc}") from None

    def _close_tail(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self._pos, self._carry = 0, b""

    def pump_wal(self, tail: WalTail) -> bool:
        if not self._wal_watched:
            self.watcher.add_dir(self.wal_dir)
            self._wal_watched = True
        files = self._list()
        if not files:
            tail.stats.note("no WAL file")
            return False
        if self.index is None or self.index < files[0].index:
            if self.index is not None:
                raise tail.gap(files[0].first_version or 0)
            self.index = files[0].index
        pos = next((k for k, f in enumerate(files) if f.index == self.index), None)
        if pos is None:  # our file vanished and nothing newer exists: impossible for a WAL
            raise RestoreError(f"WAL file {self.index} vanished during the restore")
        wf = files[pos]
        if pos < len(files) - 1 and self._fh is None:
            self._send_sealed(tail, wf)
            self.index += 1
            return True
        return self._tail(tail, wf, newer=pos < len(files) - 1)

    def _send_sealed(self, tail: WalTail, wf: _wal.WalFile) -> None:
        """A WAL file that will not change any more: sent whole (from the index entry at or
        before the first version needed) with sendfile, or scanned when it has no index."""
        idx = _wal._read_index(self.wal_dir, wf)
        if idx is None or not idx[1]:
            self._scan_file(tail, wf)
            return
        first, count, sample = idx
        last = first + count - 1
        if last <= tail.sent_version:
            return
        if first > tail.sent_version + 1:
            raise tail.gap(first)
        if tail.target is not None and first > tail.target:
            return
        offset = 0
        if tail.sent_version + 1 > first:
            k = min((tail.sent_version + 1 - first) // _wal.INDEX_STRIDE_RECORDS, len(sample) - 1)
            offset = int(sample[k])
        if tail.target is not None and last > tail.target:
            self._scan_file(tail, wf)  # only part of it is wanted: read it
            return
        try:
            fd = _wal.open_regular(wf.path)  # never a FIFO put there since it was listed
        except FileNotFoundError:
            raise tail.gap(last + 1) from None
        try:
            size = os.fstat(fd).st_size
            tail.io.send(P.WalData(size - offset))
            _stream_of(tail.io).sendfile(fd, offset, size - offset)
        finally:
            os.close(fd)
        skipped = tail.sent_version + 1 - first if tail.sent_version >= first else 0
        tail.sent_whole(last, count - skipped, size - offset)

    def _scan_file(self, tail: WalTail, wf: _wal.WalFile) -> None:
        try:
            fh = open(_wal.open_regular(wf.path), "rb")
        except FileNotFoundError:
            raise tail.gap(tail.sent_version + 1) from None
        with fh:
            carry = b""
            while not tail.done():
                chunk = fh.read(READ_CHUNK_BYTES)
                if not chunk:
                    break
                data = carry + chunk if carry else chunk
                scan = _rec.scan(data, max_payload_len=self.max_record, contiguous=True)
                tail.send_records(data, scan)
                if not scan.ok and scan.status != _rec.STATUS_INCOMPLETE:
                    raise RestoreError(f"{wf.path}: {scan.reason} at offset {fh.tell() - len(data) + scan.end}")
                carry = data[scan.end:]
            if carry and not tail.done():
                raise RestoreError(f"{wf.path}: sealed WAL file ends in a partial record")

    def _tail(self, tail: WalTail, wf: _wal.WalFile, newer: bool) -> bool:
        """Read the last WAL record by record while it may grow (the seed's LastWal cases):
        True when something was sent or the file was left for a newer one, False when
        nothing more is readable now."""
        if self._fh is None:
            try:
                self._fh = open(_wal.open_regular(wf.path), "rb")
            except FileNotFoundError:
                return False  # truncated away or renamed: list again
            self._pos, self._carry = 0, b""
        fh = self._fh
        progressed = False
        while not tail.done():
            chunk = fh.read(READ_CHUNK_BYTES)
            if chunk:
                if self._pos or self._carry:
                    tail.stats.note("last WAL growing")
                data = self._carry + chunk if self._carry else chunk
                scan = _rec.scan(data, max_payload_len=self.max_record, contiguous=True)
                if not scan.ok and scan.status not in (_rec.STATUS_INCOMPLETE, _rec.STATUS_ZERO):
                    raise RestoreError(f"{wf.path}: {scan.reason} at offset {self._pos + scan.end}")
                before = tail.sent_version
                tail.send_records(data, scan)
                progressed = progressed or tail.sent_version != before
                self._pos += scan.end
                self._carry = data[scan.end:]
                if scan.status == _rec.STATUS_ZERO:
                    # Zeros where the next record goes: space the writer has not filled yet.
                    # Read that spot again once something happens.
                    self._carry = b""
                    fh.seek(self._pos)
                    return progressed
                if len(chunk) == READ_CHUNK_BYTES:
                    continue  # more is probably there already
                return True if progressed else self._at_end(tail, wf)
            return progressed or self._at_end(tail, wf)
        return progressed

    def _at_end(self, tail: WalTail, wf: _wal.WalFile) -> bool:
        """End of what is readable now in the tailed file."""
        if self._carry:
            tail.stats.note("partial record at the end")
        elif self._pos == 0:
            tail.stats.note("last WAL open but empty")
        files = self._list()
        if files and files[-1].index > wf.index:
            # Closed and replaced: whatever it holds is written; read it to the end.
            fh = self._fh
            rest = fh.read()
            if rest:
                fh.seek(fh.tell() - len(rest))
                return True
            if self._carry:
                raise RestoreError(f"{wf.path}: closed WAL file ends in a partial record")
            tail.stats.note("last WAL closed and replaced")
            self._close_tail()
            self.index = wf.index + 1  # type: ignore[operator]
            return True
        return False


def _stream_of(io: SessionIO) -> SyncStream:
    """The socket behind a production session (os.sendfile needs it)."""
    stream = getattr(io, "stream", None)
    if not isinstance(stream, SyncStream):
        raise TypeError("a DiskSource sends files with os.sendfile: it needs a BlockingIO over a SyncStream")
    return stream
