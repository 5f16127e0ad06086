"""Restore benchmarks (docs/restore.md §Performance; figures in docs/benchmarks.md).

    python bench/bench_restore.py [--file-mb 1024] [--wal-records 2000000] [--behind-mb 256] [--dir /dev/shm]

1. loopback: a plain socket test in the same run (one thread sendall()s 4 MiB buffers, another
   recv_into()s them and throws them away): the reference throughput.
2. files phase: `vrepl restore` (restore_once) pulls archived files of --file-mb MiB in total
   from a running sync instance (os.sendfile on the sender; staged, CRC-checked, fsynced and
   renamed on the receiver) into --dir; throughput and ratio to the loopback figure.
   --rounds N alternates (loopback, files phase) N times and reports each round's ratio and
   the median; each figure also gives the process's CPU time per GiB moved (both ends run in
   this process), and a "write floor" (writing the same amount from one reused buffer into a
   new file under --dir, nothing else) says what the receiver's page-cache write alone costs.
3. WAL catch-up: a follower sync instance --wal-records 128-byte records behind is restored
   (WAL phase only) from a master in this process; records/s from session start to slave.
4. catch-up under load: the master keeps writing at half its measured peak rate while a
   follower --behind-mb MiB behind is restored; time to slave vs (behind / catch-up rate) + 2 s.
Everything runs on 127.0.0.1; data under --dir (tmpfs by default, so the disk is not measured).
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from vrepl._core import crc32c as _crc  # noqa: E402
from vrepl.child import free_port, free_ports  # noqa: E402
from vrepl.config import ReplicaAddress, SyncConfig  # noqa: E402
from vrepl.restore.config import RestoreConfig  # noqa: E402
from vrepl.sync import SyncCallbacks, SyncInstance  # noqa: E402

SECRET = b"bench-secret"
MiB = 1024 * 1024


def cpu_ms_per_gib(cpu_s: float, mb: float) -> float:
    return cpu_s * 1000 * 1024 / mb


def write_floor(tmp: str, total_mb: int) -> tuple[float, float]:
    """MiB/s and CPU ms/GiB of writing total_mb MiB from one reused 4 MiB buffer into a new
    file under tmp: the copy into fresh page-cache pages every restore must make."""
    buf = memoryview(os.urandom(4 * MiB))
    path = os.path.join(tmp, "write-floor.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    c0, t0 = time.process_time(), time.perf_counter()
    try:
        for _ in range(total_mb // 4):
            os.write(fd, buf)
    finally:
        os.close(fd)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    os.unlink(path)
    return total_mb / dt, cpu_ms_per_gib(cpu, total_mb)


def loopback_mb_s(total_mb: int) -> float:
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    buf = os.urandom(4 * MiB)
    total = total_mb * MiB

    def send() -> None:
        c = socket.create_connection(lst.getsockname())
        sent = 0
        while sent < total:
            c.sendall(buf)
            sent += len(buf)
        c.close()

    t = threading.Thread(target=send)
    t.start()
    conn = lst.accept()[0]
    block = bytearray(4 * MiB)
    view = memoryview(block)
    got = 0
    t0 = time.perf_counter()
    while got < total:
        n = conn.recv_into(view)
        if not n:
            break
        got += n
    dt = time.perf_counter() - t0
    t.join()
    conn.close()
    lst.close()
    return got / MiB / dt


class FileApp:
    """An app whose archived files are big blobs under data/ (getFileInfo per the seed rules)."""

    def __init__(self, path: str, files: list[str]) -> None:
        self.path = path
        self.files = []
        for name in files:
            with open(os.path.join(path, name), "rb") as fh:
                crc = 0
                while True:
                    chunk = fh.read(16 * MiB)
                    if not chunk:
                        break
                    crc = _crc.crc32c(chunk, crc)
            self.files.append((name, os.path.getsize(os.path.join(path, name)), crc or 1))

    def get_file_info(self, index: int, name: str | None = None):
        from vrepl.vnode.vnode import FileInfo
        if name is None:
            if 0 <= index < len(self.files):
                n, s, m = self.files[index]
                return FileInfo(index, n, s, m)
            return FileInfo(index, "", 0, 0)
        return FileInfo(index, name, 0, 0)


def one_node(tmp: str, name: str, app=None, raw_app=False, **opts) -> SyncInstance:
    port = free_port()
    cfg = SyncConfig(vgroup_id=9, replicas=(ReplicaAddress(1, "127.0.0.1", port),), self_index=0,
                     data_path=os.path.join(tmp, name), secret=SECRET, **opts)
    cb = SyncCallbacks(get_file_info=app.get_file_info if app else None)
    return SyncInstance(cfg, cb).start()


def files_phase(tmp: str, file_mb: int, loop_mb_s: float) -> dict:
    from vrepl.restore.cli import restore_once

    src = os.path.join(tmp, "src")
    os.makedirs(os.path.join(src, "data"))
    names = []
    per = max(file_mb // 4, 1)
    for i in range(4):
        name = f"data/blob{i}.bin"
        with open(os.path.join(src, name), "wb") as fh:
            block = os.urandom(MiB)
            for _ in range(per):
                fh.write(block)
        names.append(name)
    app = FileApp(src, names)
    inst = one_node(tmp, "src", app)
    try:
        time.sleep(0.3)
        dest = os.path.join(tmp, "dest")
        c0, t0 = time.process_time(), time.perf_counter()
        rec = restore_once("127.0.0.1", inst.cfg.me.port, vgroup=9, data=dest, secret=SECRET)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        inst.stop()
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(os.path.join(tmp, "dest"), ignore_errors=True)
    mb = rec.stats.file_bytes_received / MiB
    return {"file_mb": mb, "seconds": dt, "mb_s": mb / dt, "ratio": mb / dt / loop_mb_s,
            "cpu_ms_gib": cpu_ms_per_gib(cpu, mb)}


def raw_group(tmp: str, tag: str, restore: RestoreConfig, n: int = 2, **opts):
    ports = sorted(free_ports(n))
    replicas = tuple(ReplicaAddress(i + 1, "127.0.0.1", p) for i, p in enumerate(ports))
    cfgs = [SyncConfig(vgroup_id=9, replicas=replicas, self_index=i, data_path=os.path.join(tmp, f"{tag}{i}"),
                       secret=SECRET, quorum=2, heartbeat_timeout_ticks=100, forward_timeout_ticks=600,
                       max_wal_file_bytes=64 * MiB, **opts) for i in range(n)]
    return cfgs


def fill_wal(cfg: SyncConfig, records: int) -> None:
    """Write `records` 128-byte records as the log of a (single) master of epoch 1."""
    from vrepl.transport.storage import write_promise
    from vrepl.wal import Durability, WalOptions, WalWriter
    os.makedirs(cfg.data_path, exist_ok=True)
    w = WalWriter(os.path.join(cfg.data_path, "wal"), WalOptions(max_file_bytes=cfg.max_wal_file_bytes,
                                                                  durability=Durability.NONE))
    payload = b"p" * 128
    batch = [payload] * 10_000
    for _ in range(records // 10_000):
        w.append_batch(batch, 1)
    w.close()
    write_promise(cfg.data_path, 1, cfg.replicas[0].node)


def wal_catch_up(tmp: str, records: int) -> dict:
    rc = RestoreConfig(min_lag_versions=1, fsync=False)
    cfgs = raw_group(tmp, "w", rc)
    fill_wal(cfgs[0], records)
    m = SyncInstance(cfgs[0], SyncCallbacks(), restore=rc).start()
    t0 = time.perf_counter()
    f = SyncInstance(cfgs[1], SyncCallbacks(), restore=rc).start()
    try:
        while True:
            r = f.roles()
            if r["role"] == "slave" and r["last_version"] >= records:
                break
            if time.perf_counter() - t0 > 120:
                raise RuntimeError(f"catch-up did not finish: {r}")
            time.sleep(0.005)
        dt = time.perf_counter() - t0
        st = f.restore_status()["counters"]
    finally:
        f.stop()
        m.stop()
    return {"records": records, "seconds": dt, "records_s": records / dt, "sessions": st["receiver_sessions"]}


class Confirmed:
    """The master's highest confirmed version; writers keep at most `window` unconfirmed so
    the core never refuses a forward (max_inflight_forwards)."""

    def __init__(self, window: int = 50_000) -> None:
        self.hi = 0
        self.window = window
        self.cond = threading.Condition()

    def __call__(self, first: int, last: int, status) -> None:
        with self.cond:
            self.hi = max(self.hi, last)
            self.cond.notify_all()

    def room(self, v: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: v - self.hi <= self.window, 30)


def peak_rate(tmp: str, seconds: float = 2.0) -> float:
    rc = RestoreConfig()
    cfgs = raw_group(tmp, "p", rc)
    conf = Confirmed()
    m = SyncInstance(cfgs[0], SyncCallbacks(confirm_forward_range=conf), restore=rc).start()
    f = SyncInstance(cfgs[1], SyncCallbacks(), restore=rc).start()
    try:
        while f.roles()["role"] != "slave":
            time.sleep(0.01)
        v = m.roles()["last_version"] + 1
        payload = b"q" * 128
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < seconds:
            conf.room(v + 1000)
            for _ in range(1000):
                m.forward(v, payload)
                v += 1
                n += 1
        while f.roles()["last_version"] < v - 1:
            time.sleep(0.005)
        dt = time.perf_counter() - t0
    finally:
        f.stop()
        m.stop()
    return n / dt


def under_load(tmp: str, behind_mb: int, catch_rate: float, write_rate: float) -> dict:
    records = behind_mb * MiB // 164 // 10_000 * 10_000
    rc = RestoreConfig(min_lag_versions=1, fsync=False)
    cfgs = raw_group(tmp, "l", rc, n=3)
    fill_wal(cfgs[0], records)
    fill_wal(cfgs[1], records)  # n2 is up to date; n3 (restored below) has nothing
    conf = Confirmed()
    m = SyncInstance(cfgs[0], SyncCallbacks(confirm_forward_range=conf), restore=rc).start()
    s2 = SyncInstance(cfgs[1], SyncCallbacks(), restore=rc).start()
    while m.roles()["role"] != "master" or s2.roles()["role"] != "slave":
        time.sleep(0.01)
    stop = threading.Event()
    state = {"v": m.roles()["last_version"] + 1, "n": 0}

    def writer() -> None:
        payload = b"w" * 128
        t0 = time.perf_counter()
        while not stop.is_set():
            due = int((time.perf_counter() - t0) * write_rate)
            while state["n"] < due:
                conf.room(state["v"])
                m.forward(state["v"], payload)
                state["v"] += 1
                state["n"] += 1
            time.sleep(0.001)

    # Quorum 2, three replicas: n1 and n2 go on while n3 is down; then n3 comes back.
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    f = SyncInstance(cfgs[2], SyncCallbacks(), restore=rc).start()
    try:
        while f.roles()["role"] != "slave":
            if time.perf_counter() - t0 > 300:
                raise RuntimeError("no slave")
            time.sleep(0.005)
        dt = time.perf_counter() - t0
        behind = records + int(0.5 * write_rate)
    finally:
        stop.set()
        t.join()
        f.stop()
        s2.stop()
        m.stop()
    budget = behind * 164 / MiB / (catch_rate * 164 / MiB) + 2.0
    return {"records_behind": behind, "mb_behind": behind * 164 / MiB, "write_rate": write_rate,
            "seconds_to_slave": dt, "budget_s": budget, "ok": dt <= budget}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file-mb", type=int, default=1024)
    ap.add_argument("--wal-records", type=int, default=2_000_000)
    ap.add_argument("--behind-mb", type=int, default=256)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: files,wal,load")
    ap.add_argument("--rounds", type=int, default=1, help="alternate (loopback, files phase) this many times")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    tmp = tempfile.mkdtemp(prefix="vrepl-bench-restore-", dir=args.dir)
    skip = set(filter(None, args.skip.split(",")))
    try:
        ratios = []
        for _ in range(max(args.rounds, 1) if "files" not in skip else 1):
            loop_mb = max(args.file_mb, 512)
            c0 = time.process_time()
            loop = loopback_mb_s(loop_mb)
            loop_cpu = cpu_ms_per_gib(time.process_time() - c0, loop_mb)
            print(f"loopback socket (sendall -> recv_into): {loop:,.0f} MiB/s, {loop_cpu:,.0f} CPU ms/GiB")
            if "files" not in skip:
                r = files_phase(tmp, args.file_mb, loop)
                ratios.append(r["ratio"])
                print(f"files phase: {r['file_mb']:,.0f} MiB in {r['seconds']:.2f} s = {r['mb_s']:,.0f} MiB/s,"
                      f" {r['cpu_ms_gib']:,.0f} CPU ms/GiB, {100 * r['ratio']:.0f}% of loopback (target >= 80%)")
        if "files" not in skip:
            floor, floor_cpu = write_floor(tmp, args.file_mb)
            print(f"write floor (one buffer -> new file under --dir): {floor:,.0f} MiB/s, {floor_cpu:,.0f} CPU ms/GiB")
            if len(ratios) > 1:
                print(f"files phase / loopback over {len(ratios)} rounds: median"
                      f" {100 * sorted(ratios)[len(ratios) // 2]:.0f}%"
                      f" (each: {', '.join(f'{100 * x:.0f}%' for x in ratios)})")
        rate = None
        if "wal" not in skip:
            r = wal_catch_up(tmp, args.wal_records)
            rate = r["records_s"]
            print(f"WAL catch-up: {r['records']:,} x 128 B records in {r['seconds']:.2f} s = {rate:,.0f} records/s"
                  f" (target >= 1,000,000), {r['sessions']} session(s)")
        if "load" not in skip:
            peak = peak_rate(tmp)
            print(f"master peak write rate (2 replicas, quorum 2, this process): {peak:,.0f} records/s")
            r = under_load(tmp, args.behind_mb, rate or 1_000_000, peak / 2)
            print(f"under load: {r['mb_behind']:,.0f} MiB ({r['records_behind']:,} records) behind, master writing"
                  f" {r['write_rate']:,.0f} records/s: slave after {r['seconds_to_slave']:.2f} s, budget"
                  f" {r['budget_s']:.2f} s (behind / catch-up rate + 2 s): {'OK' if r['ok'] else 'MISSED'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
