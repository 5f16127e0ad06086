"""`vrepl validate` from the command line: exit codes, one-line errors, report files.

Bad inputs that make validation impossible stop before Spark starts (exit 2, one line on
stderr naming the vgroup, the replica and the path); a run that completes writes
report.json and row_diffs.parquet and exits 0 or 1. In-process runs reuse the shared
session (an active session is reused by validate()).
"""
from __future__ import annotations

import json
import os

import pytest

from vrepl.spark.cli import main

pytestmark = pytest.mark.timeout(240)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("vrepl: error: ")
    assert "Traceback" not in err and "\tat " not in err and "Exception" not in err
    return lines[0]


def test_missing_replica_dir(capsys, replicas, tmp_path):
    code, _, err = run(capsys, replicas[0], str(tmp_path / "nope"), replicas[2],
                       "--out", str(tmp_path / "out"))
    assert code == 2
    assert one_error_line(err) == (f"vrepl: error: vgroup 1 replica 2 ({tmp_path / 'nope'}):"
                                   f" no such directory")


def test_empty_replica_dir(capsys, replicas, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, "--vgroup", f"7={replicas[0]},{empty}",
                       "--out", str(tmp_path / "out"))
    assert code == 2
    line = one_error_line(err)
    assert f"vgroup 7 replica 2 ({empty}): empty replica directory" in line


def test_malformed_manifest(capsys, replicas, tmp_path):
    with open(os.path.join(replicas[1], "data", "manifest.json"), "w") as fh:
        fh.write("{not json")
    code, _, err = run(capsys, *replicas, "--out", str(tmp_path / "out"))
    assert code == 2
    line = one_error_line(err)
    assert "vgroup 1 replica 2" in line and "data/manifest.json: bad manifest: not JSON" in line


def test_replica_given_twice_and_bad_vgroup_syntax(capsys, replicas, tmp_path):
    code, _, err = run(capsys, replicas[0], replicas[0], "--out", str(tmp_path / "o"))
    assert code == 2 and "given twice" in one_error_line(err)
    code, _, err = run(capsys, "--vgroup", "x=/a,/b", "--out", str(tmp_path / "o"))
    assert code == 2 and "vgroup id 'x' is not an integer" in one_error_line(err)
    code, _, err = run(capsys, replicas[0], "--vgroup", f"1={replicas[1]}")
    assert code == 2 and "not both" in one_error_line(err)
    code, _, err = run(capsys, "--out", str(tmp_path / "o"))
    assert code == 2 and "no replica directories" in one_error_line(err)


def test_cli_identical_replicas_exit_0(spark, capsys, replicas, tmp_path):
    """Identical replicas -> exit 0 with report.json (the differing path and row_diffs.parquet
    are covered by test_spark_validate.py's one multi-vgroup run, to keep the suite fast)."""
    out = tmp_path / "ok"
    code, stdout, err = run(capsys, "--vgroup", "1=" + ",".join(replicas), "--out", str(out),
                            "--json")
    assert code == 0, stdout + err
    assert err == ""
    doc = json.loads(stdout)
    assert doc["result"] == "agree" and doc["row_diffs"]["total"] == 0
    assert all(c["ok"] for c in doc["checks"].values())
    assert json.load(open(out / "report.json"))["result"] == "agree"
    assert not (out / "row_diffs.parquet").exists()
