"""Pure checks of the validation job (vrepl/spark/checks.py, model.py): WAL version rules,
coverage, schema comparison, argument parsing. No Spark, no Java."""
from __future__ import annotations

import numpy as np
import pytest

from vrepl.spark.checks import canonical_columns, schema_findings, wal_version_findings
from vrepl.spark.inputs import WalScan
from vrepl.spark.model import ReplicaSpec, make_specs, parse_vgroup_arg

SPEC = ReplicaSpec(1, 2, "/x")


def scan(versions, epochs=None):
    n = len(versions)
    return WalScan(np.array(versions, np.int64),
                   np.array(epochs or [1] * n, np.int64), np.ones(n, np.uint8),
                   np.zeros(n, np.int32), np.arange(n, dtype=np.int64) * 100,
                   ["wal/000000000000.wal"])


def kinds(findings):
    return [(f.kind, f.details) for f in findings]


def test_contiguous_wal_is_clean():
    fs, counts = wal_version_findings(SPEC, scan([5, 6, 7, 8]))
    assert fs == [] and not any(counts.values())


def test_gap_duplicate_and_backwards():
    fs, counts = wal_version_findings(SPEC, scan([1, 2, 5, 5, 6, 3]))
    assert kinds(fs) == [("wal_gap", {"missing_from": 3, "missing_to": 4}),
                         ("wal_duplicate", {"version": 5}),
                         ("wal_duplicate", {"version": 3})]
    assert fs[1].message == ("version 5 at wal/000000000000.wal@300 duplicates the record at"
                             " wal/000000000000.wal@200")
    assert "versions go backwards" in fs[2].message
    assert counts["missing_versions"] == 2


def test_epoch_must_not_decrease():
    fs, _ = wal_version_findings(SPEC, scan([1, 2, 3], [1, 2, 1]))
    assert kinds(fs) == [("wal_epoch_backwards", {"version": 3})]


def test_schema_findings_and_canonical_columns():
    a = {"t": {"x": "int", "y": "str"}, "u": {"z": "bool"}}
    b = {"t": {"x": "float", "y": "str"}, "u": {"z": "bool"}}
    (f,) = schema_findings(3, [(1, a), (2, b)])
    assert f.kind == "table_schema_mismatch" and f.details["table"] == "t"
    assert f.message == "table 't': x: replica 1 int, replica 2 float"
    assert canonical_columns([a["t"], b["t"], {"w": "int"}]) == {"w": "int", "x": "str*",
                                                                 "y": "str"}


def test_vgroup_argument_and_specs(tmp_path):
    assert parse_vgroup_arg("2=/a,/b") == (2, ["/a", "/b"])
    for bad in ("2", "x=/a", "0=/a", "2=/a,,/b"):
        with pytest.raises(ValueError):
            parse_vgroup_arg(bad)
    specs = make_specs({2: [str(tmp_path / "b")], 1: ["file://" + str(tmp_path / "a")]})
    assert [(s.vgroup, s.replica, s.path) for s in specs] == [
        (1, 1, str(tmp_path / "a")), (2, 1, str(tmp_path / "b"))]
    with pytest.raises(ValueError, match="only local paths"):
        make_specs({1: ["hdfs://nn/x"]})


@pytest.mark.timeout(30)
def test_a_fifo_named_like_a_wal_file_is_an_input_error_not_a_hang(tmp_path):
    # Read on the driver before Spark starts: a plain open() of the FIFO would block forever.
    import os

    from vrepl.spark.inputs import load_replica
    from vrepl.errors import InputError
    (tmp_path / "wal").mkdir()
    os.mkfifo(tmp_path / "wal" / "000000000000.wal")
    with pytest.raises(InputError, match=r"wal/000000000000.wal: not a regular file; refused"):
        load_replica(ReplicaSpec(1, 1, str(tmp_path)))
