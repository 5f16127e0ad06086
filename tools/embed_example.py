"""Runnable example of the embedding API (docs/embedding.md): three sync instances of one
vgroup in this process on 127.0.0.1, a toy vnode behind each, records forwarded by the
master and confirmed, then the master stopped and a new one elected, then the old master
restarted: it rebuilds its state from its WAL and catches up as a slave.

    python tools/embed_example.py [--records N] [--dir PATH] [--keep]

Each instance owns its WAL under <dir>/n<node>/wal; the toy vnode keeps applied records in
a dict and acks them at once (a real vnode acks once they are applied and persisted). The
temporary directory is removed at the end unless --dir or --keep is given.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import tempfile
import threading
import time

from vrepl.config import ReplicaAddress, SyncConfig
from vrepl.replica import ConfirmStatus
from vrepl.sync import SyncCallbacks, SyncInstance
from vrepl.wal import WalReader


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ToyVnode:
    """What a vnode plugs into a sync instance (one per vgroup)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sync: SyncInstance | None = None
        self.rows: dict[int, bytes] = {}
        self.role = "unsynced"
        self.confirmed = 0
        self.done = threading.Condition()

    def callbacks(self) -> SyncCallbacks:
        return SyncCallbacks(
            write_to_cache=self.write_to_cache,  # slave: apply a forwarded record
            confirm_forward=self.confirm_forward,  # master: the outcome of forward()
            notify_role=self.notify_role,
            notify_flow_control=lambda level: print(f"{self.name}: flow control {level}"),
            notify_wal_truncated=self.wal_truncated,  # a deposed master's suffix was cut
            get_version=lambda: max(self.rows, default=0),
        )

    def rebuild(self, data_path: str) -> int:
        """After a restart, before start(): replay the WAL above what the app holds (this toy
        holds nothing on disk; a real vnode first loads its files, then replays above their
        version). Returns the records replayed."""
        wal_dir = os.path.join(data_path, "wal")
        if not os.path.isdir(wal_dir):
            return 0
        n = 0
        for rec in WalReader(wal_dir).iter_records(max(self.rows, default=0) + 1):
            self.rows[rec.version] = rec.payload
            n += 1
        return n

    def wal_truncated(self, version: int) -> None:
        for v in [v for v in self.rows if v > version]:
            del self.rows[v]

    def write_to_cache(self, version: int, payload: bytes) -> None:
        self.rows[version] = payload
        assert self.sync is not None
        self.sync.ack_forward(version)  # applied (and, in a real vnode, persisted)

    def confirm_forward(self, version: int, status: ConfirmStatus) -> None:
        with self.done:
            if status == ConfirmStatus.OK:
                self.confirmed = max(self.confirmed, version)
            self.done.notify_all()

    def notify_role(self, role: str, epoch: int, master: int | None) -> None:
        self.role = role
        print(f"{self.name}: {role} in epoch {epoch}, master n{master}")


def wait_until(what: str, cond, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"not within {timeout_s} s: {what}")
        time.sleep(0.02)


def wait_for_master(vnodes: dict[int, ToyVnode], timeout_s: float = 10) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        masters = [n for n, v in vnodes.items() if v.role == "master"]
        if len(masters) == 1:
            return masters[0]
        time.sleep(0.02)
    raise SystemExit("no master elected")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10_000, help="records forwarded (10000)")
    ap.add_argument("--dir", default=None, help="where the WALs go (default: a temporary"
                    " directory, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    base = args.dir or tempfile.mkdtemp(prefix="vrepl-example-")
    vnodes: dict[int, ToyVnode] = {}
    try:
        return run(args.records, base, vnodes)
    finally:
        for v in vnodes.values():
            if v.sync is not None:
                v.sync.stop()
        if args.dir is None and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"WALs are under {base}")


def run(records: int, base: str, vnodes: dict[int, ToyVnode]) -> int:
    replicas = tuple(ReplicaAddress(node, "127.0.0.1", free_port()) for node in (1, 2, 3))
    configs: dict[int, SyncConfig] = {}
    for index, me in enumerate(replicas):
        configs[me.node] = cfg = SyncConfig(
            vgroup_id=1,
            replicas=replicas,  # the same ordered list on every node
            self_index=index,
            data_path=f"{base}/n{me.node}",
            secret=b"example-cluster-secret",
            quorum=2,
        )
        vnode = ToyVnode(f"n{me.node}")
        vnode.sync = SyncInstance(cfg, vnode.callbacks()).start()
        vnodes[me.node] = vnode

    master = wait_for_master(vnodes)
    m = vnodes[master]
    assert m.sync is not None
    wait_until("both slaves connected", lambda: [v.role for v in vnodes.values()].count("slave") == 2)
    first = m.sync.roles()["last_version"] + 1
    last = first + records - 1
    t0 = time.perf_counter()
    for version in range(first, last + 1):
        m.sync.forward(version, b"row %d" % version)  # non-blocking
    with m.done:
        m.done.wait_for(lambda: m.confirmed >= last, timeout=30)
    took = time.perf_counter() - t0
    print(f"n{master}: {records} records confirmed in {took:.3f} s ({records / took:,.0f}/s)")
    print("roles:", m.sync.roles()["replicas"])
    wait_until("the slaves applied everything", lambda: all(max(v.rows, default=0) >= last for v in vnodes.values()
                                                           if v is not m))

    print(f"stopping the master n{master} ...")
    m.sync.stop()
    del vnodes[master]
    new = wait_for_master(vnodes)
    n = vnodes[new]
    assert n.sync is not None
    print(f"n{new} is master, holds v{n.sync.roles()['last_version']}; forwarding one more")
    n.sync.forward(last + 1, b"after failover")
    with n.done:
        n.done.wait_for(lambda: n.confirmed >= last + 1, timeout=10)
    print(f"confirmed v{n.confirmed}; stats:", {k: v for k, v in n.sync.stats()["sync"].items() if v})

    # Restart the old master as a new process would: an empty app rebuilds its state from
    # the WAL before start() (docs/embedding.md §Restarting), then catches up as a slave.
    old = ToyVnode(f"n{master}")
    replayed = old.rebuild(configs[master].data_path)
    old.sync = SyncInstance(configs[master], old.callbacks()).start()
    vnodes[master] = old
    wait_until(f"n{master} caught up", lambda: old.role == "slave" and max(old.rows, default=0) >= last + 1)
    print(f"n{master} restarted: rebuilt v1..v{replayed} from its WAL, then caught up to"
          f" v{max(old.rows)} as a slave")
    # One slave, the master, the other slave: the master keeps its quorum until it stops
    # (else it steps down, a warning), and the last slave alone cannot elect itself.
    slaves = [nid for nid in vnodes if nid != new]
    for node in (slaves[0], new, *slaves[1:]):
        sync = vnodes[node].sync
        if sync is not None:
            sync.stop()
            vnodes[node].sync = None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
