"""ChaosCluster: node processes in their namespaces, the workload in the client namespace, an
optional arbitrator, the nemesis, and the final heal-and-check.

The harness (this process, in the root namespace) talks to every process it starts only
through its stdin/stdout pipes; it never opens a socket. In the loopback fallback the same
processes run on 127.0.0.1 ports and the faults that need namespaces or root raise
NemesisUnsupported (tests skip them, naming the fault).

`close()` kills every process, unmounts every tmpfs and deletes every namespace of the run,
whatever state the test is in; so do the atexit hook (netns._close_all) and
tools/chaos_cleanup.py for runs whose owner died.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from vrepl.child import python_argv
from vrepl.testing.chaos import check as _check
from vrepl.testing.chaos.netns import NemesisUnsupported, Topology, namespaces_available
from vrepl.testing.cluster import free_port

PEER_PORT = 6100
CLIENT_PORT = 7100
ARB_PORT = 6042
ARB_LEASE_MS = 2500  # >= the replicas' arbitrator_lease_ticks x tick_ms (2000) plus a margin


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


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: str
    proc: subprocess.Popen | None = None
    events: list[dict] = field(default_factory=list)
    role_events: list[dict] = field(default_factory=list)  # across restarts
    lock: threading.Lock = field(default_factory=threading.Lock)
    paused: bool = False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.events = []
        self.paused = False
        with open(self.log_path + ".stderr", "ab") as err:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         text=True, bufsize=1)
        threading.Thread(target=self._reader, args=(self.proc,), daemon=True).start()

    def _reader(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                if self.proc is proc:
                    self.events.append(ev)
                    if ev.get("event") == "role":
                        self.role_events.append(ev)

    def send(self, line: str) -> bool:
        if not self.alive():
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

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.paused = False

    def quit(self, timeout_s: float = 10.0) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        if self.paused:
            self.proc.send_signal(signal.SIGCONT)
            self.paused = False
        self.send("quit")
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


class ChaosCluster:
    """`n` nodes of one vgroup (node ids 1..n), the workload, optionally an arbitrator."""

    def __init__(self, base_dir: str, n: int = 3, *, quorum: int = 0, arbitrator: bool = False,
                 namespaced: bool | None = None, disk_kib: int | None = None, clients: int = 4,
                 op_timeout_s: float = 5.0, think_ms: float = 5, lifetime_s: float = 240,
                 options: dict | None = None) -> None:
        self.n = n
        self.quorum = quorum
        self.namespaced = want_namespaces(namespaced)
        self.topo = Topology.create(base_dir, n, arbitrator, self.namespaced)
        self.dir = self.topo.base_dir
        self.run = self.topo.run
        self.secret = "chaos-" + self.run
        self.clients = clients
        self.op_timeout_s = op_timeout_s
        self.think_ms = think_ms
        self.marks: list[tuple[float, str]] = []
        self._ids = 0
        self._id_lock = threading.Lock()
        self.history_path = os.path.join(self.dir, "history.jsonl")
        self.extra_history: list[dict] = []
        try:
            self._configure(n, quorum, arbitrator, disk_kib, lifetime_s, options or {})
        except BaseException:
            self.close()
            raise

    # -- set-up --------------------------------------------------------------------------------

    def _configure(self, n: int, quorum: int, arbitrator: bool, disk_kib: int | None, lifetime_s: float,
                   options: dict) -> None:
        topo = self.topo
        if self.namespaced:
            peer = {i: (topo.host(f"n{i}"), PEER_PORT) for i in range(1, n + 1)}
            client = {i: (topo.host(f"n{i}"), CLIENT_PORT) for i in range(1, n + 1)}
            arb_addr = (topo.host("arb"), ARB_PORT) if arbitrator else None
        else:
            ports = sorted(free_port() for _ in range(n))
            peer = {i: ("127.0.0.1", ports[i - 1]) for i in range(1, n + 1)}
            client = {i: ("127.0.0.1", free_port()) for i in range(1, n + 1)}
            arb_addr = ("127.0.0.1", free_port()) if arbitrator else None
        self.client_addr = client
        replicas = [[i, f"{peer[i][0]}:{peer[i][1]}"] for i in range(1, n + 1)]
        self.nodes: dict[int, Proc] = {}
        self.data: dict[int, str] = {}
        self.disk_kib = disk_kib
        for i in range(1, n + 1):
            d = os.path.join(self.dir, f"n{i}")
            os.makedirs(d)
            data = os.path.join(d, "data")
            if disk_kib:
                topo.mount_tmpfs(data, disk_kib)
            self.data[i] = data
            conf = {
                "vgroup_id": 7, "replicas": replicas, "self_index": i - 1, "data_path": data,
                "secret": self.secret, "quorum": quorum, "client_port": client[i][1],
                "arbitrator": f"{arb_addr[0]}:{arb_addr[1]}" if arb_addr else None,
                "log_file": os.path.join(d, "node.log"), "lifetime_s": lifetime_s, "options": options,
            }
            path = os.path.join(d, "config.json")
            with open(path, "w") as fh:
                json.dump(conf, fh)
            self.nodes[i] = Proc(f"n{i}", [*topo.exec_prefix(f"n{i}"), *python_argv("-m",
                                           "vrepl.testing.chaos.node", path)], conf["log_file"])
        self.arb: Proc | None = None
        if arb_addr:
            d = os.path.join(self.dir, "arb")
            os.makedirs(d)
            with open(os.path.join(d, "secret"), "w") as fh:
                fh.write(self.secret)
            self.arb = Proc("arb", [*topo.exec_prefix("arb"), *python_argv("-m", "arbitrator.main"),
                                    "--host", arb_addr[0], "--port", str(arb_addr[1]), "--secret-file",
                                    os.path.join(d, "secret"), "--state-dir", os.path.join(d, "state"),
                                    "--lease-ms", str(ARB_LEASE_MS), "--log-file", os.path.join(d, "arb.log"),
                                    "--metrics-listen", "127.0.0.1:0"],
                            os.path.join(d, "arb.log"))
        wconf = {"nodes": {str(i): f"{h}:{p}" for i, (h, p) in client.items()}, "clients": self.clients,
                 "history_path": self.history_path, "op_timeout_s": self.op_timeout_s,
                 "think_ms": self.think_ms, "run": self.run.rsplit("-", 1)[-1]}
        wpath = os.path.join(self.dir, "workload.json")
        with open(wpath, "w") as fh:
            json.dump(wconf, fh)
        self.workload = Proc("workload", [*topo.exec_prefix("cl"), *python_argv("-m",
                                          "vrepl.testing.chaos.workload", wpath)],
                             os.path.join(self.dir, "workload.log"))

    # -- processes -----------------------------------------------------------------------------

    def start(self) -> "ChaosCluster":
        if self.arb is not None:
            self.start_arbitrator()
        for i in self.nodes:
            self.start_node(i)
        return self

    def start_node(self, i: int) -> None:
        self.nodes[i].start()
        self.wait_for(f"n{i} ready", lambda: self.event(i, "ready") or self.event(i, "error"), 15)
        err = self.event(i, "error")
        if err:
            raise RuntimeError(f"n{i} did not start: {err['text']}")

    def start_arbitrator(self) -> None:
        assert self.arb is not None
        # The arbitrator logs "listening on" to its log file; a restart appends, so start
        # from a fresh file to wait for this start's line.
        try:
            os.replace(self.arb.log_path, self.arb.log_path + f".{time.monotonic_ns()}")
        except FileNotFoundError:
            pass
        self.arb.start()
        log_path = self.arb.log_path
        self.wait_for("arbitrator listening", lambda: "listening on" in _read(log_path), 15)

    def kill(self, i: int) -> None:
        self.mark(f"kill n{i}")
        self.nodes[i].kill()

    def pause(self, i: int) -> None:
        self.mark(f"pause n{i}")
        p = self.nodes[i]
        assert p.proc is not None
        p.proc.send_signal(signal.SIGSTOP)
        p.paused = True

    def resume(self, i: int) -> None:
        self.mark(f"resume n{i}")
        p = self.nodes[i]
        if p.alive() and p.paused:
            p.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        p.paused = False

    def restart(self, i: int) -> None:
        self.nodes[i].kill()
        self.mark(f"start n{i}")
        self.start_node(i)

    def start_workload(self) -> None:
        self.workload.start()
        self.wait_for("workload started", lambda: self._wev("started"), 10)
        self.mark("workload")

    def stop_workload(self) -> dict:
        if not self.workload.alive():
            return {}
        self.workload.send("stop")
        ev = self.wait_for("workload stopped", lambda: self._wev("stopped"), self.op_timeout_s + 15)
        self.workload.quit(5)
        return ev

    def _wev(self, name: str) -> dict | None:
        return next((e for e in self.workload.snapshot() if e["event"] == name), None)

    # -- asking nodes --------------------------------------------------------------------------

    def event(self, i: int, name: str, **match: Any) -> dict | None:
        for ev in reversed(self.nodes[i].snapshot()):
            if ev["event"] == name and all(ev.get(k) == v for k, v in match.items()):
                return ev
        return None

    def request(self, i: int, cmd: str, timeout_s: float = 2.0, *args: str) -> dict | None:
        """Send `cmd ID args` on n<i>'s stdin; its answer event (or None: dead, paused, slow)."""
        p = self.nodes[i]
        if p.paused:
            return None
        with self._id_lock:
            self._ids += 1
            ident = self._ids
        if not p.send(" ".join([cmd, str(ident), *args])):
            return None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for ev in reversed(p.snapshot()):
                if ev.get("id") == ident:
                    return ev
            if not p.alive():
                return None
            time.sleep(0.01)
        return None

    def roles(self, i: int) -> dict | None:
        ev = self.request(i, "roles")
        return ev if ev and ev.get("state") == "running" else None

    def role_events(self) -> dict[int, list[dict]]:
        return {i: [e for e in p.snapshot() if e["event"] == "role"] for i, p in self.nodes.items()}

    def current_master(self, among: list[int] | None = None) -> int | None:
        """The one node (among the live, unpaused ones) whose latest role event is master."""
        nodes = among or [i for i, p in self.nodes.items() if p.alive() and not p.paused]
        masters = [i for i in nodes if (self.event(i, "role") or {}).get("role") == "master"]
        return masters[0] if len(masters) == 1 else None

    def wait_master(self, among: list[int] | None = None, timeout_s: float = 15.0) -> int:
        return self.wait_for(f"one master among {among or 'live nodes'}", lambda: self.current_master(among),
                             timeout_s)

    def write(self, i: int, key: str, timeout_s: float = 15.0) -> dict:
        """One write through n<i>'s stdin (the harness's own client); logged in the history."""
        t0 = time.monotonic()
        ev = self.request(i, "write", timeout_s, key)
        rec: dict = {"key": key, "client": -1, "node": i, "t0": t0, "t1": time.monotonic()}
        if ev is None:
            rec.update(status="unknown", detail="no answer")
        elif ev["code"] == "OK":
            v, e = ev["detail"].split()
            rec.update(status="ok", version=int(v), epoch=int(e))
        elif ev["code"] in ("NM", "ER"):
            rec.update(status="fail", detail=ev["detail"])
        else:
            rec.update(status="unknown", detail=ev["detail"])
        self.extra_history.append(rec)
        return rec

    def wait_for(self, what: str, cond: Callable[[], Any], timeout_s: float = 10.0, poll_s: float = 0.02) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            got = cond()
            if got:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"not within {timeout_s} s: {what}; roles {self.role_summary()}")
            time.sleep(poll_s)

    def role_summary(self) -> dict[int, str]:
        out = {}
        for i, p in self.nodes.items():
            ev = self.event(i, "role")
            out[i] = "dead" if not p.alive() else ("paused" if p.paused else (ev or {}).get("role", "?"))
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

    def wal_dir(self, i: int) -> str:
        return os.path.join(self.data[i], "wal")

    def damage_wal(self, i: int, how: str, nbytes: int = 100) -> str:
        """truncate: cut nbytes off the last WAL file; corrupt: flip a bit nbytes before its
        end (tools/walfault.py). The node must be dead."""
        assert not self.nodes[i].alive(), "damage a WAL only between a kill and a restart"
        from vrepl import wal

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
        """The operator's answer to a corrupt WAL: remove it (the promise file stays, so the
        node still refuses epochs older than it promised) and let the master stream it back."""
        import shutil

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

    def converge(self, timeout_s: float = 30.0) -> dict:
        """Every fault healed (dead nodes and arbitrator restarted), one master with every
        other node its slave and all logs ending at the same (epoch, version)."""
        t_heal = time.monotonic()
        self.heal()
        if self.arb is not None and not self.arb.alive():
            self.start_arbitrator()
        for i, p in self.nodes.items():
            if not p.alive():
                self.start_node(i)

        def all_follow() -> int | None:
            rs = {i: self.roles(i) for i in self.nodes}
            if any(r is None for r in rs.values()):
                return None
            masters = [i for i, r in rs.items() if r["role"] == "master"]
            if len(masters) != 1:
                return None
            m = masters[0]
            if all(r["role"] == "slave" and r["master"] == m for i, r in rs.items() if i != m):
                return m
            return None

        m = self.wait_for("one master, every other node its slave", all_follow, timeout_s, 0.1)
        t_roles = time.monotonic()
        counts = self.stop_workload()
        barrier = self.write(m, f"barrier-{self.run.rsplit('-', 1)[-1]}")
        if barrier["status"] != "ok":
            m = self.wait_for("a master after the barrier failed", all_follow, timeout_s, 0.1)
            barrier = self.write(m, f"barrier2-{self.run.rsplit('-', 1)[-1]}")

        def same_end() -> bool:
            rs = {i: self.roles(i) for i in self.nodes}
            if any(r is None for r in rs.values()):
                return False
            return len({(r["last_epoch"], r["last_version"]) for r in rs.values()}) == 1
        self.wait_for("every log ends at the master's (epoch, version)", same_end, timeout_s, 0.1)
        t_conv = time.monotonic()
        return {"master": m, "roles_s": t_roles - t_heal, "converged_s": t_conv - t_heal,
                "workload": counts, "barrier": barrier["status"]}

    def history(self) -> list[dict]:
        out = []
        try:
            with open(self.history_path) as fh:
                out = [json.loads(line) for line in fh if line.strip()]
        except FileNotFoundError:
            pass
        return out + self.extra_history

    def logs(self) -> dict[int, list[tuple[int, int, bytes]]]:
        from vrepl.wal import read_records

        return {i: [(r.epoch, r.version, r.payload) for r in read_records(self.wal_dir(i))] for i in self.nodes}

    def masters_per_epoch(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for i, p in self.nodes.items():
            for e in p.role_events:
                if e["role"] == "master":
                    out.setdefault(e["epoch"], set()).add(i)
        return out

    def finish(self, allow_loss: bool = False, timeout_s: float = 30.0) -> "Result":
        """Heal, converge, stop every node cleanly, and check history against every WAL."""
        conv = self.converge(timeout_s)
        self.stop_nodes()
        hist = self.history()
        verdict = _check.check(hist, self.logs(), allow_loss=allow_loss)
        two = {e: sorted(ns) for e, ns in self.masters_per_epoch().items() if len(ns) > 1}
        heal_t = next(t for t, what in self.marks if what == "heal")
        fault_t = next((t for t, what in self.marks if what not in ("workload", "heal")), heal_t)
        oks = sorted(op["t1"] for op in hist if op["status"] == "ok")
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
        for p in self.nodes.values():
            p.quit(15)
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
