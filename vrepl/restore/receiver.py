"""The side of a restore that is behind (a replica, or the `vrepl restore` tool).

Owns: `Receiver.session(io)`, the seed's restore flow over one sync connection
(docs/restore.md §Protocol), step by step over a `SessionIO` (vrepl/restore/session_io.py;
`Receiver.run(stream)` runs it on the calling thread over a blocking SyncStream): compare each announced file with its own (name, size, magic),
answer FILE_ACK, stage what it is sent (temporary name, size and magic verified, fsync,
rename into the staging directory), then swap the staged files into the data path in index
order (the last index — the vnode's manifest — last: the commit point), remove the files the
sender no longer has, tell the app; then ask for the WAL from its own version on and hand
whole records to its `Sink` (a live replica, or a WAL directory); `Staging`, the staging
directory `<data>/.vrepl-restore/` with its swap journal, and `recover_interrupted_swap()`,
which finishes or abandons a swap a crash interrupted. Its ports: the `Sink` and the
`StagingStore` (`Staging` on disk; the simulator's in memory, vrepl/testing/sim/).
The previous data stays intact until the swap: a full disk, a refused name, a bad file or a
lost connection before it leave the data path as it was (staged files are kept, so the next
session skips them: a crashed restore resumes).
Must not: write outside the data path, follow a symlink, or trust a size or a name it has
not checked.
"""
from __future__ import annotations

import errno
import json
import logging
import mmap
import os
import queue
import shutil
import threading
from dataclasses import dataclass
from typing import Callable, Protocol

from vrepl._core import crc32c as _crc
from vrepl._core import record as _rec
from vrepl.directio import SequentialWriter
from vrepl.durable import fsync_dir as _fsync_dir
from vrepl.restore import protocol as P
from vrepl.restore.errors import BadData, DiskFull, PeerError, RestoreError
from vrepl.restore.paths import STAGING_DIR, confined, make_parents
from vrepl.restore.session_io import BlockingIO, Session, SessionIO, run_blocking
from vrepl.restore.stream import SyncStream

log = logging.getLogger("vrepl.restore")

JOURNAL = "swap.json"
DEFAULT_MAX_FILE_BYTES = 1 << 40  # restore_max_file_bytes: a larger announced file is refused


def crc_magic(crc: int) -> int:
    """The default magic rule (the reference vnode's): CRC-32C of the bytes, 1 if that is 0."""
    return crc or 1


def file_crc_magic(path: str) -> int:
    """The default magic of a file on disk (mapped, not copied, when it is not empty)."""
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        if not size:
            return crc_magic(0)
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            crc = 0
            step = 64 * 1024 * 1024
            for off in range(0, size, step):
                crc = _crc.crc32c(view[off:off + step], crc)
            view.release()
    return crc_magic(crc)


class Sink(Protocol):
    """What the receiver hands its results to (a live replica, or a directory)."""

    data_path: str

    def on_begin(self, begin: P.SyncBegin) -> Session | None:
        """Begin; a sink that must wait for its replica (the simulator's) returns a session
        generator to run first, one that blocks (production's threads) returns None."""
    def own_file(self, index: int, name: str) -> tuple[int, int] | None: ...
    def own_files(self) -> list[str]: ...
    def files_synced(self) -> None: ...
    def wal_from_version(self) -> int: ...
    def on_wal_begin(self, msg: P.WalBegin) -> None: ...
    def feed(self, block: bytes, scan) -> None: ...
    def on_wal_end(self, last_version: int) -> int: ...


class StagingStore(Protocol):
    """Where received files wait for the swap (`Staging` on disk; the simulator's in memory)."""

    def staged_matches(self, name: str, size: int, magic: int) -> bool: ...

    def receive(self, io: SessionIO, name: str, size: int, magic: int,
                progress: Callable[[int], None] | None = None) -> Session:
        """Take `size` raw bytes from `io`, verify size and magic, keep them staged."""

    def commit(self, names: list[str], staged: set[str], remove: list[str]) -> None: ...


# ---------------------------------------------------------------------------------------------
# Staging


