"""The reference vnode's per-batch write costs, without replication or sockets.

    python bench/bench_vnode.py [--batches 10000] [--tables 16]

For batches of 100 rows of ~100 JSON bytes (the end-to-end benchmark's rows), one vnode
takes the master's path (`prepare_raw` + `apply_prepared`), a second one the slave's
(`write_to_cache` of the master's payload), then the second flushes everything it holds
to Parquet. GC thresholds as in the node process (vrepl/node/server.py). Prints µs per
batch for each path and the flush time. Compare trees by running this script from each
(`PYTHONPATH=<tree> python <tree>/bench/bench_vnode.py`), alternating.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from vrepl.vnode.vnode import Vnode  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=10_000)
    ap.add_argument("--tables", type=int, default=16)
    args = ap.parse_args()
    gc.set_threshold(50_000, 20, 100)
    tmpl = b'["lg_%d",%d,{"v":%d,"s":"' + b"x" * 60 + b'"}]'
    bodies = [b"[" + b",".join(tmpl % (b % args.tables, 1_600_000_000_000 + b * 100 + k, k)
                               for k in range(100)) + b"]" for b in range(args.batches)]
    base = tempfile.mkdtemp(prefix="vrepl-bench-vnode-")
    try:
        master = Vnode(os.path.join(base, "m"))
        slave = Vnode(os.path.join(base, "s"))
        t_master = t_slave = 0.0
        for i, body in enumerate(bodies, start=1):
            t0 = time.perf_counter()
            reason, rows, payload = master.prepare_raw(body)
            assert reason is None, reason
            master.apply_prepared(i, 1, rows, len(payload))
            t1 = time.perf_counter()
            slave.write_to_cache(i, 1, payload)
            t_slave += time.perf_counter() - t1
            t_master += t1 - t0
        t0 = time.perf_counter()
        slave.flush()
        t_flush = time.perf_counter() - t0
        n = len(bodies)
        print(f"{n} batches x 100 rows: master prepare_raw + apply_prepared"
              f" {t_master / n * 1e6:.1f} us/batch, slave write_to_cache"
              f" {t_slave / n * 1e6:.1f} us/batch, flush of {n * 100:,} rows {t_flush:.2f} s")
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
