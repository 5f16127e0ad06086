"""ChaosCluster: shipped `vrepl node` processes in their namespaces, the workload in the client
namespace, an optional arbitrator, the nemesis, and the final heal-and-check.

Each node is the real CLI entry, `vrepl node --config node.toml` (docs/operations.md), one
process per node. The harness (this process, in the root namespace) never opens a socket:
it learns a node's readiness from its one "ready" line on stdout, its role history from the
role lines of its log file (ROLE_LINE), and everything else
(status, its own writes, reading every table from every replica) through the workload
process in the client namespace, over its stdin/stdout pipes. In the loopback fallback the
same processes run on 127.0.0.1 ports and the faults that need namespaces or root raise
NemesisUnsupported (tests skip them, naming the fault).

`close()` kills every process, unmounts every tmpfs and deletes every namespace of the run,
whatever state the test is in; so do the atexit hook (netns._close_all) and
tools/chaos_cleanup.py for runs whose owner died. Every process also dies with the harness
(PR_SET_PDEATHSIG).

This module owns the cluster's set-up, its processes and asking the nodes; the processes
themselves are procs.py's (Proc, NodeProc), the disk and WAL nemesis diskfaults.py's and the
final heal-and-check healcheck.py's (mixins of ChaosCluster, on the state set up here).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any, Callable

from vrepl.child import free_ports, node_argv, python_argv, wait_for
from vrepl.node.local import render_toml
from vrepl.testing.chaos.diskfaults import DiskFaults
from vrepl.testing.chaos.healcheck import HealAndCheck, Result
from vrepl.testing.chaos.netns import Topology, namespaces_available
from vrepl.testing.chaos.procs import ROLE_LINE, NodeProc, Proc, _command, _read

# Names other modules import from here (schedules.py, tests/chaos/).
__all__ = ["ARB_LEASE_MS", "CHAOS_NODE", "CHAOS_VNODE", "ROLE_LINE", "VGROUP", "ChaosCluster",
           "NodeProc", "Proc", "Result", "want_namespaces"]

VGROUP = 7
PEER_PORT = 6100
HTTP_PORT = 7100
ARB_PORT = 6042
ARB_LEASE_MS = 2500  # >= the replicas' arbitrator_lease_ticks x tick_ms (2000) plus a margin
# Flush often, so that faults meet flushes (docs/reliability.md §Nodes): by rows every
# ~0.4 s at the workload's rate, by age after 1 s (an isolated master's memtable comes due
# well within any isolation: only what the group committed may be archived then, issue 13);
# one archived file per minute of a table's ts (600 writes).
CHAOS_VNODE = {"max_memtable_rows": 200, "max_memtable_age_ms": 1000, "file_span_ms": 60_000}
CHAOS_NODE = {"flush_check_ms": 200}


def want_namespaces(namespaced: bool | None) -> bool:
    """True: namespaces required; False: loopback; None: VREPL_CHAOS_NETNS=1 (required) or 0
    (loopback), else required when root (so CI, which runs as root, never silently falls
    back) and loopback otherwise."""
    env = os.environ.get("VREPL_CHAOS_NETNS", "")
    if namespaced is None:
        namespaced = env == "1" if env in ("0", "1") else os.geteuid() == 0
    why = namespaces_available() if namespaced is not False else "loopback asked for"
    if namespaced and why:
        raise RuntimeError(f"network namespaces required but unavailable: {why}")
    return why is None


class ChaosCluster(DiskFaults, HealAndCheck):
    """`n` nodes of vgroup 7 (node ids 1..n), the workload, optionally an arbitrator.
    `vnode`, `sync` and `node` are node.toml's [vnode], [sync] and top-level settings
    (docs/operations.md); vnode and node default to CHAOS_VNODE and CHAOS_NODE."""

    def __init__(self, base_dir: str, n: int = 3, *, quorum: int = 0, arbitrator: bool = False,
                 namespaced: bool | None = None, disk_kib: int | None = None, clients: int = 4,
                 op_timeout_s: float = 6.0, think_ms: float = 5, vnode: dict | None = None,
                 sync: dict | None = None, node: dict | None = None) -> None:
        self.n = n
        self.quorum = quorum
        self.namespaced = want_namespaces(namespaced)
        self.topo = Topology.create(base_dir, n, arbitrator, self.namespaced)
        self.dir = self.topo.base_dir
        self.run = self.topo.run
        self.tag = self.run.rsplit("-", 1)[-1]
        self.secret = "chaos-" + self.run
        self.op_timeout_s = op_timeout_s
        self.marks: list[tuple[float, str]] = []
        self._ids = 0
        self._barriers = 0
        self._reads = 0
        self._id_lock = threading.Lock()
        self.history_path = os.path.join(self.dir, "history.jsonl")
        try:
            self._configure(n, quorum, arbitrator, disk_kib, clients, think_ms,
                            CHAOS_VNODE if vnode is None else vnode, sync or {},
                            CHAOS_NODE if node is None else node)
        except BaseException:
            self.close()
            raise

    # -- set-up --------------------------------------------------------------------------------

    def _configure(self, n: int, quorum: int, arbitrator: bool, disk_kib: int | None, clients: int,
                   think_ms: float, vnode: dict, sync: dict, node: dict) -> None:
        topo = self.topo
        if self.namespaced:
            peer = {i: f"{topo.host(f'n{i}')}:{PEER_PORT}" for i in range(1, n + 1)}
            http = {i: f"{topo.host(f'n{i}')}:{HTTP_PORT}" for i in range(1, n + 1)}
            arb_addr = f"{topo.host('arb')}:{ARB_PORT}" if arbitrator else None
        else:
            ports = free_ports(2 * n + 1)
            peer = {i: f"127.0.0.1:{ports[2 * i - 2]}" for i in range(1, n + 1)}
            http = {i: f"127.0.0.1:{ports[2 * i - 1]}" for i in range(1, n + 1)}
            arb_addr = f"127.0.0.1:{ports[-1]}" if arbitrator else None
        self.http = http
        table = [{"id": i, "replication": peer[i], "http": http[i]} for i in range(1, n + 1)]
        vgroup: dict[str, Any] = {"id": VGROUP, "replicas": list(range(1, n + 1)), "quorum": quorum}
        if arb_addr:
            vgroup["arbitrator"] = arb_addr
        self.nodes: dict[int, NodeProc] = {}
        self.data: dict[int, str] = {}
        self.disk_kib = disk_kib
        for i in range(1, n + 1):
            d = os.path.join(self.dir, f"n{i}")
            os.makedirs(d)
            data = os.path.join(d, "data")
            if disk_kib:
                topo.mount_tmpfs(data, disk_kib)
            self.data[i] = data
            doc: dict[str, Any] = {"node_id": i, "data_dir": data, "secret": self.secret,
                                   "log_level": "INFO", "log_file": os.path.join(d, "node.log"), **node,
                                   # The API listens on loopback unless told: the clients (and
                                   # the peers' self-restore) come from other namespaces.
                                   "http": {"listen": http[i]}}
            for section, values in (("vnode", vnode), ("sync", sync)):
                if values:
                    doc[section] = dict(values)
            doc["nodes"] = table
            doc["vgroups"] = [vgroup]
            path = os.path.join(d, "node.toml")
            with open(path, "w") as fh:
                fh.write(render_toml(doc))
            self.nodes[i] = NodeProc(f"n{i}", [*topo.exec_prefix(f"n{i}"), *node_argv(path, console_script=True)],
                                     os.path.join(d, "stderr.log"), stdin=False,
                                     log_path=os.path.join(d, "node.log"))
        self.arb: Proc | None = None
        if arb_addr:
            d = os.path.join(self.dir, "arb")
            os.makedirs(d)
            with open(os.path.join(d, "secret"), "w") as fh:
                fh.write(self.secret)
            host, _, port = arb_addr.rpartition(":")
            self.arb_log = os.path.join(d, "arb.log")
            self.arb = Proc("arb", [*topo.exec_prefix("arb"), *_command("vrepl-arbitrator", "arbitrator.main"),
                                    "--host", host, "--port", port, "--secret-file",
                                    os.path.join(d, "secret"), "--state-dir", os.path.join(d, "state"),
                                    "--lease-ms", str(ARB_LEASE_MS), "--log-file", self.arb_log,
                                    "--metrics-listen", "127.0.0.1:0"],
                            os.path.join(d, "stderr.log"), stdin=False)
        wconf = {"nodes": {str(i): http[i] for i in http}, "vgroup": VGROUP, "clients": clients,
                 "history_path": self.history_path, "op_timeout_s": self.op_timeout_s,
                 "think_ms": think_ms, "run": self.tag}
        wpath = os.path.join(self.dir, "workload.json")
        with open(wpath, "w") as fh:
            json.dump(wconf, fh)
        self.workload = Proc("workload", [*topo.exec_prefix("cl"), *python_argv("-m",
                                          "vrepl.testing.chaos.workload", wpath)],
                             os.path.join(self.dir, "workload.stderr"))

    # -- processes -----------------------------------------------------------------------------

    def start(self) -> "ChaosCluster":
        """Start everything; on failure close everything (`with cluster.start() as c` only
        enters the block once start() returned)."""
        try:
            if self.arb is not None:
                self.start_arbitrator()
            for p in self.nodes.values():
                p.start()
            for i in self.nodes:
                self._wait_ready(i)
            self.workload.start()
            self.wait_for("workload ready", lambda: self._wev("ready"), 15)
        except BaseException:
            self.close()
            raise
        return self

    def start_node(self, i: int) -> None:
        self.nodes[i].start()
        self._wait_ready(i)

    def _wait_ready(self, i: int, timeout_s: float = 30.0) -> None:
        p = self.nodes[i]
        self.wait_for(f"n{i} ready", lambda: self.event(i, "ready") or not p.alive(), timeout_s)
        if not self.event(i, "ready"):
            raise RuntimeError(f"n{i} did not start (exit {p.proc.returncode}): {p.stderr_tail()}")  # type: ignore[union-attr]

    def start_failure(self, i: int, timeout_s: float = 30.0) -> tuple[int | None, str]:
        """Start n<i> expecting it to refuse: (exit code, its stderr's last line); exit code
        None if it started after all (it is then killed)."""
        p = self.nodes[i]
        p.start()
        self.wait_for(f"n{i} ready or refusing", lambda: self.event(i, "ready") or not p.alive(), timeout_s)
        if p.alive():
            p.kill()
            return None, ""
        return p.proc.returncode, p.stderr_tail(1)  # type: ignore[union-attr]

    def start_arbitrator(self) -> None:
        assert self.arb is not None
        # The arbitrator logs "listening on" to its log file; a restart appends, so start
        # from a fresh file to wait for this start's line.
        try:
            os.replace(self.arb_log, self.arb_log + f".{time.monotonic_ns()}")
        except FileNotFoundError:
            pass
        self.arb.start()
        log_path = self.arb_log
        self.wait_for("arbitrator listening", lambda: "listening on" in _read(log_path), 15)

    def kill(self, i: int) -> None:
        self.mark(f"kill n{i}")
        self.nodes[i].kill()

    def pause(self, i: int) -> None:
        self.mark(f"pause n{i}")
        p = self.nodes[i]
        p.signal(signal.SIGSTOP)
        p.paused = True

    def resume(self, i: int) -> None:
        self.mark(f"resume n{i}")
        p = self.nodes[i]
        if p.paused:
            p.signal(signal.SIGCONT)
        p.paused = False

    def restart(self, i: int) -> None:
        self.nodes[i].kill()
        self.mark(f"start n{i}")
        self.start_node(i)

    def start_workload(self) -> None:
        self.workload.send("start")
        self.wait_for("workload started", lambda: self._wev("started"), 10)
        self.mark("workload")

    def stop_workload(self) -> dict:
        if not self._wev("started") or self._wev("stopped"):
            return self._wev("stopped") or {}
        self.workload.send("stop")
        return self.wait_for("workload stopped", lambda: self._wev("stopped"), self.op_timeout_s + 20)

    def _wev(self, name: str) -> dict | None:
        return next((e for e in self.workload.snapshot() if e["event"] == name), None)

    # -- asking nodes --------------------------------------------------------------------------

    def event(self, i: int, name: str) -> dict | None:
        """n<i>'s latest stdout event of that name (`vrepl node` prints only "ready")."""
        return next((ev for ev in reversed(self.nodes[i].snapshot()) if ev.get("event") == name), None)

    def role(self, i: int) -> str | None:
        """n<i>'s role as its log last said (since its last start)."""
        return self.nodes[i].role()

    def ask(self, cmd: str, *args: str, timeout_s: float = 5.0, wait: bool = True) -> dict | None:
        """`cmd ID args` to the workload process; its answer (or None: no answer in time, or
        not waited for)."""
        with self._id_lock:
            self._ids += 1
            ident = self._ids
        if not self.workload.send(" ".join([cmd, str(ident), *args])) or not wait:
            return None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for ev in reversed(self.workload.snapshot()):
                if ev.get("id") == ident:
                    return ev
            if not self.workload.alive():
                return None
            time.sleep(0.005)
        return None

    def status(self, i: int) -> dict | None:
        """n<i>'s vgroup status (GET /v1/status, from the client namespace), or None."""
        if self.nodes[i].paused or not self.nodes[i].alive():
            return None
        ev = self.ask("status", str(i), timeout_s=3.0)
        return ev.get("vgroup") if ev else None

    def current_master(self, among: list[int] | None = None) -> int | None:
        """The one node (among the live, unpaused ones) whose log last said master."""
        nodes = among or [i for i, p in self.nodes.items() if p.alive() and not p.paused]
        masters = [i for i in nodes if self.nodes[i].alive() and self.role(i) == "master"]
        return masters[0] if len(masters) == 1 else None

    def wait_master(self, among: list[int] | None = None, timeout_s: float = 15.0) -> int:
        return self.wait_for(f"one master among {among or 'live nodes'}", lambda: self.current_master(among),
                             timeout_s)

    def write(self, i: int, key: str, timeout_s: float = 20.0, wait: bool = True) -> dict | None:
        """One write through n<i>'s HTTP API, sent by the workload process (one attempt, no
        retry); it is in the history like every other write. wait=False: sent, not awaited."""
        ev = self.ask("write", str(i), key, timeout_s=timeout_s, wait=wait)
        if not wait:
            return None
        return ev or {"key": key, "status": "unknown", "detail": "no answer from the workload"}

    def wait_for(self, what: str, cond: Callable[[], Any], timeout_s: float = 10.0, poll_s: float = 0.02) -> Any:
        return wait_for(what, cond, timeout_s, poll_s, detail=lambda: f"roles {self.role_summary()}")

    def role_summary(self) -> dict[int, str]:
        out = {}
        for i, p in self.nodes.items():
            out[i] = "dead" if not p.alive() else ("paused" if p.paused else (self.role(i) or "?"))
        return out

    def mark(self, what: str) -> None:
        self.marks.append((time.monotonic(), what))

    # -- paths (the disk and WAL nemesis: diskfaults.py) -------------------------------------

    def vgroup_dir(self, i: int) -> str:
        return os.path.join(self.data[i], f"vg{VGROUP}")

    def wal_dir(self, i: int) -> str:
        return os.path.join(self.vgroup_dir(i), "wal")

    def node_log(self, i: int) -> str:
        return _read(self.nodes[i].log_path)

    # -- teardown ------------------------------------------------------------------------------

    def close(self) -> None:
        for p in [*getattr(self, "nodes", {}).values(), getattr(self, "arb", None), getattr(self, "workload", None)]:
            if p is not None:
                try:
                    p.kill()
                except Exception:
                    pass
        self.topo.close()

    def __enter__(self) -> "ChaosCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