class _ChunkWriter:
    """Checksums and writes received pieces on its own thread, at most two pieces behind."""

    def __init__(self, fd: int, name: str, size: int, data_path: str, tmp: str,
                 progress: Callable[[int], None] | None) -> None:
        self.fd, self.name, self.size, self.data_path, self.tmp = fd, name, size, data_path, tmp
        self.progress = progress
        self.crc = 0
        self.written = 0
        self.error: BaseException | None = None
        # Around the page cache: a restored file is read back once, for its magic, if at all
        # (vrepl/directio.py says why).
        self._out = SequentialWriter(fd)
        self._q: queue.Queue = queue.Queue(maxsize=1)
        self._t = threading.Thread(target=self._run, name="vrepl-restore-write", daemon=True)
        self._t.start()

    def put(self, view: memoryview) -> None:
        if self.error is not None:
            raise self.error
        self._q.put(view)

    def _run(self) -> None:
        while True:
            view = self._q.get()
            if view is None:
                try:
                    self._out.finish()
                except OSError as exc:
                    self._failed(exc)
                return
            if self.error is not None:
                continue
            try:
                self.crc = _crc.crc32c(view, self.crc)
                self._out.write(view)
                self.written += len(view)
                if self.progress is not None:
                    self.progress(len(view))
            except OSError as exc:
                self._failed(exc)
            except BaseException as exc:  # handed to the receiving thread
                self.error = exc

    def _failed(self, exc: OSError) -> None:
        if self.error is not None:
            return
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self.error = DiskFull(f"no space left on device while staging {self.name} ({self.written} of"
                                  f" {self.size} bytes) under {self.data_path}: the previous data is intact")
        else:
            self.error = RestoreError(f"cannot write {self.tmp}: {exc.strerror}", restart=False)

    def finish(self) -> None:
        self._q.put(None)
        self._t.join()

    def check(self) -> None:
        if self.error is not None:
            raise self.error


