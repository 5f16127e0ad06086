"""The validation job end to end on one shared local[2] session (issue 6, Tests).

One job validates twelve vgroups at once, each a copy of the same vnode data path with one
planted fault in one replica (vgroup 1 is clean); every test then checks that its vgroup's
fault, and only it, is reported. One Spark run keeps the suite fast; each vgroup is
compared independently, so a fault cannot hide another.
"""
from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from sparkdata import (DAY_MS, EPOCH2_FROM, T0, edit_wal, file_entry, manifest, record_span,
                      rewrite_file, save_manifest, wal_file)
from vrepl._core import record as _rec
from vrepl.spark import validate
from vrepl.vnode import file_magic

pytestmark = pytest.mark.timeout(240)

CPU_B0 = T0 // DAY_MS           # bucket of the cpu/disk file holding batches 3, 6, 9, 12
CPU_B1 = CPU_B0 + 1             # batches 1, 4, 7, 10 (and batch 14's overwrite)
FAULTS = ["clean", "missing_row", "extra_row", "changed_value", "version_gap",
          "duplicate_version", "corrupted_file", "two_epochs", "schema_mismatch",
          "corrupt_parquet", "truncated_wal", "duplicate_row"]
VG = {name: i + 1 for i, name in enumerate(FAULTS)}


def plant(name: str, reps: list[str]) -> None:
    n2, n3 = reps[1], reps[2]
    if name == "missing_row":       # replica 2 lacks the row ts = T0 + 3000 (batch 3, k=0)
        rewrite_file(n2, "cpu", CPU_B0, lambda t: t.filter(
            pc.not_equal(pc.cast(t.column("ts"), pa.int64()), T0 + 3000)))
    elif name == "extra_row":       # replica 3 has a row nobody else has
        def add(t):
            extra = {c: [t.column(c)[0].as_py()] for c in t.column_names}
            extra["ts"] = [T0 + 999_999]
            return pa.concat_tables([t, pa.table(extra, schema=t.schema)])
        rewrite_file(n3, "cpu", CPU_B0, add)
    elif name == "changed_value":   # replica 2: x of ts = T0 + 6001 is 0 instead of 601
        def change(t):
            ts = pc.cast(t.column("ts"), pa.int64())
            x = pc.if_else(pc.equal(ts, T0 + 6001), 0, t.column("x"))
            return t.set_column(t.column_names.index("x"), "x", x)
        rewrite_file(n2, "cpu", CPU_B0, change)
    elif name == "version_gap":     # replica 2's WAL loses the (archived) record of version 4
        edit_wal(n2, lambda d, s: d[:record_span(s, 4, len(d))[0]]
                 + d[record_span(s, 4, len(d))[1]:])
    elif name == "duplicate_version":   # replica 3's WAL holds version 6 twice
        def dup(d, s):
            a, b = record_span(s, 6, len(d))
            return d[:b] + d[a:b] + d[b:]
        edit_wal(n3, dup)
    elif name == "corrupted_file":  # one flipped byte in replica 3's disk file
        f = file_entry(n3, "disk", CPU_B1)
        path = os.path.join(n3, *f["name"].split("/"))
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0x01
        open(path, "wb").write(bytes(data))
    elif name == "two_epochs":      # replica 3's WAL says version 8 was written in epoch 2
        def epoch(d, s):
            a, b = record_span(s, EPOCH2_FROM - 1, len(d))
            rec = _rec.decode_record(d, a)
            new = _rec.encode_record(rec.msg_type, rec.version, 2, rec.payload)
            return d[:a] + new + d[b:]
        edit_wal(n3, epoch)
    elif name == "schema_mismatch":  # replica 3 stores disk.ok as a string
        doc = manifest(n3)
        doc["schemas"]["disk"]["ok"] = "str"
        save_manifest(n3, doc)
        for f in doc["files"]:
            if f["table"] == "disk":
                rewrite_file(n3, "disk", f["bucket"], lambda t: t.set_column(
                    t.column_names.index("ok"), "ok", t.column("ok").cast(pa.string())))
    elif name == "corrupt_parquet":  # replica 2: garbage the manifest vouches for
        doc = manifest(n2)
        f = next(e for e in doc["files"] if e["table"] == "cpu" and e["bucket"] == CPU_B1)
        junk = b"PAR1" + bytes(range(256)) * 8 + b"PAR1"
        open(os.path.join(n2, *f["name"].split("/")), "wb").write(junk)
        f["size"], f["magic"] = len(junk), file_magic(junk)
        save_manifest(n2, doc)
    elif name == "duplicate_row":   # replica 2's file holds ts = T0 + 3000 twice (counts updated)
        def twice(t):
            ts = pc.cast(t.column("ts"), pa.int64())
            return pa.concat_tables([t, t.filter(pc.equal(ts, T0 + 3000))])
        rewrite_file(n2, "cpu", CPU_B0, twice)
    elif name == "truncated_wal":   # replica 2's WAL ends 10 bytes into its last record
        path = wal_file(n2)
        with open(path, "r+b") as fh:
            fh.truncate(os.path.getsize(path) - 10)


