"""The master's checks of a round before anything moves (docs/vnode.md §9.1; issue 16):
the producer's arguments (`IngestFile`, `request_invalid`), every file in `incoming/`
(`check_files`: the Parquet format, size and CRC-32C (read again unless the producer
computed it while writing: `IngestFile.crc_on_write`), types against the schemas), and what
a removal may name (`archived_key`, `pending_names`); `IngestResult`, what ingest() returns.
All re-exported by vrepl/node/ingest.py, whose module doc is the API.
Must not: move or write a file, or touch the vnode's state (it reads the manifest and the
pending rounds only).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

from vrepl.errors import IngestFileError
from vrepl.vnode import Vnode
from vrepl.vnode import staging as S
from vrepl.vnode.config import VnodeConfig
from vrepl.vnode.errors import VnodeError
from vrepl.vnode.rows import TABLE_NAME_RE
from vrepl.vnode.staging import IngestRemove


@dataclass(frozen=True)
class IngestFile:
    """One file of a round, as the producer names it (see the module doc)."""

    name: str
    table: str
    origin: str = ""
    size: int | None = None
    crc32c: int | None = None
    # The producer computed `crc32c` over the file's bytes as it wrote them, in this node
    # process: the master takes it without reading the file again (docs/vnode.md §9.1).
    crc_on_write: bool = False


class IngestResult(NamedTuple):
    version: int         # the version of the round's record
    epoch: int           # its epoch (this master's)
    rows: int            # rows in the round's files
    files: int
    applied: bool        # archived on this node already (rows visible in queries here)


def request_invalid(files: Sequence[IngestFile], kind: str, meta: Any,
                    remove: Sequence[IngestRemove] = ()) -> str | None:
    """Why a round's arguments are refused before any file is read, or None."""
    if type(kind) is not str or S.KIND_RE.fullmatch(kind) is None:
        return f"kind {str(kind)[:40]!r} does not match {S.KIND_RULE}"
    reason = S.meta_invalid(meta)
    if reason is not None:
        return reason
    reason = S.counts_invalid(len(files), len(remove))
    if reason is not None:
        return reason
    for r in remove:
        if not isinstance(r, IngestRemove):
            return f"{r!r} is not an IngestRemove"
    seen: set[str] = set()
    for f in files:
        if not isinstance(f, IngestFile):
            return f"{f!r} is not an IngestFile"
        reason = S.name_invalid(f.name) or S.origin_invalid(f.origin)
        if reason is None and (type(f.table) is not str or TABLE_NAME_RE.fullmatch(f.table) is None):
            reason = f"{f.name}: table {str(f.table)[:80]!r} is not a table name"
        for what in ("size", "crc32c"):
            v = getattr(f, what)
            if reason is None and v is not None and (type(v) is not int or v < 0 or v > 2**64):
                reason = f"{f.name}: {what} {v!r} is not a non-negative integer"
        if reason is None and f.crc_on_write is not False and (
                f.crc_on_write is not True or f.size is None or f.crc32c is None):
            reason = f"{f.name}: crc_on_write needs a size and a crc32c (and is a bool)"
        if reason is None and f.name in seen:
            reason = f"{f.name} is named twice"
        if reason is not None:
            return reason
        seen.add(f.name)
    return None


def archived_key(vnode: Vnode, name: str) -> tuple[int, int, int] | None:
    """(size, magic, ingest_version) of the archived file `name`, or None."""
    try:
        e = vnode.archived_entry(name)
    except VnodeError:
        return None
    return None if e is None else (e.size, e.magic, e.ingest_version)


def pending_names(vnode: Vnode) -> dict[str, tuple[int, int]]:
    """Archive name -> (size, magic) of every file of the rounds not archived yet (a
    removal may name one: it is applied after them, in version order)."""
    out: dict[str, tuple[int, int]] = {}
    for p in vnode.pending_ingests():
        for k, f in enumerate(p.record.files):
            out[p.record.archive_name(p.version, k)] = (f.size, f.crc32c)
    return out


def check_files(path: str, files: list[IngestFile], cfg: VnodeConfig,
                schemas: dict[str, dict[str, str]]) -> tuple[list[S.IngestEntry], list[str]]:
    """(ingest executor) Check every file of a round in `path`'s incoming/: the entries of
    the record and the files' paths; IngestFileError naming the first bad one."""
    entries, sources = [], []
    for f in files:
        try:
            full = S.confined_incoming(path, f.name)
        except ValueError as exc:
            raise IngestFileError(str(exc)) from None
        reason, entry = S.check_file(full, f.name, f.table, f.origin, cfg, schemas,
                                     f.size, f.crc32c, f.crc_on_write)
        if reason is not None or entry is None:
            raise IngestFileError(reason or f"{f.name}: not checked")
        entries.append(entry)
        sources.append(full)
    return entries, sources
