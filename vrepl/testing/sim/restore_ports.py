"""The ports production's restore session code runs over in the simulator (docs/simulation.md
§Restore, docs/restore.md).

Owns: for the master, `SimSource` (the Sender's `Source`: getFileInfo over the app's files,
log end, epoch history, the switch to live forwards and the stop check, through the
driver's `ReplicaRestore`) and `SimSourceStore` (its `SourceStore`: the app's files as
bytes, watched for changes, and the node's simulated WAL read from a version on while it
grows); for the follower, `SimSink` (the Receiver's `Sink`: begin, own files, the WAL's
first version wanted, the rebase, restored records and the end, through the driver's
`ReplicaRestore`) and `SimStaging` (its `StagingStore`: staged files in memory, kept across
a crash as production's staging directory is, and the swap into the app's files). The app's
files: `app_files()`, the archive cut into data files (`data/v<first>`, each up to
`FILE_RECORDS` records; a flush rewrites the last one while it has room, as the vnode
rewrites a time bucket) and a manifest last, each file's bytes the real WAL record encoding
of its records and its magic the default CRC-32C rule.
Must not: step a driver but through the world's `call_driver` (a crash there ends the
session: `SessionGone`), or use randomness but the world's PRNG.
"""

from __future__ import annotations

from typing import Any, Callable, Generator, Protocol

from vrepl._core import crc32c as _crc
from vrepl._core import record as _rec
from vrepl.driver import WAIT
from vrepl.replica import Record
from vrepl.restore import protocol as P
from vrepl.restore.errors import BadData, FilesChanged, PeerError, RestoreError
from vrepl.restore.receiver import crc_magic
from vrepl.restore.session_io import Session, SessionIO
from vrepl.testing.records import MAX_RECORD_BYTES, decode_block, encode_block
from vrepl.testing.sim.checker import SafetyViolation
from vrepl.testing.sim.ports import SimError, SimNode
from vrepl.testing.sim.restore_io import UNITS_PER_SECOND

FILE_RECORDS = 16  # records a data file holds before a flush starts a new one
MANIFEST = "manifest"
BEGIN_WAIT_UNITS = 200  # a follower that has not matched its log by then: the session fails


class SessionGone(RestoreError):
    """The process of this side crashed during a call into its driver."""


class PortsWorld(Protocol):
    now: int

    def call_driver(self, sn: SimNode, what: str, call: Callable[..., Any], *args: Any) -> Any: ...

    def chunk_records(self) -> int: ...

    def note(self, text: str) -> None: ...


# ---------------------------------------------------------------------------------------------
# The app's files


def magic_of(data: bytes) -> int:
    return crc_magic(_crc.crc32c(data, 0))


def app_files(sn: SimNode) -> list[tuple[str, bytes]]:
    """The app's archived files in getFileInfo order, the manifest last."""
    out = []
    for first, last in sn.files:
        out.append((f"data/v{first}", encode_block(sn.archive[first - 1:last])[0]))
    if out:
        out.append((MANIFEST, ";".join(f"{n}:{len(b)}" for n, b in out).encode()))
    return out


def app_flushed(sn: SimNode, first: int, last: int) -> None:
    """The app archived v`first`..v`last`: the last data file takes them while it has room
    (rewritten: same name, new bytes), else a new file starts."""
    if sn.files and sn.files[-1][1] == first - 1 and sn.files[-1][1] - sn.files[-1][0] + 1 < FILE_RECORDS:
        sn.files[-1] = (sn.files[-1][0], last)
    else:
        sn.files.append((first, last))


def install_files(sn: SimNode, files: list[tuple[str, bytes]]) -> None:
    """The swap: the app's files are now `files` (the manifest last); it reloads its archive
    from them and drops its memtable (the vnode's notify_file_synced)."""
    archive: list[Record] = []
    ranges = []
    for name, data in files:
        if name == MANIFEST:
            continue
        scan = _rec.scan(data, max_payload_len=MAX_RECORD_BYTES, contiguous=True)
        if not scan.ok or not scan.count:
            raise SimError(f"n{sn.node}: restored file {name} holds no whole records ({scan.describe()})")
        first = int(scan.versions[0])
        if first != len(archive) + 1:
            raise SimError(f"n{sn.node}: restored file {name} starts at v{first} after v{len(archive)}")
        archive += decode_block(first, data)
        ranges.append((first, len(archive)))
    have = sn.wal[:len(archive)]
    if archive[:len(have)] != have:
        raise SafetyViolation(f"n{sn.node}: restored files differ from its WAL below v{len(have)}")
    sn.archive, sn.files, sn.memtable = archive, ranges, []
    sn.restored_files_version = len(archive)


