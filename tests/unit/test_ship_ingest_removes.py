"""Record version 2 of the format-8 ingest payload (docs/vnode.md §9.2): one record adds
files and removes archived (ingested) files, at one flush point, the same on every replica
(two vnodes applying the same records end with the same manifest), surviving a reopen; old
(version 1) records still decode; malformed removals are refused."""
from __future__ import annotations

import json
import os

import pytest

from vrepl.vnode import PayloadError, Vnode, VnodeConfig
from vrepl.vnode import staging as S
from vrepl.testing.ingestfiles import ORIGIN_COLUMNS, origin_rows, write_round_file
from vrepl.wal import WalOptions, WalWriter

pytestmark = pytest.mark.timeout(60)

DAY_MS = 86_400_000
CFG = VnodeConfig(file_span_ms=DAY_MS)


def stage(v: Vnode, rid: str, files) -> list[S.IngestEntry]:
    entries, srcs = [], []
    for i, (table, rows) in enumerate(files):
        name = f"r{rid}/{i}.parquet"
        full = S.confined_incoming(v.path, name)
        write_round_file(full, rows, ORIGIN_COLUMNS, v.config.precision)
        reason, e = S.check_file(full, name, table, "ship/x", v.config, v.schemas)
        assert reason is None, reason
        entries.append(e)
        srcs.append(full)
    return entries, srcs


def round_payload(v: Vnode, rid: str, files, removes=()) -> bytes:
    entries, srcs = stage(v, rid, files)
    rec = S.IngestRecord(rid, "test", {}, tuple(entries), tuple(removes))
    assert S.round_invalid(entries, len(removes)) is None
    S.stage_round(v.path, rec, srcs)
    return S.encode_ingest_payload(rec)


def apply(vnodes, wals, version_payloads):
    for v, w in zip(vnodes, wals):
        for payload in version_payloads:
            version = w.append(payload, 1)
            assert v.write_to_cache(version, 1, payload)
        v.flush(None, v.get_version())


def test_v1_record_unchanged_and_v2_round_trip():
    e = S.IngestEntry("a/0.parquet", "t", 0, 10, 5, 1, 0, 0, 1, 1, 1, 1, "o", {"x": "int"})
    v1 = S.IngestRecord("0" * 16, "ship", {}, (e,))
    p1 = S.encode_ingest_payload(v1)
    assert p1[:4] == b"VRB\x08" and "v" not in json.loads(p1[4:]) and "files" in json.loads(p1[4:])
    assert S.decode_ingest_payload(p1) == v1
    r = S.IngestRemove("data/t/b0-i7-0.parquet", 10, 5)
    v2 = S.IngestRecord("1" * 16, "ship", {}, (), (r,))
    p2 = S.encode_ingest_payload(v2)
    doc = json.loads(p2[4:])
    assert doc["v"] == 2 and doc["add"] == [] and "files" not in doc
    assert doc["remove"] == [{"name": "data/t/b0-i7-0.parquet", "size": 10, "crc32c": 5}]
    assert S.decode_ingest_payload(p2) == v2
    bad = [{**doc, "v": 3}, {**doc, "remove": []},
           {**doc, "remove": [{"name": "data/t/b0-17.parquet", "size": 1, "crc32c": 1}]},
           {**doc, "remove": [{"name": "../x/b0-i7-0.parquet", "size": 1, "crc32c": 1}]},
           {**doc, "remove": [doc["remove"][0], doc["remove"][0]]},
           {**doc, "remove": [{**doc["remove"][0], "crc32c": 0}]}]
    for d in bad:
        with pytest.raises(PayloadError, match="version 4"):
            S.decode_ingest_payload(b"VRB\x08" + json.dumps(d).encode(), 4)


def test_removal_applies_atomically_and_identically_on_replicas(tmp_path):
    vs = [Vnode(str(tmp_path / f"r{i}"), CFG) for i in range(2)]
    wals = [WalWriter(os.path.join(v.path, "wal"), WalOptions(durability="fsync")) for v in vs]
    # Round 1: two files of t (buckets 0 and 1).
    first = [round_payload(v, "a" * 16, [("t", origin_rows(3)),
                                        ("t", origin_rows(2, ts0=DAY_MS))]) for v in vs]
    for v, w, p in zip(vs, wals, first):
        apply([v], [w], [p])
    names = sorted(f.name for f in vs[0]._store.manifest.files)
    assert names == sorted(f.name for f in vs[1]._store.manifest.files)
    old = next(f for f in vs[0]._store.manifest.files if f.bucket == 0)
    # Round 2: a new file for bucket 0 replaces the old one in the same record.
    rm = S.IngestRemove(old.name, old.size, old.magic)
    archived = lambda v: (lambda n: (lambda e: None if e is None else
                                     (e.size, e.magic, e.ingest_version))(v.archived_entry(n)))
    assert S.removes_invalid((rm,), archived(vs[0]), {}) is None
    assert "no such ingested file" in S.removes_invalid(
        (S.IngestRemove("data/t/b0-i99-0.parquet", 1, 1),), archived(vs[0]), {})
    assert "the removal says" in S.removes_invalid(
        (S.IngestRemove(old.name, old.size + 1, old.magic),), archived(vs[0]), {})
    second = [round_payload(v, "b" * 16, [("t", origin_rows(2, ts0=5, tag="n"))], [rm])
              for v in vs]
    for v, w, p in zip(vs, wals, second):
        apply([v], [w], [p])
    for v in vs:
        m = v._store.manifest
        assert old.name not in {f.name for f in m.files}
        assert not os.path.exists(os.path.join(v.path, *old.name.split("/")))
        # The bucket-0 rows are now only the new file's: ts 5 and 6 (0..2 went with it).
        assert [r["ts"] for r in v.query("t", 0, DAY_MS)] == [5, 6]
        assert [r["ts"] for r in v.query("t", DAY_MS, 2 * DAY_MS)] == [DAY_MS, DAY_MS + 1]
    assert [(f.name, f.size, f.magic) for f in vs[0]._store.manifest.files] == \
        [(f.name, f.size, f.magic) for f in vs[1]._store.manifest.files]
    # A reopen replays nothing twice and keeps the removal.
    again = Vnode(vs[0].path, CFG)
    again.recover()
    assert [r["ts"] for r in again.query("t", 0, 2 * DAY_MS)] == [5, 6, DAY_MS, DAY_MS + 1]


def test_removal_only_round_and_reopen_replays_pending_removal(tmp_path):
    v = Vnode(str(tmp_path / "v"), CFG)
    wal = WalWriter(os.path.join(v.path, "wal"), WalOptions(durability="fsync"))
    apply([v], [wal], [round_payload(v, "c" * 16, [("t", origin_rows(3))])])
    f = v._store.manifest.files[0]
    payload = S.encode_ingest_payload(S.IngestRecord(
        "d" * 16, "test", {}, (), (S.IngestRemove(f.name, f.size, f.magic),)))
    version = wal.append(payload, 1)
    assert v.write_to_cache(version, 1, payload)
    assert v.pending_ingest(version).staged       # nothing to stage: applicable at once
    wal.close()
    # Crash before the flush: the reopened vnode replays the record and applies it.
    v2 = Vnode(v.path, CFG)
    v2.recover()
    v2.flush(None, v2.get_version())
    assert v2.query("t", 0, DAY_MS) == []
    assert v2._store.manifest.files == []
