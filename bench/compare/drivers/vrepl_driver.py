"""Plug-in point for vrepl: the two drivers the issue asks for, not written yet.

  vrepl-client  3 vrepl nodes (processes), quorum 2, writes through the client API
                (vrepl.client) over TCP, one client process per writer: implement start/stop
                and client_factory, returning a picklable factory of a Client whose
                write_one/write_batch return once 2 of 3 replicas confirmed.
  vrepl-lib     3 replicas at library level (the sync instance embedded as in
                docs/embedding.md, forwards over real loopback TCP), writers in the master's
                process: implement start/stop and override run_latency/run_throughput to run
                workload.latency_loop / workload.run_client_threads there (see
                pysyncobj_driver.py for the same pattern across processes).

Both map the harness's fsync modes to vrepl's WAL policy: `fsync` -> fsync per write in
workload (a) and one group-commit fsync per batch in (b), on master and slaves before the ack;
`nofsync` -> WAL durability `none`. State it in fsync_setting().

Until a real driver replaces a placeholder, prepare() returns a skip reason, so the tables
show "not available yet" and every vrepl / peer ratio reads "n/a": no figure is invented.
To plug a driver in, subclass Driver in a new module and list it in DRIVERS in run.py in
place of the placeholder (keep the names "vrepl-client" and "vrepl-lib": the ratio columns
use them).
"""
from __future__ import annotations

from pathlib import Path

from ..procs import ProcessRegistry
from .base import Driver, Skip

NOT_AVAILABLE = "vrepl driver not available yet"


class VreplPlaceholder(Driver):
    is_vrepl = True

    def __init__(self, name: str, what: str):
        self.name = name
        self.what = what

    def prepare(self, allow_install: bool) -> str | None:
        return f"{NOT_AVAILABLE} ({self.what}); see bench/compare/drivers/vrepl_driver.py"

    def fsync_setting(self, fsync: bool) -> Skip:
        return Skip(NOT_AVAILABLE)

    def start(self, workdir: Path, fsync: bool, procs: ProcessRegistry) -> None:
        raise RuntimeError(NOT_AVAILABLE)

    def stop(self) -> None:
        pass


def placeholders() -> list[Driver]:
    return [VreplPlaceholder("vrepl-client", "3 nodes, quorum 2, client API"),
            VreplPlaceholder("vrepl-lib", "3 replicas, quorum 2, library level")]
