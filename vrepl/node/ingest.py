"""Ingesting files into a vgroup by one replicated record (docs/vnode.md §9; issue 16).

The master API (a producer such as `vrepl ship`'s receiver, the transactional load, the
slot migration and `POST /v1/vgroups/{id}/ingest` build on it):

    host.staging_dir() -> str
        `<vgroup path>/ingest/incoming`, created if missing: where a producer on this node
        writes the files of a round before it calls ingest(). Names given to ingest() are
        relative to it. The directory is emptied when the node opens the vgroup (a crash
        leaves nothing a producer can resume there).

    await host.ingest(files: Sequence[IngestFile], kind: str,
                      meta: Mapping[str, Any] | None = None) -> IngestResult
        On the node's I/O loop (`host.loop`; from another thread:
        `asyncio.run_coroutine_threadsafe(host.ingest(...), host.loop)`). Checks every file
        (confined name, regular file, size and CRC-32C if the producer gave them, the
        Parquet format of an archived file, types against the table's schema), moves the
        files into the staging area (fsynced), then forwards ONE WAL record (payload format
        8, docs/vnode.md §2) naming them, and returns once the group committed it:
        `IngestResult(version, epoch, rows, files, applied)`. The round then reaches every
        replica's archive at that version, all files at once (never half a round).
        `applied` says whether this node already archived it (its rows visible here); it
        normally is, within `write_timeout_ms`.

        Raises IngestError (a RuntimeError) with `code` and `outcome`:
          code "bad_files" (IngestFileError, also a ValueError): a file fails its check;
              nothing was forwarded, the files stay in staging_dir() (outcome "not_written");
          "not_master", "not_running", "needs_restore", "overloaded", "busy" (another round
              is being staged): nothing was forwarded (outcome "not_written");
          "unknown_outcome": forwarded, but not confirmed by a quorum in time or this node
              stepped down: the record may still be committed or cut (outcome "unknown");
              a producer retries with a round it can recognise (its own id in `meta`).

    IngestFile(name: str, table: str, origin: str = "", size: int | None = None,
               crc32c: int | None = None)
        `name`: relative to staging_dir(), '/'-separated components of [A-Za-z0-9_.-]
        (not starting with '.'), at most 255 bytes; `table`: the table its rows belong to;
        `origin`: who wrote the rows (printable, at most 128 bytes): their `_version` and
        `_epoch` are that origin's, not this vgroup's; `size`, `crc32c`: checked if given
        (`crc32c` is the file's magic: CRC-32C of its bytes, 1 if that is 0).
    kind: `[a-z][a-z0-9_.-]{0,31}` (e.g. "ship", "load"); meta: a JSON object of at most
        64 KiB, opaque to vrepl, stored in the record (a ship round id, a transaction id).

Owns, besides the API: the slave's side of a round (stage the files a record names: from
its own incoming/ when a producer put the same bytes there, else fetched from a replica
that has them over a FETCH connection; ack the record only once they are durable, in
version order), serving FETCH connections from the other replicas, and the kill points of
the ingest path (vrepl/killpoints.py).
Must not: block the I/O thread on disk or sockets (checks, moves and fetches run on the
ingest executor), write the WAL, or touch the archive (the vnode applies a round, at a
flush, once its version is committed: vrepl/vnode/staging.py, vnode.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from vrepl.errors import VreplError


@dataclass(frozen=True)
class IngestFile:
    """One file of a round, as the producer names it (see the module doc)."""

    name: str
    table: str
    origin: str = ""
    size: int | None = None
    crc32c: int | None = None


class IngestResult(NamedTuple):
    version: int         # the version of the round's record
    epoch: int           # its epoch (this master's)
    rows: int            # rows in the round's files
    files: int
    applied: bool        # archived on this node already (rows visible in queries here)


class IngestError(VreplError, RuntimeError):
    """A round that was refused or whose outcome is unknown (`code`, `outcome`)."""

    def __init__(self, code: str, message: str, outcome: str = "not_written",
                 version: int | None = None):
        self.code = code
        self.outcome = outcome
        self.version = version
        super().__init__(message)


class IngestFileError(IngestError, ValueError):
    """A file of the round fails its check (code "bad_files"); nothing was forwarded."""

    def __init__(self, message: str):
        super().__init__("bad_files", message)
