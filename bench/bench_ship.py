"""`vrepl ship` benchmarks (docs/ship.md; targets in issue 16, figures in docs/benchmarks.md).

    python bench/bench_ship.py [--files 2000] [--file-kib 1024] [--replicas 1,3] [--senders 8]
                               [--cut-mib 1024] [--dir DIR] [--edge DIR] [--idle-rounds 1] [--no-rsync]
                               [--pairs 1] [--warm-mib MIB]

An edge vnode directory of --files archived Parquet files of about --file-kib KiB each (one
table per file, random string values, so compression leaves the size) is written once (its
manifest as a vnode writes it). Then, each on 127.0.0.1 with real processes:

0. the edge's files are read once, so every step starts from the page cache (the time it
   took says whether they were cold); and right before each rsync and each first full ship,
   --warm-mib MiB (default: the edge's size) are written, fsynced, dropped from the page
   cache and removed, so each finds as many recently freed pages as the other
   (bench/freepages.py says why).
1. rsync baseline: `rsync -a --whole-file` of the edge's data/ to an rsync daemon (skipped
   when rsync is not installed: tools/install_system_deps.sh installs it), then `sync`
   outside rsync's timing, so the next step does not write rsync's files back. The sync is
   timed too: "rsync, then sync" is a second baseline, rsync's copy on stable storage, as a
   ship's files are (each fsynced) when `vrepl ship` returns.
2. first full ship: `vrepl ship --once` into a fresh receiving vgroup of each --replicas
   count (real `vrepl node` processes); seconds until the command returned (every file loaded
   and committed on a quorum) and the ratio of rates against rsync (target >= 1.0 with 1
   replica, >= 0.7 with 3). With each time the CPU seconds it took (rsync: client and
   daemon; a ship: `vrepl ship` and every receiving node), which says whether a run was
   bound by CPU work or by waiting (the machine is shared: compare CPU, not only seconds).
3. a round with nothing new: its wall time inside `vrepl ship` (the round line) and the file
   bytes the receiver received meanwhile (target < 50 ms and 0 bytes); with --idle-rounds N,
   N such rounds (each its own `vrepl ship --once` process), their median and each.
   Its cost grows with the number of files, not their size: `--file-kib 4` measures it on
   the issue's 2,000 files in seconds.
4. a link cut at half of one --cut-mib MiB file (the sender SIGKILLed by the kill point
   ship.sender.mid_file at half of its 1 MiB slices), then a round that resumes: bytes the
   receiver received in all / the file's size (target <= 1.05).
5. --senders senders (each its own edge directory, 1/--senders of the files) into one
   receiver at once: aggregate rate / the rate of one sender (target >= 0.8).
With --pairs N, steps 1 and 2 run N times in turn (rsync, then one first full ship per
--replicas into a fresh receiver) and each ratio's median over the pairs is printed: rsync's
own time moves by a factor of 2-3 between consecutive runs on the test VM.
Every step's copy stays on disk until the run ends (KEEP_TREES below); leave five minutes
between runs, or the first step pays for the last run's removal.
Prints each figure as it is measured, then a table (the figures of one run go to
docs/benchmarks.md). A first full ship that fails is a figure too (FAILED, with the
command's last line; the steps after it still run) and makes the exit code 1.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import pyarrow as pa
import pyarrow.parquet as pq

from freepages import free_recent_pages  # noqa: E402 (bench/, the script's directory)
from vrepl.child import free_port, python_argv
from vrepl.node.local import LocalCluster
from vrepl.vnode.files import ArchivedFile, Manifest, file_magic, parquet_options

SECRET = "bench-ship-secret-0123456789"
SPAN_MS = 864_000_000


def make_edge(path: str, files: int, file_kib: int, prefix: str = "t") -> int:
    """A vnode directory with `files` archived files; their total bytes."""
    data = os.path.join(path, "data")
    os.makedirs(data, exist_ok=True)
    rows = max(1, file_kib * 1024 // 36)      # ~36 bytes a row once compressed (56 random hex digits)
    m = Manifest("ms", SPAN_MS, archived_version=files, archived_epoch=1)
    total = 0
    for k in range(files):
        table = f"{prefix}{k}"
        blob = [os.urandom(28).hex() for _ in range(rows)]
        t = pa.table({"ts": pa.array(range(rows), pa.timestamp("ms")),
                      "_version": pa.array([k + 1] * rows, pa.int64()),
                      "_epoch": pa.array([1] * rows, pa.int64()),
                      "v": pa.array(blob, pa.string())})
        name = f"data/{table}/b0-v{k + 1}.parquet"
        full = os.path.join(path, name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        pq.write_table(t, full, **parquet_options(t.column_names))
        with open(full, "rb") as fh:
            raw = fh.read()
        total += len(raw)
        m.schemas[table] = {"v": "str"}
        m.files.append(ArchivedFile(name, len(raw), file_magic(raw), table, 0, 0, rows - 1, k + 1, k + 1, rows))
    m.sort()
    with open(os.path.join(path, "data", "manifest.json"), "wb") as fh:
        fh.write(m.to_bytes())
    return total


def receiver(base: str, replicas: int) -> LocalCluster:
    c = LocalCluster(base, replicas, ship_senders=[{"id": 7, "secret": SECRET}],
                     http={"write_timeout_ms": 120_000})
    c.start()
    c.wait_master(slaves=replicas - 1, timeout_s=60)
    return c


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    t = os.times()
    return t.children_user + t.children_system


def node_cpu_split(recv: LocalCluster) -> dict[int, tuple[float, float]]:
    """(user, system) CPU seconds each receiving node process used so far, by node id."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for node_id, n in recv.nodes.items():
        if n.proc is None:
            continue
        try:
            with open(f"/proc/{n.proc.pid}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[node_id] = (int(f[11]) / tick, int(f[12]) / tick)
    return out


def node_cpu_s(recv: LocalCluster) -> float:
    """CPU seconds (user + system) the receiving node processes used so far."""
    return sum(u + s for u, s in node_cpu_split(recv).values())


def ship(edge: str, recv: LocalCluster, *extra: str, env: dict | None = None) -> tuple[float, str, int]:
    to = ",".join(n.replication for n in recv.nodes.values())
    e = {k: v for k, v in os.environ.items() if k != "VREPL_KILLPOINT"}
    e.update(VREPL_SHIP_SECRET=SECRET, **(env or {}))
    t0 = time.monotonic()
    p = subprocess.run(python_argv("-m", "vrepl.cli", "ship", "--to", to, "--data", edge, "--sender-id", "7",
                                   "--once", "--no-progress", "--timeout", "300", *extra),
                       env=e, capture_output=True, text=True)
    return time.monotonic() - t0, p.stdout + p.stderr, p.returncode


def received_bytes(recv: LocalCluster) -> float:
    total = 0.0
    for n in recv.nodes.values():
        try:
            with urllib.request.urlopen(f"http://{n.http}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("vrepl_ship_received_bytes_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def warm(src: str) -> tuple[int, float]:
    """Read every file under `src` once (bytes, seconds), so the baseline and the ships all
    start from the page cache: the one that ran first used to pay the disk reads alone (an
    edge left for an hour is cold again), which moved rsync's figure between 2.5 and 11 s."""
    total, t0 = 0, time.monotonic()
    for root, _dirs, files in os.walk(src):
        for name in files:
            with open(os.path.join(root, name), "rb", buffering=0) as fh:
                while chunk := fh.read(4 << 20):
                    total += len(chunk)
    return total, time.monotonic() - t0


def rsync_baseline(src: str, base: str, dst_name: str = "rsync-dst") -> tuple[float | None, float, float]:
    """(seconds, CPU seconds of the rsync client and daemon, seconds of the `sync` after it),
    (None, 0, 0) without rsync."""
    if shutil.which("rsync") is None:
        return None, 0.0, 0.0
    dst = os.path.join(base, dst_name)
    os.makedirs(dst)
    port = free_port()
    conf = os.path.join(base, "rsyncd.conf")
    with open(conf, "w") as fh:
        fh.write(f"use chroot = no\npid file = {base}/rsyncd.pid\n[dst]\npath = {dst}\nread only = no\n"
                 "uid = root\ngid = root\n")
    d = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--config={conf}", f"--port={port}",
                          "--address=127.0.0.1"])
    cpu0 = children_cpu_s()
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        subprocess.run(["rsync", "-a", "--whole-file", src + "/", f"rsync://127.0.0.1:{port}/dst/"], check=True)
        secs = time.monotonic() - t0
    finally:
        d.terminate()
        d.wait(10)
    cpu = children_cpu_s() - cpu0
    # rsync does not fsync: its dirty pages would be written back during the next step and
    # counted against it. Written back here, outside both timings; how long that took is
    # the second baseline ("rsync, then sync"): what rsync costs to the point where its
    # copy is on stable storage, as a ship's is when `vrepl ship` returns.
    t0 = time.monotonic()
    os.sync()
    return secs, cpu, time.monotonic() - t0


