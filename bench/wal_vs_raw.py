"""WAL append vs raw os.write + the same fsyncs, interleaved round by round (issue 2 target).

Usage: python bench/wal_vs_raw.py [--rounds 31] [--batches 300] [--batch-records 100]

The fsync latency of a virtual disk wanders by tens of percent over seconds, so timing all WAL
rounds and then all raw rounds (as pytest-benchmark does) compares two different disks. Here
each round runs WAL and raw back to back, alternating which goes first, and the ratio of the
medians is reported for: group commit (one fdatasync per batch of records), fsync per record,
and no fsync. Target: group commit >= 0.8 of raw.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from vrepl import wal
from vrepl._core import record as rec

PAYLOAD = b"p" * 128


def run_raw(directory: str, chunks: list[bytes], sync: bool) -> float:
    path = os.path.join(directory, "raw.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    t0 = time.perf_counter()
    for c in chunks:
        os.write(fd, c)
        if sync:
            os.fdatasync(fd)
    dt = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    return dt


def run_wal(directory: str, policy: str, batches: int, batch: list[bytes],
            per_record: bool) -> float:
    path = os.path.join(directory, "wal")
    w = wal.WalWriter(path, wal.WalOptions(durability=policy, group_commit_ms=0))
    t0 = time.perf_counter()
    for _ in range(batches):
        if per_record:
            for p in batch:
                w.append(p, 1)
        else:
            w.append_batch(batch, 1)
    dt = time.perf_counter() - t0
    w.close()
    shutil.rmtree(path)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--batch-records", type=int, default=100)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    batch = [PAYLOAD] * args.batch_records
    # The raw baseline writes exactly the bytes the WAL writes (same versions), encoded
    # beforehand: a disk that compresses or deduplicates must see the same data from both.
    n = args.batch_records
    chunks = [rec.encode_batch(1, 1 + i * n, 1, batch) for i in range(args.batches)]
    per_record_batches = max(1, args.batches // 10)
    cases = {
        "group commit, 1 fdatasync per batch": (
            lambda d: run_wal(d, "group", args.batches, batch, False),
            lambda d: run_raw(d, chunks, True),
            args.batches * args.batch_records),
        "fsync policy, 1 fdatasync per record": (
            lambda d: run_wal(d, "fsync", per_record_batches, batch, True),
            lambda d: run_raw(d, [rec.encode_record(1, v + 1, 1, PAYLOAD)
                                  for v in range(per_record_batches * n)], True),
            per_record_batches * args.batch_records),
        "none, no fsync": (
            lambda d: run_wal(d, "none", args.batches, batch, False),
            lambda d: run_raw(d, chunks, False),
            args.batches * args.batch_records),
    }
    with tempfile.TemporaryDirectory(prefix="vrepl-walbench-", dir=args.dir) as d:
        print(f"{args.rounds} interleaved rounds, batches of {args.batch_records} x 128 B,"
              f" directory on {os.statvfs(d).f_fsid:#x}")
        print("| case | WAL records/s | raw records/s | WAL / raw |")
        print("|---|---:|---:|---:|")
        for name, (wal_fn, raw_fn, records) in cases.items():
            wal_t, raw_t = [], []
            for r in range(args.rounds):
                order = (wal_fn, raw_fn) if r % 2 == 0 else (raw_fn, wal_fn)
                for fn in order:
                    (wal_t if fn is wal_fn else raw_t).append(fn(d))
            wm, rm = statistics.median(wal_t), statistics.median(raw_t)
            print(f"| {name} | {records / wm:,.0f} | {records / rm:,.0f} | {rm / wm:.2f} |")


if __name__ == "__main__":
    main()
