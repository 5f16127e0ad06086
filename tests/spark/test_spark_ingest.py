"""`vrepl validate` with ingested files (docs/vnode.md §9.4, docs/validation.md): rows of an
ingested file carry their origin's versions and epochs, and compete by the version of the
record that ingested them. One vnode data path holds writes, a round ingested over them
(origin versions 1..n, far below the writes it must beat), a write after it, and a second
round still pending (in the WAL, staged, not archived). Replica 2 keeps all of it in its WAL
and staging area; replicas 1 and 3 archived everything up to the first round and the write
after it. The replicas hold the same state, so validation passes only if both paths rank
rows alike and the version and epoch rules leave the origins' versions alone; then planted
faults are found.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from sparkdata import SKIP
from vrepl.spark import read_vgroup, validate
from vrepl.testing.ingestfiles import ORIGIN_COLUMNS, origin_rows, write_round_file
from vrepl.vnode import Vnode, VnodeConfig
from vrepl.vnode import staging as S
from vrepl.wal import WalOptions, WalWriter

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(bool(SKIP), reason=str(SKIP))]

DAY_MS = 86_400_000
CFG = VnodeConfig(file_span_ms=DAY_MS)
T0 = 1_700_000_000_000 - 1_700_000_000_000 % DAY_MS      # a bucket's first ms


def _round(v: Vnode, wal: WalWriter, files: list[tuple[str, list]], tag: str
           ) -> tuple[int, str]:
    entries, srcs = [], []
    for i, (table, rows) in enumerate(files):
        name = f"{tag}/{i}.parquet"
        full = S.confined_incoming(v.path, name)
        write_round_file(full, rows, ORIGIN_COLUMNS)
        reason, e = S.check_file(full, name, table, "edge/vg9", v.config, v.schemas)
        assert reason is None, reason
        entries.append(e)
        srcs.append(full)
    rec = S.IngestRecord(S.new_round_id(), "test", {}, tuple(entries))
    assert v.reserve_columns(rec) is None
    S.stage_round(v.path, rec, srcs)
    payload = S.encode_ingest_payload(rec)
    version = wal.append(payload, 2)
    assert v.write_to_cache(version, 2, payload)
    return version, rec.round


def _write(v: Vnode, wal: WalWriter, rows) -> int:
    reason, payload = v.prepare_write(rows)
    assert reason is None, reason
    version = wal.append(payload, 2)
    assert v.write_to_cache(version, 2, payload)
    return version


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict:
    """The unflushed data path (WAL + staging) and what happened in it."""
    path = str(tmp_path_factory.mktemp("ingest") / "base")
    v = Vnode(path, CFG)
    wal = WalWriter(os.path.join(path, "wal"), WalOptions(durability="fsync"))
    w1 = _write(v, wal, [["ing", T0 + i, {"x": -1, "y": 0.5, "tag": "w1"}] for i in range(10)])
    r1, _ = _round(v, wal, [("ing", origin_rows(10, ts0=T0 + 5, version0=1, epoch=9, tag="r1"))],
                "r1")
    w2 = _write(v, wal, [["ing", T0 + 7, {"x": -2, "y": 1.5, "tag": "w2"}]])
    r2, r2_round = _round(v, wal, [("ing", origin_rows(3, ts0=T0 + 12, version0=1, epoch=9, tag="r2"))],
                "r2")
    wal.close()
    v.close(up_to_version=0)              # nothing archived: all of it in the WAL
    return {"path": path, "w1": w1, "r1": r1, "w2": w2, "r2": r2, "r2_round": r2_round}


def _replicas(base: dict, root: str) -> list[str]:
    out = []
    for i in (1, 2, 3):
        dst = os.path.join(root, f"n{i}")
        shutil.copytree(base["path"], dst)
        if i != 2:      # archive up to the write after the first round; the second waits
            v = Vnode(dst, CFG)
            v.recover()
            v.close(up_to_version=base["w2"])
            assert v.archived_version == base["w2"]
        out.append(dst)
    return out


def _manifest(path: str) -> dict:
    with open(os.path.join(path, "data", "manifest.json")) as fh:
        return json.load(fh)


def test_the_vnode_state_is_what_the_ranks_say(base, tmp_path):
    """The premise the validation cases rely on, from the vnode itself: once everything in
    the log is archived (a pending round is invisible to queries until then), every
    replica answers these rows."""
    reps = _replicas(base, str(tmp_path))
    for p in reps:
        v = Vnode(p, CFG)
        v.recover()
        v.flush()
        got = {r["ts"] - T0: r["tag"] for r in v.query("ing", T0, T0 + DAY_MS)}
        v.close(up_to_version=0)
        assert got == {**{i: "w1" for i in range(5)}, **{i: "r1" for i in range(5, 12)},
                       7: "w2", 12: "r2", 13: "r2", 14: "r2"}, p
    assert sum(1 for f in _manifest(reps[0])["files"] if f.get("ingest_version")) == 2


def test_replicas_with_ingested_files_validate_clean_and_faults_are_found(base, tmp_path, spark):
    clean = _replicas(base, str(tmp_path / "clean"))
    unstaged = _replicas(base, str(tmp_path / "unstaged"))
    # Replica 2 (nothing archived) lost the staged file of the second round.
    shutil.rmtree(os.path.join(unstaged[1], "ingest", "staged", base["r2_round"]))
    bumped = _replicas(base, str(tmp_path / "bumped"))
    m = _manifest(bumped[2])
    (entry,) = [f for f in m["files"] if f.get("ingest_version")]
    entry["ingest_version"] = m["archived_version"] + 5
    with open(os.path.join(bumped[2], "data", "manifest.json"), "w") as fh:
        json.dump(m, fh)

    report = validate({1: clean, 2: unstaged, 3: bumped}, spark=spark, bucket_ms=DAY_MS)

    def kinds(vg: int) -> set[tuple[str, str, int]]:
        return {(name, f.kind, f.replica) for name, c in report.checks.items()
                for f in c.findings if f.vgroup == vg}
    assert kinds(1) == set(), [f.describe() for c in report.checks.values() for f in c.findings
                               if f.vgroup == 1]
    assert ("files", "round_not_staged", 2) in kinds(2)
    # Its rows are not in replica 2's state: there the first round's rows hold ts 12..14.
    diffs = [d for d in report.row_diffs.to_pylist() if d["vgroup"] == 2]
    assert sorted((d["kind"], d["replica"], d["ts"] - T0) for d in diffs) == \
        [("differing", 2, 12), ("differing", 2, 13), ("differing", 2, 14)]
    assert ("versions", "ingest_version_out_of_range", 3) in kinds(3)
    assert report.exit_code == 1


def test_read_vgroup_loads_exactly_the_manifests_files(base, tmp_path, spark):
    """read_vgroup answers what the vnode's query answers (rank rule included), reads only
    the files the manifest names (a stray Parquet file in data/ and the staged round are
    not read), and its raw mode shows every archived row with its rank."""
    (path,) = _replicas(base, str(tmp_path))[:1]
    v = Vnode(path, CFG)
    v.recover()
    v.flush()
    want = [(r["ts"], r["_version"], r["_epoch"], r["x"], r["tag"])
            for r in v.query("ing", T0, T0 + DAY_MS)]
    v.close(up_to_version=0)
    stray = os.path.join(path, "data", "ing", "stray.parquet")
    write_round_file(stray, origin_rows(3, ts0=T0, tag="stray"), ORIGIN_COLUMNS)
    df = read_vgroup(spark, path)
    assert df.columns[:4] == ["table", "ts", "_version", "_epoch"]
    from pyspark.sql import functions as F
    got = sorted((r["ms"], r["_version"], r["_epoch"], r["x"], r["tag"])
                 for r in df.withColumn("ms", F.unix_millis("ts")).collect())
    assert got == want
    raw = read_vgroup(spark, path, resolve=False).collect()
    m = _manifest(path)
    assert len(raw) == sum(f["rows"] for f in m["files"])
    assert {r["_file"] for r in raw} == {f["name"] for f in m["files"]}
    ranks = {f["name"]: f.get("ingest_version") for f in m["files"]}
    assert all(r["_rank"] == (ranks[r["_file"]] or r["_version"]) for r in raw)
    assert read_vgroup(spark, path, tables=["nope"]).count() == 0
    with pytest.raises(Exception, match="no data/manifest.json"):
        read_vgroup(spark, str(tmp_path / "empty"))
