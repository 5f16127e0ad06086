"""What the metrics cost on the write path (docs/benchmarks.md §Observability).

    python bench/bench_observers.py [--records 150000] [--rounds 5] [--dir /dev/shm]

Runs a 3-replica vgroup of SyncInstances in one process (so one CPU clock counts the
master's and the slaves' threads), forwards `--records` records of 128 B as fast as flow
control lets it and waits for the last confirmation; CPU µs per record with the node's
Prometheus observers (confirm latency per run, WAL group commit time) and without,
alternately, in fresh processes. Prints each round, the medians and their ratio. The WAL
goes to `--dir` (tmpfs by default, so the disk's fdatasync does not hide the CPU cost).
It measures the vrepl Python imports (the installed one, or PYTHONPATH's): `--one off` runs
one round without observers and prints it as JSON, so PYTHONPATH=<older checkout> measures
the code from before the observers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def one_round(mode: str, records: int, directory: str) -> dict:
    """In this process: CPU µs per record with observers `mode` ("on" / "off")."""
    from vrepl.child import free_ports
    from vrepl.config import ReplicaAddress, SyncConfig
    from vrepl.sync import SyncCallbacks, SyncInstance

    replicas = tuple(ReplicaAddress(i + 1, "127.0.0.1", p) for i, p in enumerate(free_ports(3)))
    base = tempfile.mkdtemp(prefix="vrepl-observers-", dir=directory)
    done = threading.Event()
    target = [1 << 62]

    def confirmed(first: int, last: int, status) -> None:
        if last >= target[0]:
            done.set()

    insts = []
    for i in range(3):
        kw = {}
        if mode == "on":   # "off" passes nothing: it also runs on code from before the observers
            from vrepl.node.metrics import NodeMetrics
            kw["observers"] = NodeMetrics(i + 1).observers(11)
        cfg = SyncConfig(vgroup_id=11, replicas=replicas, self_index=i, data_path=f"{base}/n{i + 1}",
                         secret=b"bench", max_inflight_forwards=records + 1)
        insts.append(SyncInstance(cfg, SyncCallbacks(confirm_forward_range=confirmed), **kw).start())
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            roles = [x.roles()["role"] for x in insts]
            if roles.count("master") == 1 and roles.count("slave") == 2:
                break
            time.sleep(0.05)
        master = insts[[x.roles()["role"] for x in insts].index("master")]
        v0 = master.roles()["last_version"]
        target[0] = v0 + records
        payload = b"x" * 128
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for k in range(records):
            master.forward(v0 + k + 1, payload)
        if not done.wait(120):
            raise RuntimeError("not every forward was confirmed within 120 s")
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        return {"mode": mode, "cpu_us_per_record": cpu / records * 1e6, "records_per_s": records / wall}
    finally:
        for x in insts:
            x.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=150_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--one", choices=("on", "off"), help="run one round in this process and print it as JSON")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_round(args.one, args.records, args.dir)))
        return 0
    got: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(args.rounds):
        for mode in ("off", "on"):
            out = subprocess.run([sys.executable, __file__, "--one", mode, "--records", str(args.records),
                                  *(["--dir", args.dir] if args.dir else [])],
                                 capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                return 1
            res = json.loads(out.stdout.strip().splitlines()[-1])
            got[mode].append(res["cpu_us_per_record"])
            print(f"round {r + 1} observers {mode:>3}: {res['cpu_us_per_record']:.2f} CPU-µs/record,"
                  f" {res['records_per_s']:,.0f} records/s", flush=True)
    off, on = statistics.median(got["off"]), statistics.median(got["on"])
    print(f"median CPU-µs/record: off {off:.2f}, on {on:.2f}; on/off {on / off:.3f}"
          f" (load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
