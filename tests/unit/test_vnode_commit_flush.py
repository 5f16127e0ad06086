"""The flush rule with a commit limit (docs/vnode.md §5, issue 13 Deliver 1): a vnode archives
only the rows written by versions the group committed; the rest stays in the memtable and
the WAL, and comes back from the WAL after a restart. Also the prefix cut behind it
(TableLog.split_at, vrepl/_core/memcols.pyx), the no-op payload (format 3) and the table
list."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrepl._core.memcols import TableLog
from vrepl.vnode import PayloadError, Vnode, VnodeConfig
from vrepl.vnode import rows as R
from vrepl.vnode.memtable import Memtable
from vrepl.wal import WalOptions, WalWriter, read_records

pytestmark = pytest.mark.timeout(60)

DAY_MS = 86_400_000
CFG = VnodeConfig(file_span_ms=DAY_MS, max_memtable_age_ms=1000)
SCHEMA = {"i": "int", "f": "float", "b": "bool", "s": "str"}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# -- TableLog.split_at: a prefix cut in C -----------------------------------------------------

def _log_rows(log: TableLog, n: int | None = None) -> list[tuple]:
    n = log.n if n is None else n
    ts, ver, ep = (a.tolist() for a in log.arrays())
    pos = np.arange(n, dtype=np.int64)
    cols = {name: col.py_values(pos, n) for name, col in log.columns.items()}
    return [(ts[k], ver[k], ep[k], {c: v[k] for c, v in cols.items() if v[k] is not None})
            for k in range(n)]


row_values = st.fixed_dictionaries({}, optional={
    "i": st.integers(-2**63, 2**63 - 1), "f": st.floats(allow_nan=False, allow_infinity=False),
    "b": st.booleans(), "s": st.text(max_size=8) | st.none()})


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 50), row_values), max_size=40),
       cut=st.integers(0, 40))
def test_split_at_moves_exactly_the_suffix(rows, cut):
    log = TableLog()
    for k, (ts, vals) in enumerate(rows):
        log.append_row(ts, 1 + k // 3, 7, vals, SCHEMA)
    whole = _log_rows(log)
    cut = min(cut, log.n)
    suffix = log.split_at(cut)
    assert log.n == cut and suffix.n == len(rows) - cut
    assert _log_rows(log) + _log_rows(suffix) == whole
    for part, expect in ((log, whole[:cut]), (suffix, whole[cut:])):
        ts = [r[0] for r in expect]
        assert part.increasing == all(b > a for a, b in zip(ts, ts[1:]))
    # Both parts take appends afterwards like any log.
    suffix.append_row(99, 100, 7, {"s": "after"}, SCHEMA)
    assert _log_rows(suffix)[-1] == (99, 100, 7, {"s": "after"})


def test_split_at_refuses_a_position_outside_the_log():
    log = TableLog()
    log.append_row(1, 1, 1, {"i": 1}, SCHEMA)
    with pytest.raises(IndexError):
        log.split_at(2)
    with pytest.raises(IndexError):
        log.split_at(-1)


def test_memtable_split_above_keeps_counts_and_versions():
    mem = Memtable()
    mem.apply(5, 1, [["a", 1, {"i": 1}], ["b", 1, {"i": 1}]], 10.0, 100, {"a": SCHEMA, "b": SCHEMA})
    mem.apply(6, 1, [["a", 2, {"i": 2}]], 11.0, 50, {"a": SCHEMA})
    mem.apply(7, 2, [["b", 2, {"i": 3}], ["c", 0, {"s": "x"}]], 12.0, 50, {"b": SCHEMA, "c": SCHEMA})
    kept = mem.split_above(5, now=20.0)
    assert sorted(mem.tables) == ["a", "b"] and sorted(kept.tables) == ["a", "b", "c"]
    assert (mem.rows, mem.min_version, mem.max_version, mem.max_epoch) == (2, 5, 5, 1)
    assert (kept.rows, kept.min_version, kept.max_version, kept.max_epoch) == (3, 6, 7, 2)
    assert mem.bytes + kept.bytes == 200 and kept.bytes == 120
    assert mem.first_write_at == 10.0 and kept.first_write_at == 20.0
    assert mem.split_above(5, now=30.0).rows == 0          # nothing above: nothing moves
    everything = kept.split_above(0, now=40.0)
    assert kept.rows == 0 and not kept.tables and everything.rows == 3


# -- the flush rule at the commit boundary ----------------------------------------------------

def _slave_write(v: Vnode, wal: WalWriter, rows, epoch: int = 1) -> int:
    """A record as a slave gets it: appended to the WAL, then applied (write_to_cache)."""
    payload = R.encode_rows(rows)
    version = wal.append(payload, epoch)
    assert v.write_to_cache(version, epoch, payload)
    return version


def _file_rows(path: str, v: Vnode) -> list[tuple]:
    out = []
    for f in v._store.manifest.files:
        tbl = pq.read_table(os.path.join(path, f.name))
        out += [(f.table, r["ts"].timestamp() * 1000 // 1, r["_version"], r["x"])
                for r in tbl.to_pylist()]
    return sorted(out)


def test_flush_archives_only_up_to_the_committed_version_and_replays_the_rest(tmp_path):
    path = str(tmp_path)
    wal = WalWriter(os.path.join(path, "wal"), WalOptions(durability="fsync"))
    v = Vnode(path, CFG)
    v1 = _slave_write(v, wal, [("t", 10, {"x": 1}), ("u", 10, {"x": 1})])
    committed = _slave_write(v, wal, [("t", 11, {"x": 2}), ("t", 10, {"x": 20})])
    above = _slave_write(v, wal, [("t", 12, {"x": 3}), ("t", 11, {"x": 30})], epoch=2)
    assert (v1, committed, above) == (1, 2, 3)
    before = v.query("t", 0, 100)

    written = v.flush(up_to_version=committed)
    assert v.archived_version == committed and v.get_version() == above
    # Exactly the rows of versions <= committed are in the files, newest per ts ...
    assert _file_rows(path, v) == [("t", 10, 2, 20), ("t", 11, 2, 2), ("u", 10, 1, 1)]
    assert {f.table for f in written} == {"t", "u"}
    assert all(f.max_version <= committed for f in v._store.manifest.files)
    with open(os.path.join(path, "data", "manifest.json")) as fh:
        doc = json.load(fh)
    assert doc["archived_version"] == committed and doc["archived_epoch"] == 1
    # ... and the memtable holds exactly the rows of the version above it.
    st = v.status()
    assert st["memtable_rows"] == 2 and st["archived_version"] == committed
    assert v._mem.min_version == above and sorted(v._mem.tables) == ["t"]
    assert v.query("t", 0, 100) == before                  # reads see no difference

    # Nothing more is committed: nothing more to archive, however old the rows get.
    assert v.flush(up_to_version=committed) == []
    # close() archives the committed prefix only; the WAL brings the rest back.
    v.close(up_to_version=committed)
    wal.close()
    v2 = Vnode(path, CFG)
    assert v2.archived_version == committed and v2.get_version() == committed
    assert v2.recover() == 1                               # v3 replayed from the WAL
    assert v2.get_version() == above and v2.status()["memtable_rows"] == 2
    assert v2.query("t", 0, 100) == before
    assert _file_rows(path, v2) == [("t", 10, 2, 20), ("t", 11, 2, 2), ("u", 10, 1, 1)]
    # Once v3 is committed a flush archives it, merged with the files.
    v2.flush(up_to_version=above)
    assert v2.archived_version == above and v2.status()["memtable_rows"] == 0
    assert _file_rows(path, v2) == [("t", 10, 2, 20), ("t", 11, 3, 30), ("t", 12, 3, 3),
                                    ("u", 10, 1, 1)]
    assert v2.query("t", 0, 100) == before
    v2.close()


def test_rows_above_the_commit_limit_survive_a_truncation_of_the_log(tmp_path):
    """The bug of issue 13: unconfirmed rows flushed, then cut from the log. With the limit
    they are never archived, so a truncation above the limit rebuilds cleanly."""
    path = str(tmp_path)
    wal = WalWriter(os.path.join(path, "wal"), WalOptions(durability="fsync"))
    v = Vnode(path, CFG)
    committed = _slave_write(v, wal, [("t", 1, {"x": 1})])
    _slave_write(v, wal, [("t", 2, {"x": 99}), ("ghost", 1, {"x": 99})])   # never committed
    v.flush(up_to_version=committed)
    wal.truncate_after(committed)                 # the group cuts the deposed suffix
    assert v.rebuild() == 0                       # no VnodeError: nothing archived was cut
    assert [r["x"] for r in v.query("t", 0, 100)] == [1]
    assert v.query("ghost", 0, 100) == [] and not v.has_table("ghost")
    wal.close()
    v.close()


def test_flush_due_needs_committed_rows_and_counts_age_from_the_flush_that_kept_them(tmp_path):
    clock = Clock()
    v = Vnode(str(tmp_path), VnodeConfig(file_span_ms=DAY_MS, max_memtable_age_ms=1000,
                                        max_memtable_rows=3), clock=clock)
    v.write_to_cache(1, 1, R.encode_rows([("t", 1, {"x": 1})]))
    v.write_to_cache(2, 1, R.encode_rows([("t", 2, {"x": 1})]))
    clock.t += 5
    # Old enough, but every row is above the limit: not due (no flush loop every tick).
    assert v.flush_due(up_to_version=0) is None
    assert v.flush_due(up_to_version=1) is not None
    assert "max_memtable_age_ms" in v.flush_due()
    v.flush(up_to_version=1)
    # The kept row counts its age from that flush: not due again at once.
    assert v.flush_due(up_to_version=2) is None
    clock.t += 1.0
    assert "max_memtable_age_ms" in v.flush_due(up_to_version=2)
    # Size and row limits also need a committed row.
    v.write_to_cache(3, 1, R.encode_rows([("t", 3, {"x": 1}), ("t", 4, {"x": 1})]))
    clock.t = 0.0
    v._mem.first_write_at = 0.0
    assert v.flush_due(up_to_version=1) is None
    assert "max_memtable_rows" in v.flush_due(up_to_version=2)
    assert v.maybe_flush(up_to_version=1) == [] and v.archived_version == 1
    assert v.maybe_flush(up_to_version=2) and v.archived_version == 2
    v.close(up_to_version=3)
    assert v.archived_version == 3


# -- the no-op record (payload format 3) --------------------------------------------------------

def test_noop_record_advances_the_version_everywhere(tmp_path):
    path = str(tmp_path)
    wal = WalWriter(os.path.join(path, "wal"), WalOptions(durability="fsync"))
    v = Vnode(path, CFG)
    _slave_write(v, wal, [("t", 1, {"x": 1})])
    noop = wal.append(R.NOOP_PAYLOAD, 2)
    assert v.write_to_cache(noop, 2, R.NOOP_PAYLOAD)
    assert v.get_version() == noop and v.status()["memtable_rows"] == 1
    assert R.decode_rows(R.NOOP_PAYLOAD) == []
    with pytest.raises(PayloadError, match="no-op payload"):
        R.decode_rows(R.NOOP_PAYLOAD + b"[]", version=9)
    _slave_write(v, wal, [("t", 2, {"x": 2})], epoch=2)
    v.flush(up_to_version=noop)
    assert v.archived_version == noop
    wal.close()
    v.close(up_to_version=noop)
    assert [r.payload for r in read_records(os.path.join(path, "wal"))][1] == R.NOOP_PAYLOAD
    v2 = Vnode(path, CFG)                   # recovery replays across it
    assert v2.recover() == 1 and v2.get_version() == 3
    assert [r["x"] for r in v2.query("t", 0, 10)] == [1, 2]
    v2.close()


def test_tables_lists_what_the_vnode_holds(tmp_path):
    v = Vnode(str(tmp_path), CFG)
    v.write_to_cache(1, 1, R.encode_rows([("b", 1, {"x": 1, "s": "a"}), ("b", 2, {"x": 2})]))
    v.flush()
    v.write_to_cache(2, 1, R.encode_rows([("b", 2, {"x": 3}), ("a", 5, {"y": 1.5})]))
    assert v.tables() == [
        {"name": "a", "columns": {"y": "float"}, "archived_rows": 0, "memtable_rows": 1},
        {"name": "b", "columns": {"x": "int", "s": "str"}, "archived_rows": 2,
         "memtable_rows": 1}]
    assert v.has_table("a") and v.has_table("b") and not v.has_table("c")
    # A table only reserved by a validated write (never applied) holds no rows: not listed.
    assert v.prepare_write([("c", 1, {"z": 1})])[0] is None
    assert [t["name"] for t in v.tables()] == ["a", "b"] and not v.has_table("c")
    v.close()
