"""Rounds of ingested files in the reference vnode (docs/vnode.md §9): the format-8 payload,
the producer's file check, a round applied at its version only once committed and staged
(a flush point: one manifest commit adds every file and archives the rows below it), the
rank rule of later-version-wins for ingested rows, recovery, and a crash at every kill
point of the apply (the process "dies" in the middle; a fresh vnode recovers from the
disk and the WAL and converges on the same rows, with nothing left in staging)."""
from __future__ import annotations

import json
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vrepl import killpoints
from vrepl.txn import TxnRecord, encode_txn_payload
from vrepl.vnode import ApplyError, PayloadError, Vnode, VnodeConfig, VnodeError
from vrepl.vnode import staging as S
from vrepl.vnode.files import MANIFEST_NAME
from vrepl.testing.ingestfiles import ORIGIN_COLUMNS, origin_rows, write_round_file
from vrepl.testing.pagecache import page_cache_drops, resident_pages
from vrepl.wal import WalOptions, WalWriter

pytestmark = pytest.mark.timeout(60)

DAY_MS = 86_400_000
CFG = VnodeConfig(file_span_ms=DAY_MS)


class SimulatedCrash(BaseException):
    """An armed kill point's crash, in process (a BaseException: no `except Exception` on
    the way may swallow it)."""


def open_wal(path) -> WalWriter:
    return WalWriter(os.path.join(path, "wal"), WalOptions(durability="fsync"))


def write(v: Vnode, wal: WalWriter, rows, epoch: int = 1) -> int:
    reason, payload = v.prepare_write(rows)
    assert reason is None, reason
    version = wal.append(payload, epoch)
    assert v.write_to_cache(version, epoch, payload)
    return version


def make_round(v: Vnode, files, origin: str = "dc1/vg3") -> bytes:
    """What the master does before forwarding: write each file into incoming/, check it,
    stage the round; returns the format-8 payload naming it."""
    entries, srcs = [], []
    for i, (table, rows) in enumerate(files):
        name = f"batch/{i}.parquet"
        full = S.confined_incoming(v.path, name)
        write_round_file(full, rows, ORIGIN_COLUMNS, v.config.precision)
        reason, e = S.check_file(full, name, table, origin, v.config, v.schemas)
        assert reason is None, reason
        entries.append(e)
        srcs.append(full)
    rec = S.IngestRecord(S.new_round_id(), "test", {"round": 1}, tuple(entries))
    assert S.round_invalid(list(entries)) is None
    assert v.reserve_columns(rec) is None
    S.stage_round(v.path, rec, srcs)
    return S.encode_ingest_payload(rec)


def ingest(v: Vnode, wal: WalWriter, files, epoch: int = 1) -> tuple[int, bytes]:
    payload = make_round(v, files)
    version = wal.append(payload, epoch)
    assert v.write_to_cache(version, epoch, payload)
    return version, payload


def xs(rows):
    return [(r["ts"], r["x"], r["tag"]) for r in rows]


def leftovers(path) -> list[str]:
    out = []
    for root, _, names in os.walk(os.path.join(path, "ingest")):
        out += [os.path.relpath(os.path.join(root, n), path) for n in names]
    return out


# -- payload and file check -------------------------------------------------------------------