@pytest.fixture(scope="module")
def faults(spark, base_replica, tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    groups = {}
    for name, vg in VG.items():
        reps = []
        for i in (1, 2, 3):
            dst = str(root / f"vg{vg}" / f"n{i}")
            shutil.copytree(base_replica, dst)
            reps.append(dst)
        plant(name, reps)
        groups[vg] = reps
    report = validate(groups, spark=spark, examples=100)
    return report, groups


def found(report, vgroup: int) -> dict[str, dict[str, int]]:
    """check -> kind -> count for one vgroup: findings (the job keeps 100 examples per
    check, enough for all but the rows), rows from the exact per-replica counts."""
    out: dict[str, dict[str, int]] = {}
    for f in report.findings():
        if f.vgroup == vgroup and f.check != "rows":
            kinds = out.setdefault(f.check, {})
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
    for c in report.checks["rows"].by_replica:
        if c["vgroup"] == vgroup:
            kinds = out.setdefault("rows", {})
            kinds[c["kind"]] = kinds.get(c["kind"], 0) + c["rows"]
    return out


def only(report, vgroup: int, check: str):
    return [f for f in report.findings() if f.vgroup == vgroup and f.check == check]


def test_all_faults_found_and_counts_exact(faults):
    report, _ = faults
    assert report.exit_code == 1
    assert set(report.checks["rows"].kinds) == {"missing", "extra", "differing", "duplicate"}
    assert report.checks["epochs"].kinds == {"two_epochs": 1}
    assert report.checks["files"].kinds == {"magic_mismatch": 1, "corrupt_parquet": 1}


def test_identical_replicas_agree(faults):
    report, _ = faults
    assert found(report, VG["clean"]) == {}
    reps = report.vgroups[VG["clean"]]
    assert [r["rows"] for r in reps] == [reps[0]["rows"]] * 3 and reps[0]["rows"] > 300
    assert reps[0]["archived_version"] == 12 and reps[0]["wal_last_version"] == 15


def test_missing_row(faults):
    report, _ = faults
    assert found(report, VG["missing_row"]) == {"rows": {"missing": 1}}
    (f,) = only(report, VG["missing_row"], "rows")
    assert (f.replica, f.details["table"], f.details["ts"]) == (2, "cpu", T0 + 3000)
    assert f.details["ref_replica"] == 1 and f.details["ref_version"] == 3
    assert json.loads(f.details["ref_values"]) == {"x": 300, "y": 0.75}


def test_extra_row(faults):
    report, _ = faults
    assert found(report, VG["extra_row"]) == {"rows": {"extra": 1}}
    (f,) = only(report, VG["extra_row"], "rows")
    assert (f.replica, f.details["table"], f.details["ts"]) == (3, "cpu", T0 + 999_999)


def test_changed_value(faults):
    report, _ = faults
    assert found(report, VG["changed_value"]) == {"rows": {"differing": 1}}
    (f,) = only(report, VG["changed_value"], "rows")
    assert (f.replica, f.details["ts"]) == (2, T0 + 6001)
    assert json.loads(f.details["values"])["x"] == 0
    assert json.loads(f.details["ref_values"])["x"] == 601


def test_duplicate_row_in_one_replica(faults):
    # The same (table, ts) twice in one file, the manifest's counts updated so the files
    # check passes: the digests differ, yet every copy equals the reference row (issue 14).
    from vrepl.spark.validation import _row_finding
    report, _ = faults
    assert found(report, VG["duplicate_row"]) == {"rows": {"duplicate": 1}}
    # The examples kept (100) end before the last vgroup's: read its rows from the diffs.
    (d,) = report.row_diffs.filter(pc.equal(report.row_diffs.column("vgroup"), VG["duplicate_row"])).to_pylist()
    assert (d["kind"], d["replica"], d["table"], d["ts"]) == ("duplicate", 2, "cpu", T0 + 3000)
    assert (d["version"], d["ref_replica"], d["ref_version"]) == (3, 1, 3)
    assert json.loads(d["values"]) == json.loads(d["ref_values"]) == {"x": 300, "y": 0.75}
    assert "held more than once by this replica" in _row_finding(d).describe()


def test_version_gap(faults):
    report, _ = faults
    assert found(report, VG["version_gap"]) == {"versions": {"wal_gap": 1}}
    (f,) = only(report, VG["version_gap"], "versions")
    assert f.replica == 2 and f.details == {"missing_from": 4, "missing_to": 4}
    assert f.file == "wal/000000000000.wal"


def test_duplicate_version(faults):
    report, _ = faults
    assert found(report, VG["duplicate_version"]) == {"versions": {"wal_duplicate": 1}}
    (f,) = only(report, VG["duplicate_version"], "versions")
    assert f.replica == 3 and f.details == {"version": 6}


def test_corrupted_file(faults):
    report, groups = faults
    assert found(report, VG["corrupted_file"]) == {"files": {"magic_mismatch": 1}}
    (f,) = only(report, VG["corrupted_file"], "files")
    assert f.replica == 3 and f.file == file_entry(groups[VG["corrupted_file"]][0], "disk",
                                                   CPU_B1)["name"]
    # its rows are not compared (in any replica), and say so
    notes = [n for n in report.checks["rows"].notes if n["vgroup"] == VG["corrupted_file"]]
    assert [(n["table"], n["file_bucket"]) for n in notes] == [("disk", CPU_B1)]


def test_two_epochs_for_one_version(faults):
    report, _ = faults
    assert found(report, VG["two_epochs"]) == {"epochs": {"two_epochs": 1}}
    (f,) = only(report, VG["two_epochs"], "epochs")
    assert f.details["version"] == EPOCH2_FROM - 1
    assert f.details["epochs"]["2"] == ["replica 3 wal"]
    assert "replica 3 archive" in f.details["epochs"]["1"]


def test_mismatched_schemas(faults):
    report, _ = faults
    got = found(report, VG["schema_mismatch"])
    assert got["schemas"]["table_schema_mismatch"] == 1
    (f,) = [f for f in only(report, VG["schema_mismatch"], "schemas")
            if f.kind == "table_schema_mismatch"]
    assert f.details["table"] == "disk" and "replica 3 str" in f.message
    # replica 3's own WAL no longer fits its schema: the three records above the archived
    # version cannot be replayed there (as its vnode would refuse them), so their rows
    # are missing on replica 3
    assert got["schemas"]["wal_type_conflict"] == 3
    assert set(got["rows"]) == {"missing", "differing"}   # differing: v14 overwrote a row


def test_corrupt_parquet(faults):
    report, _ = faults
    assert found(report, VG["corrupt_parquet"]) == {"files": {"corrupt_parquet": 1}}
    (f,) = only(report, VG["corrupt_parquet"], "files")
    assert f.replica == 2 and "not a readable Parquet file" in f.message


def test_truncated_wal(faults):
    report, _ = faults
    got = found(report, VG["truncated_wal"])
    assert got["versions"]["wal_torn_tail"] == 1
    (f,) = [f for f in only(report, VG["truncated_wal"], "versions")
            if f.kind == "wal_torn_tail"]
    assert f.replica == 2 and f.file == "wal/000000000000.wal"
    assert f.details["last_good_version"] == 14
    # the lost record was version 15: replica 2 ends one version short and lacks its rows
    assert got["versions"]["last_version_differs"] == 1
    assert got["rows"] == {"missing": 25}       # batch 15: 20 cpu + 5 disk rows


def test_report_json_and_row_diffs(faults, tmp_path):
    report, _ = faults
    report.write(str(tmp_path))
    doc = json.load(open(tmp_path / "report.json"))
    assert doc["result"] == "differ" and doc["exit_code"] == 1
    assert doc["checks"]["epochs"]["kinds"] == {"two_epochs": 1}
    diffs = pq.read_table(tmp_path / "row_diffs.parquet")
    assert diffs.num_rows == doc["row_diffs"]["total"] == report.checks["rows"].found
    rows = diffs.filter(pc.equal(diffs.column("vgroup"), VG["changed_value"])).to_pylist()
    assert [(r["kind"], r["replica"], r["table"], r["ts"]) for r in rows] == [
        ("differing", 2, "cpu", T0 + 6001)]

