"""Replica data directories for the Spark validation tests, built with the real reference
vnode and WAL writer, and helpers that plant faults in a copy (an archived file rewritten
consistently, WAL records cut, duplicated or re-encoded)."""
from __future__ import annotations

import json
import os
import shutil


import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


from vrepl._core import record as _rec
from vrepl.vnode import Vnode, VnodeConfig, file_magic
from vrepl.wal import WalOptions, WalWriter

DAY_MS = 86_400_000
T0 = 1_700_000_000_000 - (1_700_000_000_000 % DAY_MS)    # a day boundary, in ms
CFG = VnodeConfig(file_span_ms=DAY_MS, fsync=False)
EPOCH2_FROM = 9           # versions >= this were written by the master of epoch 2
ARCHIVED_BATCHES = 12     # versions 1..12 are flushed; 13..15 stay in the WAL only
TOTAL_BATCHES = 15


def _skip_reason() -> str | None:
    from vrepl.spark.session import java_missing
    reason = java_missing()
    if reason:
        return reason
    try:
        import pyspark  # noqa: F401  (only whether it imports)
    except ImportError:
        return "pyspark is not installed (pip install -e '.[spark]')"
    return None


SKIP = _skip_reason()


def batch(i: int) -> list:
    """Batch i (1-based): rows of two tables over three days; batch 7 overwrites batch 2's
    first rows (later version wins) and batch 14 overwrites archived rows from the WAL."""
    rows = []
    base = T0 + (i % 3) * DAY_MS + i * 1000
    for k in range(20):
        rows.append(("cpu", base + k, {"x": i * 100 + k, "y": (i + k) / 4,
                                       "host": f"h{k % 3}" if k % 5 else None}))
    for k in range(5):
        rows.append(("disk", base + 500 + k, {"used": i * 10 + k, "ok": k % 2 == 0}))
    if i == 7:
        rows.append(("cpu", T0 + 2 * DAY_MS + 2000, {"x": -7, "y": 0.5, "host": "over"}))
    if i == 14:
        rows.append(("cpu", T0 + 1 * DAY_MS + 1000, {"x": -14, "y": 1.5, "host": "wal"}))
        rows.append(("mem", T0 + 5, {"free": 1.0}))      # a table only in the WAL
    return rows


def build_replica(path: str) -> None:
    """A replica data path as a vnode leaves it: files up to version 12, WAL 1..15."""
    v = Vnode(path, CFG)
    wal = WalWriter(os.path.join(path, "wal"), WalOptions(durability="none"))
    for i in range(1, TOTAL_BATCHES + 1):
        epoch = 1 if i < EPOCH2_FROM else 2
        reason, payload = v.prepare_write(batch(i))
        assert reason is None, reason
        version = wal.append(payload, epoch)
        assert version == i
        assert v.write_to_cache(version, epoch, payload)
        if i == 5 or i == ARCHIVED_BATCHES:
            v.flush(wal)            # one WAL file: nothing is recycled, 1..15 stay
    wal.close()


def copies(base: str, parent: str, n: int = 3) -> list[str]:
    """n identical replicas (copies of the data path `base`) named n1.. under `parent`."""
    out = []
    for i in range(1, n + 1):
        dst = os.path.join(parent, f"n{i}")
        shutil.copytree(base, dst)
        out.append(dst)
    return out


# -- planting faults ------------------------------------------------------------------------

def manifest(path: str) -> dict:
    with open(os.path.join(path, "data", "manifest.json")) as fh:
        return json.load(fh)


def save_manifest(path: str, doc: dict) -> None:
    with open(os.path.join(path, "data", "manifest.json"), "w") as fh:
        json.dump(doc, fh, indent=1)


def file_entry(path: str, table: str, bucket: int) -> dict:
    return next(f for f in manifest(path)["files"]
                if f["table"] == table and f["bucket"] == bucket)


def rewrite_file(path: str, table: str, bucket: int, change) -> None:
    """Replace the rows of one archived file with change(pa.Table) and update the manifest
    (size, magic, rows, ranges) so that the files check passes: a consistent replica that
    just holds other rows."""
    doc = manifest(path)
    entry = next(f for f in doc["files"] if f["table"] == table and f["bucket"] == bucket)
    fpath = os.path.join(path, *entry["name"].split("/"))
    old = pq.read_table(fpath)
    new = change(old).replace_schema_metadata(old.schema.metadata)
    sink = pa.BufferOutputStream()
    pq.write_table(new, sink, compression="zstd")
    data = sink.getvalue().to_pybytes()
    with open(fpath, "wb") as fh:
        fh.write(data)
    ts = pc.cast(new.column("ts"), pa.int64())
    entry.update(size=len(data), magic=file_magic(data), rows=new.num_rows,
                 ts_min=pc.min(ts).as_py(), ts_max=pc.max(ts).as_py(),
                 min_version=pc.min(new.column("_version")).as_py(),
                 max_version=pc.max(new.column("_version")).as_py())
    save_manifest(path, doc)


def wal_file(path: str) -> str:
    wdir = os.path.join(path, "wal")
    return os.path.join(wdir, sorted(n for n in os.listdir(wdir) if n.endswith(".wal"))[-1])


def wal_records(path: str) -> tuple[bytes, object]:
    with open(wal_file(path), "rb") as fh:
        data = fh.read()
    return data, _rec.scan(data)


def record_span(scan, version: int, data_len: int) -> tuple[int, int]:
    i = [int(v) for v in scan.versions].index(version)
    start = int(scan.offsets[i])
    end = int(scan.offsets[i + 1]) if i + 1 < scan.count else data_len
    return start, end


def edit_wal(path: str, edit) -> None:
    """Rewrite the (single) WAL file with edit(data, scan) -> bytes; drop its index."""
    data, scan = wal_records(path)
    new = edit(data, scan)
    with open(wal_file(path), "wb") as fh:
        fh.write(new)
    idx = wal_file(path)[:-4] + ".idx"
    if os.path.exists(idx):
        os.unlink(idx)
