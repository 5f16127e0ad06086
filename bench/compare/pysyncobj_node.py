"""One PySyncObj node in its own process, driven by the harness over stdin/stdout.

Usage (by drivers/pysyncobj_driver.py only):
    python -m bench.compare.pysyncobj_node SELF_PORT PARTNER_PORT... [--journal FILE]

PySyncObj has no network client protocol: a write is a call on a SyncObj object in some
node's process. So the writers of both workloads run here, in the leader's process, as
threads, calling a replicated dict (`ReplDict`) with sync=True: the call returns once the
entry is committed by a majority (2 of 3) and applied on this node. Running the writers in
the leader's process is PySyncObj's best case (no forwarding hop), and they share its GIL,
as an application embedding it would.

Protocol: one JSON object per line on stdin, one JSON reply per line on stdout:
    {"cmd": "status"}                  -> {"leader": bool, "ready": bool}
    {"cmd": "latency", "spec": {...}}  -> workload.latency_loop result
    {"cmd": "throughput", "spec": {...}} -> workload.run_client_threads result
    {"cmd": "quit"}                    -> exits
Errors come back as {"error": "..."}.
"""
from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
    from pysyncobj import SyncObj, SyncObjConf
    from pysyncobj.batteries import ReplDict

    from bench.compare.drivers.base import LatencySpec, ThroughputSpec
    from bench.compare.jsonline import serve
    from bench.compare.workload import latency_loop, run_client_threads

    journal = None
    if "--journal" in argv:
        i = argv.index("--journal")
        journal = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    self_port, partners = argv[0], argv[1:]
    rdict = ReplDict()
    # appendEntriesUseBatch=False sends each entry at once. The default (True) holds entries
    # for the next append_entries period (100 ms): on this machine it measured p50 101 ms and
    # 7.7 k writes/s against 0.47 ms and 148 k writes/s without it, so False is PySyncObj's
    # best setting for both workloads (docs/compare.md).
    conf = SyncObjConf(journalFile=journal, dynamicMembershipChange=False,
                       appendEntriesUseBatch=False)
    node = SyncObj(f"127.0.0.1:{self_port}", [f"127.0.0.1:{p}" for p in partners],
                   conf=conf, consumers=[rdict])

    class Client:
        def write_one(self, key: bytes, value: bytes) -> None:
            rdict.set(key, value, sync=True, timeout=10)

        def write_batch(self, items: list[tuple[bytes, bytes]]) -> None:
            # One replicated call = one Raft entry for the batch, as an etcd txn.
            rdict.update(dict(items), sync=True, timeout=10)

        def close(self) -> None:
            pass

    serve({"status": lambda msg: {"leader": node._isLeader(), "ready": node.isReady()},
           "latency": lambda msg: latency_loop(Client(), LatencySpec(**msg["spec"])),
           "throughput": lambda msg: run_client_threads(Client, ThroughputSpec(**msg["spec"]))})
    node.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
