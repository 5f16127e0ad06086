"""Bulk transactional load benchmark (issue 17 target; docs/transactions.md §4.1, figures in
docs/benchmarks.md §Transactions, "bulk").

    python bench/bench_txn_bulk.py [--total-mb 1024] [--files 8] [--parallel 1] [--dir /dev/shm]
                                   [--plain] [--warm-mib MIB]

1. txn bulk: --files archived-format Parquet files of --total-mb MiB in all (random float64
   values, one table and one bucket each, so compression leaves the size) are loaded through
   ONE transaction into a 3-replica vgroup of real `vrepl node` processes on 127.0.0.1: begin,
   `put_file` each file (streamed to the master with its CRC-32C, staged there, its files
   record committed once a quorum fetched and staged it), commit (answered once the master
   archived every file). Rate = file bytes / (begin .. commit answered). --parallel loaders
   (threads, each its own Client, the same label and so the same transaction) put the
   files at once, seq = the file's number, as a Spark job's tasks would. With --plain the
   files are plain Parquet (ts and values only): the master converts each one.
2. restore files phase, same run: bench/bench_restore.py's files_phase (`vrepl restore`
   pulling --total-mb MiB of archived files from a sync instance). Rate = bytes / seconds.
Prints both rates and their ratio (target >= 0.5) and the load average. Data under --dir
(tmpfs by default: the disk is not measured, as in bench_restore.py). Right before each of
the two timed steps, --warm-mib MiB are written under --dir and removed, so both find
recently freed pages (bench/freepages.py says why: without it the restore, which follows the
removal of the load's files, found them and the load's last puts did not).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_restore import files_phase  # noqa: E402
from freepages import free_recent_pages  # noqa: E402

from vrepl.client import Client  # noqa: E402
from vrepl.node.local import LocalCluster  # noqa: E402

MiB = 1024 * 1024
VG = 1
COLS = 4            # float64 value columns: a row is about 8 * (COLS + 3) bytes in Parquet


def make_files(tmp: str, total_mb: int, files: int, plain: bool) -> list[tuple[str, str]]:
    """(path, table) of `files` Parquet files of total_mb MiB in all."""
    rows = max(1, total_mb * MiB // files // (8 * (COLS + 3)))
    rng = np.random.default_rng(17)
    out = []
    for k in range(files):
        cols = {"ts": pa.array(np.arange(rows, dtype=np.int64), pa.timestamp("ms"))}
        if not plain:
            cols["_version"] = pa.array(np.arange(1, rows + 1, dtype=np.int64))
            cols["_epoch"] = pa.array(np.full(rows, 1, np.int64))
        for c in range(COLS):
            cols[f"v{c}"] = pa.array(rng.random(rows))
        path = os.path.join(tmp, f"f{k}.parquet")
        pq.write_table(pa.table(cols), path, compression="none")
        out.append((path, f"t{k}"))
    return out


def txn_bulk(tmp: str, files: list[tuple[str, str]], parallel: int, warm_mib: int) -> dict:
    c = LocalCluster(os.path.join(tmp, "cluster"), 3, vgroup=VG,
                     http={"write_timeout_ms": 120_000},
                     txn={"timeout_ms": 600_000, "max_timeout_ms": 3_600_000})
    try:
        c.start()
        c.wait_ready(timeout_s=60)
        c.wait_master(slaves=2, timeout_s=60)
        total = sum(os.path.getsize(p) for p, _ in files)
        datas = []
        for p, t in files:
            with open(p, "rb") as fh:
                datas.append((fh.read(), t))
        puts: list[float] = []

        def loader(k0: int) -> None:
            with Client(c.endpoints, timeout_s=300, request_timeout_s=300) as cl:
                txn = cl.transaction(VG, "bulk-1", timeout_ms=600_000).begin()
                for k in range(k0, len(datas), parallel):
                    p0 = time.perf_counter()
                    txn.put_file(datas[k][0], table=datas[k][1], seq=k)
                    puts.append(time.perf_counter() - p0)

        with Client(c.endpoints, timeout_s=300, request_timeout_s=300) as cl:
            free_recent_pages(warm_mib, tmp)
            t0 = time.perf_counter()
            txn = cl.transaction(VG, "bulk-1", timeout_ms=600_000).begin()
            threads = [threading.Thread(target=loader, args=(k,)) for k in range(parallel)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            c0 = time.perf_counter()
            done = txn.commit()
            t1 = time.perf_counter()
        assert done["state"] == "VISIBLE" and done["files"] >= len(files), done
        for n in c.nodes:       # every replica publishes (a row of each table read back)
            with Client([c.nodes[n].http], timeout_s=60, request_timeout_s=60) as rd:
                for _, table in files:
                    c.wait_for(f"n{n} publishes {table}", lambda t=table, ep=c.nodes[n].http: len(
                        rd.read(VG, t, limit=1, node=ep)["rows"]) == 1, 60)
        for n in c.nodes:
            with open(os.path.join(c.nodes[n].dir, "node.log")) as fh:
                lines = [ln.strip() for ln in fh if "file seq" in ln or "role" in ln
                         or "timed out" in ln or "staged (" in ln]
            for ln in lines:
                print(f"  n{n}:", ln[:220], flush=True)
        mb = total / MiB
        return {"mb": mb, "seconds": t1 - t0, "mb_s": mb / (t1 - t0),
                "put_s": puts, "commit_s": t1 - c0}
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-mb", type=int, default=1024)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=1, help="loaders putting files at once")
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--plain", action="store_true", help="plain Parquet: the master converts")
    ap.add_argument("--warm-mib", type=int, default=None, help="MiB written and removed under --dir right"
                    " before each timed step (default: 3 x --total-mb, the copies a load writes; 0: none)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="vrepl-bench-txn-bulk-", dir=args.dir)
    try:
        print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
        files = make_files(tmp, args.total_mb, args.files, args.plain)
        warm_mib = args.warm_mib if args.warm_mib is not None else 3 * args.total_mb
        bulk = txn_bulk(tmp, files, args.parallel, warm_mib)
        print(f"txn bulk: {bulk['mb']:.0f} MiB in {bulk['seconds']:.2f} s = {bulk['mb_s']:.0f}"
              f" MiB/s (puts {', '.join(f'{s:.2f}' for s in bulk['put_s'])} s; commit"
              f" {bulk['commit_s']:.2f} s)", flush=True)
        for p, _ in files:
            os.unlink(p)
        shutil.rmtree(os.path.join(tmp, "cluster"), ignore_errors=True)
        free_recent_pages(warm_mib, tmp)
        fp = files_phase(tmp, args.total_mb, 1.0)
        print(f"restore files phase: {fp['file_mb']:.0f} MiB in {fp['seconds']:.2f} s ="
              f" {fp['mb_s']:.0f} MiB/s", flush=True)
        ratio = bulk["mb_s"] / fp["mb_s"]
        print(f"ratio txn bulk / restore files phase: {ratio:.2f} (target >= 0.5);"
              f" load average after: {os.getloadavg()[0]:.1f}", flush=True)
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
