"""PySyncObj: 3 nodes on 127.0.0.1, each in its own process (own GIL), a replicated dict.

The writers run inside the leader's process (see bench/compare/pysyncobj_node.py for why);
this driver starts the nodes, finds the leader and sends it the workload specs over a pipe.

fsync: PySyncObj 0.3.x never fsyncs its Raft log. Without `journalFile` the log is in memory
(the default: our `nofsync` mode). With `journalFile` the log is an mmap'd file, written on
every append but flushed (msync) only when the node is destroyed; that is our `fsync` mode,
the most durable setting it has, and still no fsync per write: PySyncObj's figures in the
fsync table are an upper bound for what a durable PySyncObj would do.
"""
from __future__ import annotations

import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from .. import jsonline
from ..install import ensure_pip
from ..procs import ProcessRegistry, bench_module_argv, free_ports
from .base import Driver, FsyncSetting, LatencySpec, ThroughputSpec

REPO_ROOT = Path(__file__).resolve().parents[3]


class PySyncObjDriver(Driver):
    name = "pysyncobj"
    client_mode = "threads in the leader node's process (no network client exists)"

    def __init__(self):
        self.nodes: list[subprocess.Popen] = []
        self.leader: subprocess.Popen | None = None

    def prepare(self, allow_install: bool) -> str | None:
        return ensure_pip("pysyncobj", "pysyncobj", allow_install)

    def version(self) -> str:
        from importlib.metadata import version
        return f"pysyncobj {version('pysyncobj')}"

    def fsync_setting(self, fsync: bool) -> FsyncSetting:
        if fsync:
            return FsyncSetting("fsync", "journalFile (mmap'd log file, written per entry, "
                                "never fsynced while running: no fsync option exists)", None)
        return FsyncSetting("nofsync", "default: in-memory log", False)

    def start(self, workdir: Path, fsync: bool, procs: ProcessRegistry) -> None:
        ports = free_ports(3)
        for i, port in enumerate(ports):
            argv = bench_module_argv("bench.compare.pysyncobj_node", str(port),
                                     *[str(p) for p in ports if p != port])
            if fsync:
                argv += ["--journal", str(workdir / f"pysyncobj{i}.journal")]
            self.nodes.append(procs.spawn(f"pysyncobj{i}", argv, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, cwd=REPO_ROOT))
        deadline = time.monotonic() + 30
        while self.leader is None:
            for node in self.nodes:
                if node.poll() is not None:
                    raise RuntimeError(f"pysyncobj node exited with {node.returncode}")
                st = self._ask(node, {"cmd": "status"})
                if st.get("leader") and st.get("ready"):
                    self.leader = node
                    break
            else:
                if time.monotonic() > deadline:
                    raise RuntimeError("no pysyncobj leader ready after 30 s")
                time.sleep(0.2)
        self._ask(self.leader, {"cmd": "latency",
                                "spec": asdict(LatencySpec(count=1, warmup=0, value_size=1))})

    @staticmethod
    def _ask(node: subprocess.Popen, msg: dict) -> dict:
        return jsonline.ask(node, msg, "pysyncobj")

    def run_latency(self, spec: LatencySpec) -> dict:
        return self._ask(self.leader, {"cmd": "latency", "spec": asdict(spec)})

    def run_throughput(self, spec: ThroughputSpec) -> dict:
        return self._ask(self.leader, {"cmd": "throughput", "spec": asdict(spec)})

    def stop(self) -> None:
        jsonline.quit_all(self.nodes)
        self.nodes = []
        self.leader = None
