"""The driver interface: what a system must provide to be measured by the harness.

A driver is one system under test (Redis, PySyncObj, etcd, and later vrepl through its client
API and at library level). The harness calls, for each fsync mode:

    reason = driver.prepare(allow_install)      # None, or why the system is skipped
    driver.start(workdir, fsync, procs)         # 3 nodes, quorum 2, ready for writes
    lat = driver.run_latency(spec)              # workload (a)
    thr = driver.run_throughput(spec)           # workload (b)
    driver.stop()                               # always, from a finally
    (the harness stops every process the driver spawned, then calls driver.cleanup())

Most drivers only implement `start`, `stop` and `client_factory`: the default `run_latency`
and `run_throughput` then drive `Client` objects (`write_one`, `write_batch`), one in this
process for latency and one per client process for throughput. A system that has no network
client (PySyncObj; vrepl at library level) overrides the two `run_*` methods to run the same
loops (`workload.latency_loop`, `workload.throughput_loop`) where its writers live.

Contract of a Client:
  write_one(key, value)  returns only once a quorum (2 of 3) has confirmed the write;
  write_batch(items)     returns only once a quorum has confirmed every write of the batch;
  close()                releases the connection.
Both raise on a failed or unconfirmed write (the workload counts it as an error and goes on).
A driver starts every process through `procs.spawn` so the harness can stop it.
"""
from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..procs import ProcessRegistry


class Client(Protocol):
    def write_one(self, key: bytes, value: bytes) -> None: ...
    def write_batch(self, items: list[tuple[bytes, bytes]]) -> None: ...
    def close(self) -> None: ...


# A picklable zero-argument callable that opens a Client; called in a client process.
ClientFactory = Callable[[], Client]


@dataclass(frozen=True)
class LatencySpec:
    """Workload (a): `count` measured writes after `warmup` unmeasured ones, one at a time.
    A run stops early after time_limit_s of measured writes (a slow system must not hold
    the whole comparison); the result then says `truncated` and its count is smaller."""
    count: int
    warmup: int
    value_size: int
    time_limit_s: float = 120.0


@dataclass(frozen=True)
class ThroughputSpec:
    """Workload (b): `clients` writers, each writing batches of `batch` writes of `value_size`
    bytes for `warmup_s` (not counted) then `duration_s` (counted)."""
    clients: int
    batch: int
    value_size: int
    duration_s: float
    warmup_s: float


@dataclass
class Skip:
    """A system (or one fsync mode of it) that was not measured, and why."""
    reason: str


@dataclass
class FsyncSetting:
    """What a system does about durability in one mode, in words for the table."""
    mode: str                    # "fsync" or "nofsync"
    description: str
    per_write: bool | None       # True: fsync before confirming; False: never; None: cannot say
    notes: list[str] = field(default_factory=list)


class Driver(abc.ABC):
    #: short name used in tables, JSON and --systems
    name: str = "?"
    #: True for the vrepl drivers: they form the numerators of the ratios
    is_vrepl: bool = False
    #: how clients reach the system in workload (b), stated in the docs
    client_mode: str = "one process per client"

    def prepare(self, allow_install: bool) -> str | None:
        """Install what the system needs (or check it is there): None, or the skip reason."""
        return None

    def version(self) -> str:
        return "?"

    @abc.abstractmethod
    def fsync_setting(self, fsync: bool) -> FsyncSetting | Skip:
        """The durability the system gives in this mode, or a Skip if it cannot run it."""

    @abc.abstractmethod
    def start(self, workdir: Path, fsync: bool, procs: ProcessRegistry) -> None:
        """Start 3 nodes (quorum 2) in workdir, each through procs.spawn, and return once a
        write can be confirmed. Raise RuntimeError with the reason if it cannot."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Release what start() opened. The harness also stops the processes it spawned."""

    def cleanup(self) -> None:
        """Remove what start() made outside the work directory; called after the harness
        has stopped the processes. Default: nothing."""

    def client_factory(self) -> ClientFactory:
        raise NotImplementedError(f"{self.name}: no network client; override run_latency "
                                  "and run_throughput")

    def run_latency(self, spec: LatencySpec) -> dict:
        from ..workload import latency_loop
        client = self.client_factory()()
        try:
            return latency_loop(client, spec)
        finally:
            client.close()

    def run_throughput(self, spec: ThroughputSpec) -> dict:
        from ..workload import run_client_processes
        return run_client_processes(self.client_factory(), spec)
