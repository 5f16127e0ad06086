"""A replica's side of a round of ingested files: staging the files a record names, and
serving them to the other replicas (docs/vnode.md §9.3 step 3, §9.6; issue 16).

`Fetcher` stages a round's missing files on this replica: from its own `incoming/` when a
producer put the same bytes there, else fetched from another replica over a FETCH
connection; and answers the FETCH connections of the other replicas. `Rounds`
(vrepl/node/ingest.py) owns one, runs `stage_job` on its ingest executor, and acks the
record once the job is done.
Must not: run on the I/O thread (every method blocks on disk or sockets), ack, write the
WAL, or touch the archive (the vnode applies a round: vrepl/vnode/staging.py, vnode.py).
"""
from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
from typing import Callable, Iterable, Protocol

from vrepl._core import crc32c as _crc
from vrepl.endpoint import parse_endpoint
from vrepl.directio import SequentialWriter
from vrepl.errors import FetchFailed, FrameError
from vrepl.killpoints import killpoint, register
from vrepl.node.config import NodeConfig, VgroupSpec
from vrepl.restore import protocol as P
from vrepl.restore.errors import PeerError, RestoreError
from vrepl.restore.stream import SyncStream, connect_sync
from vrepl.sync import SyncInstance
from vrepl.transport.codec import ConnKind
from vrepl.vnode import Vnode
from vrepl.vnode import staging as S
from vrepl.vnode.errors import VnodeError
from vrepl.vnode.rows import TABLE_NAME_RE

log = logging.getLogger("vrepl.node")

FETCH_WINDOW = 32      # FETCH_REQUESTs a replica sends ahead of the answers (§9.6)

# docs/vnode.md §9.5 (the master's and the ack's kill points are in vrepl/node/ingest.py).
KP_FETCH_RECEIVED = register("ingest.fetch.after_receive",
                             "a replica fetching a file: its bytes are in a .part file,"
                             " checked, not fsynced or renamed")
KP_SLAVE_STAGED = register("ingest.slave.after_stage",
                           "a replica: every file of the round is staged; the record is not"
                           " acknowledged yet")


class StagingJob:
    """Staging the missing files of one round on this replica (executor thread)."""

    def __init__(self, version: int, record: S.IngestRecord) -> None:
        self.version = version
        self.record = record
        self.cancelled = False
        self.attempts = 0
        self.started = 0.0                          # time.monotonic() of the last attempt
        self.stream: SyncStream | None = None       # the fetch in progress (closed to cancel)
        self.timer: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.timer is not None:
            self.timer.cancel()
        stream = self.stream
        if stream is not None:
            stream.close()

class IngestHost(Protocol):
    """What Rounds needs of its VgroupHost (vrepl/node/vgroup.py, which owns a Rounds: not
    imported here, so the two modules do not import each other)."""

    id: int
    node_id: int
    path: str
    node_cfg: NodeConfig
    spec: VgroupSpec
    vnode: Vnode | None
    sync: SyncInstance | None
    loop: asyncio.AbstractEventLoop | None
    state: str
    role: str
    epoch: int
    master: int | None
    next_version: int
    stopping: bool

    def _role_now(self) -> tuple[str, int | None]: ...

    def _maybe_flush(self) -> None: ...


class OfHost:
    """The vgroup directory and the fsync setting of `self.host` (Rounds and Fetcher)."""

    host: IngestHost

    @property
    def path(self) -> str:
        return self.host.path

    @property
    def fsync(self) -> bool:
        return self.host.node_cfg.vnode.fsync


