"""vrepl in the comparison: through the client API (`vrepl-client`) and at library level
(`vrepl-lib`). Both run 3 replicas on 127.0.0.1 with quorum 2: a write is confirmed once the
master and at least one slave hold it in their WAL (the slave acks after its WAL append is
durable and the record applied).

  vrepl-client  3 `vrepl node` processes (one vgroup), writers talk HTTP/1.1 to the master
                through `vrepl.client.Client` (keep-alive, request ids, master following),
                one client process per writer, as for Redis and etcd. A write is one row
                [table, ts, {"v": base64(value)}] (the 16-byte key gives the table, "c03",
                and the ts, its sequence number); a batch of N writes is one request of N
                rows, i.e. ONE WAL record (like an etcd txn or a PySyncObj update).
  vrepl-lib     3 processes each embedding a SyncInstance (bench/compare/vrepl_lib_node.py,
                built on vrepl.testing.node_runner: a slave's app acks each record at once),
                writers are coroutines on the master's I/O loop calling forward_many() (the
                library API of docs/embedding.md, used as the vrepl node uses it). A write
                is one record (key + value bytes); a batch of N writes is N records in one
                forward_many() call, then waited for together (N records in the log, like
                Redis's N pipelined SETs + WAIT).
  vrepl-lib-1rec
                vrepl-lib with a batch of N writes packed into ONE record (a length before
                each write): one log entry per batch, the shape the PySyncObj (`update` of a
                dict) and etcd (a txn of N puts) batches have. Single writes as vrepl-lib.
  vrepl-lib-threads
                vrepl-lib with one thread per writer instead (a thread-based application):
                the cost of two thread hand-offs per batch, measured in the same run.

fsync modes (stated in fsync_setting): vrepl's WAL always commits in groups: one write() and
ONE fdatasync per append call, covering every record the I/O thread collected since the
previous one, on the master and on each slave before it acks. `fsync`: the WAL on the disk
of the work directory, so workload (a) pays one fdatasync per write on master and slave, and
(b) one per group of records. `nofsync`: the data directories on tmpfs (/dev/shm), where
fdatasync returns without I/O; the WAL keeps its group commit (vrepl has no durability
"none" at the node level), so the cost of the call itself remains.
"""
from __future__ import annotations

import base64
import importlib
import json
import shutil
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from vrepl.child import node_argv
from vrepl.client import ARROW_END_OF_STREAM

from .. import jsonline
from ..procs import ProcessRegistry, bench_module_argv, free_ports
from .base import Driver, FsyncSetting, LatencySpec, ThroughputSpec

REPO_ROOT = Path(__file__).resolve().parents[3]
SHM = Path("/dev/shm")


def _data_base(workdir: Path, fsync: bool) -> Path:
    """Where the nodes' data go: the work directory (disk) or a tmpfs directory whose name
    carries the run's unique directory name, so the harness's leftover check finds it."""
    if fsync or not SHM.is_dir():
        return workdir
    return SHM / f"{workdir.parent.name}-{workdir.name}"


def _fsync_setting(fsync: bool) -> FsyncSetting:
    if fsync:
        return FsyncSetting("fsync", "WAL group commit on disk: one write + one fdatasync per "
                            "append batch, on master and slave before the ack (one per write "
                            "in (a))", True)
    if not SHM.is_dir():
        return FsyncSetting("nofsync", "no /dev/shm here: WAL on disk with group commit (same "
                            "as fsync)", True)
    return FsyncSetting("nofsync", "WAL (and data) on tmpfs /dev/shm: group commit kept, "
                        "fdatasync is a no-op", False)


