"""Reference vnode storage (vrepl/vnode, docs/vnode.md): later version wins in the memtable
and across flushes, archived files with contiguous indexes and a CRC-32C magic, the
manifest, the getFileInfo / getWalInfo rules of seed 数据恢复流程 (rules 1-6), queries that
merge memtable and files, crash recovery from the WAL, and corrupt files named in errors."""
from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vrepl._core.crc32c import crc32c
from vrepl.vnode import (ApplyError, ArchiveError, PayloadError, Vnode, VnodeClosedError,
                         VnodeConfig, VnodeError, file_magic)
from vrepl.vnode.files import MANIFEST_NAME, ArchiveStore
from vrepl.wal import WalOptions, WalWriter

pytestmark = pytest.mark.timeout(60)

DAY_MS = 86_400_000
CFG = VnodeConfig(file_span_ms=DAY_MS)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def write(v: Vnode, wal: WalWriter | None, rows, epoch: int = 1) -> int:
    """The master's write path: validate, append to the WAL, apply."""
    reason, payload = v.prepare_write(rows)
    assert reason is None, reason
    if wal is None:
        version = v.get_version() + 1
    else:
        version = wal.append(payload, epoch)
    assert v.write_to_cache(version, epoch, payload)
    return version


def values(rows, col="x"):
    return [(r["ts"], r[col]) for r in rows]


def open_wal(path, **kw) -> WalWriter:
    return WalWriter(os.path.join(path, "wal"), WalOptions(durability="fsync", **kw))


# -- later version wins -----------------------------------------------------------------------

