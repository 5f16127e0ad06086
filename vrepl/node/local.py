"""Node processes on 127.0.0.1 for the demo, the integration tests and the benchmarks.

Owns: one node.toml and data directory per node under a base directory (`render_toml`),
starting `vrepl node` processes (vrepl.child.start_node: each dies with its parent),
signalling (SIGKILL, SIGTERM), restarting, waiting for readiness and roles through the HTTP
API, and `close()`, which kills every process it started whatever state it is in.
Must not: bind or connect anywhere but loopback.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from prometheus_client.parser import text_string_to_metric_families

from vrepl.child import LOOPBACK, free_ports, start_node, wait_for
from vrepl.client import Client


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def render_toml(doc: dict[str, Any]) -> str:
    """A small TOML writer for node.toml (scalars, [tables] and [[arrays of tables]])."""
    out = [f"{k} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, (dict, list))
           or (isinstance(v, list) and not (v and isinstance(v[0], dict)))]
    for k, v in doc.items():
        if isinstance(v, dict):
            out.append(f"\n[{k}]")
            out += [f"{kk} = {_toml_value(vv)}" for kk, vv in v.items()]
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for item in v:
                out.append(f"\n[[{k}]]")
                out += [f"{kk} = {_toml_value(vv)}" for kk, vv in item.items()]
    return "\n".join(out) + "\n"


@dataclass
class LocalNode:
    id: int
    http: str
    replication: str
    dir: str
    config_path: str
    proc: subprocess.Popen | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalCluster:
    """`n` node processes (ids 1..n) under `base_dir`, hosting vgroup `vgroup` (and, with
    vgroup_count k > 1, the vgroups vgroup..vgroup+k-1, each on every node)."""

    def __init__(self, base_dir: str, n: int = 3, *, vgroup: int = 1, vgroup_count: int = 1,
                 quorum: int = 0,
                 secret: str = "vrepl-local-secret", vnode: dict | None = None,
                 sync: dict | None = None, http: dict | None = None,
                 log_level: str = "INFO", log_format: str = "text",
                 arbitrator: str | None = None, client_kw: dict | None = None,
                 ship_senders: list[dict] | None = None, txn: dict | None = None) -> None:
        self.base_dir = os.path.abspath(base_dir)
        # Client keyword arguments for every client this object makes (token, tls, cafile),
        # for nodes whose [http] sets token_file or tls_cert.
        self.client_kw = dict(client_kw or {})
        self.vgroup = vgroup
        self.vgroup_ids = list(range(vgroup, vgroup + vgroup_count))
        ports = free_ports(2 * n)
        self.nodes: dict[int, LocalNode] = {}
        node_table = []
        for i in range(n):
            nid = i + 1
            node_table.append({"id": nid, "replication": f"{LOOPBACK}:{ports[2 * i]}",
                               "http": f"{LOOPBACK}:{ports[2 * i + 1]}"})
        for entry in node_table:
            nid = entry["id"]
            d = os.path.join(self.base_dir, f"n{nid}")
            os.makedirs(d, exist_ok=True)
            doc: dict[str, Any] = {"node_id": nid, "data_dir": os.path.join(d, "data"),
                                   "secret": secret, "log_level": log_level,
                                   "log_file": os.path.join(d, "node.log"),
                                   "log_format": log_format}
            if http:
                doc["http"] = dict(http)
            if vnode:
                doc["vnode"] = dict(vnode)
            if sync:
                doc["sync"] = dict(sync)
            if txn:
                doc["txn"] = dict(txn)
            doc["nodes"] = node_table
            doc["vgroups"] = [{"id": vg, "replicas": [e["id"] for e in node_table],
                               "quorum": quorum, **({"arbitrator": arbitrator} if arbitrator else {})}
                              for vg in range(vgroup, vgroup + vgroup_count)]
            path = os.path.join(d, "node.toml")
            text = render_toml(doc)
            for sender in ship_senders or ():       # [[ship.senders]] (docs/ship.md §2.1)
                text += "\n[[ship.senders]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in sender.items())
            with open(path, "w") as fh:
                fh.write(text)
            self.nodes[nid] = LocalNode(nid, entry["http"], entry["replication"], d, path)

    @property
    def endpoints(self) -> list[str]:
        return [n.http for n in self.nodes.values()]

    # -- processes ------------------------------------------------------------------------------
    def start(self, node: int | None = None) -> None:
        for n in [self.nodes[node]] if node is not None else list(self.nodes.values()):
            if n.alive():
                continue
            n.proc = start_node(n.config_path, stderr_path=os.path.join(n.dir, "stderr.log"))

    def kill(self, node: int, sig: int = signal.SIGKILL, wait_s: float = 15.0) -> int | None:
        """Signal a node and wait for it to exit; its exit code."""
        n = self.nodes[node]
        if n.proc is None or n.proc.poll() is not None:
            return n.proc.returncode if n.proc else None
        n.proc.send_signal(sig)
        try:
            return n.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            n.proc.kill()
            return n.proc.wait(5)

    def stop_all(self, sig: int = signal.SIGTERM) -> dict[int, int | None]:
        procs = {nid: n.proc for nid, n in self.nodes.items() if n.alive()}
        for p in procs.values():
            p.send_signal(sig)
        out = {}
        for nid, p in procs.items():
            try:
                out[nid] = p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                out[nid] = p.wait(5)
        return out

    def close(self) -> None:
        for n in self.nodes.values():
            if n.proc is not None and n.proc.poll() is None:
                try:
                    n.proc.kill()
                    n.proc.wait(5)
                except (OSError, subprocess.TimeoutExpired):
                    pass

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- observing ------------------------------------------------------------------------------
    def client(self, **kw: Any) -> Client:
        return Client(self.endpoints, **{**self.client_kw, **kw})

    def status(self, node: int, timeout_s: float = 2.0) -> dict | None:
        """A node's /v1/status, or None if it does not answer."""
        c = Client([self.nodes[node].http], request_timeout_s=timeout_s, **self.client_kw)
        try:
            return c.status(self.nodes[node].http)
        except Exception:
            return None
        finally:
            c.close()

    def vgroup_status(self, node: int) -> dict | None:
        st = self.status(node)
        if st is None:
            return None
        return next((v for v in st["vgroups"] if v["vgroup"] == self.vgroup), None)

    def metric(self, node: int, name: str, **labels: str) -> float | None:
        """One sample of a node's `GET /metrics` (read with prometheus_client's own parser):
        the first named `name` whose labels include `labels`; None if there is none."""
        with urllib.request.urlopen(f"http://{self.nodes[node].http}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return None

    def roles(self) -> dict[int, str]:
        out = {}
        for nid, n in self.nodes.items():
            vs = self.vgroup_status(nid) if n.alive() else None
            out[nid] = vs["role"] if vs else ("dead" if not n.alive() else "down")
        return out

    def wait_for(self, what: str, cond: Callable[[], Any], timeout_s: float = 15.0,
                 poll_s: float = 0.02) -> Any:
        return wait_for(what, cond, timeout_s, poll_s, check=self._check_exits,
                        detail=lambda: f"roles {self.roles()}")

    def _check_exits(self) -> None:
        """RuntimeError when a node exited by itself (not 0, not our SIGKILL or SIGTERM)."""
        for nid, n in self.nodes.items():
            if n.proc is not None and n.proc.poll() not in (None, 0, -9, -15):
                raise RuntimeError(f"node {nid} exited with {n.proc.returncode}:"
                                   f" {self.stderr_tail(nid)}")

    def wait_ready(self, node: int | None = None, timeout_s: float = 20.0) -> None:
        for nid in [node] if node is not None else list(self.nodes):
            self.wait_for(f"node {nid} answers", lambda nid=nid: self.status(nid, 0.5) is not None,
                          timeout_s)

    def master(self) -> int | None:
        roles = self.roles()
        masters = [n for n, r in roles.items() if r == "master"]
        return masters[0] if len(masters) == 1 else None

    def wait_master(self, slaves: int = 0, timeout_s: float = 15.0,
                    exclude: int | None = None) -> int:
        def ok() -> int | None:
            roles = self.roles()
            masters = [n for n, r in roles.items() if r == "master" and n != exclude]
            if len(masters) != 1 or sum(1 for r in roles.values() if r == "slave") < slaves:
                return None
            return masters[0]
        return self.wait_for(f"one master with {slaves} slaves", ok, timeout_s)

    def stderr_tail(self, node: int, lines: int = 3) -> str:
        try:
            with open(os.path.join(self.nodes[node].dir, "stderr.log")) as fh:
                return " | ".join(fh.read().strip().splitlines()[-lines:])
        except OSError:
            return ""

    def replica_rows(self, node: int, table: str) -> list[dict]:
        """All rows of a table on one replica (paged by ts)."""
        c = Client([self.nodes[node].http], **self.client_kw)
        try:
            out: list[dict] = []
            start = None
            while True:
                doc = c.read(self.vgroup, table, start=start, node=self.nodes[node].http)
                out += doc["rows"]
                if not doc["truncated"] or not doc["rows"]:
                    return out
                start = doc["rows"][-1]["ts"] + 1
        finally:
            c.close()