def _missing(module: str) -> str | None:
    """Why this driver cannot run (vrepl not importable here), or None."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"vrepl is not importable here ({exc}): pip install -e ."
    return None


# -- vrepl-client --------------------------------------------------------------------------------

def _row(key: bytes, b64: bytes) -> bytes:
    # key b"c03-000000012345": table "c03", ts 12345 (unique per client and write).
    return b'["%s",%s,{"v":"%s"}]' % (key[:3], key[4:].lstrip(b"0") or b"0", b64)


class VreplHttpClient:
    """A bench Client over vrepl.client.Client: a write or a batch is one confirmed request.
    `request_ids=False` posts without a request id (payload format 1, no dedup entry) and
    `plain_values=True` sends a 70-byte plain string instead of the base64 value: the two
    variants bench/profile_client.py uses to split the client path's cost (docs/perf.md)."""

    def __init__(self, endpoints: list[str], vgroup: int, request_ids: bool = True,
                 plain_values: bool = False):
        from vrepl.client import Client
        self.client = Client(endpoints, timeout_s=10.0, binary=False)
        self.vgroup = vgroup
        self.request_ids = request_ids
        self.plain_values = plain_values
        self._value: bytes | None = None
        self._b64 = b""

    def _enc(self, value: bytes) -> bytes:
        if value is not self._value:
            self._value = value
            self._b64 = b"x" * 70 if self.plain_values else base64.b64encode(value)
        return self._b64

    def _post(self, body: bytes) -> None:
        if self.request_ids:
            self.client.write(self.vgroup, body)
            return
        ep = self.client._master.get(self.vgroup) or self.client.find_master(self.vgroup)
        code, doc = self.client.request(ep or self.client.nodes[0], "POST",
                                        f"/v1/vgroups/{self.vgroup}/write", body)
        if code != 200:
            raise RuntimeError(f"{code} {doc.get('error')}")

    def write_one(self, key: bytes, value: bytes) -> None:
        self._post(b"[" + _row(key, self._enc(value)) + b"]")

    def write_batch(self, items: list[tuple[bytes, bytes]]) -> None:
        enc = self._enc
        self._post(b"[" + b",".join([_row(k, enc(v)) for k, v in items]) + b"]")

    def close(self) -> None:
        self.client.close()


class VreplHttpClientFactory:
    def __init__(self, endpoints: list[str], vgroup: int, **options):
        self.endpoints = endpoints
        self.vgroup = vgroup
        self.options = options

    def __call__(self) -> VreplHttpClient:
        return VreplHttpClient(self.endpoints, self.vgroup, **self.options)


class VreplArrowClient(VreplHttpClient):
    """vrepl-client-arrow: the same rows as an Arrow IPC stream (Client.write_arrow): table
    "c03" in the schema metadata, ts int64, the base64 value a string column."""

    def __init__(self, endpoints: list[str], vgroup: int):
        super().__init__(endpoints, vgroup)
        import pyarrow as pa
        self.pa = pa
        self.schema: dict[bytes, object] = {}

    def _batch(self, items: list[tuple[bytes, bytes]]) -> bytes:
        pa = self.pa
        table = items[0][0][:3]
        cached = self.schema.get(table)
        if cached is None:
            schema = pa.schema([("ts", pa.int64()), ("v", pa.string())],
                               metadata={"vrepl.table": table})
            cached = self.schema[table] = (schema, schema.serialize().to_pybytes())
        schema, head = cached
        v = self._enc(items[0][1]).decode()
        batch = pa.record_batch([pa.array([int(k[4:]) for k, _ in items], pa.int64()),
                                 pa.array([v] * len(items), pa.string())], schema=schema)
        return head + batch.serialize().to_pybytes() + ARROW_END_OF_STREAM

    def write_one(self, key: bytes, value: bytes) -> None:
        self.client.write_arrow(self.vgroup, self._batch([(key, value)]))

    def write_batch(self, items: list[tuple[bytes, bytes]]) -> None:
        self.client.write_arrow(self.vgroup, self._batch(items))


