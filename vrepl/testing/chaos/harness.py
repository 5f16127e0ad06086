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
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from vrepl import wal
from vrepl.child import free_ports, node_argv, python_argv, start_child, wait_for
from vrepl.node.local import render_toml
from vrepl.testing.chaos import check as _check
from vrepl.testing.chaos.netns import NemesisUnsupported, Topology, namespaces_available

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
# The log line of every role change, in the node's text log format: the node's own
# (`vg7 n2: role master, epoch 3, master 2`) or the sync layer's
# (`vg7 n2 e3: role unsynced -> master, epoch 3, master n2 (...)`).
ROLE_LINE = re.compile(r"vg\d+ n\d+(?: e\S+)?: role (?:\w+ -> )?(?P<role>\w+), epoch (?P<epoch>\d+),"
                       r" master (?P<master>n?\d+|none|None)")


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


def _command(script: str, module: str) -> list[str]:
    """The installed console script (what an operator runs), else `python -P -m module`."""
    path = os.path.join(os.path.dirname(sys.executable), script)
    return [path] if os.access(path, os.X_OK) else python_argv("-m", module)


@dataclass
class Proc:
    """One process of the run: stdout parsed as JSON event lines, stderr to a file."""

    name: str
    argv: list[str]
    stderr_path: str
    stdin: bool = True               # a command pipe (the workload); nodes get /dev/null
    proc: subprocess.Popen | None = None
    events: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    paused: bool = False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.events = []
        self.paused = False
        self.proc = start_child(self.argv, stderr_path=self.stderr_path, text=True, new_session=False,
                                stdin=subprocess.PIPE if self.stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE)
        threading.Thread(target=self._reader, args=(self.proc,), daemon=True).start()

    def _reader(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if not isinstance(ev, dict):
                continue
            with self.lock:
                if self.proc is proc:
                    self.events.append(ev)

    def send(self, line: str) -> bool:
        if not self.alive() or not self.stdin:
            return False
        try:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.events)

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)  # type: ignore[union-attr]

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.paused = False

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (a node's graceful stop; the workload's stdin closes too), wait, else
        SIGKILL. The exit code."""
        if not self.alive():
            return self.proc.returncode if self.proc is not None else None
        assert self.proc is not None
        if self.paused:
            self.proc.send_signal(signal.SIGCONT)
            self.paused = False
        if self.stdin:
            self.send("quit")
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def stderr_tail(self, lines: int = 3) -> str:
        return " | ".join(_read(self.stderr_path).strip().splitlines()[-lines:])


@dataclass
class NodeProc(Proc):
    """A `vrepl node` process and the role lines of its log file (across restarts)."""

    log_path: str = ""
    role_events: list[dict] = field(default_factory=list)
    started_at_event: int = 0        # role_events index where the running process began
    _log_offset: int = 0

    def start(self) -> None:
        self.poll_log()
        self.started_at_event = len(self.role_events)
        super().start()

    def poll_log(self) -> None:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                data = fh.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1     # whole lines only
        self._log_offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            m = ROLE_LINE.search(line)
            if m:
                master = m["master"].lstrip("n")
                self.role_events.append({"role": m["role"], "epoch": int(m["epoch"]),
                                         "master": int(master) if master.isdigit() else None})

    def role(self) -> str | None:
        """The latest role the running process logged (None before its first)."""
        self.poll_log()
        current = self.role_events[self.started_at_event:]
        return current[-1]["role"] if current else None


class ChaosCluster:
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

    # -- nemesis: disk and WAL -----------------------------------------------------------------

    def fill_disk(self, i: int) -> None:
        if not self.disk_kib:
            raise NemesisUnsupported("no tmpfs: create the cluster with disk_kib")
        self.mark(f"disk full n{i}")
        path = os.path.join(self.data[i], "filler")
        try:
            with open(path, "wb") as fh:
                while True:
                    fh.write(b"\0" * 65536)
        except OSError:
            pass
        try:
            with open(path, "ab") as fh:
                while True:
                    fh.write(b"\0" * 512)
                    fh.flush()
        except OSError:
            pass

    def free_disk(self, i: int) -> None:
        self.mark(f"disk freed n{i}")
        try:
            os.unlink(os.path.join(self.data[i], "filler"))
        except FileNotFoundError:
            pass

    def vgroup_dir(self, i: int) -> str:
        return os.path.join(self.data[i], f"vg{VGROUP}")

    def wal_dir(self, i: int) -> str:
        return os.path.join(self.vgroup_dir(i), "wal")

    def damage_wal(self, i: int, how: str, nbytes: int = 100) -> str:
        """truncate: cut nbytes off the last WAL file; corrupt: flip a bit nbytes before its
        end (tools/walfault.py). The node must be dead."""
        assert not self.nodes[i].alive(), "damage a WAL only between a kill and a restart"
        files = wal.list_wal_files(self.wal_dir(i))
        last = files[-1].path
        size = os.path.getsize(last)
        tool = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools", "walfault.py")
        if how == "truncate":
            argv = ["truncate", self.wal_dir(i), str(min(nbytes, size))]
        else:
            argv = ["flip", self.wal_dir(i), os.path.basename(last), str(max(0, size - nbytes))]
        if os.path.exists(tool):
            out = subprocess.run(python_argv(tool, *argv), capture_output=True, text=True, timeout=30)
            text = (out.stdout + out.stderr).strip()
        else:  # installed without the tools/ directory: same operation inline
            if how == "truncate":
                os.truncate(last, size - min(nbytes, size))
            else:
                with open(last, "r+b") as fh:
                    fh.seek(max(0, size - nbytes))
                    b = fh.read(1)
                    fh.seek(max(0, size - nbytes))
                    fh.write(bytes([b[0] ^ 1]))
            text = f"{last}: {how} {nbytes}"
        self.mark(f"wal {how} n{i}")
        return text

    def node_log(self, i: int) -> str:
        return _read(self.nodes[i].log_path)

    def wipe_wal(self, i: int) -> None:
        """The operator's answer to a corrupt WAL: remove it (the promise file and the
        archived files stay, so the node still refuses epochs older than it promised) and let
        the master stream the log back."""
        assert not self.nodes[i].alive()
        shutil.rmtree(self.wal_dir(i))
        self.mark(f"wal wiped n{i}")

    # -- heal and check ------------------------------------------------------------------------

    def heal(self) -> None:
        if self.namespaced:
            self.topo.heal()
        for i, p in self.nodes.items():
            if p.paused:
                self.resume(i)
        self.mark("heal")

    def all_follow(self, among: list[int] | None = None) -> int | None:
        """The master, if among (default all) the nodes are one master and its slaves, by
        their /v1/status."""
        sts = {i: self.status(i) for i in among or self.nodes}
        if any(s is None for s in sts.values()):
            return None
        masters = [i for i, s in sts.items() if s["role"] == "master"]  # type: ignore[index]
        if len(masters) != 1:
            return None
        m = masters[0]
        if all(s["role"] == "slave" and s["master"] == m for i, s in sts.items() if i != m):  # type: ignore[index]
            return m
        return None

    def same_end(self, among: list[int] | None = None) -> bool:
        """Every node (among) at the same epoch, WAL end and applied version."""
        sts = [self.status(i) for i in among or self.nodes]
        if any(s is None for s in sts):
            return False
        return len({(s["epoch"], s["wal_last_version"], s["version"]) for s in sts}) == 1  # type: ignore[index]

    def settle(self, among: list[int] | None = None, timeout_s: float = 30.0) -> int:
        """One master with every other node (among) its slave, a barrier write confirmed
        through it, every log at the same end; returns the master."""
        who = among or list(self.nodes)
        m = self.wait_for(f"one master, every other of {who} its slave", lambda: self.all_follow(among),
                          timeout_s, 0.1)
        for attempt in range(3):
            self._barriers += 1
            barrier = self.write(m, f"{self.tag}-barrier-{self._barriers}")
            if barrier["status"] == "ok":  # type: ignore[index]
                break
            m = self.wait_for("a master after the barrier failed", lambda: self.all_follow(among), timeout_s, 0.1)
        self.wait_for(f"every log of {who} ends at the master's", lambda: self.same_end(among), timeout_s, 0.1)
        return m

    def converge(self, timeout_s: float = 30.0) -> dict:
        """Every fault healed (dead nodes and arbitrator restarted), one master with every
        other node its slave, the workload stopped, a barrier confirmed and every log ending
        at the same place."""
        t_heal = time.monotonic()
        self.heal()
        if self.arb is not None and not self.arb.alive():
            self.start_arbitrator()
        for i, p in self.nodes.items():
            if not p.alive():
                self.start_node(i)
        self.wait_for("one master, every other node its slave", self.all_follow, timeout_s, 0.1)
        t_roles = time.monotonic()
        counts = self.stop_workload()
        m = self.settle(timeout_s=timeout_s)
        t_conv = time.monotonic()
        return {"master": m, "roles_s": t_roles - t_heal, "converged_s": t_conv - t_heal, "workload": counts}

    def history(self) -> list[dict]:
        try:
            with open(self.history_path) as fh:
                return [json.loads(line) for line in fh if line.strip()]
        except FileNotFoundError:
            return []

    def read_rows(self, among: list[int] | None = None, timeout_s: float = 60.0) -> dict[int, dict]:
        """Every table the workload wrote, from every node (among), through the client API:
        {node: {table: rows}} or {node: {"error": reason}}."""
        self._reads += 1
        path = os.path.join(self.dir, f"rows-{self._reads}.json")
        ev = self.ask("read", path, timeout_s=timeout_s)
        if ev is None:
            raise TimeoutError(f"the workload did not read the replicas within {timeout_s} s")
        with open(path) as fh:
            got = {int(k): v for k, v in json.load(fh).items()}
        return {i: got[i] for i in among or self.nodes}

    def logs(self) -> dict[int, list[tuple[int, int, bytes]]]:
        return {i: [(r.epoch, r.version, r.payload) for r in wal.read_records(self.wal_dir(i))] for i in self.nodes}

    def masters_per_epoch(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for i, p in self.nodes.items():
            p.poll_log()
            for e in p.role_events:
                if e["role"] == "master":
                    out.setdefault(e["epoch"], set()).add(i)
        return out

    def check(self, rows: dict[int, dict], logs: dict | None = None, allow_loss: bool = False) -> _check.Verdict:
        return _check.check(self.history(), rows, logs, allow_loss=allow_loss)

    def finish(self, allow_loss: bool = False, timeout_s: float = 30.0) -> "Result":
        """Heal, converge, read every table from every replica, stop every node cleanly, and
        check the history against the rows and every WAL."""
        conv = self.converge(timeout_s)
        self.mark("converged")
        rows = self.read_rows()
        self.stop_nodes()
        verdict = self.check(rows, self.logs(), allow_loss)
        hist = self.history()
        two = {e: sorted(ns) for e, ns in self.masters_per_epoch().items() if len(ns) > 1}
        heal_t = next(t for t, what in self.marks if what == "heal")
        fault_t = next((t for t, what in self.marks if what not in ("workload", "heal")), heal_t)
        oks = sorted(op["t1"] for op in hist if op["status"] == "ok" and op["client"] >= 0)
        after_fault = [t for t in oks if t >= fault_t]
        after_heal = [t for t in oks if t >= heal_t]
        gaps = [b - a for a, b in zip(oks, oks[1:])]
        return Result(
            namespaced=self.namespaced, verdict=verdict, masters_in_one_epoch=two, converge=conv,
            first_ok_after_fault_s=(after_fault[0] - fault_t) if after_fault else None,
            first_ok_after_heal_s=(after_heal[0] - heal_t) if after_heal else None,
            longest_gap_s=max(gaps, default=0.0), dir=self.dir,
            marks=[(round(t - self.marks[0][0], 3), what) for t, what in self.marks])

    def stop_nodes(self) -> None:
        """SIGTERM every node, the master last: while the master runs, the others never lose
        it and never elect a new one (whose first record, a no-op, would make the WALs end
        apart)."""
        order = sorted(self.nodes, key=lambda i: (self.role(i) == "master", i))
        for i in order:
            p = self.nodes[i]
            code = p.stop(20)
            if code not in (0, None):
                self.mark(f"n{i} stopped with exit code {code}")
        if self.arb is not None:
            self.arb.kill()

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


@dataclass
class Result:
    namespaced: bool
    verdict: _check.Verdict
    masters_in_one_epoch: dict[int, list[int]]
    converge: dict
    first_ok_after_fault_s: float | None
    first_ok_after_heal_s: float | None
    longest_gap_s: float
    dir: str
    marks: list[tuple[float, str]]

    @property
    def safe(self) -> bool:
        return self.verdict.safe and not self.masters_in_one_epoch

    def summary(self) -> dict:
        r3 = lambda x: None if x is None else round(x, 3)  # noqa: E731
        return {**self.verdict.summary(), "namespaced": self.namespaced,
                "masters_in_one_epoch": {str(k): v for k, v in self.masters_in_one_epoch.items()},
                "converged_s": r3(self.converge["converged_s"]), "roles_s": r3(self.converge["roles_s"]),
                "first_ok_after_fault_s": r3(self.first_ok_after_fault_s),
                "first_ok_after_heal_s": r3(self.first_ok_after_heal_s), "longest_gap_s": r3(self.longest_gap_s)}


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except FileNotFoundError:
        return ""
