"""The transaction state machine (vrepl/txn/machine.py) and its record (payload format 9),
docs/transactions.md §2-§4: states and reasons, labels and their retention, replays ignored,
the flush limit that keeps an unfinished transaction's records in the WAL, and the labels
file that survives a flush."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrepl.txn import (ABORTED, PRECOMMITTED, PREPARE, VISIBLE, TxnRecord, TxnTable,
                       decode_txn_payload, encode_txn_payload, is_txn_payload)
from vrepl.txn.machine import BEGUN, IGNORED, PUBLISHED, abort_kind
from vrepl.txn.record import TxnPayloadError, encode_rows_payload


def begin(t: TxnTable, v: int, label: str, at: int = 0, timeout: int = 1000):
    return t.apply(v, TxnRecord("begin", v, label=label, timeout_ms=timeout, at_ms=at))


def rows(t: TxnTable, v: int, txn: int, batch, tables=("cpu",), seq=None):
    rec = TxnRecord("rows", txn, rows=batch, seq=v if seq is None else seq)
    return t.apply(v, rec, batch, 10 * len(batch), tables)


def op(t: TxnTable, v: int, name: str, txn: int, at: int = 0, reason: str = ""):
    return t.apply(v, TxnRecord(name, txn, at_ms=at, reason=reason))


def test_record_round_trip_and_refusals():
    for rec in (TxnRecord("begin", 3, label="job-1", timeout_ms=5000, at_ms=17),
                TxnRecord("rows", 3, rows=[["cpu", 1, {"x": 1}]], seq=4),
                TxnRecord("precommit", 3, at_ms=18), TxnRecord("commit", 3, at_ms=19),
                TxnRecord("abort", 3, at_ms=20, reason="client: gave up")):
        p = encode_txn_payload(rec)
        assert is_txn_payload(p) and decode_txn_payload(p, 4) == rec
    p = encode_rows_payload(7, 2, b'[["cpu",1,{"x":1.5}]]')
    assert decode_txn_payload(p) == TxnRecord("rows", 7, rows=[["cpu", 1, {"x": 1.5}]], seq=2)
    for bad, why in ((b"VRB\x09{", "malformed"), (b'VRB\x09{"op":"fly","txn":1}', "op 'fly'"),
                     (b'VRB\x09{"op":"begin","txn":1,"label":"a/b","timeout_ms":1,"at_ms":0}',
                      "label 'a/b'"),
                     (b'VRB\x09{"op":"rows","txn":1,"rows":[]}', "non-empty"),
                     (b'VRB\x09{"op":"commit","txn":0,"at_ms":0}', "txn is not")):
        with pytest.raises(TxnPayloadError, match=why):
            decode_txn_payload(bad, 9)
    with pytest.raises(TxnPayloadError, match="version 9"):
        decode_txn_payload(b"VRB\x01[]", 9)


def test_life_of_a_transaction_and_its_states():
    t = TxnTable()
    assert begin(t, 1, "a").effect == BEGUN
    assert t.get(1).state == PREPARE and t.state_counts()[PREPARE] == 1
    assert rows(t, 2, 1, ["r1", "r2"]).txn.rows == 2
    assert rows(t, 3, 1, ["r3"], tables=("mem",)).txn.tables == {"cpu", "mem"}
    assert op(t, 4, "precommit", 1).txn.state == PRECOMMITTED
    # A sealed transaction takes no rows: ignored with the reason, nothing staged.
    out = rows(t, 5, 1, ["late"])
    assert out.effect == IGNORED and "takes no more rows" in out.reason and t.get(1).rows == 3
    out = op(t, 6, "commit", 1, at=50)
    assert out.effect == PUBLISHED and out.batches == (["r1", "r2"], ["r3"])
    txn = t.get(1)
    assert txn.state == VISIBLE and txn.describe()["visible_version"] == 6
    assert txn.batches == [] and t.state_counts() == {"PREPARE": 0, "PRECOMMITTED": 0,
                                                      "COMMITTED": 0, "VISIBLE": 1, "ABORTED": 0}


def test_commit_after_abort_and_abort_after_commit_are_ignored_with_reasons():
    t = TxnTable()
    begin(t, 1, "a")
    rows(t, 2, 1, ["r"])
    op(t, 3, "abort", 1, reason="client: changed its mind")
    out = op(t, 4, "commit", 1)
    assert out.effect == IGNORED and "ABORTED (client: changed its mind)" in out.reason
    assert out.batches == () and not out.duplicate
    assert op(t, 5, "abort", 1).duplicate         # a repeated abort: already done
    begin(t, 6, "b")
    op(t, 7, "commit", 6)
    assert op(t, 8, "commit", 6).duplicate        # a repeated commit: already done
    out = op(t, 9, "abort", 6, reason="client")
    assert out.effect == IGNORED and "is VISIBLE" in out.reason and not out.duplicate
    assert t.aborts == {"client": 1}
    assert op(t, 10, "commit", 99).reason.startswith("no transaction 99")


def test_labels_duplicate_in_flight_reuse_after_abort():
    t = TxnTable()
    begin(t, 1, "job")
    out = begin(t, 2, "job")                   # a second begin with the label in flight
    assert out.effect == IGNORED and out.txn.id == 1 and len(t.txns) == 1
    op(t, 3, "abort", 1, reason="timeout: silent loader")
    assert t.aborts == {"timeout": 1}
    assert begin(t, 4, "job").effect == BEGUN   # reuse after abort: a new transaction
    assert t.by_label("job").id == 4
    op(t, 5, "commit", 4)
    assert begin(t, 6, "job").effect == IGNORED and t.by_label("job").state == VISIBLE


def test_a_batch_seq_is_staged_once():
    t = TxnTable()
    begin(t, 1, "a")
    assert rows(t, 2, 1, ["r1"], seq=0).effect != IGNORED
    out = rows(t, 3, 1, ["r1 again"], seq=0)         # a retried or speculative put
    assert out.effect == IGNORED and "already staged" in out.reason
    assert rows(t, 4, 1, ["r2"], seq=1).effect != IGNORED
    assert op(t, 5, "commit", 1).batches == (["r1"], ["r2"])


def test_replays_are_ignored_and_begin_must_name_its_own_version():
    t = TxnTable()
    begin(t, 1, "a")
    rows(t, 2, 1, ["r"])
    assert rows(t, 2, 1, ["r"]).effect == IGNORED and t.get(1).rows == 1
    out = t.apply(3, TxnRecord("begin", 1, label="b", timeout_ms=1, at_ms=0))
    assert out.effect == IGNORED and "not its own version" in out.reason


def test_label_retention_by_the_records_clock():
    t = TxnTable(label_retention_ms=1000)
    begin(t, 1, "old", at=0)
    op(t, 2, "commit", 1, at=10)
    begin(t, 3, "new", at=500)
    assert t.by_label("old") is not None
    op(t, 4, "abort", 3, at=1011, reason="client")   # the clock passes 10 + 1000
    assert t.by_label("old") is None and t.get(1) is None
    assert begin(t, 5, "old", at=1012).effect == BEGUN    # an expired label is new again
    assert t.state_counts()[VISIBLE] == 0 and t.state_counts()[ABORTED] == 1


def test_flush_limit_keeps_unfinished_transactions_in_the_log():
    t = TxnTable()
    assert t.flush_limit(10) == 10
    begin(t, 5, "a")
    begin(t, 7, "b")
    assert t.flush_limit(4) == 4 and t.flush_limit(10) == 4
    op(t, 9, "commit", 5)            # a finished at 9, b still open
    # b's begin holds the cut at 6; a finished at 9, above 6: its begin holds it at 4
    assert t.flush_limit(10) == 4
    op(t, 11, "commit", 7)
    assert t.flush_limit(10) == 4 and t.flush_limit(11) == 11 and t.flush_limit(8) == 4


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["begin", "commit", "abort"]),
                          st.integers(0, 4)), max_size=30), st.integers(0, 40))
def test_flush_limit_never_cuts_inside_an_unfinished_transaction(steps, limit):
    t = TxnTable()
    v = 0
    ids: list[int] = []
    for name, k in steps:
        v += 1
        if name == "begin":
            begin(t, v, f"l{k}")
            ids.append(v)
        elif ids:
            op(t, v, name, ids[k % len(ids)])
        else:
            v -= 1
    cut = t.flush_limit(limit)
    assert cut <= limit

    def valid(c: int) -> bool:
        return all(not x.open and x.finish_version <= c for x in t.txns.values() if x.id <= c)
    assert valid(cut)
    # ... and the highest such cut: a flush archives as much as the rule allows.
    assert not any(valid(c) for c in range(cut + 1, limit + 1))


def test_flush_limit_walks_a_chain_of_overlapping_transactions():
    # Concurrent loaders: each transaction begins before the previous one finishes, so
    # the only cut outside every one of them is below the first.
    t = TxnTable()
    begin(t, 1, "l0")
    for k in range(1, 200):
        begin(t, 2 * k, f"l{k}")
        op(t, 2 * k + 1, "commit", 1 if k == 1 else 2 * (k - 1))
    assert t.flush_limit(1000) == 0
    op(t, 400, "commit", 398)       # the last one finishes: every version can go
    assert t.flush_limit(1000) == 1000 and t.flush_limit(399) == 0


def test_labels_file_round_trip_drops_entries_above_the_archive():
    t = TxnTable()
    begin(t, 1, "a", at=1)
    rows(t, 2, 1, ["r"])
    op(t, 3, "commit", 1, at=3)
    begin(t, 4, "b", at=4)
    op(t, 5, "abort", 4, at=5, reason="timeout")
    begin(t, 6, "c", at=6)                       # open: never in the file
    doc = json.loads(json.dumps(t.labels_doc(5)))
    assert [d["label"] for d in doc["txns"]] == ["a", "b"]
    u = TxnTable()
    u.load_labels(doc, 5)
    assert u.by_label("a").state == VISIBLE and u.by_label("a").finish_version == 3
    assert u.by_label("b").reason == "timeout" and u.aborts == {"timeout": 1}
    assert u.applied_version == 5 and u.by_label("c") is None
    w = TxnTable()
    w.load_labels(doc, 3)                        # manifest commit did not happen past 3
    assert w.by_label("a") is not None and w.by_label("b") is None


def test_abort_kind():
    assert abort_kind("timeout: 60000 ms without commit") == "timeout"
    assert abort_kind("client") == "client"
    assert abort_kind("who knows") == "other"


def test_files_record_round_trip_shares_seqs_and_abort_hands_back_the_batches():
    entry = {"name": "f.parquet", "table": "cpu", "bucket": 0, "size": 10, "crc32c": 7}
    rec = TxnRecord("files", 3, seq=2, round="0123456789abcdef", files=[entry])
    assert decode_txn_payload(encode_txn_payload(rec), 9) == rec
    for bad in ({"round": "XYZ", "files": [entry]}, {"round": "0123456789abcdef", "files": []},
                {"round": "0123456789abcdef", "files": ["x"]}):
        raw = b"VRB\x09" + json.dumps({"op": "files", "txn": 3, "seq": 1, **bad}).encode()
        with pytest.raises(TxnPayloadError):
            decode_txn_payload(raw, 9)
    t = TxnTable()
    begin(t, 1, "f")
    batch = object()
    out = t.apply(2, TxnRecord("files", 1, seq=0, round="0123456789abcdef", files=[entry]),
                  batch, 1000, ("cpu",), 50)
    assert out.txn.files == 1 and out.txn.file_bytes == 1000 and out.txn.rows == 50
    assert t.staged_file_bytes() == 1000 and t.staged_bytes() == 0
    assert rows(t, 3, 1, [["cpu", 1, {}]], seq=0).effect == IGNORED     # seq 0 is the file
    done = op(t, 4, "abort", 1, reason="client: x")
    assert done.batches == (batch,) and t.staged_file_bytes() == 0
    assert done.txn.describe()["files"] == 1