def test_payload_round_trip_and_refusals(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    payload = make_round(v, [("t", origin_rows(5)), ("u", origin_rows(3, ts0=10))])
    assert payload[:4] == b"VRB\x08"
    rec = S.decode_ingest_payload(payload, 9)
    assert [f.table for f in rec.files] == ["t", "u"] and rec.rows == 8
    assert rec.files[0].min_version == 1000 and rec.files[0].max_epoch == 7
    assert rec.files[1].origin == "dc1/vg3" and rec.meta == {"round": 1}
    assert S.decode_ingest_payload(S.encode_ingest_payload(rec)) == rec
    doc = json.loads(payload[4:])
    bad = [b"VRB\x08not json", b"VRB\x08[]",
           b"VRB\x08" + json.dumps({**doc, "round": "../x"}).encode(),
           b"VRB\x08" + json.dumps({**doc, "files": []}).encode(),
           b"VRB\x08" + json.dumps({**doc, "kind": "Bad Kind"}).encode(),
           b"VRB\x08" + json.dumps({**doc, "files": [{**doc["files"][0], "table": "a/b"}]}).encode(),
           b"VRB\x08" + json.dumps({**doc, "files": [{**doc["files"][0], "name": "../x"}]}).encode()]
    for p in bad:
        with pytest.raises(PayloadError, match="version 9"):
            S.decode_ingest_payload(p, 9)
    # A row decoder meeting format 8 says what it is.
    from vrepl.vnode.rows import decode_rows
    with pytest.raises(PayloadError, match="round of ingested files"):
        decode_rows(payload)


@pytest.mark.parametrize("case,expect", [
    ("unsorted", "strictly increasing"),
    ("two_buckets", "spans buckets"),
    ("no_rows", "no rows"),
    ("us_ts", "expected timestamp"),
    ("bad_column_type", "int32"),
    ("type_conflict", "cannot change"),
    ("not_parquet", "not a readable Parquet"),
    ("reserved_column", "not a value column name"),
    ("null_version", "must not be null"),
])
def test_check_file_refusals(tmp_path, case, expect):
    v = Vnode(str(tmp_path / "v"), CFG)
    wal = open_wal(v.path)
    write(v, wal, [("t", 1, {"x": "text"})])        # t.x is a string column here
    full = S.confined_incoming(v.path, "f.parquet")
    rows = origin_rows(4)
    cols = dict(ORIGIN_COLUMNS)
    if case == "unsorted":
        rows = rows[::-1]
    elif case == "two_buckets":
        rows = [rows[0], (DAY_MS + 5, 1, 1, rows[1][3])]
    elif case == "no_rows":
        rows = []
    if case in ("unsorted", "two_buckets", "no_rows"):
        write_round_file(full, rows, cols)
    elif case == "type_conflict":
        write_round_file(full, rows, cols)
    elif case == "not_parquet":
        os.makedirs(os.path.dirname(full), exist_ok=True)
        open(full, "wb").write(b"not parquet at all")
    else:
        arrays = {"ts": pa.array([1, 2], pa.timestamp("us" if case == "us_ts" else "ms")),
                  "_version": pa.array([1, None if case == "null_version" else 2], pa.int64()),
                  "_epoch": pa.array([1, 1], pa.int64())}
        if case == "bad_column_type":
            arrays["z"] = pa.array([1, 2], pa.int32())
        if case == "reserved_column":
            arrays["_x"] = pa.array([1, 2], pa.int64())
        os.makedirs(os.path.dirname(full), exist_ok=True)
        pq.write_table(pa.table(arrays), full)
    table = "t" if case == "type_conflict" else "fresh"
    reason, entry = S.check_file(full, "f.parquet", table, "", v.config, v.schemas)
    assert entry is None and reason is not None and expect in reason, reason
    assert reason.startswith("f.parquet: ")


def test_check_file_size_magic_and_names(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    full = S.confined_incoming(v.path, "a/b.parquet")
    write_round_file(full, origin_rows(3), ORIGIN_COLUMNS)
    reason, e = S.check_file(full, "a/b.parquet", "t", "", v.config, v.schemas)
    assert reason is None and e.rows == 3 and e.columns == ORIGIN_COLUMNS
    assert S.check_file(full, "a/b.parquet", "t", "", v.config, v.schemas, size=e.size + 1)[0]
    assert "magic" in S.check_file(full, "a/b.parquet", "t", "", v.config, v.schemas,
                                   magic=e.crc32c ^ 1)[0]
    for bad in ("../x", "/abs", "a/../b", ".hidden", "a\nb", "", "a//b"):
        with pytest.raises(ValueError):
            S.confined_incoming(v.path, bad)
    os.symlink("/etc", os.path.join(S.incoming_path(v.path), "link"))
    with pytest.raises(ValueError, match="symlink"):
        S.confined_incoming(v.path, "link/passwd")
    # Two files of one table overlapping in ts cannot be one round (their rows would tie).
    _, e2 = S.check_file(full, "a/b.parquet", "t", "", v.config, v.schemas)
    assert "must not overlap" in S.round_invalid([e, e2])


def test_check_file_with_the_magic_computed_while_writing_reads_no_byte_again(tmp_path,
                                                                             monkeypatch):
    """magic_from_write: the caller's CRC covers the bytes it wrote, so the file is not read
    again for a CRC (one pass); its size, footer and key columns are still checked."""
    v = Vnode(str(tmp_path), CFG)
    full = S.confined_incoming(v.path, "a/b.parquet")
    write_round_file(full, origin_rows(3), ORIGIN_COLUMNS)
    _, want = S.check_file(full, "a/b.parquet", "t", "", v.config, v.schemas)
    passes = []
    real = S.file_crc_magic
    monkeypatch.setattr(S, "file_crc_magic", lambda fd: passes.append(fd) or real(fd))
    reason, e = S.check_file(full, "a/b.parquet", "t", "", v.config, v.schemas, want.size,
                             want.crc32c, magic_from_write=True)
    assert reason is None and e == want and passes == []
    # The size is still the file's own: a file cut or grown since the write is refused.
    reason, _ = S.check_file(full, "a/b.parquet", "t", "", v.config, v.schemas, want.size + 1,
                             want.crc32c, magic_from_write=True)
    assert reason == f"a/b.parquet: {want.size} bytes, the producer says {want.size + 1}"
    assert passes == []
    # Without it, a claimed magic other than the bytes' is refused (the one reread).
    reason, _ = S.check_file(full, "a/b.parquet", "t", "", v.config, v.schemas, want.size,
                             want.crc32c ^ 1)
    assert "magic (CRC-32C)" in reason and len(passes) == 1
    # The footer is still read: bytes that are not Parquet are refused.
    with open(full, "r+b") as fh:
        fh.seek(want.size - 4)
        fh.write(b"XXXX")
    reason, _ = S.check_file(full, "a/b.parquet", "t", "", v.config, v.schemas, want.size,
                             want.crc32c, magic_from_write=True)
    assert "not a readable Parquet file" in reason and len(passes) == 1
    with pytest.raises(ValueError, match="magic_from_write"):
        S.check_file(full, "a/b.parquet", "t", "", v.config, v.schemas, magic_from_write=True)


def test_a_producer_that_checksummed_while_writing_is_not_read_again(tmp_path, monkeypatch):
    """IngestFile.crc_on_write (the master's check_files): needs a size and a crc32c; a file
    carrying it is checked without a CRC pass, one without it with one."""
    from vrepl.errors import IngestFileError
    from vrepl.node.ingestcheck import IngestFile, check_files, request_invalid
    v = Vnode(str(tmp_path), CFG)
    write_round_file(S.confined_incoming(v.path, "a.parquet"), origin_rows(3), ORIGIN_COLUMNS)
    write_round_file(S.confined_incoming(v.path, "b.parquet"), origin_rows(3, ts0=5_000),
                     ORIGIN_COLUMNS)
    (ea, eb), _ = check_files(v.path, [IngestFile("a.parquet", "t"), IngestFile("b.parquet", "t")],
                              v.config, v.schemas)
    assert "crc_on_write needs a size and a crc32c" in request_invalid(
        [IngestFile("a.parquet", "t", crc_on_write=True)], "load", {})
    assert request_invalid([IngestFile("a.parquet", "t", "", ea.size, ea.crc32c, True)],
                           "load", {}) is None
    passes = []
    real = S.file_crc_magic
    monkeypatch.setattr(S, "file_crc_magic", lambda fd: passes.append(fd) or real(fd))
    got, _ = check_files(v.path, [IngestFile("a.parquet", "t", "", ea.size, ea.crc32c, True),
                                  IngestFile("b.parquet", "t", "", eb.size, eb.crc32c)],
                         v.config, v.schemas)
    assert got == [ea, eb] and len(passes) == 1         # b's only
    with pytest.raises(IngestFileError, match="magic"):
        check_files(v.path, [IngestFile("b.parquet", "t", "", eb.size, eb.crc32c ^ 1)],
                    v.config, v.schemas)


# -- apply at commit, rank rule ---------------------------------------------------------------

def test_round_is_invisible_until_its_version_is_committed_then_ranks_by_it(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    wal = open_wal(v.path)
    v1 = write(v, wal, [("t", 0, {"x": -1, "tag": "w"}), ("t", 1, {"x": -1, "tag": "w"})])
    iv, _ = ingest(v, wal, [("t", origin_rows(6))])          # ts 0..5, origin v1000..
    v3 = write(v, wal, [("t", 2, {"x": 99, "tag": "later"})])
    assert (v1, iv, v3) == (1, 2, 3)
    assert v.get_version() == 3 and v.pending_ingests()[0].staged
    # Not committed: the round stays staged, nothing of it is visible, and a flush limit
    # at or above it cannot archive past it while it is not applied.
    assert v.flush_due(up_to_version=1, now=1e12) is not None     # age: rows of v1 are due
    v.flush(None, 1)
    assert v.archived_version == 1
    assert xs(v.query("t", 0, 10)) == [(0, -1, "w"), (1, -1, "w"), (2, 99, "later")]
    # Committed: due at once; one manifest commit adds the file at archived_version 2.
    assert "ingested files at v2" in v.flush_due(up_to_version=2)
    v.flush(None, 2)
    assert v.archived_version == 2 and not v.pending_ingests()
    got = v.query("t", 0, 10)
    # ts 0, 1: the round (rank 2) beats the write at v1; ts 2: v3 beats the round.
    assert xs(got) == [(0, 0, "o"), (1, 1, "o"), (2, 99, "later"), (3, 3, "o"), (4, 4, "o"),
                       (5, 5, "o")]
    # Ingested rows keep their origin's versions and epochs.
    assert [(r["_version"], r["_epoch"]) for r in got[:2]] == [(1000, 7), (1001, 7)]
    m = v._store.manifest
    (ing,) = [f for f in m.files if f.ingest_version]
    assert (ing.ingest_version, ing.origin, ing.min_version) == (2, "dc1/vg3", 1000)
    assert ing.name.endswith("-i2-0.parquet")
    doc = json.load(open(os.path.join(v.path, MANIFEST_NAME)))
    assert [f.get("ingest_version") for f in doc["files"]].count(2) == 1
    assert leftovers(v.path) == []           # the staged copy went after the commit
    # Later flushes merge only their own files; the ranks still hold.
    write(v, wal, [("t", 3, {"x": 77, "tag": "later"}), ("t", 1, {"x": 55, "tag": "later"})])
    v.flush(None, 4)
    assert xs(v.query("t", 0, 10))[:4] == [(0, 0, "o"), (1, 55, "later"), (2, 99, "later"),
                                          (3, 77, "later")]
    assert sum(1 for f in v._store.manifest.files if f.ingest_version) == 1
    assert v.verify_files() == []
    v.close(None, 4)
    # Reopened: the same rows from the manifest alone.
    v2 = Vnode(v.path, CFG)
    v2.recover()
    assert xs(v2.query("t", 0, 10))[:4] == [(0, 0, "o"), (1, 55, "later"), (2, 99, "later"),
                                           (3, 77, "later")]


def test_an_applied_round_leaves_the_page_cache(tmp_path):
    """The master wrote the round's bytes through the page cache; once the manifest names
    them they are read again only by queries, so the apply drops them (vrepl/directio.py
    drop_cached). The rows stay readable, from disk."""
    if not page_cache_drops(str(tmp_path)):
        pytest.skip("this file system keeps a file's pages (tmpfs)")
    v = Vnode(str(tmp_path), CFG)
    wal = open_wal(v.path)
    iv, _ = ingest(v, wal, [("t", origin_rows(2000)), ("u", origin_rows(10))])
    (p,) = v.pending_ingests()
    staged = [S.abspath(v.path, p.record.staged_name(k)) for k in range(2)]
    assert all(resident_pages(f)[0] > 0 for f in staged)    # written and fsynced: cached
    v.flush(None, iv)
    archived = [v._store.abspath(f.name) for f in v._store.manifest.files if f.ingest_version]
    assert len(archived) == 2
    assert [resident_pages(f)[0] for f in archived] == [0, 0]
    assert xs(v.query("t", 0, 3)) == [(0, 0, "o"), (1, 1, "o"), (2, 2, "o")]
    v.close(None, iv)


def test_a_limited_query_is_the_first_rows_of_the_whole_answer(tmp_path):
    """`query(limit=L)` cuts each source (file, round, memtable) to its first L rows before
    the merge: the answer must be the unlimited answer's first L rows, whichever source
    holds them and whichever wins a ts."""
    rng = random.Random(5)
    v = Vnode(str(tmp_path), CFG)
    wal = open_wal(v.path)
    for _ in range(3):      # flushed writes: files of their own, overlapping in ts
        write(v, wal, [("t", rng.randrange(200), {"x": rng.randrange(99), "tag": "w"})
                       for _ in range(40)])
        v.flush(None, v.get_version())
    iv, _ = ingest(v, wal, [("t", origin_rows(30, ts0=rng.randrange(50), step=3))])
    v.flush(None, iv)                                   # an ingested file, ranked by iv
    write(v, wal, [("t", rng.randrange(200), {"x": -1, "tag": "m"}) for _ in range(30)])
    whole = v.query("t", 0, 1 << 40)
    assert len(whole) > 60 and {r["tag"] for r in whole} == {"w", "o", "m"}
    for limit in (1, 2, 7, 30, 59, len(whole), len(whole) + 5):
        assert v.query("t", 0, 1 << 40, limit=limit) == whole[:limit], limit
    start = whole[10]["ts"]
    inner = v.query("t", start, 1 << 40)
    assert v.query("t", start, 1 << 40, limit=9) == inner[:9]
    v.close(None, v.get_version())


def test_unstaged_round_holds_the_archive_below_it(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    wal = open_wal(v.path)
    write(v, wal, [("t", 100, {"x": 1})])
    payload = make_round(v, [("t", origin_rows(3))])
    rec = S.decode_ingest_payload(payload)
    # Slave's view: the record arrives but its files are not staged here.
    os.rename(S.staged_round_path(v.path, rec.round), str(tmp_path / "elsewhere"))
    iv = wal.append(payload, 1)
    v.write_to_cache(iv, 1, payload)
    write(v, wal, [("t", 200, {"x": 2})])
    assert not v.pending_ingests()[0].staged
    assert [r["ts"] for r in v.query("t", 0, 1000)] == [100, 200]   # not staged: not read
    v.flush(None, 3)
    assert v.archived_version == 1        # only below the round
    assert v.flush_due(up_to_version=3, now=1e12) is None
    with pytest.raises(VnodeError, match="not staged"):
        v.flush()                          # a tool owning the whole log must have it all
    os.rename(str(tmp_path / "elsewhere"), S.staged_round_path(v.path, rec.round))
    assert v.ingest_staged(iv)
    v.flush(None, 3)
    assert v.archived_version == 3
    assert [r["ts"] for r in v.query("t", 0, 1000)] == [0, 1, 2, 100, 200]


def test_a_round_held_below_an_open_transaction_is_read_before_it_is_archived(tmp_path):
    """A flush never passes the begin of an open transaction (docs/transactions.md §4), so
    a round applied after that begin waits in the staging area until the transaction
    ends. Reads show it meanwhile, as its flush will archive it: its files (ranked by its
    version), what it removes gone; the table list counts it; a read racing the flush
    that archives it and removes the staged copies snapshots again."""
    v = Vnode(str(tmp_path), CFG)
    wal = open_wal(v.path)
    w1 = write(v, wal, [("t", 0, {"x": -1, "tag": "w"})])
    payload = encode_txn_payload(TxnRecord("begin", w1 + 1, label="slow", timeout_ms=60_000, at_ms=0))
    tv = wal.append(payload, 1)
    assert v.apply_txn(tv, 1, payload).effect == "begun"
    iv, _ = ingest(v, wal, [("t", origin_rows(3)), ("u", origin_rows(2))])
    v.flush(None, iv)
    assert v.archived_version == w1 and v.archive_held_by(iv) == tv
    assert xs(v.query("t", 0, 10)) == [(0, 0, "o"), (1, 1, "o"), (2, 2, "o")]
    assert v.has_table("u") and xs(v.query("u", 0, 10)) == [(0, 0, "o"), (1, 1, "o")]
    assert {t["name"]: (t["archived_rows"], t["memtable_rows"]) for t in v.tables()} == {"t": (1, 3), "u": (0, 2)}
    # The flush that archives it, between a read's snapshot and its file reads.
    real = v._store.read
    raced, seen = [], []

    def read_racing_the_flush(f):
        seen.append(f.name)
        if not raced:
            raced.append(f.name)
            payload = encode_txn_payload(TxnRecord("abort", tv, at_ms=1, reason="client"))
            c = wal.append(payload, 1)
            v.apply_txn(c, 1, payload)
            v.flush(None, c)
        return real(f)

    v._store.read = read_racing_the_flush
    assert xs(v.query("t", 0, 10)) == [(0, 0, "o"), (1, 1, "o"), (2, 2, "o")]
    # The snapshot named the staged copy; the flush removed it before it was read.
    assert raced and any(n.startswith("ingest/staged/") for n in seen)
    assert v.archive_held_by(iv) is None and v.archived_version >= iv and leftovers(v.path) == []


def test_schema_conflict_of_a_round(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    wal = open_wal(v.path)
    payload = make_round(v, [("t", origin_rows(2))])      # t.x int, t.tag str
    v.write_to_cache(wal.append(payload, 1), 1, payload)
    # Another replica's view: t.tag is already an int column there.
    other = Vnode(str(tmp_path / "o"), CFG)
    write(other, open_wal(other.path), [("t", 50, {"tag": 5})])
    with pytest.raises(ApplyError, match="'tag' of table 't' is int"):
        other.write_to_cache(2, 1, payload)
    assert other.get_version() == 1
    rec = S.decode_ingest_payload(payload)
    assert "cannot change" in other.reserve_columns(rec)


def test_rebuild_keeps_staged_rounds_open_cleans_them(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    wal = open_wal(v.path)
    write(v, wal, [("t", 1, {"x": 1})])
    kept = make_round(v, [("t", origin_rows(2))])
    v.write_to_cache(wal.append(kept, 1), 1, kept)
    unforwarded = S.decode_ingest_payload(make_round(v, [("t", origin_rows(2, ts0=50))]))
    os.makedirs(S.incoming_path(v.path), exist_ok=True)
    open(os.path.join(S.incoming_path(v.path), "junk"), "w").write("x")
    v.rebuild()
    assert os.path.isdir(S.staged_round_path(v.path, unforwarded.round))
    assert v.pending_ingests()[0].staged
    wal.close()
    v2 = Vnode(v.path, CFG)
    v2.recover()
    assert not os.path.exists(S.staged_round_path(v.path, unforwarded.round))
    assert os.listdir(S.incoming_path(v.path)) == []
    assert [p.version for p in v2.pending_ingests()] == [2] and v2.pending_ingests()[0].staged


# -- a crash at every step of the apply ---------------------------------------------------------

APPLY_POINTS = sorted(killpoints.registered("ingest.apply."))


def test_apply_kill_points_are_registered():
    assert APPLY_POINTS == ["ingest.apply.after_cleanup", "ingest.apply.after_flush_files",
                            "ingest.apply.after_link", "ingest.apply.after_manifest"]


def _scenario(path):
    v = Vnode(path, CFG)
    wal = open_wal(path)
    write(v, wal, [("t", 0, {"x": -1, "tag": "w"}), ("t", 9, {"x": -9, "tag": "w"})])
    ingest(v, wal, [("t", origin_rows(4)), ("u", origin_rows(3, ts0=5))])
    write(v, wal, [("t", 1, {"x": 50, "tag": "later"})])
    return v, wal


def _state(v):
    return {t: xs(v.query(t, -10, 100)) for t in ("t", "u")}


@pytest.mark.parametrize("point", APPLY_POINTS)
def test_crash_at_each_apply_step_converges(tmp_path, point):
    ref, _ = _scenario(str(tmp_path / "ref"))
    ref.flush(None, 3)
    expect = _state(ref)
    assert expect["t"] == [(0, 0, "o"), (1, 50, "later"), (2, 2, "o"), (3, 3, "o"),
                           (9, -9, "w")]
    path = str(tmp_path / "crash")
    v, wal = _scenario(path)
    killpoints.arm(point, lambda: (_ for _ in ()).throw(SimulatedCrash(point)))
    try:
        with pytest.raises(SimulatedCrash):
            v.flush(None, 3)
    finally:
        killpoints.disarm()
    wal.close()
    # The process died here: a new vnode recovers from the disk and the WAL.
    v2 = Vnode(path, CFG)
    v2.recover()
    before = point in ("ingest.apply.after_flush_files", "ingest.apply.after_link")
    assert v2.archived_version == (0 if before else 2)
    assert [p.version for p in v2.pending_ingests()] == ([2] if before else [])
    # No orphan in data/: every Parquet file there is one the manifest names.
    named = {f.name for f in v2._store.manifest.files}
    on_disk = {os.path.relpath(os.path.join(r, n), path).replace(os.sep, "/")
               for r, _, ns in os.walk(os.path.join(path, "data")) for n in ns
               if n.endswith(".parquet")}
    assert on_disk == named
    v2.flush(None, 3)
    assert _state(v2) == expect
    assert leftovers(path) == []
    assert v2.verify_files() == []
