"""A transaction's rows take the plain write path's compiled parser (docs/transactions.md
§3, §12): a "rows" record's rows array is parsed straight into columns at staging and
applied with the memtable's batch apply at the publish, with the same result as the
reference decode (json.loads + check_rows), which still decides every record the parser
is not sure of, and records of other layouts (older writers, hand-written) still decode."""
from __future__ import annotations

import json

import pytest

from vrepl.txn import TxnRecord, decode_txn_payload, encode_txn_payload
from vrepl.txn.record import HEADER, encode_rows_payload, split_rows_payload
from vrepl.vnode import ApplyError, Vnode, VnodeConfig
from vrepl.vnode.ingest import Staged

pytestmark = pytest.mark.timeout(60)


class Replica:
    def __init__(self, path: str) -> None:
        self.v = Vnode(path, VnodeConfig())
        self.v.recover()
        self.version = 0

    def put(self, payload: bytes):
        self.version += 1
        return self.v.apply_txn(self.version, 1, payload)

    def begin(self) -> int:
        self.put(encode_txn_payload(TxnRecord("begin", self.version + 1, label=f"l{self.version}",
                                              timeout_ms=1000, at_ms=0)))
        return self.version

    def commit(self, txn: int):
        return self.put(encode_txn_payload(TxnRecord("commit", txn, at_ms=1)))

    def rows(self, table: str) -> list[tuple]:
        return [(r["ts"], r["_version"], r.get("x"), r.get("s"))
                for r in self.v.query(table, 0, 1 << 40)]


BATCHES = [
    b'[["cpu",1,{"x":1,"s":"a"}],["mem",1,{"x":2.5}],["cpu",2,{"x":3}]]',   # compiled
    b'[["cpu",3,{"x":4,"s":"caf\\u00e9"}],["cpu",1,{"x":5}]]',              # an escape: reference
    b' [ ["mem", 2, {"x": 7}] ] \n',                                          # spaces: compiled
]


def test_split_finds_the_rows_array_of_the_records_this_module_writes():
    p = encode_rows_payload(12, 3, BATCHES[0])
    assert split_rows_payload(p) == (12, 3, memoryview(BATCHES[0]))
    doc = encode_txn_payload(TxnRecord("rows", 5, seq=0, rows=[["cpu", 1, {"x": 1}]]))
    txn, seq, body = split_rows_payload(doc)
    assert (txn, seq, json.loads(bytes(body))) == (5, 0, [["cpu", 1, {"x": 1}]])
    # Other layouts (another key order, spaces, leading zeros, other ops) are not split:
    # decode_txn_payload reads them as before.
    other = HEADER + json.dumps({"op": "rows", "txn": 5, "seq": 1, "rows": [["cpu", 1, {"x": 1}]]}).encode()
    reordered = HEADER + b'{"txn":5,"op":"rows","seq":1,"rows":[["cpu",1,{"x":1}]]}'
    for p in (other, reordered, HEADER + b'{"op":"rows","txn":05,"seq":1,"rows":[]}',
              encode_txn_payload(TxnRecord("commit", 5, at_ms=1))):
        assert split_rows_payload(p) is None
    assert decode_txn_payload(other).rows == decode_txn_payload(reordered).rows == [["cpu", 1, {"x": 1}]]


def test_staged_batches_are_columnar_and_publish_like_the_reference_decode(tmp_path):
    fast, ref = Replica(str(tmp_path / "fast")), Replica(str(tmp_path / "ref"))
    t, t2 = fast.begin(), ref.begin()
    for seq, body in enumerate(BATCHES):
        assert fast.put(encode_rows_payload(t, seq, body)).effect == "staged"
        # The reference: the same rows in a record of another layout (never split).
        doc = {"txn": t2, "op": "rows", "seq": seq, "rows": json.loads(body)}
        assert ref.put(HEADER + json.dumps(doc).encode()).effect == "staged"
    held = fast.v.txns.table.get(t).batches
    assert [type(b) for b in held] == [Staged, list, Staged]
    assert fast.v.txns.table.get(t).rows == ref.v.txns.table.get(t2).rows == 6
    assert fast.rows("cpu") == [] and fast.rows("mem") == []
    assert fast.commit(t).effect == ref.commit(t2).effect == "published"
    for table in ("cpu", "mem"):
        assert fast.rows(table) == ref.rows(table)
    # Later batches win a ts, at the publish version.
    assert fast.rows("cpu") == [(1, 5, 5, None), (2, 5, 3, None), (3, 5, 4, "café")]
    assert fast.v.status()["memtable_rows"] == 6


def test_a_duplicate_seq_is_ignored_and_a_conflict_still_refused(tmp_path):
    r = Replica(str(tmp_path))
    t = r.begin()
    assert r.put(encode_rows_payload(t, 0, BATCHES[0])).effect == "staged"
    assert r.put(encode_rows_payload(t, 0, BATCHES[2])).effect == "ignored"
    with pytest.raises(ApplyError, match="cannot stage rows of transaction"):
        r.put(encode_rows_payload(t, 1, b'[["cpu",9,{"x":"text"}]]'))
    assert r.commit(t).effect == "published"
    assert [row[0] for row in r.rows("cpu")] == [1, 2] and r.rows("mem") == [(1, r.version, 2.5, None)]
