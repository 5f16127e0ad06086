"""Runnable example of the embedding API (docs/embedding.md): three sync instances of one
vgroup in this process on 127.0.0.1, a toy vnode behind each, records forwarded by the
master and confirmed, then the master stopped and a new one elected.

    python tools/embed_example.py [--records N] [--dir PATH]

Each instance owns its WAL under <dir>/n<node>/wal; the toy vnode keeps applied records in
a dict and acks them at once (a real vnode acks once they are applied and persisted).
"""

from __future__ import annotations

import argparse
import logging
import socket
import tempfile
import threading
import time

from vrepl.config import ReplicaAddress, SyncConfig
from vrepl.replica import ConfirmStatus
from vrepl.sync import SyncCallbacks, SyncInstance


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
            get_version=lambda: max(self.rows, default=0),
        )

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
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    base = args.dir or tempfile.mkdtemp(prefix="vrepl-example-")

    replicas = tuple(ReplicaAddress(node, "127.0.0.1", free_port()) for node in (1, 2, 3))
    vnodes: dict[int, ToyVnode] = {}
    for index, me in enumerate(replicas):
        cfg = SyncConfig(
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
    first = m.sync.roles()["last_version"] + 1
    last = first + args.records - 1
    t0 = time.perf_counter()
    for version in range(first, last + 1):
        m.sync.forward(version, b"row %d" % version)  # non-blocking
    with m.done:
        m.done.wait_for(lambda: m.confirmed >= last, timeout=30)
    took = time.perf_counter() - t0
    print(f"n{master}: {args.records} records confirmed in {took:.3f} s ({args.records / took:,.0f}/s)")
    print("roles:", m.sync.roles()["replicas"])

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
    for v in vnodes.values():
        assert v.sync is not None
        v.sync.stop()
    print(f"WALs are under {base}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
