"""Restore settings (docs/restore.md §Configuration): every limit with a name and a default.

Owns: `RestoreConfig` (passed to SyncInstance as `restore=`) and `restore_config_invalid()`.
Must not: open files or sockets.
"""
from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class RestoreConfig:
    enabled: bool = True  # False: lagging followers are always streamed in-band (design §4.3)
    max_concurrent_restores: int = 2  # per node (seed tsMaxSyncNum); more wait in a queue, logged
    min_lag_versions: int = 10_000  # a lag below this, still in the master's WAL, is streamed in-band
    switch_lag_versions: int = 1_000  # the WAL stream this close to the log end: live forwards start
    connect_timeout_s: float = 5.0  # sync connection connect + handshake
    io_timeout_s: float = 30.0  # no byte moving for this long: the session fails
    wal_wait_s: float = 10.0  # records that should be in the WAL but are not readable for this long
    begin_wait_s: float = 5.0  # a follower waits this long for the master's SyncStart to arrive
    retry_interval_ms: int = 1_000  # a failed restore is retried (a new SyncRequest) after this
    max_file_bytes: int = 1 << 40  # largest file a receiver accepts
    max_undurable_versions: int = 262_144  # restored records fed but not yet durable in the WAL
    max_inflight_feeds: int = 4  # restored WAL chunks queued for the I/O thread
    fsync: bool = True  # fsync staged files and directories
    poll: bool = False  # watch files by polling instead of inotify
    poll_interval_s: float = 0.05
    allow_backup: bool = True  # serve `vrepl restore` (connection kind BACKUP)


def restore_config_invalid(cfg: RestoreConfig) -> str | None:
    for name in ("max_concurrent_restores", "switch_lag_versions", "retry_interval_ms", "max_file_bytes",
                 "max_undurable_versions", "max_inflight_feeds"):
        if getattr(cfg, name) < 1:
            return f"restore.{name} must be >= 1"
    for name in ("connect_timeout_s", "io_timeout_s", "wal_wait_s", "begin_wait_s", "poll_interval_s"):
        if getattr(cfg, name) <= 0:
            return f"restore.{name} must be > 0"
    if cfg.min_lag_versions < 0:
        return "restore.min_lag_versions must be >= 0"
    return None
