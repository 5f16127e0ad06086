"""A small app embedding a sync instance with the reference vnode, for the restore tests
(not used by the node process).

Owns: `VnodeApp` (one replica: a Vnode applying forwarded records, getFileInfo /
notifyFileSynced / getVersion from the Vnode, a `write()` helper on the master, `flush()`
that archives and recycles the WAL) and `make_configs()`.
Must not: be imported by production code.
"""
from __future__ import annotations

import threading
from typing import Any

from vrepl.child import free_ports
from vrepl.config import ReplicaAddress, SyncConfig
from vrepl.replica import ConfirmStatus
from vrepl.restore.config import RestoreConfig
from vrepl.sync import SyncCallbacks, SyncInstance
from vrepl.vnode import Vnode
from vrepl.vnode.config import VnodeConfig

SECRET = b"restore-secret"


def make_configs(tmp_path: Any, n: int = 3, vgroup_id: int = 5, **opts: Any) -> list[SyncConfig]:
    ports = sorted(free_ports(n))
    replicas = tuple(ReplicaAddress(i + 1, "127.0.0.1", p) for i, p in enumerate(ports))
    return [SyncConfig(vgroup_id=vgroup_id, replicas=replicas, self_index=i, data_path=str(tmp_path / f"n{i + 1}"),
                       secret=SECRET, **opts) for i in range(n)]


class VnodeApp:
    """One replica: a Vnode behind a SyncInstance. Records carry epoch 0 in the vnode (the
    sync callback does not pass record epochs), on every replica alike."""

    def __init__(self, cfg: SyncConfig, *, restore: RestoreConfig | None = None,
                 vnode_cfg: VnodeConfig | None = None, raw: bool = False) -> None:
        self.cfg = cfg
        # raw: payloads are opaque bytes kept in a dict (benchmarks); else vnode rows
        self.raw = raw
        self.vnode = Vnode(cfg.data_path, vnode_cfg or VnodeConfig(fsync=False, max_memtable_age_ms=3_600_000))
        self.vnode.recover(f"{cfg.data_path}/wal")
        self.applied_raw: dict[int, bytes] = {}
        self.roles: list[str] = []
        self.restores: list[tuple[str, str]] = []
        self.confirms: dict[int, ConfirmStatus] = {}
        self.cond = threading.Condition()
        self.lock = threading.Lock()
        self.next_version: int | None = None
        self.inst = SyncInstance(cfg, SyncCallbacks(
            write_to_cache_batch=self._write_batch,
            confirm_forward_range=self._confirm,
            notify_role=lambda r, e, m: self.roles.append(r),
            get_version=self.vnode.get_version,
            get_file_info=self.vnode.get_file_info,
            notify_file_synced=self.vnode.notify_file_synced,
            notify_restore=lambda status, reason: self.restores.append((status, reason)),
        ), restore=restore)

    def start(self) -> "VnodeApp":
        self.inst.start()
        return self

    def stop(self) -> None:
        self.inst.stop()

    # -- callbacks ---------------------------------------------------------------------------------

    def _write_batch(self, first: int, payloads: tuple[bytes, ...]) -> None:
        with self.lock:
            for k, p in enumerate(payloads):
                if self.raw:
                    self.applied_raw[first + k] = p
                else:
                    self.vnode.write_to_cache(first + k, 0, p)
        self.inst.ack_forward(first + len(payloads) - 1)

    def _confirm(self, first: int, last: int, status: ConfirmStatus) -> None:
        with self.cond:
            for v in range(first, last + 1):
                self.confirms[v] = status
            self.cond.notify_all()

    # -- master helpers ----------------------------------------------------------------------------

    def role(self) -> str:
        return self.inst.roles()["role"]

    def last_version(self) -> int:
        return self.inst.roles()["last_version"]

    def write(self, rows: list) -> int:
        """Master: validate, forward, apply; returns the version (confirmation comes later)."""
        with self.lock:
            reason, payload = self.vnode.prepare_write(rows)
            assert reason is None, reason
            if self.next_version is None:
                self.next_version = self.last_version() + 1
            version = self.next_version
            self.inst.forward(version, payload)
            self.next_version += 1
            self.vnode.apply_local(version, 0, rows)
        return version

    def write_raw(self, version: int, payload: bytes) -> None:
        self.inst.forward(version, payload)

    def wait_confirmed(self, version: int, timeout_s: float = 20.0) -> ConfirmStatus:
        with self.cond:
            assert self.cond.wait_for(lambda: version in self.confirms, timeout_s), f"v{version} not confirmed"
            return self.confirms[version]

    def flush(self) -> int:
        """Archive the memtable, then let the WAL below the archived version go."""
        with self.lock:
            self.vnode.flush()
            archived = self.vnode.archived_version
        self.inst.recycle_wal(archived + 1)
        return archived

    def rows(self, table: str) -> list[dict]:
        """Rows without `_epoch` (the sync callback does not pass record epochs to the app)."""
        with self.lock:
            return strip_epoch(self.vnode.query(table, 0, 1 << 60))


def strip_epoch(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "_epoch"} for r in rows]
