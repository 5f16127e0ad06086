"""A one-vgroup node in its own process, driven over stdin/stdout (integration tests, bench).

    python -m vrepl.testing.node_runner CONFIG.json

Owns: starting one SyncInstance from a JSON config, a minimal app behind it (a slave applies
a forwarded record by counting it and acks at once; the WAL is the sync instance's), and a
line protocol: commands on stdin, JSON events on stdout.

Commands (one per line):
    forward COUNT SIZE       forward COUNT records of SIZE bytes after the last version
    roles | stats            print {"event": "roles"/"stats", ...}
    bench_throughput COUNT SIZE INFLIGHT [BATCH]   measure confirmed records/s (master;
                             BATCH > 0: forward_many() runs of BATCH records)
    bench_latency COUNT SIZE               one forward at a time: confirm latency percentiles
    quit
Events: ready, role, confirm, forwarded, roles, stats, bench, error.

Safety for tests: the process exits when stdin closes (its parent is gone), when
`lifetime_s` passes, and (Linux) when its parent dies (PR_SET_PDEATHSIG).
Must not: be used as a real vnode; it is a harness.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from vrepl.child import die_with_parent
from vrepl.config import SyncConfig
from vrepl.errors import VreplError
from vrepl.logsetup import setup_logging
from vrepl.replica import ConfirmStatus
from vrepl.sync import FlowControlError, SyncCallbacks, SyncInstance

_out_lock = threading.Lock()


def emit(event: str, **fields: object) -> None:
    line = json.dumps({"event": event, "t": time.monotonic(), **fields})
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def payload_for(version: int, size: int) -> bytes:
    head = b"v%d|" % version
    return (head * (size // len(head) + 1))[:size]


def sync_config(c: dict) -> SyncConfig:
    """The SyncConfig of a node process's JSON config (the keys in the module doc)."""
    return SyncConfig(
        vgroup_id=c["vgroup_id"],
        replicas=tuple((r[0], r[1]) for r in c["replicas"]),
        self_index=c["self_index"],
        data_path=c["data_path"],
        secret=c["secret"].encode(),
        quorum=c.get("quorum", 0),
        arbitrator=c.get("arbitrator"),
        **c.get("options", {}),
    )


