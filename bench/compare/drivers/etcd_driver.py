"""etcd: 3 members on 127.0.0.1; writes through the gRPC-gateway's HTTP/JSON API.

A write is `POST /v3/kv/put`; a batch is one `POST /v3/kv/txn` whose success branch holds N
puts (one Raft entry). etcd replies once the entry is committed by a majority (2 of 3) and
applied on the member that received it: quorum-2 semantics. Clients talk to the leader, found
with `/v3/maintenance/status`, as Redis clients talk to the master (a follower would forward
the proposal to the leader, adding a hop). The client is http.client with keep-alive.

fsync: etcd fsyncs its WAL before a Raft entry is acknowledged or committed, always; its
only switch is `--unsafe-no-fsync` (etcd >= 3.5). Debian 12 ships 3.4, which lacks it, so
the `nofsync` mode puts the members' data directories on tmpfs (/dev/shm), where fsync
returns without I/O: the same effect, stated as such in the table.
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ..install import ensure_apt, tool_version
from ..procs import ProcessRegistry, free_ports, wait_port
from .base import Driver, FsyncSetting


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class EtcdClient:
    def __init__(self, port: int, timeout_s: float = 30.0):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
        self.headers = {"Content-Type": "application/json"}

    def post(self, path: str, body: dict) -> dict:
        self.conn.request("POST", path, json.dumps(body), self.headers)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"etcd {path}: HTTP {resp.status}: {data[:200]!r}")
        out = json.loads(data)
        if "error" in out:
            raise RuntimeError(f"etcd {path}: {out['error']}")
        return out

    def write_one(self, key: bytes, value: bytes) -> None:
        self.post("/v3/kv/put", {"key": _b64(key), "value": _b64(value)})

    def write_batch(self, items: list[tuple[bytes, bytes]]) -> None:
        ops = [{"requestPut": {"key": _b64(k), "value": _b64(v)}} for k, v in items]
        out = self.post("/v3/kv/txn", {"success": ops})
        if not out.get("succeeded"):
            raise RuntimeError(f"etcd txn not applied: {str(out)[:200]}")

    def close(self) -> None:
        self.conn.close()


class EtcdClientFactory:
    def __init__(self, port: int):
        self.port = port

    def __call__(self) -> EtcdClient:
        return EtcdClient(self.port)


def _supports_unsafe_no_fsync(binary: str) -> bool:
    proc = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=20)
    return "--unsafe-no-fsync" in proc.stdout + proc.stderr


class EtcdDriver(Driver):
    name = "etcd"

    def __init__(self):
        self.leader_port: int | None = None
        self._tmpfs_dir: str | None = None

    def prepare(self, allow_install: bool) -> str | None:
        return ensure_apt("etcd-server", "etcd", allow_install)

    def version(self) -> str:
        return tool_version(["etcd", "--version"])

    def fsync_setting(self, fsync: bool) -> FsyncSetting:
        if fsync:
            return FsyncSetting("fsync", "always fsyncs its WAL before acking/committing "
                                "an entry (not configurable)", True)
        if _supports_unsafe_no_fsync(shutil.which("etcd")):
            return FsyncSetting("nofsync", "--unsafe-no-fsync", False)
        return FsyncSetting("nofsync", "data dirs on tmpfs (/dev/shm): fsync is a no-op; "
                            "this etcd has no --unsafe-no-fsync", False)

    def start(self, workdir: Path, fsync: bool, procs: ProcessRegistry) -> None:
        binary = shutil.which("etcd")
        ports = free_ports(6)
        client_ports, peer_ports = ports[:3], ports[3:]
        unsafe = not fsync and _supports_unsafe_no_fsync(binary)
        base = workdir
        if not fsync and not unsafe:
            # Named after the run's work directory so the leftover check recognizes its users.
            self._tmpfs_dir = tempfile.mkdtemp(prefix=f"{procs.workdir.name}-etcd-",
                                               dir="/dev/shm")
            base = Path(self._tmpfs_dir)
        cluster = ",".join(f"n{i}=http://127.0.0.1:{p}" for i, p in enumerate(peer_ports))
        members = []
        for i in range(3):
            argv = [binary, "--name", f"n{i}", "--data-dir", str(base / f"etcd{i}"),
                    "--listen-client-urls", f"http://127.0.0.1:{client_ports[i]}",
                    "--advertise-client-urls", f"http://127.0.0.1:{client_ports[i]}",
                    "--listen-peer-urls", f"http://127.0.0.1:{peer_ports[i]}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_ports[i]}",
                    "--initial-cluster", cluster, "--initial-cluster-state", "new",
                    "--initial-cluster-token", f"bench-{os.getpid()}",
                    "--logger", "zap", "--log-level", "warn",
                    # The default 2 GiB backend quota is far above a 10 s run; raise it so a
                    # long run never trips the space alarm mid-measurement.
                    "--quota-backend-bytes", str(8 * 1024**3)]
            if unsafe:
                argv.append("--unsafe-no-fsync")
            members.append(procs.spawn(f"etcd{i}", argv,
                                       env=dict(os.environ, ETCD_UNSUPPORTED_ARCH="")))
        for port, proc in zip(client_ports, members):
            wait_port(port, 30, proc)
        self.leader_port = self._find_leader(client_ports, timeout_s=30)
        EtcdClient(self.leader_port).write_one(b"ready", b"1")

    def _find_leader(self, client_ports: list[int], timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            for port in client_ports:
                try:
                    c = EtcdClient(port, timeout_s=2)
                    st = c.post("/v3/maintenance/status", {})
                    c.close()
                except (OSError, RuntimeError, ValueError):
                    continue
                leader = st.get("leader")
                if leader and leader == st.get("header", {}).get("member_id"):
                    return port
            if time.monotonic() > deadline:
                raise RuntimeError(f"no etcd leader elected after {timeout_s} s")
            time.sleep(0.2)

    def stop(self) -> None:
        self.leader_port = None

    def cleanup(self) -> None:
        """Remove the tmpfs data directory, after the harness stopped the members."""
        if self._tmpfs_dir:
            shutil.rmtree(self._tmpfs_dir, ignore_errors=True)
            self._tmpfs_dir = None

    def client_factory(self) -> EtcdClientFactory:
        return EtcdClientFactory(self.leader_port)