# ---------------------------------------------------------------------------------------------
# The master


class SimSource:
    """The Sender's Source on a simulated master (vrepl/restore/sender.py)."""

    data_path = ""
    wal_dir = ""
    max_record_bytes = MAX_RECORD_BYTES

    def __init__(self, world: PortsWorld, m: SimNode, follower: int) -> None:
        self.w = world
        self.m = m
        self.inc = m.inc
        self.follower = follower
        self.epoch = 0

    def _host(self) -> Any:
        if not self.m.up or self.m.inc != self.inc:
            raise SessionGone(f"n{self.m.node} (the master) went down")
        return self.m.driver.restore  # type: ignore[union-attr]

    def file_info(self, index: int) -> tuple[str, int, int] | None:
        files = app_files(self.m)
        if index >= len(files):
            return None
        name, data = files[index]
        return name, len(data), magic_of(data)

    def begin(self) -> tuple[int, int]:
        why = self._host().stop_reason(self.follower, 0)
        if why:
            raise RestoreError(why)
        self.epoch, last = self._host().log_end()
        return self.epoch, last

    def history_upto(self, version: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        answer = self._host().history_upto(version)
        if isinstance(answer, str):
            raise RestoreError(answer, restart=False)
        epoch, pairs = answer
        return epoch, pairs[-P.MAX_HISTORY_PAIRS:]

    def switch_to_live(self) -> int:
        host = self._host()
        why = self.stop_reason()
        if why:
            raise RestoreError(why)
        target = self.w.call_driver(self.m, f"restore of n{self.follower}: sync cache", host.caught_up, self.follower)
        self._host()
        self.w.note(f"restore n{self.m.node}->n{self.follower}: live forwards after v{target}")
        return target

    def last_version(self) -> int:
        return self.m.replica.last_version  # type: ignore[union-attr]

    def stop_reason(self) -> str | None:
        return self._host().stop_reason(self.follower, self.epoch)


class SimSourceStore:
    """The Sender's SourceStore on a simulated master: its app's files and its WAL."""

    def __init__(self, world: PortsWorld, m: SimNode) -> None:
        self.w = world
        self.m = m
        self.watched: dict[str, tuple[int, int]] = {}

    def _current(self, name: str) -> bytes | None:
        return next((data for n, data in app_files(self.m) if n == name), None)

    def watch_file(self, name: str, size: int) -> None:
        data = self._current(name)
        if data is None:
            raise FilesChanged(f"{name} is gone on the source")
        if len(data) != size:
            raise FilesChanged(f"{name} is {len(data)} bytes on the source, getFileInfo said {size}")
        self.watched[name] = (len(data), magic_of(data))

    def changed(self) -> str | None:
        for name, (size, magic) in self.watched.items():
            data = self._current(name)
            if data is None or (len(data), magic_of(data)) != (size, magic):
                return f"{name} changed on the source"
        return None

    def forget_files(self) -> None:
        self.watched.clear()

    def send_file(self, io: SessionIO, index: int, name: str, size: int) -> None:
        data = self._current(name)
        if data is None or len(data) != size:
            raise FilesChanged(f"{name} changed size on the source")
        io.send(P.FileData(index, size))
        io.send_bytes(data)

    def pump_wal(self, tail: Any) -> bool:
        """The records after what was sent, a block of 1-8 as written (readable at once)."""
        sent = tail.sent_version
        recs = self.m.wal[sent: sent + self.w.chunk_records()]
        if not recs:
            return False
        block, scan = encode_block(recs)
        tail.send_records(block, scan)
        return True

    def wait_wal(self, timeout_s: float) -> Generator[Any, None, None]:
        yield max(1, round(timeout_s * UNITS_PER_SECOND))

    def close(self) -> None:
        self.watched.clear()


# ---------------------------------------------------------------------------------------------
# The follower


class SimSink:
    """The Receiver's Sink on a simulated follower (vrepl/restore/receiver.py)."""

    data_path = ""

    def __init__(self, world: PortsWorld, f: SimNode, master: int, on_state: Callable[[str], None]) -> None:
        self.w = world
        self.f = f
        self.inc = f.inc
        self.master = master
        self.on_state = on_state
        self.prev_epoch = 0

    def _host(self) -> Any:
        if not self.f.up or self.f.inc != self.inc:
            raise SessionGone(f"n{self.f.node} (the follower) went down")
        return self.f.driver.restore  # type: ignore[union-attr]

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        result = self.w.call_driver(self.f, f"restore from n{self.master}: {what}", fn, *args)
        self._host()
        return result

    def on_begin(self, begin: P.SyncBegin) -> Session:
        started = self.w.now
        while True:
            why = self._call("begin", self._host().begin_refusal, self.master, begin.epoch)
            if why is None:
                self.on_state("files" if begin.flags & P.FLAG_FILES else "begun")
                return
            if why != WAIT or self.w.now - started > BEGIN_WAIT_UNITS:
                raise RestoreError(f"cannot restore from n{self.master}: {why if why != WAIT else 'no SyncStart arrived'}")
            yield 5

    def own_file(self, index: int, name: str) -> tuple[int, int] | None:
        data = next((d for n, d in app_files(self.f) if n == name), None)
        return None if data is None else (len(data), magic_of(data))

    def own_files(self) -> list[str]:
        return [n for n, _ in app_files(self.f)]

    def files_synced(self) -> None:
        self.w.note(f"n{self.f.node} reloads restored files up to v{len(self.f.archive)}")

    def wal_from_version(self) -> int:
        return self._host().wal_from(len(self.f.archive))

    def on_wal_begin(self, msg: P.WalBegin) -> None:
        host = self._host()
        base = msg.first_version - 1
        self.prev_epoch = msg.prev_epoch
        why = host.restoring_refusal(self.master)
        if why:
            raise RestoreError(why)
        bad = host.rebase_refusal(base, msg.prev_epoch)
        if bad:
            raise BadData(bad, restart=False)
        why = self._call(f"WAL from v{msg.first_version}", host.rebase, self.master, base, msg.prev_epoch, msg.history)
        if why:
            raise RestoreError(why)
        self.on_state("wal")

    def feed(self, block: bytes, scan: Any) -> None:
        prev_epoch = self.prev_epoch
        self.prev_epoch = int(scan.epochs[-1])
        why = self._call(f"v{int(scan.versions[0])}..v{int(scan.versions[-1])}", self._host().feed, self.master,
                         block, scan, prev_epoch)
        if why:
            raise RestoreError(why)

    def on_wal_end(self, last_version: int) -> int:
        done = self._call(f"end at v{last_version}", self._host().end, self.master, last_version)
        if isinstance(done, str):
            raise RestoreError(done)
        return done


class SimStaging:
    """The Receiver's StagingStore on a simulated follower: staged files in `f.staged`
    (they survive a crash, so a later session resumes), the swap into its app's files."""

    def __init__(self, f: SimNode) -> None:
        self.f = f

    def staged_matches(self, name: str, size: int, magic: int) -> bool:
        data = self.f.staged.get(name)
        return data is not None and len(data) == size and magic_of(data) == magic

    def receive(self, io: SessionIO, name: str, size: int, magic: int,
                progress: Callable[[int], None] | None = None) -> Session:
        pieces: list[bytes] = []
        yield from io.recv_raw(size, lambda view: pieces.append(bytes(view)))
        data = b"".join(pieces)
        if len(data) != size:
            raise PeerError(f"{name}: received {len(data)} bytes, announced {size}")
        got = magic_of(data)
        if got != magic:
            raise BadData(f"{name}: received file has magic {got:#010x}, announced {magic:#010x}")
        self.f.staged[name] = data

    def commit(self, names: list[str], staged: set[str], remove: list[str]) -> None:
        if not staged and not remove:
            return  # the same files: nothing moves, the app is not told (production's swap)
        own = dict(app_files(self.f))
        files = [(n, self.f.staged[n] if n in staged else own[n]) for n in names]
        install_files(self.f, files)
        self.f.staged.clear()