class Fetcher(OfHost):
    """Stages the files of rounds on this replica and serves them to the others (see the
    module doc). Every method blocks: the ingest executor or a FETCH connection's thread."""

    def __init__(self, host: IngestHost, count: Callable[..., None]) -> None:
        self.host = host
        self._count = count         # Rounds' counters (thread-safe)

    def stage_job(self, job: StagingJob) -> None:
        """(ingest executor) Stage every missing file of the round: from incoming/ when a
        producer put the same bytes there, else fetched from another replica."""
        rec = job.record
        missing = S.missing_staged(self.path, rec)
        local = []
        for k in list(missing):
            if job.cancelled:
                return
            src = self._incoming_copy(rec, k)
            if src is not None:
                local.append((src, k))
                missing.remove(k)
        S.stage_files(self.path, rec.round, local, self.fsync)
        if local:
            self._count("files_from_incoming", len(local))
        if missing:
            self._fetch(job, missing)
        killpoint(KP_SLAVE_STAGED)

    def _incoming_copy(self, rec: S.IngestRecord, k: int) -> str | None:
        """The path of file k of the round in this node's incoming/ if the producer put the
        same bytes there (size and CRC-32C as the record says), else None."""
        f = rec.files[k]
        try:
            full = S.confined_incoming(self.path, f.name)
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except (ValueError, OSError):
            return None
        try:
            if os.fstat(fd).st_size != f.size:
                return None
            self._count("checksum_bytes_reread", f.size)    # a producer's bytes: read them
            if S.file_crc_magic(fd) != (f.size, f.crc32c):
                return None
        finally:
            os.close(fd)
        return full

    def _sources(self) -> list[int]:
        """Replicas to fetch from: the master this node follows first, then the others."""
        host = self.host
        others = [n for n in host.spec.replicas if n != host.node_id and n in host.node_cfg.nodes]
        master = host.master
        return ([master] if master in others else []) + [n for n in others if n != master]

    def _fetch(self, job: StagingJob, missing: list[int]) -> None:
        """(ingest executor) Fetch files `missing` of the round over FETCH connections, one
        per source; FetchFailed when some are still missing after every source."""
        host = self.host
        rc = host.node_cfg.restore
        errors: list[str] = []
        for node in self._sources():
            if job.cancelled or not missing:
                break
            where = host.node_cfg.nodes[node].replication_endpoint
            h, p = parse_endpoint(where)
            try:
                stream = connect_sync(h, p, secret=host.node_cfg.secret, kind=ConnKind.FETCH,
                                      vgroup_id=host.id, node=host.node_id, target_node=node,
                                      timeout_s=rc.connect_timeout_s, io_timeout_s=rc.io_timeout_s)
            except (PeerError, OSError) as exc:
                errors.append(f"n{node}: {exc}")
                continue
            job.stream = stream
            parts: list[tuple[str, int]] = []
            try:
                self._fetch_from(stream, job, missing, parts, f"n{node}", errors)
            except (PeerError, RestoreError, FrameError, OSError) as exc:
                errors.append(f"n{node}: {exc}")
            finally:
                job.stream = None
                stream.close()
            if job.cancelled:
                _unlink_all(part for part, _ in parts)
                return
            # What this source gave is staged before the next is asked (all fsynced, then
            # renamed, then one directory fsync: S.stage_files).
            try:
                S.stage_files(self.path, job.record.round, parts, self.fsync)
            except OSError:
                _unlink_all(part for part, _ in parts)
                raise
            for _, k in parts:
                missing.remove(k)
            self._count("files_fetched", len(parts))
        if missing and not job.cancelled:
            raise FetchFailed(f"files {missing} of round {job.record.round}: "
                              + ("; ".join(errors) or "no other replica to fetch from"))

    def _fetch_from(self, stream: SyncStream, job: StagingJob, missing: list[int],
                    parts: list[tuple[str, int]], source: str, errors: list[str]) -> None:
        """Ask `source` for every file of `missing`, FETCH_WINDOW requests ahead of the
        answers (the source answers in order), and receive each into a checked `.part`;
        (part, k) of each one received joins `parts`, why a file is not there joins
        `errors`."""
        rec, version = job.record, job.version
        todo = iter(list(missing))
        asked: collections.deque[int] = collections.deque()
        while True:
            while len(asked) < FETCH_WINDOW:
                k = next(todo, None)
                if k is None:
                    break
                f = rec.files[k]
                stream.send(P.FetchRequest(version, k, f.size, f.crc32c, f.bucket, rec.round,
                                           f.table))
                asked.append(k)
            if not asked or job.cancelled:
                return
            k = asked.popleft()
            got = self._receive_one(stream, rec, k)
            if got is None:
                parts.append((S.abspath(self.path, rec.staged_name(k)) + S.PART_SUFFIX, k))
            else:
                errors.append(f"{source}: {got}")

    def _receive_one(self, stream: SyncStream, rec: S.IngestRecord, k: int) -> str | None:
        """The answer to the request for file k: None once its bytes are in its `.part`
        (CRC-32C checked, not fsynced), else why this source cannot give it."""
        f = rec.files[k]
        info = stream.recv()
        if type(info) is not P.FileInfo or info.index != k:
            raise PeerError(f"expected file_info #{k}, got {info.describe()}")
        if info.magic == 0:
            return f"has no file {k} of the round"
        if (info.size, info.magic) != (f.size, f.crc32c):
            raise PeerError(f"announces file {k} with {info.size} bytes, magic {info.magic:#x}")
        data = stream.recv()
        if type(data) is not P.FileData or data.index != k or data.size != f.size:
            raise PeerError(f"expected file_data #{k} of {f.size} bytes, got {data.describe()}")
        part = S.abspath(self.path, rec.staged_name(k)) + S.PART_SUFFIX
        os.makedirs(os.path.dirname(part), exist_ok=True)     # only once a source has a copy
        st = os.statvfs(os.path.dirname(part))
        if st.f_bavail * st.f_frsize < f.size:
            raise RestoreError(f"not enough disk space for file {k} ({f.size} bytes)")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        crc = 0
        ok = False
        # Around the page cache: this replica reads the file only if it becomes master
        # (vrepl/directio.py says why).
        writer = SequentialWriter(fd)
        try:
            def take(view: memoryview) -> None:
                nonlocal crc
                crc = _crc.crc32c(view, crc)
                writer.write(view)
            try:
                stream.recv_raw(f.size, take)
            finally:
                writer.finish()
            self._count("checksum_bytes_received", f.size)
            if (crc or 1) != f.crc32c:
                return f"sent file {k} with magic {crc or 1:#010x}, the record says {f.crc32c:#010x}"
            ok = True
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise RestoreError(f"no space left on device while staging file {k}") from None
            raise
        finally:
            os.close(fd)
            if not ok:
                _unlink_all([part])
        killpoint(KP_FETCH_RECEIVED)
        return None

    # -- serving fetches (a thread per FETCH connection) ------------------------------------------
    def serve_fetch(self, stream: SyncStream, node: int) -> None:
        """(SyncCallbacks.serve_fetch) Answer FETCH_REQUESTs until the other side closes: a
        staged file of the round, else the archived file it became, else magic 0."""
        host = self.host
        while True:
            try:
                msg = stream.recv()
            except PeerError:
                return                      # closed: the usual end
            if type(msg) is not P.FetchRequest:
                stream.send_error(f"expected fetch_request, got {msg.describe()}")
                return
            found = self._locate(msg)
            if found is None:
                stream.send(P.FileInfo(msg.index, 0, 0, ""))
                continue
            fd, name = found
            try:
                stream.send(P.FileInfo(msg.index, msg.size, msg.magic, name))
                stream.send(P.FileData(msg.index, msg.size))
                stream.sendfile(fd, 0, msg.size)
            finally:
                os.close(fd)
            self._count("files_served")
            log.debug("vg%d n%d: served %s to n%d", host.id, host.node_id, name, node)

    def _locate(self, msg: P.FetchRequest) -> tuple[int, str] | None:
        """An open descriptor and the name of this node's copy of the requested file (its
        size as asked; the fetching side checks the CRC), or None."""
        if S.ROUND_RE.fullmatch(msg.round_id) is None or TABLE_NAME_RE.fullmatch(msg.table) is None \
                or not 0 <= msg.index < S.MAX_ROUND_FILES:
            return None
        # The staged copy first: looking the archived name up scans the manifest.
        found = _open_sized(S.abspath(self.path, S.staged_name(msg.round_id, msg.index)), msg.size)
        if found is not None:
            return found, S.staged_name(msg.round_id, msg.index)
        vnode = self.host.vnode
        archived = S.archive_name(msg.table, msg.bucket, msg.version, msg.index)
        try:
            entry = vnode.archived_entry(archived) if vnode is not None else None
        except VnodeError:
            entry = None
        if entry is None or (entry.size, entry.magic) != (msg.size, msg.magic):
            return None
        found = _open_sized(S.abspath(self.path, archived), msg.size)
        return None if found is None else (found, archived)


def _unlink_all(paths: Iterable[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def _open_sized(path: str, size: int) -> int | None:
    """An open descriptor of the regular file at `path` if it holds `size` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if os.fstat(fd).st_size == size:
        return fd
    os.close(fd)
    return None
