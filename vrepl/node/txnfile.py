"""Whole Parquet files staged by a transaction: the master's side of
`POST /v1/vgroups/{id}/txn/{txn}/file?table=T&seq=S[&crc32c=C][&origin=O]`
(docs/transactions.md §4.1, docs/client-api.md §Transactions).

Owns: the upload (the body streamed by the HTTP server into
`<vgroup>/ingest/incoming/txn-<txn>-<seq>-<random>.parquet`, its CRC-32C computed while it
arrives: `FileSink`), the refusals before the body is read (not the master, no such open
transaction, a seq being put, `[txn] max_staged_file_bytes`; a seq already staged is
answered once its body is read and dropped: `Answered`) and after
(a wrong checksum, not Parquet, a schema conflict, a file overlapping another of the
transaction), making the upload an archived file of this vnode's format (as it is when it
already is one; otherwise its `ts` sorted and cast, `_version`/`_epoch` added, one file per
bucket: `archived_files`), staging it under a fresh round id (fsynced, as ingest does) and
forwarding one "files" record of the transaction; the staged files of a put that never
reached the log are removed.
Must not: write the WAL or touch the archive (the vnode applies the record; the node's
Rounds fetch the files on the other replicas and ack only once they are staged), or block
the I/O thread on anything but the upload's own writes (checks, conversion and staging run
on the ingest executor).
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vrepl._core.crc32c import crc32c
from vrepl.errors import IngestFileError
from vrepl.killpoints import killpoint, register
from vrepl.node.http import Response
from vrepl.txn.machine import PREPARE
from vrepl.txn.record import TxnRecord, encode_txn_payload
from vrepl.vnode import staging as S
from vrepl.vnode.config import VnodeConfig
from vrepl.vnode.files import ARROW_TYPES, arrow_schema, parquet_options
from vrepl.vnode.rows import TABLE_NAME_RE

log = logging.getLogger("vrepl.node")

KP_FILE_STAGED = register("txn.master.after_file_stage", "a transaction's file is staged"
                          " (fsynced in ingest/staged/<round>/); its files record is not"
                          " forwarded")
KP_FILES = register("txn.master.after_files", "a transaction's files record is committed;"
                    " the loader has no answer")

# Arrow types an uploaded file's value columns may have, by the column type they become
# (cast to ARROW_TYPES[kind]).
_VALUE_TYPES = {"int": pa.types.is_integer, "float": pa.types.is_floating,
                "str": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
                "bool": pa.types.is_boolean}


class FileSink:
    """The body of one upload, written to `path` as it arrives (on the I/O thread: page
    cache writes) with its CRC-32C; a write error (a full disk) is kept and answered once the
    body is read."""

    def __init__(self, path: str, on_end: Any) -> None:
        self.path = path
        self.fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                                      0o644)
        self.crc = 0
        self.size = 0
        self.started = time.monotonic()
        self.error: OSError | None = None
        self._on_end = on_end           # releases the reservation (once)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.error is not None or self.fd is None:
            return
        view = memoryview(data)
        try:
            self.crc = crc32c(view, self.crc)
            off = 0
            while off < len(view):
                off += os.write(self.fd, view[off:])
            self.size += len(view)
        except OSError as exc:
            self.error = exc

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def end(self) -> None:
        self.close()
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()

    def abort(self) -> None:
        self.end()
        _unlink(self.path)

    @property
    def magic(self) -> int:
        return self.crc or 1


class Answered:
    """The body of a put answered before it is read (a seq already staged): read and
    dropped, then `response` is the answer, so a retried put of a large file is answered
    however long its body takes (an early answer would close the connection under it)."""

    path = ""

    def __init__(self, response: Response) -> None:
        self.response = response

    def write(self, data: Any) -> None:
        pass

    def abort(self) -> None:
        pass

    def end(self) -> None:
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def archived_files(full: str, name: str, table: str, origin: str, cfg: VnodeConfig,
                   schemas: Mapping[str, Mapping[str, str]], size: int, magic: int, txn: int,
                   epoch: int) -> tuple[list[S.IngestEntry], list[str]]:
    """(ingest executor) The upload at `full` (in incoming/) as archived files of this
    vnode's format and their entries. A file with `_version` and `_epoch` columns must be one
    already (docs/vnode.md §9.1) and is taken as it is (its origin is `origin`); any other is
    read, its `ts` (timestamp, or int64 in the vnode's precision) sorted, one row per ts,
    `_version` = the transaction id and `_epoch` = this master's epoch added, and written
    again as one file per bucket of `file_span_ms` (origin ""). IngestFileError names the
    problem; nothing is kept then."""
    try:
        names = pq.read_schema(full).names
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise IngestFileError(f"{name}: not a readable Parquet file: "
                              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                              ) from None
    if "_version" in names and "_epoch" in names:
        # `magic` was computed over the body as it was written (FileSink): one pass.
        reason, entry = S.check_file(full, name, table, origin, cfg, schemas, size, magic,
                                     magic_from_write=True)
        if reason is not None or entry is None:
            raise IngestFileError(reason or f"{name}: not checked")
        return [entry], [full]
    tbl = _normalised(pq.read_table(full), name, cfg, txn, epoch)
    _unlink(full)
    span = cfg.file_span
    ts = tbl.column("ts").cast(pa.int64()).to_numpy()
    buckets = ts // span
    cuts = np.flatnonzero(buckets[1:] != buckets[:-1]) + 1
    entries, sources = [], []
    try:
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(ts)]):
            part_name = f"{name}.b{int(buckets[lo])}.parquet"
            part = os.path.join(os.path.dirname(full), part_name)
            # As the vnode writes its own files (zstd, ts delta-encoded).
            pq.write_table(tbl.slice(lo, hi - lo), part, **parquet_options(tbl.column_names))
            sources.append(part)
            reason, entry = S.check_file(part, part_name, table, "", cfg, schemas)
            if reason is not None or entry is None:
                raise IngestFileError(reason or f"{part_name}: not checked")
            entries.append(entry)
    except BaseException:
        for src in sources:
            _unlink(src)
        raise
    return entries, sources


def _normalised(tbl: pa.Table, name: str, cfg: VnodeConfig, txn: int, epoch: int) -> pa.Table:
    """An uploaded table in the archived layout: ts sorted and unique, keys added."""
    if "ts" not in tbl.column_names:
        raise IngestFileError(f"{name}: needs a ts column")
    if tbl.num_rows == 0:
        raise IngestFileError(f"{name}: no rows")
    ts = tbl.column("ts")
    if ts.null_count:
        raise IngestFileError(f"{name}: ts must not be null")
    if not (pa.types.is_timestamp(ts.type) or pa.types.is_integer(ts.type)):
        raise IngestFileError(f"{name}: column 'ts' is {ts.type}: a timestamp or an integer in"
                              f" the vnode's precision ({cfg.precision})")
    try:
        ts = ts.cast(pa.timestamp(cfg.precision)) if pa.types.is_timestamp(ts.type) \
            else ts.cast(pa.int64()).cast(pa.timestamp(cfg.precision))
    except pa.ArrowInvalid as exc:
        raise IngestFileError(f"{name}: ts does not fit the precision {cfg.precision}: {exc}"
                              ) from None
    columns: dict[str, str] = {}
    arrays = []
    for fld in tbl.schema:
        if fld.name == "ts":
            continue
        kind = next((k for k, test in _VALUE_TYPES.items() if test(fld.type)), None)
        if kind is None:
            raise IngestFileError(f"{name}: column {fld.name!r} is {fld.type} (integers,"
                                  " floats, strings or bool)")
        columns[fld.name] = kind
        arrays.append(tbl.column(fld.name).cast(ARROW_TYPES[kind]))
    n = tbl.num_rows
    schema = arrow_schema(cfg.precision, columns)
    out = pa.Table.from_arrays([ts, pa.array(np.full(n, txn, np.int64)),
                                pa.array(np.full(n, epoch, np.int64)), *arrays], schema=schema)
    out = out.take(pc.sort_indices(out.column("ts")))
    keys = out.column("ts").cast(pa.int64()).to_numpy()
    dup = np.flatnonzero(keys[1:] == keys[:-1])
    if len(dup):
        raise IngestFileError(f"{name}: ts {int(keys[dup[0]])} appears twice (one row per ts)")
    return out


def overlap(staged: list[S.IngestEntry], new: list[S.IngestEntry]) -> str | None:
    """Why files `new` cannot join a transaction that staged `staged`: two files of one table
    holding a common ts would tie (one publish, one rank)."""
    reason = S.round_invalid(list(new))
    if reason is not None:
        return reason
    for e in new:
        for f in staged:
            if f.table == e.table and e.ts_min <= f.ts_max and f.ts_min <= e.ts_max:
                return (f"{e.name}: ts {max(e.ts_min, f.ts_min)}..{min(e.ts_max, f.ts_max)}"
                        f" of table {e.table!r} are in a file this transaction staged already"
                        " (files of one table in a transaction must not overlap)")
    return None


class TxnFiles:
    """The file puts of one vgroup's transactions (the master's side; see the module doc).
    `txns` is the vgroup's Txns (vrepl/node/txnhost.py)."""

    def __init__(self, txns: Any) -> None:
        self.txns = txns
        self.uploading: dict[tuple[int, int], int] = {}   # (txn, seq) -> bytes announced
        self.t_checked = 0.0                               # the last put's, for its log line

    # -- before the body: refusals and the sink (I/O thread) ----------------------------------
    def sink(self, key: str, query: Mapping[str, str], length: int
             ) -> FileSink | Answered | Response:
        txns = self.txns
        refused = txns._refusal()
        if refused is not None:
            return refused
        t = txns._find(key, step=True)
        if isinstance(t, Response):
            return t
        table, seq_text = query.get("table", ""), query.get("seq")
        if TABLE_NAME_RE.fullmatch(table) is None:
            return txns._refuse(400, "bad_txn", f"table {table[:80]!r} is not a table name")
        if seq_text is None or not seq_text.isdigit() or len(seq_text) >= 19:
            return txns._refuse(400, "bad_txn", f"seq {str(seq_text)[:30]!r} is not an integer"
                                " >= 0 (a file put names its seq)")
        seq = int(seq_text)
        if seq in t.seqs:
            return Answered(txns._answer(t, duplicate=True))
        if (t.id, seq) in self.uploading:
            return txns._refuse(503, "busy", f"transaction {t.id}: a put of seq {seq} is in"
                                " progress; retry it once that one is answered")
        if t.state != PREPARE or t.id in txns.finishing:
            return txns._refuse(409, "txn_not_open", f"transaction {t.id} is {txns._state(t)}"
                                f"{txns._why(t)}: it takes no more files")
        staged = txns.host.vnode.txns.table.staged_file_bytes() + sum(self.uploading.values())
        limit = txns.cfg.max_staged_file_bytes
        if staged + length > limit:
            return txns._refuse(429, "too_many_staged_bytes", f"transaction {t.id}: {staged} +"
                                f" {length} bytes of files would exceed max_staged_file_bytes"
                                f" {limit} (nothing staged)")
        incoming = S.incoming_path(txns.host.path)
        os.makedirs(incoming, exist_ok=True)
        path = os.path.join(incoming, f"txn-{t.id}-{seq}-{os.urandom(4).hex()}.parquet")
        try:
            sink = FileSink(path, lambda k=(t.id, seq): self.uploading.pop(k, None))
        except OSError as exc:
            return txns._refuse(507, "disk_full" if exc.errno == errno.ENOSPC else "io_error",
                                f"cannot receive the file: {exc.strerror}")
        self.uploading[(t.id, seq)] = length
        return sink

    # -- once the body is in (a task on the I/O thread) ---------------------------------------
    async def put(self, key: str, query: Mapping[str, str], sink: FileSink | Answered
                  ) -> Response:
        if isinstance(sink, Answered):
            return sink.response
        try:
            return await self._put(key, query, sink)
        finally:
            sink.end()
            _unlink(sink.path)

    async def _put(self, key: str, query: Mapping[str, str], sink: FileSink) -> Response:
        txns = self.txns
        host = txns.host
        sink.close()
        if sink.error is not None:
            code = "disk_full" if sink.error.errno in (errno.ENOSPC, errno.EDQUOT) else "io_error"
            return txns._refuse(507, code, f"cannot write the file: {sink.error.strerror}"
                                " (nothing staged)")
        host.rounds.count("checksum_bytes_received", sink.size)
        given = query.get("crc32c")
        if given is not None and given != str(sink.magic):
            return txns._refuse(400, "bad_checksum", f"the file's CRC-32C magic is {sink.magic},"
                                f" the request says {given[:20]} (nothing staged)")
        origin = query.get("origin", "")
        reason = S.origin_invalid(origin)
        if reason is not None:
            return txns._refuse(400, "bad_file", reason)
        refused = txns._refusal()
        t = txns._find(key, step=True) if refused is None else refused
        if isinstance(t, Response):
            return t
        seq = int(query["seq"])
        if seq in t.seqs:
            return txns._answer(t, duplicate=True)
        vnode, loop, pool = host.vnode, host.loop, host.rounds.pool()
        name = os.path.basename(sink.path)
        t_received = time.monotonic()
        try:
            entries, sources = await loop.run_in_executor(
                pool, archived_files, sink.path, name, query["table"], origin,
                host.node_cfg.vnode, vnode.schemas, sink.size, sink.magic, t.id, host.epoch)
        except IngestFileError as exc:
            return txns._refuse(400, "bad_file", f"transaction {t.id}: {exc} (nothing staged;"
                                " the transaction stays open)")
        if sources != [sink.path]:      # converted: the parts written were read back
            host.rounds.count("checksum_bytes_reread", sum(e.size for e in entries))
        try:
            resp = await self._stage(t, seq, entries, sources, t_received)
            # Where a put's time goes (docs/benchmarks.md §Transactions, bulk).
            log.info("vg%d n%d: txn %d file seq %d (%d bytes): received in %.3f s, checked in"
                     " %.3f s, staged and committed in %.3f s: %d", host.id, host.node_id,
                     t.id, seq, sink.size, t_received - sink.started,
                     self.t_checked - t_received, time.monotonic() - self.t_checked,
                     resp.status, extra={"event": "txn_file", "txn": t.id})
            return resp
        finally:
            for src in sources:
                _unlink(src)

    async def _stage(self, t: Any, seq: int, entries: list[S.IngestEntry], sources: list[str],
                     t_received: float) -> Response:
        self.t_checked = time.monotonic()
        txns = self.txns
        host = txns.host
        vnode = host.vnode
        staged = [f for p in vnode.txns.rounds.values() if p.record.meta.get("txn") == t.id
                  for f in p.record.files]
        rec = S.IngestRecord(S.new_round_id(), "txn", {"txn": t.id, "seq": seq}, tuple(entries))
        reason = overlap(staged, entries) or vnode.reserve_columns(rec)
        if reason is not None:
            return txns._refuse(400, "bad_file", f"transaction {t.id}: {reason} (nothing"
                                " staged; the transaction stays open)")
        payload = encode_txn_payload(TxnRecord("files", t.id, seq=seq, round=rec.round,
                                               files=[e.to_json() for e in entries]))
        limit = host.node_cfg.vnode.max_payload_bytes
        if len(payload) > limit:
            return txns._refuse(413, "too_large", f"transaction {t.id}: the files record would"
                                f" be {len(payload)} bytes, above max_payload_bytes {limit}")
        if t.state != PREPARE or t.id in txns.finishing or seq in t.seqs:
            return txns._answer(t, duplicate=True) if seq in t.seqs else txns._refuse(
                409, "txn_not_open", f"transaction {t.id} is {txns._state(t)}: it takes no"
                " more files")
        try:
            await host.loop.run_in_executor(host.rounds.pool(), S.stage_round, host.path, rec,
                                            sources, host.node_cfg.vnode.fsync)
        except OSError as exc:
            self._unstage(rec)
            return txns._refuse(507, "disk_full" if exc.errno == errno.ENOSPC else "io_error",
                                f"cannot stage the file: {exc.strerror or exc} (nothing staged)")
        killpoint(KP_FILE_STAGED)
        resp = await txns._step(payload, "files", KP_FILES, patient=True)
        if (resp.status != 200 and resp.body.get("outcome") != "unknown") \
                or resp.body.get("duplicate"):
            self._unstage(rec)      # never in the log, or ignored there: nobody names it
        return resp

    def _unstage(self, rec: S.IngestRecord) -> None:
        shutil.rmtree(S.staged_round_path(self.txns.host.path, rec.round), ignore_errors=True)
