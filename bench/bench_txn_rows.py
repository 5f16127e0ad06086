"""A transaction's rows in one vnode, no network: staging and publishing speed, and the
memory a staged row holds (docs/benchmarks.md §Transactions, txnrows).

    python bench/bench_txn_rows.py [--rows 500000] [--batch 50000] [--tables 8]

One `Vnode` in a temporary directory applies, through `Vnode.apply_txn` as a replica
does: a begin record, `--rows / --batch` rows records (the master's layout,
`encode_rows_payload`) of rows [t<i % tables>, T0 + i, {"x": float, "n": int, "s": str}],
then the commit (the publish). Printed: the staging and publish times and rows/s; the same
bodies applied as plain writes (`write_to_cache` of format-1 payloads) for comparison; and
the RSS growth per staged row (measured first: the staged batches of a transaction of the
same rows, before its publish).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from vrepl.txn import TxnRecord, encode_txn_payload  # noqa: E402
from vrepl.txn.record import encode_rows_payload  # noqa: E402
from vrepl.vnode import Vnode, VnodeConfig  # noqa: E402
from vrepl.vnode.rows import encode_payload  # noqa: E402

T0 = 1_700_000_000_000


def bodies(rows: int, batch: int, tables: int) -> list[bytes]:
    out = []
    for start in range(0, rows, batch):
        rs = [[f"t{i % tables}", T0 + i, {"x": i * 0.5, "n": i, "s": f"abc{i % 100}"}]
              for i in range(start, min(rows, start + batch))]
        out.append(json.dumps(rs, separators=(",", ":")).encode())
    return out


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fresh_vnode(root: str, name: str) -> Vnode:
    v = Vnode(os.path.join(root, name), VnodeConfig())
    v.recover()
    return v


def begin(v: Vnode, version: int) -> None:
    v.apply_txn(version, 1, encode_txn_payload(TxnRecord("begin", version, label=f"b{version}",
                                                         timeout_ms=3_600_000, at_ms=0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--tables", type=int, default=8)
    args = ap.parse_args()
    bs = bodies(args.rows, args.batch, args.tables)
    with tempfile.TemporaryDirectory() as root:
        # Memory first, while the process has freed nothing its RSS would reuse.
        m = fresh_vnode(root, "memory")
        begin(m, 1)
        gc.collect()
        r0 = rss_bytes()
        for k, b in enumerate(bs):
            m.apply_txn(k + 2, 1, encode_rows_payload(1, k, b))
        gc.collect()
        print(f"staged memory: {(rss_bytes() - r0) / args.rows:.0f} bytes of RSS per staged row")
        del m
        v = fresh_vnode(root, "txn")
        begin(v, 1)
        t0 = time.perf_counter()
        for k, b in enumerate(bs):
            v.apply_txn(k + 2, 1, encode_rows_payload(1, k, b))
        t1 = time.perf_counter()
        out = v.apply_txn(len(bs) + 2, 1, encode_txn_payload(TxnRecord("commit", 1, at_ms=1)))
        t2 = time.perf_counter()
        assert out is not None and out.effect == "published"
        print(f"transaction: {args.rows} rows staged in {t1 - t0:.2f} s, published in"
              f" {t2 - t1:.2f} s: {args.rows / (t2 - t0):,.0f} rows/s")
        w = fresh_vnode(root, "plain")
        t0 = time.perf_counter()
        for k, b in enumerate(bs):
            w.write_to_cache(k + 1, 1, encode_payload(b))
        t1 = time.perf_counter()
        print(f"plain writes: {args.rows} rows in {t1 - t0:.2f} s: {args.rows / (t1 - t0):,.0f} rows/s")


if __name__ == "__main__":
    main()
