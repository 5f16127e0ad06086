"""WAL append with each durability policy against raw os.write + the same fsyncs, same run.

Each round appends BATCHES batches of 100 x 128 B records. The baselines write the same
encoded bytes with os.write and call os.fdatasync exactly as often as the policy does:
  fsync       : one append() per record, each made durable  vs  write+fdatasync per record
  group       : one append_batch() per batch, one fdatasync  vs  write+fdatasync per batch
  none        : append_batch(), no fsync                     vs  write only
bench/report.py prints the ratio WAL / raw for each (target: group >= 0.8).
"""
import os
import shutil
import tempfile

import pytest

from vrepl import wal
from vrepl._core import record as rec

BATCHES = 200
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


class _Runs:
    """Fresh WAL writer per round, created and closed outside the timed part."""

    def __init__(self, directory, durability):
        self.directory = directory
        self.durability = durability
        self.round = 0
        self.writer = None

    def setup(self):
        # Like the raw baseline, which unlinks its file after each round, start every round
        # on a disk with the previous round's files gone.
        self.close()
        self.round += 1
        self.writer = wal.WalWriter(os.path.join(self.directory, f"w{self.round}"),
                                    wal.WalOptions(durability=self.durability,
                                                   group_commit_ms=0))
        return (), {}

    def close(self):
        if self.writer is not None:
            self.writer.close()
            shutil.rmtree(self.writer.directory)
            self.writer = None


def _append_batches(runs, per_record, batch_records):
    w = runs.writer
    batch = [PAYLOAD] * batch_records
    for _ in range(BATCHES):
        if per_record:
            for p in batch:
                w.append(p, 1)
        else:
            w.append_batch(batch, 1)


def _info(benchmark, records):
    benchmark.extra_info.update(records=records, bytes=records * (128 + 36))


@pytest.mark.parametrize("policy", ["group", "none"])
def test_wal_append_batch(benchmark, wal_dir, policy):
    _info(benchmark, BATCHES * BATCH_RECORDS)
    runs = _Runs(wal_dir, policy)
    try:
        benchmark.pedantic(lambda: _append_batches(runs, False, BATCH_RECORDS),
                           setup=runs.setup, rounds=7, iterations=1)
    finally:
        runs.close()


@pytest.mark.parametrize("sync", [True, False], ids=["fsync-per-batch", "no-fsync"])
def test_raw_write_batch(benchmark, wal_dir, sync):
    # The same bytes the WAL writes (versions differ per batch), encoded beforehand.
    chunks = [rec.encode_batch(1, 1 + i * BATCH_RECORDS, 1, [PAYLOAD] * BATCH_RECORDS)
              for i in range(BATCHES)]
    _info(benchmark, BATCHES * BATCH_RECORDS)
    benchmark.pedantic(_raw, args=(wal_dir, chunks, sync), rounds=7, iterations=1)


def test_wal_append_fsync_per_record(benchmark, wal_dir):
    _info(benchmark, BATCHES * 10)
    runs = _Runs(wal_dir, "fsync")
    try:
        benchmark.pedantic(lambda: _append_batches(runs, True, 10), setup=runs.setup,
                           rounds=3, iterations=1)
    finally:
        runs.close()


def test_raw_write_fsync_per_record(benchmark, wal_dir):
    records = [rec.encode_record(1, v + 1, 1, PAYLOAD) for v in range(BATCHES * 10)]
    _info(benchmark, BATCHES * 10)
    benchmark.pedantic(_raw, args=(wal_dir, records, True), rounds=3, iterations=1)