class VreplLineClient(VreplHttpClient):
    """vrepl-client-lp: the same rows as InfluxDB line protocol (`POST /api/v2/write`,
    precision ms, a token-less node): measurement "c03" (no tags: table "c03"), field v the
    base64 value, the ts from the key. One request per write or batch, no retry."""

    def __init__(self, endpoints: list[str], vgroup: int):
        super().__init__(endpoints, vgroup)
        self.path = f"/api/v2/write?bucket=vg{vgroup}&precision=ms"

    def _post_lines(self, body: bytes) -> None:
        c = self.client
        ep = c._master.get(self.vgroup) or c.find_master(self.vgroup)
        code, doc = c._conn(ep or c.nodes[0]).request("POST", self.path, body, b"text/plain")
        if code != 204:
            c._master.pop(self.vgroup, None)
            raise RuntimeError(f"{code} {doc}")

    def write_one(self, key: bytes, value: bytes) -> None:
        self._post_lines(b'%s v="%s" %s\n' % (key[:3], self._enc(value), key[4:]))

    def write_batch(self, items: list[tuple[bytes, bytes]]) -> None:
        v = self._enc(items[0][1])
        self._post_lines(b"".join([b'%s v="%s" %s\n' % (k[:3], v, k[4:]) for k, _ in items]))


class _Factory:
    def __init__(self, cls, endpoints: list[str], vgroup: int):
        self.cls, self.endpoints, self.vgroup = cls, endpoints, vgroup

    def __call__(self):
        return self.cls(self.endpoints, self.vgroup)


def VreplArrowClientFactory(endpoints: list[str], vgroup: int) -> _Factory:
    return _Factory(VreplArrowClient, endpoints, vgroup)


def VreplLineClientFactory(endpoints: list[str], vgroup: int) -> _Factory:
    return _Factory(VreplLineClient, endpoints, vgroup)


class VreplClientDriver(Driver):
    name = "vrepl-client"
    is_vrepl = True
    client_mode = "one process per writer, HTTP/1.1 client API (vrepl.client)"
    vgroup = 1

    def __init__(self):
        self.cluster = None
        self.data_base: Path | None = None

    def prepare(self, allow_install: bool) -> str | None:
        return _missing("vrepl.node.server")

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return f"vrepl {version('vrepl')}"
        except PackageNotFoundError:
            return "vrepl (source tree)"

    def fsync_setting(self, fsync: bool) -> FsyncSetting:
        return _fsync_setting(fsync)

    def start(self, workdir: Path, fsync: bool, procs: ProcessRegistry) -> None:
        from vrepl.node.local import LocalCluster
        self.data_base = _data_base(workdir, fsync)
        self.data_base.mkdir(parents=True, exist_ok=True)
        self.cluster = c = LocalCluster(str(self.data_base), 3, vgroup=self.vgroup, quorum=2,
                                        log_level="WARNING")
        for nid, node in c.nodes.items():
            node.proc = procs.spawn(f"vrepl-n{nid}", node_argv(node.config_path), cwd=REPO_ROOT)
        c.wait_ready(timeout_s=30)
        c.wait_master(slaves=2, timeout_s=30)
        client = VreplHttpClient(c.endpoints, self.vgroup)
        try:
            client.write_one(b"c99-000000000001", b"ready")
        finally:
            client.close()

    def stop(self) -> None:
        self.cluster = None

    def cleanup(self) -> None:
        if self.data_base is not None and self.data_base.parent == SHM:
            shutil.rmtree(self.data_base, ignore_errors=True)
        self.data_base = None

    def client_factory(self):
        assert self.cluster is not None
        return VreplHttpClientFactory(self.cluster.endpoints, self.vgroup)


class VreplArrowClientDriver(VreplClientDriver):
    name = "vrepl-client-arrow"
    client_mode = ("one process per writer, HTTP/1.1 client API with Arrow IPC bodies"
                   " (vrepl.client.Client.write_arrow)")

    def client_factory(self):
        assert self.cluster is not None
        return VreplArrowClientFactory(self.cluster.endpoints, self.vgroup)


class VreplLineClientDriver(VreplClientDriver):
    name = "vrepl-client-lp"
    client_mode = ("one process per writer, InfluxDB line protocol (POST /api/v2/write,"
                   " precision ms) on a keep-alive connection")

    def client_factory(self):
        assert self.cluster is not None
        return VreplLineClientFactory(self.cluster.endpoints, self.vgroup)


# -- vrepl-lib ------------------------------------------------------------------------------------