class Staging:
    """`<data>/.vrepl-restore/files/<name>`: verified files waiting for the swap."""

    def __init__(self, data_path: str, *, magic_of: Callable[[str], int] | None = None, fsync: bool = True,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        self.data_path = os.path.abspath(data_path)
        self.root = os.path.join(self.data_path, STAGING_DIR)
        self.files_root = os.path.join(self.root, "files")
        self.magic_of = magic_of
        self.fsync = fsync
        self.max_file_bytes = max_file_bytes
        os.makedirs(self.files_root, exist_ok=True)

    def staged_path(self, name: str) -> str:
        return confined(self.files_root, name)

    def staged_matches(self, name: str, size: int, magic: int) -> bool:
        """A file of this name, size and magic was staged by an earlier (interrupted) session."""
        path = self.staged_path(name)
        try:
            if os.lstat(path).st_size != size:
                return False
        except FileNotFoundError:
            return False
        magic_of = self.magic_of or file_crc_magic
        return magic_of(path) == magic

    def receive(self, io: SessionIO, name: str, size: int, magic: int,
                progress: Callable[[int], None] | None = None) -> Session:
        """Take `size` raw bytes from the session into a temporary file, verify size and
        magic, fsync, rename into the staging tree. DiskFull / RestoreError on failure (the
        temporary file is removed)."""
        if size > self.max_file_bytes:
            # docs/restore.md §6 Sizes: bad data from the sender (exit 1), not a full disk.
            raise BadData(f"refused {name}: the sender announces {size} bytes, above max_file_bytes"
                          f" {self.max_file_bytes}", restart=False)
        final = make_parents(self.files_root, name)
        tmp = final + ".part"
        st = os.statvfs(self.files_root)
        free = st.f_bavail * st.f_frsize
        if free < size:
            raise DiskFull(f"not enough disk space for {name}: it needs {size} bytes, {free} are free under"
                           f" {self.data_path}: the previous data is intact")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        # Receiving and writing overlap: this thread receives into one buffer while a writer
        # thread checksums and writes the previous one (both release the GIL).
        writer = _ChunkWriter(fd, name, size, self.data_path, tmp, progress)
        ok = False
        try:
            try:
                yield from io.recv_raw(size, writer.put, buffers=3)
            finally:
                writer.finish()
            writer.check()
            if writer.written != size:
                raise PeerError(f"{name}: received {writer.written} bytes, announced {size}")
            try:
                if self.fsync:
                    os.fsync(fd)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise DiskFull(f"no space left on device while syncing {name}: the previous data is intact")
                raise
            got = self.magic_of(tmp) if self.magic_of is not None else crc_magic(writer.crc)
            if got != magic:
                raise BadData(f"{name}: received file has magic {got:#010x}, announced {magic:#010x}")
            ok = True
        finally:
            os.close(fd)
            if not ok:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        os.replace(tmp, final)

    # -- the swap --------------------------------------------------------------------------------

    def commit(self, names: list[str], staged: set[str], remove: list[str]) -> None:
        """Move the staged files into the data path in the order given (the highest index,
        the vnode's manifest, last), then remove `remove`. A journal makes a crash in the
        middle finish (or be abandoned) on the next start: recover_interrupted_swap()."""
        journal = {"move": [n for n in names if n in staged], "remove": remove}
        path = os.path.join(self.root, JOURNAL)
        with open(path + ".tmp", "w") as fh:
            json.dump(journal, fh)
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        os.replace(path + ".tmp", path)
        if self.fsync:
            _fsync_dir(self.root)
        _roll_forward(self.data_path, journal, self.fsync)
        self.clear()

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _roll_forward(data_path: str, journal: dict, fsync: bool) -> None:
    root = os.path.join(data_path, STAGING_DIR, "files")
    dirs: set[str] = set()
    for name in journal["move"]:
        src = confined(root, name)
        dst = make_parents(data_path, name)
        if os.path.lexists(src):
            os.replace(src, dst)
            dirs.add(os.path.dirname(dst))
            if fsync:
                _fsync_dir(os.path.dirname(dst))  # each file in place before the next (the last commits)
    for name in journal["remove"]:
        try:
            os.unlink(confined(data_path, name))
        except FileNotFoundError:
            pass
    if fsync:
        for d in dirs:
            _fsync_dir(d)


def recover_interrupted_swap(data_path: str, *, fsync: bool = True) -> str | None:
    """Finish a swap a crash interrupted, or abandon it when a moved file is gone (the app
    removed it as an orphan: then the last file, the commit point, was not moved and the old
    data is whole). Returns what was done, or None. Call before the app opens its data."""
    path = os.path.join(data_path, STAGING_DIR, JOURNAL)
    try:
        with open(path) as fh:
            journal = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        os.unlink(path)
        return "discarded an unreadable restore journal"
    root = os.path.join(data_path, STAGING_DIR, "files")
    missing = [n for n in journal.get("move", [])
               if not os.path.lexists(confined(root, n)) and not os.path.lexists(confined(data_path, n))]
    if missing:
        os.unlink(path)
        return f"abandoned an interrupted restore swap ({len(missing)} files gone); the previous data is in use"
    _roll_forward(data_path, journal, fsync)
    shutil.rmtree(os.path.join(data_path, STAGING_DIR), ignore_errors=True)
    return f"finished an interrupted restore swap ({len(journal.get('move', []))} files)"


# ---------------------------------------------------------------------------------------------
# The session


@dataclass
class ReceiverStats:
    files_checked: int = 0
    files_same: int = 0
    files_resumed: int = 0  # staged by an earlier interrupted session
    files_received: int = 0
    file_bytes_received: int = 0
    files_removed: int = 0
    wal_bytes_received: int = 0
    wal_records_received: int = 0
    from_version: int = 0
    last_version: int = 0


class Receiver:
    """One restore session on the receiving side (see the module doc)."""

    def __init__(self, sink: Sink, *, magic_of: Callable[[str], int] | None = None, fsync: bool = True,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, max_record_bytes: int = _rec.DEFAULT_MAX_PAYLOAD_BYTES,
                 progress: Callable[[str, int], None] | None = None, name: str = "restore",
                 staging: Callable[[], StagingStore] | None = None) -> None:
        self.sink = sink
        self.staging = staging  # None: the staging directory under the sink's data path
        self.magic_of = magic_of
        self.fsync = fsync
        self.max_file_bytes = max_file_bytes
        self.max_record_bytes = max_record_bytes
        self.progress = progress or (lambda kind, n: None)
        self.name = name
        self.stats = ReceiverStats()
        self.begin: P.SyncBegin | None = None

    def run(self, stream: SyncStream) -> int:
        """The whole session on this thread; returns the last version applied."""
        return run_blocking(self.session(BlockingIO(stream)))

    def session(self, io: SessionIO) -> Session:
        """The session step by step; returns the last version applied."""
        begin = yield from io.recv()
        if type(begin) is not P.SyncBegin:
            raise PeerError(f"expected sync_begin, got {begin.describe()}")
        self.begin = begin
        self.progress("total_files", begin.files)
        self.progress("total_bytes", begin.file_bytes)
        wait = self.sink.on_begin(begin)
        if wait is not None:
            yield from wait
        if begin.flags & P.FLAG_FILES:
            yield from self._files_phase(io)
        from_version = self.sink.wal_from_version()
        self.stats.from_version = from_version
        io.send(P.WalRequest(from_version))
        msg = yield from io.recv()
        if type(msg) is not P.WalBegin:
            raise PeerError(f"expected wal_begin, got {msg.describe()}")
        if msg.first_version != from_version:
            raise PeerError(f"asked for the WAL from v{from_version}, the sender starts at v{msg.first_version}")
        self.sink.on_wal_begin(msg)
        yield from self._wal_phase(io)
        return self.stats.last_version

    def _staging(self) -> StagingStore:
        """The staging directory on disk, after finishing or abandoning an interrupted swap."""
        data_path = self.sink.data_path
        recovered = recover_interrupted_swap(data_path, fsync=self.fsync)
        if recovered:
            log.warning("%s: %s", self.name, recovered)
        return Staging(data_path, magic_of=self.magic_of, fsync=self.fsync, max_file_bytes=self.max_file_bytes)

    # -- files -----------------------------------------------------------------------------------

    def _files_phase(self, io: SessionIO) -> Session:
        data_path = self.sink.data_path
        staging = self.staging() if self.staging is not None else self._staging()
        own_before = self.sink.own_files()
        names: list[str] = []
        staged: set[str] = set()
        expect = 0
        while True:
            msg = yield from io.recv()
            if type(msg) is P.FilesEnd:
                if msg.count != expect:
                    raise PeerError(f"files_end says {msg.count} files, {expect} were announced")
                break
            if type(msg) is not P.FileInfo or msg.index != expect:
                raise PeerError(f"expected file_info #{expect}, got {msg.describe()}")
            confined(data_path, msg.name)  # refuse a hostile name before anything else
            if msg.magic == 0:
                raise PeerError(f"file_info #{msg.index} {msg.name} with magic 0")
            self.stats.files_checked += 1
            mine = self.sink.own_file(msg.index, msg.name)
            if mine == (msg.size, msg.magic):
                need = 0
                self.stats.files_same += 1
                self.progress("file_bytes", msg.size)
            elif staging.staged_matches(msg.name, msg.size, msg.magic):
                need = 0
                staged.add(msg.name)
                self.stats.files_resumed += 1
                self.progress("file_bytes", msg.size)
            else:
                need = 1
            io.send(P.FileAck(msg.index, need))
            if need:
                data = yield from io.recv()
                if type(data) is not P.FileData or data.index != msg.index:
                    raise PeerError(f"expected file_data #{msg.index}, got {data.describe()}")
                if data.size != msg.size:
                    raise PeerError(f"{msg.name}: file_data announces {data.size} bytes, file_info said {msg.size}")
                yield from staging.receive(io, msg.name, msg.size, msg.magic, lambda n: self.progress("file_bytes", n))
                staged.add(msg.name)
                self.stats.files_received += 1
                self.stats.file_bytes_received += msg.size
            names.append(msg.name)
            self.progress("files", 1)
            expect += 1
        keep = set(names)
        remove = [n for n in own_before if n not in keep]
        staging.commit(names, staged, remove)
        self.stats.files_removed = len(remove)
        if staged or remove:
            self.sink.files_synced()
        log.info("%s: files phase done: %d files, %d same, %d resumed, %d received (%d bytes), %d removed",
                 self.name, len(names), self.stats.files_same, self.stats.files_resumed, self.stats.files_received,
                 self.stats.file_bytes_received, len(remove))

    # -- WAL -------------------------------------------------------------------------------------

    def _wal_phase(self, io: SessionIO) -> Session:
        max_record = self.max_record_bytes
        sink = self.sink
        while True:
            msg = yield from io.recv()
            t = type(msg)
            if t is P.WalEnd:
                last = sink.on_wal_end(msg.last_version)
                self.stats.last_version = last
                io.send(P.Done(last))
                return
            if t is not P.WalData:
                raise PeerError(f"expected wal_data or wal_end, got {msg.describe()}")
            carry = bytearray()

            def take(view: memoryview) -> None:
                nonlocal carry
                if carry:
                    carry += view
                    data = bytes(carry)
                else:
                    data = bytes(view)
                scan = _rec.scan(data, max_payload_len=max_record, contiguous=True)
                if not scan.ok and scan.status != _rec.STATUS_INCOMPLETE:
                    raise BadData(f"bad WAL data from the sender: {scan.reason}")
                if scan.count:
                    block = data if scan.end == len(data) else data[:scan.end]
                    sink.feed(block, scan)
                    self.stats.wal_records_received += scan.count
                    self.progress("wal_records", scan.count)
                carry = bytearray(data[scan.end:])

            yield from io.recv_raw(msg.size, take)
            if carry:
                raise BadData(f"WAL data from the sender ended inside a record ({len(carry)} bytes left)")
            self.stats.wal_bytes_received += msg.size
            self.progress("wal_bytes", msg.size)