def test_same_ts_later_version_wins_in_memtable(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    write(v, None, [("t", 5, {"x": 1}), ("t", 6, {"x": 1})])
    write(v, None, [("t", 5, {"x": 2})])
    # Within one batch the later row wins.
    write(v, None, [("t", 7, {"x": 3}), ("t", 7, {"x": 4})])
    rows = v.query("t", 0, 100)
    assert values(rows) == [(5, 2), (6, 1), (7, 4)]
    assert [r["_version"] for r in rows] == [2, 1, 3]


def test_same_ts_later_version_wins_across_flushes(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    write(v, None, [("t", 5, {"x": 1}), ("t", 6, {"x": 1})])
    v.flush()
    write(v, None, [("t", 5, {"x": 2})])
    assert values(v.query("t", 0, 100)) == [(5, 2), (6, 1)]   # memtable over file
    v.flush()
    assert values(v.query("t", 0, 100)) == [(5, 2), (6, 1)]   # merged file
    (f,) = v._store.manifest.files
    tbl = pq.read_table(os.path.join(tmp_path, f.name))
    assert tbl.num_rows == 2
    assert tbl.column("_version").to_pylist() == [2, 1]
    write(v, None, [("t", 6, {"x": 3})])
    v.flush()
    assert values(v.query("t", 0, 100)) == [(5, 2), (6, 3)]


def test_write_to_cache_is_idempotent(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    _, p1 = v.prepare_write([("t", 5, {"x": 1})])
    _, p2 = v.prepare_write([("t", 5, {"x": 2})])
    assert v.write_to_cache(1, 1, p1) is True
    assert v.write_to_cache(2, 1, p2) is True
    assert v.write_to_cache(1, 1, p1) is False   # a re-forward of v1 changes nothing
    assert values(v.query("t", 0, 10)) == [(5, 2)]
    v.flush()
    assert v.write_to_cache(2, 1, p2) is False   # archived versions too
    assert v.get_version() == 2


def test_apply_type_conflict_names_the_version_and_applies_nothing(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    write(v, None, [("t", 5, {"x": 1})])
    bad = b"VRB\x01" + json.dumps([["t", 6, {"y": 1}], ["t", 7, {"x": "s"}]]).encode()
    with pytest.raises(ApplyError, match="version 2: cannot apply: .*'x' of table 't' is int"):
        v.write_to_cache(2, 1, bad)
    assert v.get_version() == 1 and "y" not in v.schemas["t"]
    with pytest.raises(PayloadError, match="version 2: malformed row payload"):
        v.write_to_cache(2, 1, b"garbage")


# -- flush, files, manifest -------------------------------------------------------------------

def three_tables(v, wal=None):
    write(v, wal, [("a", 10, {"x": 1}), ("a", DAY_MS + 10, {"x": 2}),
                   ("b", 20, {"x": 3, "s": "x"}), ("c", 3 * DAY_MS, {"x": 4.5})])


def test_flush_writes_files_with_contiguous_indexes_and_crc_magic(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    three_tables(v)
    write(v, None, [("a", 11, {"x": 7})], epoch=3)
    written = v.flush()
    assert len(written) == 4
    doc = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert doc["archived_version"] == 2 and doc["archived_epoch"] == 3
    assert doc["schemas"] == {"a": {"x": "int"}, "b": {"x": "int", "s": "str"},
                              "c": {"x": "float"}}
    files = doc["files"]
    assert [f["index"] for f in files] == [0, 1, 2, 3]
    # Ordered oldest time range first, then by table.
    assert [(f["bucket"], f["table"]) for f in files] == [(0, "a"), (0, "b"), (1, "a"), (3, "c")]
    for f in files:
        assert not os.path.isabs(f["name"]) and f["name"].startswith("data/")
        data = (tmp_path / f["name"]).read_bytes()
        assert f["size"] == len(data)
        assert f["magic"] == crc32c(data) != 0
    a0 = files[0]
    assert (a0["ts_min"], a0["ts_max"], a0["min_version"], a0["max_version"], a0["rows"]) \
        == (10, 11, 1, 2, 2)
    tbl = pq.read_table(tmp_path / a0["name"])
    assert tbl.column_names == ["ts", "_version", "_epoch", "x"]
    assert tbl.schema.field("ts").type == pa.timestamp("ms")
    assert tbl.column("_version").to_pylist() == [1, 2]
    assert tbl.column("_epoch").to_pylist() == [1, 3]
    # docs/vnode.md §4: zstd everywhere, ts delta-encoded (sorted and unique), the other
    # columns dictionary-encoded.
    col = {c.path_in_schema: c for c in
           (pq.ParquetFile(tmp_path / a0["name"]).metadata.row_group(0).column(i) for i in range(4))}
    assert {c.compression for c in col.values()} == {"ZSTD"}
    assert "DELTA_BINARY_PACKED" in col["ts"].encodings
    assert "RLE_DICTIONARY" not in col["ts"].encodings
    assert "RLE_DICTIONARY" in col["x"].encodings
    assert not [p for p in tmp_path.rglob("*.tmp")]
    assert v.flush() == []   # nothing new


def test_rewriting_a_file_set_keeps_indexes_contiguous(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    three_tables(v)
    v.flush()
    before = {f.name for f in v._store.manifest.files}
    write(v, None, [("a", 12, {"x": 9})])
    (new,) = v.flush()
    after = v._store.manifest.files
    assert len(after) == 4 and new.name not in before
    assert {f.name for f in after} == before - {"data/a/b0-v1.parquet"} | {new.name}
    assert not (tmp_path / "data/a/b0-v1.parquet").exists()   # superseded file removed
    infos = [v.get_file_info(i) for i in range(6)]
    assert [i.index for i in infos[:5]] == [0, 1, 2, 3, 4]
    assert infos[4].name == MANIFEST_NAME and infos[5].magic == 0
    assert values(v.query("a", 0, 100)) == [(10, 1), (12, 9)]


def test_file_magic_is_never_zero():
    assert crc32c(b"") == 0
    assert file_magic(b"") == 1
    assert file_magic(b"abc") == crc32c(b"abc")


def test_crash_before_manifest_commit_keeps_the_old_state(tmp_path, monkeypatch):
    v = Vnode(str(tmp_path), CFG)
    wal = open_wal(str(tmp_path))
    write(v, wal, [("a", 10, {"x": 1})])
    v.flush(wal)
    write(v, wal, [("a", 10, {"x": 2}), ("b", 10, {"x": 3})])
    manifest_before = (tmp_path / "data/manifest.json").read_bytes()

    def crash(self, manifest, superseded=()):
        raise OSError("simulated crash before the manifest rename")
    monkeypatch.setattr(ArchiveStore, "commit", crash)
    with pytest.raises(OSError, match="simulated"):
        v.flush(wal)
    monkeypatch.undo()
    assert (tmp_path / "data/manifest.json").read_bytes() == manifest_before
    assert (tmp_path / "data/b/b0-v2.parquet").exists()   # the orphan the crash left
    del v
    v2 = Vnode(str(tmp_path), CFG)
    assert not (tmp_path / "data/b/b0-v2.parquet").exists()   # removed on load
    assert v2.archived_version == 1
    assert v2.recover() == 1
    assert values(v2.query("a", 0, 100)) == [(10, 2)]
    assert values(v2.query("b", 0, 100)) == [(10, 3)]


def test_flush_due_by_size_rows_and_age(tmp_path):
    clock = Clock()
    v = Vnode(str(tmp_path), VnodeConfig(max_memtable_rows=3, max_memtable_age_ms=500,
                                         max_memtable_bytes=10_000), clock=clock)
    assert v.flush_due() is None
    write(v, None, [("t", 1, {"x": 1})])
    assert v.flush_due() is None
    clock.t += 0.6
    assert "max_memtable_age_ms" in v.flush_due()
    assert len(v.maybe_flush()) == 1 and v.flush_due() is None
    write(v, None, [("t", i, {"x": i}) for i in range(2, 5)])
    assert "max_memtable_rows" in v.flush_due()
    v.flush()
    write(v, None, [("t", 9, {"s": "y" * 10_000})])
    assert "max_memtable_bytes" in v.flush_due()


def test_flush_recycles_the_wal_below_the_archived_version(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    wal = open_wal(str(tmp_path), max_file_bytes=1024)
    for i in range(40):
        write(v, wal, [("t", i, {"x": i, "s": "v" * 40})])
    files_before = len(wal.files)
    assert files_before > 3
    v.flush(wal)
    assert v.archived_version == 40
    assert len(wal.files) < files_before
    assert wal.files[0].first_version <= v.archived_version + 1
    info = v.get_wal_info(0)
    assert info.index == wal.files[0].index and info.name.startswith("wal/")
    wal.close()


# -- getFileInfo / getWalInfo (seed 数据恢复流程 rules 4-6) ---------------------------------

def test_get_file_info_rules(tmp_path):
    v = Vnode(str(tmp_path / "m"), CFG)
    # No files at all: magic 0 at index 0 (and no manifest yet).
    assert v.get_file_info(0) == (v.get_file_info(0).__class__(0, "", 0, 0))
    three_tables(v)
    v.flush()
    files = v._store.manifest.files
    n = len(files)
    # Master: no name -> the file at the index; index 0 is the oldest.
    for i, f in enumerate(files):
        info = v.get_file_info(i)
        assert (info.index, info.name, info.size, info.magic) == (i, f.name, f.size, f.magic)
    assert v.get_file_info(0).name == "data/a/b0-v1.parquet"
    # Then the manifest, then magic 0: no more files.
    mb = (tmp_path / "m/data/manifest.json").read_bytes()
    assert v.get_file_info(n) == v.get_file_info(n).__class__(n, MANIFEST_NAME, len(mb),
                                                                crc32c(mb))
    assert v.get_file_info(n + 1).magic == 0 and v.get_file_info(n + 1).name == ""
    assert v.get_file_info(-1).magic == 0
    # Slave: with a name -> this node's file of that name, magic 0 if absent.
    slave = Vnode(str(tmp_path / "s"), CFG)
    assert slave.get_file_info(0, files[0].name).magic == 0
    for i in range(n + 1):
        m = v.get_file_info(i)
        src, dst = tmp_path / "m" / m.name, tmp_path / "s" / m.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        got = slave.get_file_info(m.index, m.name)
        assert (got.name, got.size, got.magic) == (m.name, m.size, m.magic)
    # A name that is not a file this vnode could own is an error (the sync layer's -1).
    for bad in ("../etc/passwd", "/etc/passwd", "data/../x.parquet", "data/a/b/c.parquet",
                "data/a%b/x.parquet", "wal/000000000000.wal"):
        with pytest.raises(ArchiveError):
            slave.get_file_info(0, bad)
    # The restored slave reloads the manifest and holds the master's archived rows.
    slave.notify_file_synced()
    assert slave.get_version() == v.get_version() == 1
    for t in "abc":
        assert slave.query(t, 0, 10 * DAY_MS) == v.query(t, 0, 10 * DAY_MS)
    assert [slave.get_file_info(i) for i in range(n + 2)] == \
        [v.get_file_info(i) for i in range(n + 2)]


def test_get_wal_info_rules(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    assert v.get_wal_info(0).name == ""   # no WAL directory: no WAL file
    wal = open_wal(str(tmp_path), max_file_bytes=512)
    for i in range(20):
        write(v, wal, [("t", i, {"s": "w" * 60})])
    wal.recycle(5)
    idx = [f.index for f in wal.files]
    first = v.get_wal_info(0)
    assert (first.more, first.index, first.name) == (1, idx[0], f"wal/{idx[0]:012d}.wal")
    assert v.get_wal_info(idx[1]).more == 1
    last = v.get_wal_info(idx[-1])
    assert (last.more, last.index) == (0, idx[-1])
    assert v.get_wal_info(idx[-1] + 1).name == ""
    wal.close()


# -- query ------------------------------------------------------------------------------------

def test_query_merges_memtable_and_files(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    write(v, None, [("t", 0, {"x": 0}), ("t", DAY_MS - 1, {"x": 1}), ("t", DAY_MS, {"x": 2}),
                    ("t", 2 * DAY_MS + 5, {"x": 3})])
    v.flush()
    # A later column; an overwrite in the memtable; a new row between archived ones.
    write(v, None, [("t", DAY_MS, {"x": 20, "y": 1.5}), ("t", DAY_MS + 1, {"x": 21, "y": 2})])
    rows = v.query("t", 0, 3 * DAY_MS)
    assert [(r["ts"], r["x"], r["y"], r["_version"]) for r in rows] == [
        (0, 0, None, 1), (DAY_MS - 1, 1, None, 1), (DAY_MS, 20, 1.5, 2),
        (DAY_MS + 1, 21, 2.0, 2), (2 * DAY_MS + 5, 3, None, 1)]
    assert type(rows[3]["y"]) is float   # an int stored in a float column reads as float
    # [start, end): end excluded, across bucket edges.
    assert [r["ts"] for r in v.query("t", DAY_MS - 1, DAY_MS + 1)] == [DAY_MS - 1, DAY_MS]
    assert v.query("t", 5, 5) == [] and v.query("nosuch", 0, 10) == []
    v.flush()
    assert v.query("t", 0, 3 * DAY_MS) == rows
    with pytest.raises(VnodeError, match="table name '../t'"):
        v.query("../t", 0, 1)


def test_microsecond_precision(tmp_path):
    v = Vnode(str(tmp_path), VnodeConfig(precision="us", file_span_ms=1))
    write(v, None, [("t", 999, {"x": 1}), ("t", 1000, {"x": 2})])
    v.flush()
    assert [f.bucket for f in v._store.manifest.files] == [0, 1]
    tbl = pq.read_table(tmp_path / v._store.manifest.files[0].name)
    assert tbl.schema.field("ts").type == pa.timestamp("us")
    assert values(v.query("t", 0, 2000)) == [(999, 1), (1000, 2)]
    v.close()
    with pytest.raises(ArchiveError, match="precision 'us'.*cannot change"):
        Vnode(str(tmp_path), VnodeConfig(precision="ms"))


# -- corruption -------------------------------------------------------------------------------

def test_corrupt_parquet_file_is_named_in_the_error(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    three_tables(v)
    v.flush()
    f = v._store.manifest.files[0]
    path = tmp_path / f.name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(ArchiveError) as exc:
        v.query(f.table, 0, DAY_MS)
    assert str(path) in str(exc.value) and "corrupt archived file: magic" in str(exc.value)
    path.write_bytes(bytes(data[:-10]))
    with pytest.raises(ArchiveError, match=f"{path}: corrupt archived file: .* bytes"):
        v.query(f.table, 0, DAY_MS)
    assert len(v.verify_files()) == 1 and str(path) in v.verify_files()[0]
    # Bytes that pass the magic but are not Parquet: the parser's error, naming the file.
    with pytest.raises(ArchiveError, match=f"{path}: corrupt Parquet file"):
        v._store.parse(b"PAR1 not really parquet PAR1", str(path))


@pytest.mark.parametrize("content,words", [
    (b"{not json", "bad manifest: not JSON"),
    (b'{"format": 9}', "unknown format 9"),
    (b'{"format": 1}', "missing or malformed field"),
])
def test_corrupt_manifest_is_named_in_the_error(tmp_path, content, words):
    (tmp_path / "data").mkdir()
    (tmp_path / "data/manifest.json").write_bytes(content)
    with pytest.raises(ArchiveError) as exc:
        Vnode(str(tmp_path), CFG)
    assert "manifest.json" in str(exc.value) and words in str(exc.value)


def test_manifest_with_unsafe_file_name_is_refused(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    three_tables(v)
    v.close()
    p = tmp_path / "data/manifest.json"
    doc = json.loads(p.read_text())
    doc["files"][0]["name"] = "../../etc/passwd"
    p.write_text(json.dumps(doc))
    with pytest.raises(ArchiveError, match="bad manifest: file name"):
        Vnode(str(tmp_path), CFG)


# -- recovery ---------------------------------------------------------------------------------

def test_recovery_after_a_crash(tmp_path):
    path = str(tmp_path)
    v = Vnode(path, CFG)
    wal = open_wal(path, max_file_bytes=2048)
    for i in range(30):
        write(v, wal, [("a", i * 1000, {"x": i}), ("b", i, {"s": f"s{i}", "f": i / 2})],
                    epoch=1 + i // 10)
    v.flush(wal)
    archived = v.archived_version
    for i in range(25, 45):   # overwrite some archived rows, add new ones
        write(v, wal, [("a", i * 1000, {"x": -i}), ("c", i, {"b": i % 2 == 0})], epoch=5)
    expected = {t: v.query(t, 0, 10 * DAY_MS) for t in "abc"}
    version = v.get_version()
    wal.close()
    del v   # crash: no close(), the memtable is lost

    v2 = Vnode(path, CFG)
    assert v2.get_version() == archived == 30
    assert v2.recover() == version - archived
    assert v2.get_version() == version
    assert {t: v2.query(t, 0, 10 * DAY_MS) for t in "abc"} == expected
    assert v2.recover() == 0   # replaying again changes nothing
    v2.close()
    v3 = Vnode(path, CFG)
    assert v3.archived_version == version and v3.recover() == 0
    assert {t: v3.query(t, 0, 10 * DAY_MS) for t in "abc"} == expected


def test_recovery_refuses_a_wal_gap(tmp_path):
    path = str(tmp_path)
    v = Vnode(path, CFG)
    wal = open_wal(path, max_file_bytes=512)
    for i in range(20):
        write(v, wal, [("t", i, {"s": "z" * 60})])
    wal.recycle(15)   # deletes records the files never received
    wal.close()
    del v
    with pytest.raises(VnodeError, match="versions 1\\.\\.\\d+ are lost"):
        Vnode(path, CFG).recover()


def test_recover_without_wal_and_closed_vnode(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    assert v.recover() == 0
    v.close()
    v.close()
    with pytest.raises(VnodeClosedError):
        v.write_to_cache(1, 1, b"")
    with pytest.raises(VnodeClosedError):
        v.query("t", 0, 1)


def test_callbacks_role_flow_control_and_confirmations(tmp_path):
    v = Vnode(str(tmp_path), VnodeConfig(max_confirmations=2))
    v.notify_role("master")
    v.notify_flow_control(1)
    v.confirm_forward(1, "ok")
    v.confirm_forward(2, "timed_out")
    assert v.wait_confirmed(2, 0.01) == "timed_out"
    v.confirm_forward(3, "ok")
    assert v.wait_confirmed(1, 0.01) is None      # the oldest was dropped (bounded)
    st = v.status()
    assert (st["role"], st["flow_control"], st["version"]) == ("master", 1, 0)


def test_rebuild_after_wal_truncation(tmp_path):
    """design.md §4.3: a follower's WAL truncated after a version; the vnode drops the
    versions above it by rebuilding from the manifest and the (truncated) WAL."""
    path = str(tmp_path)
    v = Vnode(path, CFG)
    wal = open_wal(path)
    write(v, wal, [("t", 1, {"x": 1})])
    v.flush(wal)
    write(v, wal, [("t", 1, {"x": 2}), ("t", 2, {"x": 2})])
    kept = values(v.query("t", 0, 10))
    write(v, wal, [("t", 1, {"x": 3}), ("t", 3, {"x": 3})])
    wal.close()
    # Simulate TruncateWalAfter(2): rewrite the WAL with versions 1..2 only.
    from vrepl.wal import read_records
    recs = read_records(os.path.join(path, "wal"))[:2]
    shutil.rmtree(os.path.join(path, "wal"))
    w2 = open_wal(path)
    for r in recs:
        w2.append(r.payload, r.epoch)
    w2.close()
    assert v.rebuild() == 1
    assert v.get_version() == 2 and values(v.query("t", 0, 10)) == kept
    # Truncated below the archived version: the vnode needs a restore.
    v.flush()
    shutil.rmtree(os.path.join(path, "wal"))
    w3 = open_wal(path)
    w3.append(recs[0].payload, 1)
    w3.close()
    with pytest.raises(VnodeError, match="needs a restore"):
        v.rebuild()