class Runner:
    def __init__(self, conf: dict) -> None:
        self.conf = conf
        self.inst: SyncInstance | None = None
        self.confirm_lock = threading.Condition()
        self.confirmed: dict[int, str] = {}
        self.confirmed_ok_through = 0
        self.last_confirm_version = 0
        self.print_confirms = conf.get("print_confirms", True)
        self.bench_hook = None

    # callbacks (I/O thread)
    def write_to_cache_batch(self, first: int, payloads: tuple[bytes, ...]) -> None:
        assert self.inst is not None
        self.inst.ack_forward(first + len(payloads) - 1)

    def confirm_forward_range(self, first: int, last: int, status: ConfirmStatus) -> None:
        if self.bench_hook is not None:
            self.bench_hook(first, last, status)
        if self.print_confirms:
            emit("confirm", first=first, last=last, status=status.describe())
        with self.confirm_lock:
            self.last_confirm_version = max(self.last_confirm_version, last)
            self.confirm_lock.notify_all()

    def notify_role(self, role: str, epoch: int, master: int | None) -> None:
        emit("role", role=role, epoch=epoch, master=master)

    def start(self) -> None:
        cfg = sync_config(self.conf)
        cb = SyncCallbacks(
            write_to_cache_batch=self.write_to_cache_batch,
            confirm_forward_range=self.confirm_forward_range,
            notify_role=self.notify_role,
        )
        self.inst = SyncInstance(cfg, cb).start()
        emit("ready", node=cfg.me.node, port=cfg.me.port, pid=os.getpid())

    # commands (main thread)
    def forward(self, count: int, size: int) -> None:
        assert self.inst is not None
        first = self.inst.roles()["last_version"] + 1
        for v in range(first, first + count):
            self.inst.forward(v, payload_for(v, size))
        emit("forwarded", first=first, last=first + count - 1)

    def bench_throughput(self, count: int, size: int, inflight: int, batch: int = 0) -> None:
        """Forward `count` records of `size` bytes with at most `inflight` unconfirmed, and
        time until all are confirmed. batch 0: one forward() call per record; batch N: runs
        of N records per forward_many() call. The harness's own bookkeeping is per
        confirmation range, not per record (confirmations come in version order, so "confirmed
        through v" says how many are in flight), so it does not weigh on what it measures."""
        assert self.inst is not None
        inst = self.inst
        cond = threading.Condition()
        state = {"through": 0, "ok": 0, "other": 0, "waiting": False}
        target_last = [0]

        def hook(first: int, last: int, status: ConfirmStatus) -> None:
            state["ok" if status == ConfirmStatus.OK else "other"] += last - first + 1
            state["through"] = last
            if state["waiting"] or last >= target_last[0]:
                with cond:
                    cond.notify_all()

        self.print_confirms = False
        payload = b"x" * size
        first = inst.roles()["last_version"] + 1
        state["through"] = first - 1
        target_last[0] = first + count - 1
        self.bench_hook = hook
        t0 = time.perf_counter()
        v = first
        end = target_last[0]
        while v <= end:
            room = state["through"] + inflight - v + 1  # versions that may go now
            if room <= 0:
                with cond:
                    state["waiting"] = True
                    while state["through"] + inflight - v + 1 <= 0:
                        cond.wait(0.05)
                    state["waiting"] = False
                continue
            n = min(room, end - v + 1)
            try:
                if batch:
                    n = min(n, batch)
                    inst.forward_many(v, [payload] * n)
                else:
                    for _ in range(n):
                        inst.forward(v, payload)
                        v += 1
                    continue
            except FlowControlError:
                time.sleep(0.0005)
                continue
            v += n
        with cond:
            cond.wait_for(lambda: state["through"] >= end, 120)
        elapsed = time.perf_counter() - t0
        self.bench_hook = None
        self.print_confirms = self.conf.get("print_confirms", True)
        emit("bench", kind="throughput", count=count, size=size, inflight=inflight, batch=batch, seconds=elapsed,
             records_per_s=count / elapsed, ok=state["ok"], other=state["other"])

    def bench_latency(self, count: int, size: int) -> None:
        assert self.inst is not None
        inst = self.inst
        got = threading.Event()
        status_box: list[ConfirmStatus] = []

        def hook(first: int, last: int, status: ConfirmStatus) -> None:
            status_box.append(status)
            got.set()

        self.print_confirms = False
        self.bench_hook = hook
        payload = b"x" * size
        v = inst.roles()["last_version"] + 1
        lat = []
        bad = 0
        for _ in range(count):
            got.clear()
            status_box.clear()
            t = time.perf_counter()
            inst.forward(v, payload)
            got.wait(5)
            lat.append(time.perf_counter() - t)
            if not status_box or status_box[0] != ConfirmStatus.OK:
                bad += 1
            v += 1
        self.bench_hook = None
        self.print_confirms = self.conf.get("print_confirms", True)
        lat.sort()
        pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000  # noqa: E731
        emit("bench", kind="latency", count=count, size=size, p50_ms=pct(0.50), p90_ms=pct(0.90),
             p99_ms=pct(0.99), max_ms=lat[-1] * 1000, not_ok=bad)

    def serve(self) -> None:
        deadline = time.monotonic() + float(self.conf.get("lifetime_s", 300))

        def watchdog() -> None:
            while time.monotonic() < deadline:
                time.sleep(0.5)
            emit("error", text="lifetime_s exceeded, exiting")
            os._exit(3)

        threading.Thread(target=watchdog, daemon=True).start()
        for line in sys.stdin:
            parts = line.split()
            if not parts:
                continue
            cmd, args = parts[0], [int(a) for a in parts[1:]]
            try:
                if cmd == "quit":
                    break
                if cmd == "forward":
                    self.forward(*args)
                elif cmd == "roles":
                    emit("roles", **self.inst.roles())  # type: ignore[union-attr]
                elif cmd == "stats":
                    emit("stats", stats=self.inst.stats())  # type: ignore[union-attr]
                elif cmd == "bench_throughput":
                    self.bench_throughput(*args)
                elif cmd == "bench_latency":
                    self.bench_latency(*args)
                else:
                    emit("error", text=f"unknown command {cmd}")
            except VreplError as exc:
                emit("error", text=str(exc))
        if self.inst is not None:
            self.inst.stop()


def run_node_process(argv: list[str] | None, make_node) -> int:
    """The body of a node process: read the JSON config named by argv[0], set up logging,
    start `make_node(conf)` (anything with start() and serve()), and serve until told to
    quit. Exit code 2 when the node cannot start (the reason is emitted as an event)."""
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    with open(argv[0]) as fh:
        conf = json.load(fh)
    setup_logging(level=conf.get("log_level", "INFO"), log_file=conf.get("log_file") or None,
                  log_format=conf.get("log_format", "text"))
    node = make_node(conf)
    try:
        node.start()
    except VreplError as exc:
        emit("error", text=str(exc))
        return 2
    node.serve()
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_node_process(argv, Runner)


if __name__ == "__main__":
    sys.exit(main())