# KEEP_TREES: no step's copy is removed before the run ends. On ext4 without a journal (the
# test VM's root file system) every inode allocation skips the inodes freed in the last 60 to
# 300 s one by one (the kernel's `recently_deleted` check), so a step that followed the
# removal of the previous step's 4,000 files and directories paid about 0.8 ms more per
# file it created: 0.8 s against 4.1 s for 4,000 directories of one file each, fresh against just
# after a removal of 8,000 (docs/benchmarks.md §Shipping, eighth session). Which step paid
# depended on the order of the steps, not on the programs measured.


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=2000, help="archived files in the edge directory (2000)")
    ap.add_argument("--file-kib", type=int, default=1024, help="approximate size of each file in KiB (1024)")
    ap.add_argument("--replicas", default="1,3", help="receiving vgroup sizes to measure (1,3)")
    ap.add_argument("--senders", type=int, default=8, help="concurrent senders in step 5 (8; 0 skips it)")
    ap.add_argument("--cut-mib", type=int, default=1024, help="size of the file cut at half in step 4 (1024; 0 skips)")
    ap.add_argument("--dir", default=None, help="where to put everything (default: a temporary directory)")
    ap.add_argument("--edge", default=None, help="keep the edge directory of steps 1-3 here, and reuse it when"
                    " it has a manifest (runs of the same --files and --file-kib; default: made in --dir, removed)")
    ap.add_argument("--idle-rounds", type=int, default=1, help="rounds with nothing new after each first full"
                    " ship (1)")
    ap.add_argument("--rsync", action=argparse.BooleanOptionalAction, default=True,
                    help="run the rsync baseline (default; --no-rsync skips it)")
    ap.add_argument("--pairs", type=int, default=1, help="steps 1 and 2 this many times in turn (rsync, then a"
                    " first full ship per --replicas), and the median of the ratios (1)")
    ap.add_argument("--warm-mib", type=int, default=None, help="MiB written, dropped and removed right"
                    " before each rsync and first full ship (default: the edge's size; 0: none)")
    args = ap.parse_args()
    if args.dir is not None:
        os.makedirs(args.dir, exist_ok=True)
    base = tempfile.mkdtemp(prefix="bench-ship-", dir=args.dir)
    out: list[tuple[str, str]] = []

    def note(what: str, figure: str) -> None:
        """A figure as soon as it is measured (a later failure loses nothing), and in the table."""
        print(f"{what}: {figure}", flush=True)
        out.append((what, figure))
    try:
        edge = os.path.abspath(args.edge) if args.edge else os.path.join(base, "edge")
        t0 = time.monotonic()
        if os.path.exists(os.path.join(edge, "data", "manifest.json")):
            mpath = os.path.join(edge, "data", "manifest.json")
            with open(mpath, "rb") as fh:
                size = sum(f.size for f in Manifest.from_bytes(fh.read(), mpath).files)
            print(f"edge: {edge} reused, {size / 2**20:.0f} MiB", flush=True)
        else:
            size = make_edge(edge, args.files, args.file_kib)
            print(f"edge: {args.files} files, {size / 2**20:.0f} MiB written in {time.monotonic() - t0:.1f} s",
                  flush=True)
        warm_mib = args.warm_mib if args.warm_mib is not None else size >> 20
        warmed, warm_s = warm(os.path.join(edge, "data"))
        print(f"edge read into the page cache: {warmed / 2**20:.0f} MiB in {warm_s:.2f} s", flush=True)
        ratios: dict[str, list[float]] = {}
        for pair in range(max(1, args.pairs)):
            tag = f" (pair {pair + 1}/{args.pairs})" if args.pairs > 1 else ""
            free_recent_pages(warm_mib, base)
            rs, rs_cpu, rs_sync = (rsync_baseline(os.path.join(edge, "data"), base, f"rsync-dst{pair}")
                                   if args.rsync else (None, 0.0, 0.0))
            if rs is not None:
                note("rsync -a --whole-file to an rsync daemon" + tag,
                     f"{rs:.2f} s, {size / rs / 1e6:.0f} MB/s, {rs_cpu:.2f} CPU s")
                note("rsync, then sync (its copy on stable storage)" + tag,
                     f"{rs + rs_sync:.2f} s, {size / (rs + rs_sync) / 1e6:.0f} MB/s (the sync {rs_sync:.2f} s)")
            else:
                note("rsync baseline", "skipped: " + ("rsync is not installed" if args.rsync else "--no-rsync"))
            for n in [int(x) for x in args.replicas.split(",") if x]:
                recv = receiver(os.path.join(base, f"recv{n}-{pair}"), n)
                try:
                    shutil.rmtree(os.path.join(edge, "ship"), ignore_errors=True)
                    free_recent_pages(warm_mib, base)
                    split0, t0s = node_cpu_split(recv), os.times()
                    cpu0 = children_cpu_s() + node_cpu_s(recv)
                    secs, text, rc = ship(edge, recv)
                    cpu = children_cpu_s() + node_cpu_s(recv) - cpu0
                    t1s, split1 = os.times(), node_cpu_split(recv)
                    # Where the CPU went (user + system seconds): which process bounds a run.
                    parts = [f"vrepl ship {t1s.children_user - t0s.children_user:.2f}"
                             f"+{t1s.children_system - t0s.children_system:.2f}"]
                    for node_id in sorted(split1):
                        u0, s0 = split0.get(node_id, (0.0, 0.0))
                        u1, s1 = split1[node_id]
                        parts.append(f"n{node_id} {u1 - u0:.2f}+{s1 - s0:.2f}")
                    print(f"  CPU s (user+system) by process: {', '.join(parts)}", flush=True)
                    if rc != 0:         # a figure of its own (e.g. the load never committed)
                        last = text.strip().splitlines()[-1] if text.strip() else ""
                        note(f"first full ship, {n} replica(s){tag}",
                             f"FAILED after {secs:.2f} s (exit {rc}): {last[:300]}")
                        continue
                    ratio = ""
                    if rs:
                        ratio = f", {rs / secs:.2f} x rsync's rate, {(rs + rs_sync) / secs:.2f} x rsync-then-sync's"
                        ratios.setdefault(f"{n} replica(s) / rsync", []).append(rs / secs)
                        ratios.setdefault(f"{n} replica(s) / rsync, then sync", []).append((rs + rs_sync) / secs)
                    m = re.search(r" in ([0-9.]+) s \(sender", text)
                    inside = f", {m.group(1)} s inside the round" if m else ""
                    note(f"first full ship, {n} replica(s){tag}",
                         f"{secs:.2f} s, {size / secs / 1e6:.0f} MB/s{ratio}{inside}, {cpu:.2f} CPU s")
                    if pair:
                        continue        # the rounds with nothing new: once
                    before = received_bytes(recv)
                    inside, whole = [], []
                    for _ in range(max(1, args.idle_rounds)):
                        secs2, text, rc = ship(edge, recv)
                        m = re.search(r"nothing new \((\d+) ms", text)
                        inside.append(int(m.group(1)) if m else -1)
                        whole.append(round(secs2 * 1000))
                    each = f" (each: {', '.join(map(str, inside))} ms)" if len(inside) > 1 else ""
                    note(f"round with nothing new, {n} replica(s)",
                         f"{statistics.median(inside):.0f} ms in the round ({statistics.median(whole):.0f} ms with"
                         f" process start){each}, {received_bytes(recv) - before:.0f} file bytes received")
                finally:
                    recv.close()    # its tree stays until the end (KEEP_TREES)
        if args.pairs > 1:
            for what, values in ratios.items():
                note(f"first full ship, {what}, median of {len(values)} pairs",
                     f"{statistics.median(values):.2f} x (each: {', '.join(f'{v:.2f}' for v in values)})")
        if args.cut_mib:
            cut = os.path.join(base, "cut")
            big = make_edge(cut, 1, args.cut_mib * 1024, prefix="big")
            recv = receiver(os.path.join(base, "recv-cut"), 1)
            try:
                half = max(1, big // (2 << 20))
                _, text, rc = ship(cut, recv, env={"VREPL_KILLPOINT": f"ship.sender.mid_file@{half}"})
                time.sleep(1.0)         # the receiver reads what was in flight, then sees the cut
                first = received_bytes(recv)
                secs, text, rc = ship(cut, recv)
                total = received_bytes(recv)
                note(f"link cut at half of a {big / 2**20:.0f} MiB file",
                     f"{first / 2**20:.0f} MiB before the cut; {total / big:.3f} x the file's size received in all"
                     f" (resumed round {secs:.2f} s, exit {rc})")
            finally:
                recv.close()
        if args.senders:
            per = max(1, args.files // args.senders)
            dirs = []
            for s in range(args.senders + 1):      # edge0 alone first, then the others at once
                d = os.path.join(base, f"edge{s}")
                make_edge(d, per, args.file_kib, prefix=f"s{s}t")
                dirs.append(d)
            recv = receiver(os.path.join(base, "recv-many"), 1)
            try:
                one_secs, _, _ = ship(dirs[0], recv)
                one_size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(os.path.join(dirs[0], "data"))
                               for f in fs if f.endswith(".parquet"))
                t0 = time.monotonic()
                to = recv.nodes[1].replication
                env = dict(os.environ, VREPL_SHIP_SECRET=SECRET)
                procs = [subprocess.Popen(python_argv("-m", "vrepl.cli", "ship", "--to", to, "--data", d,
                                                      "--sender-id", "7", "--once", "--no-progress"),
                                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                         for d in dirs[1:]]
                codes = [p.wait() for p in procs]
                many_secs = time.monotonic() - t0
                many_size = one_size * len(procs)
                one_rate, many_rate = one_size / one_secs, many_size / many_secs
                note(f"{len(procs)} senders at once into one receiver",
                     f"aggregate {many_rate / 1e6:.0f} MB/s vs one sender {one_rate / 1e6:.0f} MB/s:"
                     f" {many_rate / one_rate:.2f} x (exit codes {sorted(set(codes))})")
            finally:
                recv.close()
        width = max(len(k) for k, _ in out)
        for k, v in out:
            print(f"{k:<{width}}  {v}")
        return 1 if any(v.startswith("FAILED") for _, v in out) else 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
