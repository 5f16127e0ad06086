"""Transactions in the reference vnode (docs/transactions.md §4): staged rows invisible until
the publish record, then visible at its version across tables in one step; a flush never
archives past an unfinished transaction's begin; the labels file and the WAL rebuild every
transaction after a restart (a crash: no close), nothing applied twice."""
from __future__ import annotations

import os

import pytest

from vrepl.txn import TxnRecord, encode_txn_payload
from vrepl.txn.record import encode_rows_payload
from vrepl.vnode import ApplyError, PayloadError, Vnode, VnodeConfig
from vrepl.wal import WalOptions, WalWriter

pytestmark = pytest.mark.timeout(60)


class Log:
    """A vnode and its WAL, as a replica applies records."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.wal = WalWriter(os.path.join(path, "wal"), WalOptions(durability="fsync"))
        self.v = Vnode(path, VnodeConfig())
        self.v.recover()

    def put(self, payload: bytes):
        version = self.wal.append(payload, 1)
        return version, self.v.apply_txn(version, 1, payload)

    def begin(self, label: str, at: int = 0) -> int:
        version = self.wal.last_version + 1
        got, out = self.put(encode_txn_payload(TxnRecord("begin", version, label=label,
                                                         timeout_ms=1000, at_ms=at)))
        assert got == version and out.effect == "begun"
        return version

    def rows(self, txn: int, rows: bytes, seq: int = 0):
        return self.put(encode_rows_payload(txn, seq, rows))[1]

    def step(self, op: str, txn: int, reason: str = ""):
        return self.put(encode_txn_payload(TxnRecord(op, txn, at_ms=1, reason=reason)))

    def write(self, rows) -> int:
        reason, payload = self.v.prepare_write(rows)
        assert reason is None
        version = self.wal.append(payload, 1)
        assert self.v.write_to_cache(version, 1, payload)
        return version

    def crash_and_reopen(self) -> None:
        self.wal.close()      # the process dies: the vnode is not closed, nothing flushed
        self.wal = WalWriter(os.path.join(self.path, "wal"), WalOptions(durability="fsync"))
        self.v = Vnode(self.path, VnodeConfig())
        self.v.recover()


def q(v: Vnode, table: str) -> list[tuple]:
    return [(r["ts"], r["_version"], r["x"]) for r in v.query(table, 0, 1 << 40)]


def test_invisible_until_the_publish_then_all_tables_at_its_version(tmp_path):
    lg = Log(str(tmp_path))
    t = lg.begin("a")
    lg.rows(t, b'[["cpu",1,{"x":1}],["cpu",2,{"x":2}]]', seq=0)
    lg.rows(t, b'[["mem",1,{"x":10}]]', seq=1)
    w = lg.write([["cpu", 5, {"x": 5}]])
    assert q(lg.v, "cpu") == [(5, w, 5)] and q(lg.v, "mem") == []
    assert lg.v.schemas["mem"] == {"x": "int"}         # columns join at staging
    c, out = lg.step("commit", t)
    assert out.effect == "published"
    assert q(lg.v, "cpu") == [(1, c, 1), (2, c, 2), (5, w, 5)] and q(lg.v, "mem") == [(1, c, 10)]
    assert lg.v.get_version() == c


def test_abort_drops_the_staged_rows_and_a_conflict_is_an_apply_error(tmp_path):
    lg = Log(str(tmp_path))
    t = lg.begin("a")
    lg.rows(t, b'[["cpu",1,{"x":1}]]')
    lg.step("abort", t, "client")
    assert lg.step("commit", t)[1].effect == "ignored"
    assert q(lg.v, "cpu") == []
    t2 = lg.begin("b")
    with pytest.raises(ApplyError, match="cannot stage rows of transaction"):
        lg.rows(t2, b'[["cpu",2,{"x":"text"}]]')
    with pytest.raises(PayloadError, match="malformed"):
        lg.v.write_to_cache(lg.wal.last_version + 1, 1, b"VRB\x09{")


def test_flush_stops_below_an_open_transaction_and_restart_rebuilds_it(tmp_path):
    lg = Log(str(tmp_path))
    w1 = lg.write([["cpu", 1, {"x": 1}]])
    t = lg.begin("open")
    lg.rows(t, b'[["cpu",2,{"x":2}]]')
    w2 = lg.write([["cpu", 3, {"x": 3}]])
    lg.v.flush(None, w2)
    assert lg.v.archived_version == w1           # not past the open transaction's begin
    lg.crash_and_reopen()
    assert q(lg.v, "cpu") == [(1, w1, 1), (3, w2, 3)]
    assert lg.v.txns.table.get(t).rows == 1 and lg.v.txns.table.get(t).state == "PREPARE"
    c, _ = lg.step("commit", t)
    assert q(lg.v, "cpu") == [(1, w1, 1), (2, c, 2), (3, w2, 3)]
    lg.v.flush(None, c)
    assert lg.v.archived_version == c
    with open(os.path.join(str(tmp_path), "data", "txn_labels.json")) as fh:
        assert '"label":"open"' in fh.read()
    # After a crash the label is answered from the file; nothing is applied twice.
    lg.crash_and_reopen()
    assert lg.v.txns.table.by_label("open").state == "VISIBLE"
    assert q(lg.v, "cpu") == [(1, w1, 1), (2, c, 2), (3, w2, 3)]
    assert lg.v.apply_txn(c, 1, encode_txn_payload(TxnRecord("commit", t, at_ms=1))) is None


def test_a_crash_between_labels_file_and_manifest_loses_nothing(tmp_path):
    lg = Log(str(tmp_path))
    t = lg.begin("x")
    lg.rows(t, b'[["cpu",1,{"x":1}]]')
    c, _ = lg.step("commit", t)
    lg.v.txns.save(c)            # the labels file is written, the manifest commit never is
    lg.crash_and_reopen()
    assert lg.v.archived_version == 0
    assert q(lg.v, "cpu") == [(1, c, 1)]       # replayed from the WAL, not skipped
    assert lg.v.txns.table.by_label("x").finish_version == c


def test_the_validation_replay_shows_a_transaction_only_at_its_publish(tmp_path):
    from vrepl.spark.inputs import replay_wal
    from vrepl.spark.model import ReplicaSpec

    def rec(v, payload):
        return (v, 1, 1, payload)

    b = encode_txn_payload(TxnRecord("begin", 1, label="a", timeout_ms=1, at_ms=0))
    r = encode_rows_payload(1, 0, b'[["cpu",1,{"x":1}],["mem",2,{"x":2.5}]]')
    c = encode_txn_payload(TxnRecord("commit", 1, at_ms=0))
    spec = ReplicaSpec(1, 1, str(tmp_path))
    findings: list = []
    staged_only = replay_wal(spec, 0, {}, [rec(1, b), rec(2, r)], findings)
    assert staged_only == {} and findings == []
    schemas: dict = {}
    rows = replay_wal(spec, 0, schemas, [rec(1, b), rec(2, r), rec(3, c)], findings)
    assert rows == {("cpu", 1): (3, 1, {"x": 1}), ("mem", 2): (3, 1, {"x": 2.5})}
    assert schemas == {"cpu": {"x": "int"}, "mem": {"x": "float"}} and findings == []
    replay_wal(spec, 0, {}, [rec(1, b"VRB\x09{")], findings)
    assert [f.kind for f in findings] == ["wal_bad_payload"]


def test_validation_compares_transaction_outcomes_across_replicas(tmp_path):
    from vrepl.spark.checks import txn_findings
    from vrepl.spark.inputs import load_replica
    from vrepl.spark.model import ReplicaSpec

    paths = []
    for i, fate in enumerate(("commit", "commit", "abort")):
        lg = Log(str(tmp_path / f"n{i}"))
        t = lg.begin("job")
        lg.rows(t, b'[["cpu",1,{"x":1}],["cpu",2,{"x":2}]]')
        c, _ = lg.step(fate, t, "client")
        lg.v.flush(None, c)               # the labels file holds it
        lg.write([["cpu", 9, {"x": 9}]])  # and the WAL above
        lg.wal.close()
        paths.append(lg.path)
    reps = [load_replica(ReplicaSpec(1, i + 1, p)) for i, p in enumerate(paths)]
    assert reps[0].txns == {1: ("job", "VISIBLE", 3, 2)} == reps[1].txns
    assert txn_findings(1, reps[:2]) == []
    found = txn_findings(1, reps)
    assert [f.kind for f in found] == ["txn_outcome_differs"]
    assert "replica 3: ABORTED at v0" in found[0].message
