"""A cluster of node_runner processes on 127.0.0.1 (integration tests and bench).

Owns: one JSON config and data directory per node, starting (vrepl.child.start_child),
signalling (SIGKILL / SIGSTOP / SIGCONT) and restarting node processes, collecting their
stdout events, and waiting for conditions with a deadline. `close()` kills every process
it started, whatever state the test is in; use it as a context manager or pytest fixture.
Must not: connect anywhere but loopback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from vrepl import wal
from vrepl.child import LOOPBACK, free_ports, python_argv, start_child, wait_for


@dataclass
class NodeProc:
    node: int
    index: int
    port: int
    config_path: str
    log_file: str
    data_path: str
    proc: subprocess.Popen | None = None
    events: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: bool = False  # SIGSTOPped

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.events)

    def role(self) -> str | None:
        roles = [e for e in self.snapshot() if e["event"] == "role"]
        return roles[-1]["role"] if roles else None

    def log_text(self) -> str:
        try:
            with open(self.log_file) as fh:
                return fh.read()
        except FileNotFoundError:
            return ""


class ProcessCluster:
    """`n` node processes of one vgroup. Node ids are 1..n, in port order."""

    def __init__(self, base_dir: str, n: int = 3, *, vgroup_id: int = 7, secret: str = "test-secret",
                 quorum: int = 0, lifetime_s: float = 120, **options: Any) -> None:
        self.base_dir = base_dir
        self.vgroup_id = vgroup_id
        self.secret = secret
        ports = sorted(free_ports(n))
        self.replicas = [[i + 1, f"{LOOPBACK}:{p}"] for i, p in enumerate(ports)]
        self.nodes: dict[int, NodeProc] = {}
        for i, port in enumerate(ports):
            node = i + 1
            d = os.path.join(base_dir, f"n{node}")
            os.makedirs(d, exist_ok=True)
            conf = {
                "vgroup_id": vgroup_id,
                "replicas": self.replicas,
                "self_index": i,
                "data_path": os.path.join(d, "data"),
                "secret": secret,
                "quorum": quorum,
                "log_file": os.path.join(d, "node.log"),
                "lifetime_s": lifetime_s,
                "options": options,
            }
            path = os.path.join(d, "config.json")
            with open(path, "w") as fh:
                json.dump(conf, fh)
            self.nodes[node] = NodeProc(node, i, port, path, conf["log_file"], conf["data_path"])

    # -- processes -------------------------------------------------------------------------------

    def start(self, node: int | None = None) -> None:
        for np_ in [self.nodes[node]] if node is not None else list(self.nodes.values()):
            np_.events = []
            np_.stopped = False
            np_.proc = start_child(python_argv("-m", "vrepl.testing.node_runner", np_.config_path),
                                   stderr_path=np_.log_file + ".stderr", stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, new_session=False)
            threading.Thread(target=self._reader, args=(np_, np_.proc), daemon=True).start()

    def _reader(self, np_: NodeProc, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with np_.lock:
                if np_.proc is proc:
                    np_.events.append(ev)

    def send(self, node: int, command: str) -> None:
        proc = self.nodes[node].proc
        assert proc is not None and proc.stdin is not None
        proc.stdin.write(command + "\n")
        proc.stdin.flush()

    def signal(self, node: int, sig: int) -> None:
        np_ = self.nodes[node]
        assert np_.proc is not None
        if sig == signal.SIGSTOP:
            np_.stopped = True
        elif sig == signal.SIGCONT:
            np_.stopped = False
        np_.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            np_.proc.wait(5)

    def close(self) -> None:
        for np_ in self.nodes.values():
            proc = np_.proc
            if proc is None or proc.poll() is not None:
                continue
            try:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def __enter__(self) -> "ProcessCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- observing -------------------------------------------------------------------------------

    def wait_for(self, what: str, cond: Callable[[], Any], timeout_s: float = 10.0, poll_s: float = 0.01) -> Any:
        return wait_for(what, cond, timeout_s, poll_s, detail=lambda: f"roles {self.roles()}")

    def roles(self) -> dict[int, str | None]:
        return {n: (np_.role() if np_.alive() else "dead") for n, np_ in self.nodes.items()}

    def master(self, among: list[int] | None = None) -> int | None:
        """The single live node reporting master whose followers agree, else None."""
        nodes = among or [n for n, np_ in self.nodes.items() if np_.alive() and not np_.stopped]
        masters = [n for n in nodes if self.nodes[n].role() == "master"]
        if len(masters) != 1:
            return None
        return masters[0]

    def wait_master(self, among: list[int] | None = None, timeout_s: float = 10.0, slaves: int = 0) -> int:
        def ok() -> int | None:
            m = self.master(among)
            if m is None:
                return None
            nodes = among or [n for n, np_ in self.nodes.items() if np_.alive() and not np_.stopped]
            if sum(1 for n in nodes if self.nodes[n].role() == "slave") < slaves:
                return None
            return m
        return self.wait_for(f"one master among {among or 'live nodes'} with {slaves} slaves", ok, timeout_s)

    def event(self, node: int, name: str, after: float = 0.0, **match: Any) -> dict | None:
        for ev in reversed(self.nodes[node].snapshot()):
            if ev["event"] == name and ev["t"] >= after and all(ev.get(k) == v for k, v in match.items()):
                return ev
        return None

    def confirmed_ok(self, node: int) -> set[int]:
        out: set[int] = set()
        for ev in self.nodes[node].snapshot():
            if ev["event"] == "confirm" and ev["status"] == "ok":
                out.update(range(ev["first"], ev["last"] + 1))
        return out

    def confirms(self, node: int, after: float = 0.0) -> list[dict]:
        return [ev for ev in self.nodes[node].snapshot() if ev["event"] == "confirm" and ev["t"] >= after]

    def wal(self, node: int) -> list[tuple[int, int, bytes]]:
        return [(r.epoch, r.version, r.payload)
                for r in wal.read_records(os.path.join(self.nodes[node].data_path, "wal"))]
