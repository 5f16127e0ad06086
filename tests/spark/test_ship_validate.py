"""`vrepl validate --ship SENDER_DIR RECEIVER_DIR` with real Spark (docs/ship.md §12): a real
edge node's vnode shipped by a real `vrepl ship` process into a real receiving node; the
job proves the receiver holds exactly the rows shipped (exit 0); a copy of the receiver with
one row removed and one value changed in a loaded file, or a loaded file missing, is named
(exit 1) per table and bucket and row; usage errors are exit 2."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pyarrow.parquet as pq
import pytest

from vrepl.child import python_argv
from vrepl.node.local import LocalCluster
from vrepl.spark.cli import main as validate_main
from vrepl.vnode.files import MANIFEST_NAME, Manifest, write_atomic

pytestmark = pytest.mark.timeout(300)

VG = 1
SECRET = "ship-secret-for-tests-0123456789"
SPAN_MS = 864_000_000


def _write(c: LocalCluster, rows) -> None:
    c.start()
    c.wait_master(timeout_s=60)
    cl = c.client()
    try:
        cl.write(VG, rows)
    finally:
        cl.close()
    c.stop_all()


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """(edge vnode dir, receiver vgroup dir) after two rounds (the second replaces a file)."""
    base = str(tmp_path_factory.mktemp("ship"))
    edge = LocalCluster(os.path.join(base, "edge"), 1)
    recv = LocalCluster(os.path.join(base, "recv"), 1, ship_senders=[{"id": 7, "secret": SECRET}])
    edge_vg = os.path.join(edge.nodes[1].dir, "data", f"vg{VG}")
    try:
        recv.start()
        recv.wait_master(timeout_s=60)
        env = dict(os.environ, VREPL_SHIP_SECRET=SECRET)
        argv = python_argv("-m", "vrepl.cli", "ship", "--to", recv.nodes[1].replication, "--data", edge_vg,
                           "--sender-id", "7", "--once")
        _write(edge, [(t, b * SPAN_MS + i, {"x": float(i), "tag": f"{t}{i}"})
                      for t in ("cpu", "mem") for b in (0, 1) for i in range(200)])
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        _write(edge, [("cpu", i, {"x": 1000.0 + i}) for i in range(20)])   # cpu bucket 0 replaced
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "1 of 1 deletions applied" in p.stdout, p.stdout
        recv.stop_all()
        yield edge_vg, os.path.join(recv.nodes[1].dir, "data", f"vg{VG}")
    finally:
        edge.close()
        recv.close()


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = validate_main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_receiver_holds_exactly_what_was_shipped(shipped, spark, capsys):
    sender, receiver = shipped
    code, out, err = run_cli(capsys, "--ship", sender, receiver, "--json")
    assert code == 0, out + err
    doc = json.loads(out)
    assert doc["equal"] and doc["shipped_files"] == doc["receiver_files"] == 4
    assert doc["rows"] == {"sender": 800, "receiver": 800, "missing": 0, "extra": 0, "different": 0}
    code, out, _ = run_cli(capsys, "--ship", sender, receiver)
    assert code == 0 and "holds exactly the rows the sender shipped (2 tables, 4 buckets, 800 rows)" in out


def _damage(receiver: str, dst: str) -> str:
    """A copy of the receiver whose loaded cpu bucket-1 file lost ts SPAN_MS+5 and holds
    another x at ts SPAN_MS+7 (manifest entry updated to the new size and magic, as a
    consistent but wrong file would be)."""
    shutil.copytree(receiver, dst)
    mpath = os.path.join(dst, *MANIFEST_NAME.split("/"))
    with open(mpath, "rb") as fh:
        m = Manifest.from_bytes(fh.read(), mpath)
    f = next(f for f in m.files if f.table == "cpu" and f.bucket == 1)
    path = os.path.join(dst, *f.name.split("/"))
    t = pq.read_table(path)
    rows = t.to_pylist()
    rows = [r for r in rows if r["ts"].timestamp() * 1000 != SPAN_MS + 5]
    for r in rows:
        if r["ts"].timestamp() * 1000 == SPAN_MS + 7:
            r["x"] = -1.0
    os.unlink(path)
    pq.write_table(type(t).from_pylist(rows, schema=t.schema), path)
    return dst


def test_a_missing_and_a_different_row_are_named(shipped, spark, capsys, tmp_path):
    sender, receiver = shipped
    bad = _damage(receiver, str(tmp_path / "bad"))
    code, out, err = run_cli(capsys, "--ship", sender, bad, "--json")
    assert code == 1, out + err
    doc = json.loads(out)
    assert not doc["equal"]
    assert doc["rows"]["missing"] == 1 and doc["rows"]["different"] == 1 and doc["rows"]["extra"] == 0
    assert doc["buckets"] == [{"table": "cpu", "bucket": 1, "sender_rows": 200, "receiver_rows": 199,
                               "missing": 1, "extra": 0, "different": 1}]
    ex = {(e["kind"], e["ts"]) for e in doc["examples"]}
    assert ex == {("missing", SPAN_MS + 5), ("different", SPAN_MS + 7)}
    diff = next(e for e in doc["examples"] if e["kind"] == "different")
    assert json.loads(diff["receiver"])["x"] == "-1.0" and json.loads(diff["sender"])["x"] == "7.0"
    code, out, _ = run_cli(capsys, "--ship", sender, bad)
    assert code == 1
    assert "result: DIFFERENT: 1 buckets differ (1 rows missing, 0 extra, 1 different)" in out
    assert f"missing: table cpu ts {SPAN_MS + 5} (bucket 1)" in out


def test_a_missing_file_is_named(shipped, spark, capsys, tmp_path):
    sender, receiver = shipped
    dst = str(tmp_path / "nofile")
    shutil.copytree(receiver, dst)
    mpath = os.path.join(dst, *MANIFEST_NAME.split("/"))
    with open(mpath, "rb") as fh:
        m = Manifest.from_bytes(fh.read(), mpath)
    gone = next(f for f in m.files if f.table == "mem" and f.bucket == 0)
    m.files = [f for f in m.files if f is not gone]
    write_atomic(mpath, m.to_bytes(), False)
    code, out, _ = run_cli(capsys, "--ship", sender, dst)
    assert code == 1
    assert f"file missing on the receiver: mem 0 {gone.size} {gone.magic:#010x}" in out
    assert "mem                             0        200          0      200" in out


def test_usage_errors_exit_2(shipped, capsys, tmp_path):
    sender, receiver = shipped
    code, _, err = run_cli(capsys, "--ship", str(tmp_path), receiver)
    assert code == 2 and "no sender UUID" in err
    code, _, err = run_cli(capsys, "--ship", sender, str(tmp_path))
    assert code == 2 and "no data/manifest.json" in err
    code, _, err = run_cli(capsys, "--ship", sender, receiver, "--ship-state", "nope")
    assert code == 2 and "state directories:" in err
    code, _, err = run_cli(capsys, "--ship", sender, receiver, receiver)
    assert code == 2 and "give no replica directories" in err
