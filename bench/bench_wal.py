"""WAL append with each durability policy against raw os.write + the same fsyncs, same run.

Each round appends BATCHES batches of 100 x 128 B records. The baselines write the same
encoded bytes with os.write and call os.fdatasync exactly as often as the policy does:
  fsync       : one append() per record, each made durable  vs  write+fdatasync per record
  group       : one append_batch() per batch, one fdatasync  vs  write+fdatasync per batch
  none        : append_batch(), no fsync                     vs  write only
bench/report.py prints the ratio WAL / raw for each (target: group >= 0.8).
"""
import os
import tempfile

import pytest

from vrepl import wal
from vrepl._core import record as rec

BATCHES = 50
BATCH_RECORDS = 100
PAYLOAD = b"p" * 128


@pytest.fixture()
def wal_dir():
    with tempfile.TemporaryDirectory(prefix="vrepl-bench-", dir=os.environ.get("VREPL_BENCH_DIR")) as d:
        yield d


def _raw(directory, chunks, sync):
    fd = os.open(os.path.join(directory, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for c in chunks:
            os.write(fd, c)
            if sync:
                os.fdatasync(fd)
    finally:
        os.close(fd)
    os.unlink(os.path.join(directory, "raw.log"))


def _wal_run(directory, durability, per_record):
    w = wal.WalWriter(os.path.join(directory, "w"), wal.WalOptions(durability=durability,
                                                                   group_commit_ms=0))
    batch = [PAYLOAD] * BATCH_RECORDS
    try:
        for _ in range(BATCHES):
            if per_record:
                for p in batch:
                    w.append(p, 1)
            else:
                w.append_batch(batch, 1)
    finally:
        w.close()
    for name in os.listdir(os.path.join(directory, "w")):
        os.unlink(os.path.join(directory, "w", name))
    os.rmdir(os.path.join(directory, "w"))


def _info(benchmark, records):
    benchmark.extra_info.update(records=records, bytes=records * (128 + 36))


@pytest.mark.parametrize("policy", ["group", "none"])
def test_wal_append_batch(benchmark, wal_dir, policy):
    _info(benchmark, BATCHES * BATCH_RECORDS)
    benchmark.pedantic(_wal_run, args=(wal_dir, policy, False), rounds=5, iterations=1)


@pytest.mark.parametrize("sync", [True, False], ids=["fsync-per-batch", "no-fsync"])
def test_raw_write_batch(benchmark, wal_dir, sync):
    chunk = rec.encode_batch(1, 1, 1, [PAYLOAD] * BATCH_RECORDS)
    _info(benchmark, BATCHES * BATCH_RECORDS)
    benchmark.pedantic(_raw, args=(wal_dir, [chunk] * BATCHES, sync), rounds=5, iterations=1)


def test_wal_append_fsync_per_record(benchmark, wal_dir):
    _info(benchmark, BATCHES * 10)
    global BATCH_RECORDS
    saved, BATCH_RECORDS = BATCH_RECORDS, 10
    try:
        benchmark.pedantic(_wal_run, args=(wal_dir, "fsync", True), rounds=3, iterations=1)
    finally:
        BATCH_RECORDS = saved


def test_raw_write_fsync_per_record(benchmark, wal_dir):
    rec1 = rec.encode_record(1, 1, 1, PAYLOAD)
    _info(benchmark, BATCHES * 10)
    benchmark.pedantic(_raw, args=(wal_dir, [rec1] * (BATCHES * 10), True), rounds=3, iterations=1)
