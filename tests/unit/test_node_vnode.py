"""The vnode features the node relies on: raw client bodies as payloads, request ids carried
in the WAL payload (format 2) and remembered on apply, flush through an immutable memtable
that queries still see."""
from __future__ import annotations

import json
import threading

from vrepl.vnode import Vnode, VnodeConfig
from vrepl.vnode import rows as R


def body(rows):
    return json.dumps(rows).encode()


def test_prepare_raw_embeds_the_body_and_request_id(tmp_path):
    v = Vnode(str(tmp_path / "a"))
    b = body([["t", 1, {"x": 1.5}], ["t", 2, {"x": 2}]])
    reason, rows, payload = v.prepare_raw(b, "req-1")
    assert reason is None and len(rows) == 2          # a Staged batch: parsed into columns
    assert payload.endswith(b) and R.payload_request_id(payload) == "req-1"
    assert R.decode_rows(payload) == [["t", 1, {"x": 1.5}], ["t", 2, {"x": 2}]]
    assert v.apply_prepared(1, 1, rows, len(payload), "req-1")
    assert [(r["ts"], r["x"]) for r in v.query("t", 0, 10)] == [(1, 1.5), (2, 2.0)]
    assert v.prepare_raw(b"[1", None)[0].startswith("body is not JSON")
    assert "UTF-8" in v.prepare_raw(b'["\xff"]', None)[0]
    assert "request_id" in v.prepare_raw(b, "a/b")[0]
    assert "is float, got str" in v.prepare_raw(body([["t", 3, {"x": "s"}]]), None)[0]


def test_request_ids_are_remembered_on_every_path(tmp_path):
    m = Vnode(str(tmp_path / "m"))
    s = Vnode(str(tmp_path / "s"))
    _, rows, payload = m.prepare_raw(body([["t", 1, {"x": 1}]]), "r-7")
    assert m.apply_prepared(1, 1, rows, len(payload), "r-7")
    assert not m.apply_prepared(1, 1, rows, len(payload), "r-7")   # already applied
    assert s.write_to_cache(1, 1, payload)                           # a slave applying it
    assert m.request_version("r-7") == s.request_version("r-7") == 1
    assert m.query("t", 0, 10) == s.query("t", 0, 10)


def test_dedup_table_is_bounded(tmp_path):
    v = Vnode(str(tmp_path / "v"), VnodeConfig(max_dedup_entries=3))
    for i in range(1, 6):
        _, rows, payload = v.prepare_raw(body([["t", i, {"x": i}]]), f"r{i}")
        v.apply_prepared(i, 1, rows, len(payload), f"r{i}")
    assert v.request_version("r1") is None and v.request_version("r5") == 5


def test_queries_see_the_immutable_memtable_during_a_flush(tmp_path, monkeypatch):
    v = Vnode(str(tmp_path / "v"))
    for i in range(1, 11):
        _, rows, payload = v.prepare_raw(body([["t", i, {"x": i}]]), None)
        v.apply_prepared(i, 1, rows, len(payload))
    started, release = threading.Event(), threading.Event()
    real = v._write_files

    def slow(*a):
        started.set()
        release.wait(5)
        return real(*a)
    monkeypatch.setattr(v, "_write_files", slow)
    t = threading.Thread(target=v.flush)
    t.start()
    assert started.wait(5)
    # Writes go on (the lock is free) and queries see imem + the new memtable.
    _, rows, payload = v.prepare_raw(body([["t", 5, {"x": 50}], ["t", 11, {"x": 11}]]), None)
    v.apply_prepared(11, 1, rows, len(payload))
    got = v.query("t", 0, 100)
    assert len(got) == 11 and got[4]["x"] == 50 and v.status()["flushing"]
    release.set()
    t.join(5)
    assert v.archived_version == 10
    assert v.query("t", 0, 100) == got                 # files + memtable, later version wins
    v.close()
    again = Vnode(str(tmp_path / "v"))
    assert again.query("t", 0, 100) == got             # close() flushed the rest
