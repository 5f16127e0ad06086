"""Settings of the transactional load (docs/operations.md §[txn]), each with a default.

Owns: TxnConfig and txn_config_invalid(). Must not: read files or the environment (the node
maps its `[txn]` TOML table onto these names).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

MIB = 1024 * 1024


@dataclass(frozen=True)
class TxnConfig:
    max_running: int = 100  # open (PREPARE or PRECOMMITTED) per vgroup
    max_staged_bytes: int = 256 * MIB  # rows staged by open transactions, per vgroup
    max_staged_file_bytes: int = 16 * 1024 * MIB  # Parquet files staged by open ones (disk)
    timeout_ms: int = 60_000  # default: abort a transaction still open after
    max_timeout_ms: int = 3_600_000  # the largest timeout_ms a begin may ask for
    label_retention_ms: int = 3_600_000  # finished labels answered this long (1 h)


def txn_config_invalid(cfg: TxnConfig) -> str | None:
    """Why the settings are refused, or None."""
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if type(v) is not int or v <= 0:
            return f"{f.name} must be a positive integer, got {v!r}"
    if cfg.timeout_ms > cfg.max_timeout_ms:
        return f"timeout_ms {cfg.timeout_ms} is above max_timeout_ms {cfg.max_timeout_ms}"
    return None