class VreplLibDriver(Driver):
    name = "vrepl-lib"
    is_vrepl = True
    client_mode = ("coroutines on the master's I/O loop calling SyncInstance.forward_many()"
                   " (N records per batch)")
    batch_as_record = False
    writers = "loop"

    def __init__(self):
        self.nodes: list[subprocess.Popen] = []
        self.master: subprocess.Popen | None = None
        self.data_base: Path | None = None

    def prepare(self, allow_install: bool) -> str | None:
        return _missing("vrepl.sync")

    def version(self) -> str:
        return VreplClientDriver().version()

    def fsync_setting(self, fsync: bool) -> FsyncSetting:
        return _fsync_setting(fsync)

    def start(self, workdir: Path, fsync: bool, procs: ProcessRegistry) -> None:
        self.data_base = _data_base(workdir, fsync)
        self.data_base.mkdir(parents=True, exist_ok=True)
        ports = free_ports(3)
        replicas = [[i + 1, f"127.0.0.1:{p}"] for i, p in enumerate(ports)]
        for i in range(3):
            d = self.data_base / f"lib{i + 1}"
            d.mkdir()
            conf = {"vgroup_id": 1, "replicas": replicas, "self_index": i,
                    "data_path": str(d / "data"), "secret": "vrepl-compare", "quorum": 2,
                    "log_file": str(d / "node.log"), "lifetime_s": 86400,
                    "print_confirms": False, "options": {},
                    "batch_as_record": self.batch_as_record, "writers": self.writers}
            path = workdir / f"vrepl-lib{i + 1}.json"
            path.write_text(json.dumps(conf))
            self.nodes.append(procs.spawn(
                f"vrepl-lib{i + 1}", bench_module_argv("bench.compare.vrepl_lib_node",
                                                    str(path)),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO_ROOT))
        deadline = time.monotonic() + 30
        while self.master is None:
            states = []
            for node in self.nodes:
                if node.poll() is not None:
                    raise RuntimeError(f"vrepl-lib node exited with {node.returncode}")
                st = self._ask(node, {"cmd": "status"})
                states.append(st)
            masters = [n for n, st in zip(self.nodes, states) if st.get("role") == "master"]
            slaves = sum(1 for st in states if st.get("role") == "slave")
            if len(masters) == 1 and slaves == 2:
                self.master = masters[0]
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no vrepl master with 2 slaves after 30 s: {states}")
            time.sleep(0.2)
        self._ask(self.master, {"cmd": "latency",
                                "spec": asdict(LatencySpec(count=1, warmup=0, value_size=1))})

    @staticmethod
    def _ask(node: subprocess.Popen, msg: dict) -> dict:
        return jsonline.ask(node, msg, "vrepl-lib")

    def run_latency(self, spec: LatencySpec) -> dict:
        return self._ask(self.master, {"cmd": "latency", "spec": asdict(spec)})

    def run_throughput(self, spec: ThroughputSpec) -> dict:
        return self._ask(self.master, {"cmd": "throughput", "spec": asdict(spec)})

    def stop(self) -> None:
        jsonline.quit_all(self.nodes)
        self.nodes = []
        self.master = None

    def cleanup(self) -> None:
        if self.data_base is not None and self.data_base.parent == SHM:
            shutil.rmtree(self.data_base, ignore_errors=True)
        self.data_base = None


class VreplLibOneRecordDriver(VreplLibDriver):
    name = "vrepl-lib-1rec"
    client_mode = ("coroutines on the master's I/O loop calling SyncInstance.forward_many();"
                   " a batch of N writes is one record")
    batch_as_record = True


class VreplLibThreadsDriver(VreplLibDriver):
    name = "vrepl-lib-threads"
    client_mode = ("threads in the master's process calling SyncInstance.forward_many()"
                   " (N records per batch)")
    writers = "threads"


def vrepl_drivers() -> list[Driver]:
    return [VreplClientDriver(), VreplArrowClientDriver(), VreplLineClientDriver(),
            VreplLibDriver(), VreplLibOneRecordDriver(), VreplLibThreadsDriver()]
