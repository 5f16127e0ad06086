"""`vrepl validate`'s per-transaction check (vrepl/spark/txncheck.py, docs/validation.md
§versions): three replicas built by a real vnode and WAL writer from a log with plain writes
and transactions (one published and archived, rows of it overwritten by later writes, one
aborted, one published in the WAL only) agree; a replica whose archive is made to lack part
of a transaction (the Parquet file rewritten consistently, as the other validation tests
do) is named with the transaction, how many of its rows are missing and one of them; a row
a later write replaced is never called missing."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkdata import CFG, DAY_MS, SKIP, T0, copies, manifest, rewrite_file

from vrepl.spark import validate
from vrepl.txn.record import TxnRecord, encode_rows_payload, encode_txn_payload
from vrepl.vnode import Vnode
from vrepl.wal import WalOptions, WalWriter

pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def rows_json(rows: list) -> bytes:
    return json.dumps(rows, separators=(",", ":")).encode()


def cpu(ts_from: int, ts_to: int, x: int) -> list:
    return [["cpu", T0 + k, {"x": x, "y": k / 2}] for k in range(ts_from, ts_to)]


def build(path: str) -> None:
    """v1 plain cpu 0..9; txn 2 (load-a): v3 cpu 5..14 and disk 0..4, v4 cpu 15..19, v5 a
    plain write of cpu 12 (before the publish: the transaction wins), v6 publish; v7 a
    plain write of cpu 14 and disk 0 (after: it replaces them); flush (archive 1..7);
    txn 8 (load-b) aborted at v10; txn 11 (load-c) published at v13, in the WAL only."""
    v = Vnode(path, CFG)
    wal = WalWriter(os.path.join(path, "wal"), WalOptions(durability="none"))

    def put(payload: bytes) -> None:
        version = wal.append(payload, 1)
        assert v.write_to_cache(version, 1, payload)

    def plain(rows: list) -> None:
        reason, payload = v.prepare_write([tuple(r) for r in rows])
        assert reason is None, reason
        put(payload)

    def step(op: str, txn: int, **kw) -> None:
        put(encode_txn_payload(TxnRecord(op, txn, at_ms=1000, **kw)))

    plain(cpu(0, 10, 1))                                                            # v1
    step("begin", 2, label="load-a", timeout_ms=60_000)                             # v2
    put(encode_rows_payload(2, 0, rows_json(
        cpu(5, 15, 2) + [["disk", T0 + k, {"used": k}] for k in range(5)])))       # v3
    put(encode_rows_payload(2, 1, rows_json(cpu(15, 20, 2))))                      # v4
    plain(cpu(12, 13, 5))                                                           # v5
    step("commit", 2)                                                               # v6
    plain(cpu(14, 15, 7) + [["disk", T0, {"used": 70}]])                            # v7
    v.flush(wal)
    step("begin", 8, label="load-b", timeout_ms=60_000)                             # v8
    put(encode_rows_payload(8, 0, rows_json(cpu(30, 35, 8))))                      # v9
    step("abort", 8, reason="client: test")                                         # v10
    step("begin", 11, label="load-c", timeout_ms=60_000)                            # v11
    put(encode_rows_payload(11, 0, rows_json(cpu(40, 45, 11))))                    # v12
    step("commit", 11)                                                              # v13
    wal.close()
    assert manifest(path)["archived_version"] == 7


@pytest.fixture
def txn_replicas(tmp_path) -> list[str]:
    base = str(tmp_path / "base")
    build(base)
    return copies(base, str(tmp_path))


def test_transactions_present_whole_and_a_replica_lacking_part_of_one(spark, txn_replicas):
    clean = validate({1: txn_replicas}, spark)
    vc = clean.checks["versions"]
    assert clean.exit_code == 0, [f.describe() for c in clean.checks.values() for f in c.findings]
    # load-a (archived, 2 of its 20 keys replaced by v7) and load-c (WAL only) are checked;
    # the aborted load-b publishes nothing
    assert vc.counts["txns_checked"] == 2 and vc.counts["txn_keys_checked"] == 20 + 5
    assert vc.counts["txns_not_checkable"] == 0

    # replica 2's archive lacks two rows of load-a (cpu ts 17 and 18, at v6) and the row
    # v7 wrote over cpu 14 (a later write's row: the rows check's, not the transaction's)
    gone = {T0 + 17, T0 + 18, T0 + 14}
    rewrite_file(txn_replicas[1], "cpu", T0 // DAY_MS,
                 lambda t: t.filter(pc.invert(pc.is_in(pc.cast(t.column("ts"), "int64"),
                                                        value_set=pa.array(sorted(gone))))))
    rep = validate({1: txn_replicas}, spark)
    assert rep.exit_code == 1
    vc = rep.checks["versions"]
    assert vc.kinds == {"txn_rows_missing": 1}
    f = vc.findings[0]
    assert (f.kind, f.vgroup, f.replica) == ("txn_rows_missing", 1, 2)
    d = f.details
    assert (d["txn"], d["label"], d["version"]) == (2, "load-a", 6)
    assert (d["keys"], d["missing"], d["replaced"], d["present"]) == (20, 2, 2, 16)
    assert d["example"] == {"table": "cpu", "ts": T0 + 17}
    assert "transaction 2 (label load-a, VISIBLE at v6): 2 of its 20 rows missing" in f.message
    assert rep.checks["rows"].kinds.get("missing") == 3     # the rows check sees all three
